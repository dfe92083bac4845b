"""``search``: local BM25 retrieval over a corpus of text, markdown and JSONL documents (``bm25s``).

Why local BM25: search-augmented agent training (Search-R1 style) needs a retriever that answers in
milliseconds, deterministically and without network; BM25 over a local corpus is the standard
baseline. The index is built once and cached on disk (next to the corpus, or in ``index_dir``) with
a fingerprint of the corpus files, so a changed corpus is re-indexed and an unchanged one loads fast.

Corpus formats (``corpus`` is a folder, searched recursively, or one file):

* ``.txt`` / ``.md``: split into passages of about ``passage_words`` words at paragraph breaks; the
  title is the first markdown heading, else the file name;
* ``.jsonl``: one passage per line, text in ``text``, ``contents`` or ``content``, optional ``title``
  and ``id`` (a bad line is refused naming ``file:line``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlweave.agents.tools.base import Tool, ToolConfigError, ToolError, ToolSpec, register_tool
from rlweave.utils.jsonl import read_jsonl

INDEX_VERSION = 1
TEXT_SUFFIXES = (".txt", ".md", ".markdown")
JSONL_SUFFIXES = (".jsonl",)
_TEXT_KEYS = ("text", "contents", "content")


def import_bm25s() -> Any:
    """``import bm25s`` without letting it import jax.

    Why: when jax is installed, bm25s imports it and runs a jax ``top_k`` at import time, which
    starts an XLA backend: seconds of start-up in every process that builds a search tool, and on a
    GPU machine jax's default preallocation of most of the GPU's memory beside the policy. bm25s
    falls back to its numpy top-k (same results) when the import fails, so jax is hidden while
    bm25s loads, unless something in this process has imported jax already.
    """
    import sys

    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    hide = "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # type: ignore[assignment]  # makes `import jax` raise ImportError
    try:
        import bm25s
    finally:
        if hide and sys.modules.get("jax", 0) is None:
            del sys.modules["jax"]
    return bm25s


def corpus_files(corpus: Path) -> list[Path]:
    if corpus.is_file():
        return [corpus]
    files = [p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES
             and not any(part.startswith(".") for part in p.relative_to(corpus).parts)]
    return sorted(files)


def _split_text(text: str, passage_words: int) -> list[str]:
    """Paragraphs packed into passages of up to ``passage_words`` words (a longer paragraph is cut)."""
    out: list[str] = []
    cur: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        words = para.split()
        while len(words) > passage_words:
            if cur:
                out.append(" ".join(cur))
                cur = []
            out.append(" ".join(words[:passage_words]))
            words = words[passage_words:]
        if cur and len(cur) + len(words) > passage_words:
            out.append(" ".join(cur))
            cur = []
        cur.extend(words)
    if cur:
        out.append(" ".join(cur))
    return out


def read_passages(corpus: Path, passage_words: int = 200) -> list[dict[str, str]]:
    """All passages of the corpus as ``{"id", "title", "text"}``, in a stable order."""
    passages: list[dict[str, str]] = []
    root = corpus if corpus.is_dir() else corpus.parent
    for path in corpus_files(corpus):
        rel = path.relative_to(root).as_posix()
        if path.suffix.lower() in JSONL_SUFFIXES:
            for lineno, row in read_jsonl(path, ToolConfigError, allow_empty=True):
                text = next((row[k] for k in _TEXT_KEYS if isinstance(row.get(k), str)), None)
                if text is None:
                    raise ToolConfigError(f"{path}:{lineno}: no text field (one of {', '.join(_TEXT_KEYS)})")
                passages.append({"id": str(row.get("id", f"{rel}:{lineno}")), "title": str(row.get("title", "")), "text": text})
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
            heading = re.search(r"^#\s+(.+)$", text, flags=re.M)
            title = heading.group(1).strip() if heading else path.stem
            for j, chunk in enumerate(_split_text(text, passage_words)):
                passages.append({"id": f"{rel}#{j}", "title": title, "text": chunk})
    return passages


def fingerprint(corpus: Path, passage_words: int) -> str:
    h = hashlib.sha256(f"v{INDEX_VERSION}:{passage_words}".encode())
    root = corpus if corpus.is_dir() else corpus.parent
    for path in corpus_files(corpus):
        st = path.stat()
        h.update(f"{path.relative_to(root).as_posix()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def default_index_dir(corpus: Path) -> Path:
    """Beside the corpus when writable, else under ~/.cache/rlweave/bm25 keyed by the corpus path."""
    beside = (corpus / ".bm25_index") if corpus.is_dir() else corpus.with_name(corpus.name + ".bm25_index")
    if os.access(beside.parent, os.W_OK):
        return beside
    key = hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "rlweave" / "bm25" / key


class BM25Index:
    """A bm25s retriever plus the passages it returns; built or loaded from its cache folder."""

    def __init__(self, corpus: str | os.PathLike, index_dir: str | os.PathLike | None = None, passage_words: int = 200):
        self._bm25s = bm25s = import_bm25s()
        self.corpus = Path(corpus).expanduser()
        if not self.corpus.exists():
            raise ToolConfigError(f"corpus not found: {self.corpus}")
        self.index_dir = Path(index_dir).expanduser() if index_dir else default_index_dir(self.corpus)
        self.passage_words = int(passage_words)
        self.built = False  # whether this instance (re)built the index rather than loading it
        meta_path = self.index_dir / "meta.json"
        fp = fingerprint(self.corpus, self.passage_words)
        if meta_path.is_file() and json.loads(meta_path.read_text()).get("fingerprint") == fp:
            self.retriever = bm25s.BM25.load(str(self.index_dir), show_progress=False)
            with open(self.index_dir / "passages.jsonl", encoding="utf-8") as f:
                self.passages = [json.loads(line) for line in f]
        else:
            self._build(fp)

    def _build(self, fp: str) -> None:
        self.passages = read_passages(self.corpus, self.passage_words)
        if not self.passages:
            raise ToolConfigError(f"corpus {self.corpus} has no passages (looked for {', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES)})")
        tokens = self._tokenize([f"{p['title']}\n{p['text']}" for p in self.passages])
        self.retriever = self._bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)
        tmp = self.index_dir.with_name(self.index_dir.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(tmp), show_progress=False)
        with open(tmp / "passages.jsonl", "w", encoding="utf-8") as f:
            for p in self.passages:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        (tmp / "meta.json").write_text(json.dumps({"fingerprint": fp, "passages": len(self.passages)}))
        if self.index_dir.exists():  # replace the stale index (written whole, then swapped in)
            shutil.rmtree(self.index_dir, ignore_errors=True)
        try:
            tmp.rename(self.index_dir)
        except OSError:  # another process (a rollout worker beside this one) swapped its own in first
            shutil.rmtree(tmp, ignore_errors=True)
        self.built = True

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str, k: int = 5) -> list[tuple[dict[str, str], float]]:
        """Top-``k`` passages with their BM25 scores (passages scoring 0 are left out)."""
        tokens = self._tokenize([query])
        vocab = self.retriever.vocab_dict
        tokens = [[t for t in tokens[0] if t in vocab]]
        if not tokens[0]:
            return []
        k = max(1, min(int(k), len(self.passages)))
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [(self.passages[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


def format_hits(hits: list[tuple[dict[str, str], float]]) -> str:
    if not hits:
        return "no results"
    return "\n\n".join(f"[{n}] {p['title']} (id: {p['id']})\n{p['text']}" for n, (p, _) in enumerate(hits, 1))


class SearchTool(Tool):
    """BM25 search over a local corpus (see the module docstring)."""

    def __init__(self, index: BM25Index, default_k: int = 3, max_k: int = 10, timeout_s: float = 10.0,
                 name: str = "search", description: str | None = None):
        self.index, self.default_k, self.max_k, self.timeout_s = index, int(default_k), int(max_k), float(timeout_s)
        self.spec = ToolSpec(
            name=name,
            description=description or "Search the local document collection; returns the best-matching passages "
                                       "with their titles and ids.",
            parameters={"type": "object", "properties": {
                "query": {"type": "string", "minLength": 1, "description": "keywords or a question"},
                "k": {"type": "integer", "minimum": 1, "maximum": self.max_k,
                      "description": f"number of passages (default {self.default_k})"}},
                "required": ["query"], "additionalProperties": False},
        )

    async def run(self, arguments: dict[str, Any]) -> str:
        query = arguments["query"].strip()
        if not query:
            raise ToolError("empty query")
        hits = await asyncio.to_thread(self.index.search, query, arguments.get("k", self.default_k))
        return format_hits(hits)


@register_tool("search")
def make_search(corpus: str | None = None, index_dir: str | None = None, passage_words: int = 200, k: int = 3,
                max_k: int = 10, tool_name: str = "search", description: str | None = None) -> Tool:
    """Options: ``corpus`` (folder or file, required), ``index_dir``, ``passage_words``, ``k`` (default
    top-k), ``max_k``, and ``tool_name``/``description`` to expose several corpora as differently named tools."""
    if not corpus:
        raise ToolConfigError("missing 'corpus' (a folder of .txt/.md/.jsonl documents, or one such file)")
    return SearchTool(BM25Index(corpus, index_dir, passage_words), default_k=k, max_k=max_k, name=tool_name, description=description)
