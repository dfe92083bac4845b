"""Task ``multihop``: questions of 1, 2 and 3 hops over a generated corpus of fictional entities.

Why generated: every name (people, companies, cities, regions) is made up from syllables by a
seeded generator, so no fact can be recalled from pre-training; a model scores only by searching
the corpus and following the hops ("In which region was the founder of Velmar Works born?" needs
the company's page, then its founder's, then the birthplace's). The corpus is a pure function of
``(entities, seed)``: a run that finds its corpus folder missing makes it again, identically.

Split: each question has a *root*, the person it is about (a company's root is its founder,
a city question's root the city). A root is in the test split when a hash of its name falls below
``test_fraction``; so no person or company named in a test question is named in any train question,
and no train answer is one of them. The corpus itself is shared (it is the knowledge base the search
tool reads); what is held out is which chains are asked about.

Files in the corpus folder (``python -m rlweave.agents.tasks.multihop --out DIR --entities N --seed S``)::

    docs/corpus.jsonl   one document per entity: {"id", "title", "text"} (what the search tool indexes)
    train.jsonl         questions: {"id", "question", "answer", "hops", "docs", "queries", "root"}
    test.jsonl
    meta.json           {"format", "entities", "seed", "test_fraction", counts}

``docs`` lists the ids of the documents to read, in hop order; ``queries`` the scripted search
query per hop (the expert's); answers compare exactly after normalisation (case, spaces, a final dot).

Config: ``task.name: multihop``, ``task.corpus: DIR``, ``task.hops: [1, 2]``, ``task.entities``,
``task.corpus_seed``, ``task.test_fraction``, ``task.search_k`` (passages a search returns unless the
call asks for another ``k``: each passage costs ~50 tokens of the episode's ``agent.max_tokens``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Sequence

from rlweave.agents.tasks.base import AgentTask, ExpertCall
from rlweave.envs.text_tasks import Prompt, TaskDataError, TextTask, read_jsonl

__all__ = ["MultihopTask", "make_corpus", "build", "FORMAT"]

FORMAT = 2  # bump when the generator's output changes, so an old folder is refused, not silently mixed
HOPS = (1, 2, 3)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th",
           "tr", "gr", "sh", "vel", "mor")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "ia")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "x", "nd")
_PROFESSIONS = ("painter", "engineer", "chemist", "sailor", "architect", "composer", "botanist", "judge",
                "cartographer", "weaver", "astronomer", "brewer")
_INDUSTRIES = ("shipping", "textile", "mining", "glassware", "printing", "clockmaking", "ceramics", "brewing",
               "insurance", "railway")
_COMPANY_SUFFIXES = ("Works", "Holdings", "Foundry", "Trading", "Mills", "Company", "Brothers", "Guild")


# --------------------------------------------------------------------------- corpus generation
class _Names:
    """Unique made-up words from syllables (distinct across all entity kinds)."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        while True:
            n = self.rng.randint(*syllables)
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(n))
            w = w.capitalize()
            if w not in self.used and len(w) <= 10:
                self.used.add(w)
                return w


def _generate(n_people: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Entities and their documents: returns ``(docs, questions)``; questions without splits."""
    rng = random.Random(seed)
    names = _Names(rng)
    n_cities, n_companies = max(3, n_people // 10), max(1, n_people // 2)
    regions = [names.word() for _ in range(max(2, n_cities // 4))]
    cities = [{"id": f"city{i:04d}", "name": names.word(), "region": rng.choice(regions),
               "founded": rng.randint(1100, 1800)} for i in range(n_cities)]
    people = [{"id": f"person{i:05d}", "name": f"{names.word()} {names.word()}", "city": rng.choice(cities),
               "year": rng.randint(1850, 1975), "profession": rng.choice(_PROFESSIONS)} for i in range(n_people)]
    companies = []
    for i, founder in enumerate(rng.sample(people, n_companies)):  # each founder founds one company
        companies.append({"id": f"company{i:05d}", "name": f"{names.word()} {rng.choice(_COMPANY_SUFFIXES)}",
                          "founder": founder, "year": founder["year"] + rng.randint(20, 45),
                          "hq": rng.choice(cities), "industry": rng.choice(_INDUSTRIES)})
    # each year and each founder is stated twice, as every name is: with the loss on the passages'
    # tokens, a second mention is learned by copying the first, which is the skill an answer needs
    # (with years stated once, a warm-up never learned to copy one: docs/results.md, grpo-search)
    docs = []
    for c in cities:
        docs.append({"id": c["id"], "title": c["name"],
                     "text": f"{c['name']} is a city in the region of {c['region']}, founded in {c['founded']}. "
                             f"{c['name']} was founded in {c['founded']}."})
    for p in people:
        # no link back to a founded company: the company's page is the only way from it to its founder
        docs.append({"id": p["id"], "title": p["name"],
                     "text": f"{p['name']} is a {p['profession']}, born in {p['year']}. {p['name']} was born in {p['year']} "
                             f"in {p['city']['name']}."})
    for c in companies:
        docs.append({"id": c["id"], "title": c["name"],
                     "text": f"{c['name']} is a {c['industry']} company founded in {c['year']} by {c['founder']['name']}. "
                             f"{c['name']} was founded in {c['year']} by {c['founder']['name']}; "
                             f"the headquarters of {c['name']} are in {c['hq']['name']}."})
    return docs, _questions(cities, people, companies)


def _q(kind: str, root: str, question: str, answer, chain: Sequence[tuple[dict, str]]) -> dict:
    """A question record; ``chain`` holds (entity, search query) per hop, in order."""
    return {"kind": kind, "root": root, "question": question, "answer": str(answer), "hops": len(chain),
            "docs": [e["id"] for e, _ in chain], "queries": [q for _, q in chain]}


def _questions(cities: list[dict], people: list[dict], companies: list[dict]) -> list[dict]:
    """Every question the templates make; the search query of a hop is the entity's name plus the
    word its document uses for the asked relation, as a person would type it."""
    out = []
    for x in cities:
        out.append(_q("city_region", x["name"], f"In which region is the city of {x['name']}?", x["region"],
                      [(x, f"{x['name']} region")]))
    for p in people:
        x, hop_p, root = p["city"], (p, f"{p['name']} born"), p["name"]
        hop_x = (x, f"{x['name']} region")
        out += [_q("person_city", root, f"In which city was {p['name']} born?", x["name"], [hop_p]),
                _q("person_year", root, f"In which year was {p['name']} born?", p["year"], [hop_p]),
                _q("person_region", root, f"In which region was {p['name']} born?", x["region"], [hop_p, hop_x]),
                _q("person_city_founded", root, f"In which year was the city where {p['name']} was born founded?",
                   x["founded"], [hop_p, (x, f"{x['name']} founded")])]
    for c in companies:
        p, hq, root = c["founder"], c["hq"], c["founder"]["name"]
        hop_c, hop_p = (c, f"{c['name']} founded"), (p, f"{p['name']} born")
        out += [_q("company_founder", root, f"Who founded {c['name']}?", p["name"], [hop_c]),
                _q("company_year", root, f"In which year was {c['name']} founded?", c["year"], [hop_c]),
                _q("company_hq", root, f"In which city are the headquarters of {c['name']}?", hq["name"],
                   [(c, f"{c['name']} headquarters")]),
                _q("founder_city", root, f"In which city was the founder of {c['name']} born?", p["city"]["name"],
                   [hop_c, hop_p]),
                _q("founder_year", root, f"In which year was the founder of {c['name']} born?", p["year"], [hop_c, hop_p]),
                _q("hq_region", root, f"In which region are the headquarters of {c['name']}?", hq["region"],
                   [(c, f"{c['name']} headquarters"), (hq, f"{hq['name']} region")]),
                _q("founder_region", root, f"In which region was the founder of {c['name']} born?",
                   p["city"]["region"], [hop_c, hop_p, (p["city"], f"{p['city']['name']} region")]),
                _q("founder_city_founded", root,
                   f"In which year was the city where the founder of {c['name']} was born founded?",
                   p["city"]["founded"], [hop_c, hop_p, (p["city"], f"{p['city']['name']} founded")])]
    return out


def split_of(root: str, test_fraction: float) -> str:
    """``test`` when a hash of the question's root falls below ``test_fraction``: fixed per root."""
    h = int.from_bytes(hashlib.blake2b(root.encode(), digest_size=8).digest(), "big")
    return "test" if h / 2**64 < test_fraction else "train"


def make_corpus(out_dir: str | Path, n_entities: int = 300, seed: int = 0, test_fraction: float = 0.1) -> Path:
    """Writes the corpus of ``n_entities`` people (``n/2`` companies, ``n/10`` cities) and its
    questions to ``out_dir`` (see the module doc); returns ``out_dir``. Deterministic in
    ``(n_entities, seed, test_fraction)``; files are written under temporary names and renamed,
    so a crash never leaves a half corpus that looks complete."""
    if n_entities < 2:
        raise ValueError(f"entities: need at least 2, got {n_entities}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must be in (0, 1), got {test_fraction}")
    out = Path(out_dir)
    (out / "docs").mkdir(parents=True, exist_ok=True)
    docs, questions = _generate(int(n_entities), int(seed))
    splits: dict[str, list[dict]] = {"train": [], "test": []}
    for q in questions:
        splits[split_of(q["root"], test_fraction)].append(q)
    files = {out / "docs" / "corpus.jsonl": docs}
    for split, qs in splits.items():
        files[out / f"{split}.jsonl"] = [{"id": f"{split}{i:06d}", **q} for i, q in enumerate(qs)]
    for path, records in files.items():
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # per process: workers may make it at once
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        tmp.replace(path)
    meta = {"format": FORMAT, "entities": int(n_entities), "seed": int(seed), "test_fraction": float(test_fraction),
            "documents": len(docs), "train_questions": len(splits["train"]), "test_questions": len(splits["test"])}
    tmp = out / f"meta.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / "meta.json")  # last: its presence marks a complete corpus
    return out


# --------------------------------------------------------------------------- the task
class MultihopTask(AgentTask, TextTask):
    """Questions of ``hops`` hop counts over the corpus in ``corpus`` (made there when missing);
    the expert searches each hop's scripted query and answers."""

    name = "multihop"
    tools = ("search",)

    def __init__(self, corpus: str | Path, hops: Sequence[int] = (1, 2), entities: int = 300, seed: int = 0,
                 test_fraction: float = 0.1, search_k: int = 3):
        bad = [h for h in hops if h not in HOPS]
        if not hops or bad:
            raise ValueError(f"task.hops: {bad or 'none given'}; choose from {', '.join(map(str, HOPS))}")
        if int(search_k) < 1:
            raise ValueError(f"task.search_k: passages a search returns must be >= 1, got {search_k}")
        self.search_k = int(search_k)
        self.dir, self.hops = Path(corpus), tuple(sorted(set(int(h) for h in hops)))
        meta_path = self.dir / "meta.json"
        if not meta_path.is_file():
            make_corpus(self.dir, entities, seed, test_fraction)
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        want = {"format": FORMAT, "entities": int(entities), "seed": int(seed), "test_fraction": float(test_fraction)}
        differ = [f"{k}={meta.get(k)} (config {v})" for k, v in want.items() if meta.get(k) != v]
        if differ:
            raise TaskDataError(f"task.corpus: {self.dir} was made with {', '.join(differ)}; "
                                f"point task.corpus at another folder or set the task keys to match")
        self.docs_dir, self._docs = self.dir / "docs", None
        self._splits = {split: self._read(self.dir / f"{split}.jsonl") for split in self.splits}

    def _read(self, path: Path) -> list[Prompt]:
        out = []
        for lineno, r in read_jsonl(path):
            if r.get("hops") not in self.hops:
                continue
            out.append(Prompt(id=r["id"], text=r["question"], answer=r["answer"],
                              meta={"tools": list(self.tools), "hops": r["hops"], "docs": r["docs"],
                                    "queries": r["queries"], "kind": r["kind"], "corpus": str(self.docs_dir)}))
        if not out:
            raise TaskDataError(f"{path}: no questions of task.hops {list(self.hops)}")
        return out

    def _pool(self, split: str) -> list[Prompt]:
        self._check_split(split)
        return self._splits[split]

    def documents(self) -> dict[str, dict]:
        """The corpus by document id (read once)."""
        if self._docs is None:
            self._docs = {r["id"]: r for _, r in read_jsonl(self.docs_dir / "corpus.jsonl")}
        return self._docs

    def tool_entries(self) -> list:
        return [{"name": "search", "corpus": str(self.docs_dir), "k": self.search_k}]

    def expert_calls(self, prompt: Prompt) -> list[ExpertCall]:
        """One search per hop, with the hop's scripted query; each result must contain the text of the
        hop's document (which holds the fact the next hop, or the answer, needs)."""
        docs = self.documents()
        return [ExpertCall("search", {"query": q}, expect=docs[d]["text"])
                for q, d in zip(prompt.meta["queries"], prompt.meta["docs"])]


def build(cfg: dict) -> MultihopTask:
    """The task registry's builder (``task.name: multihop``)."""
    if not cfg.get("corpus"):
        raise TaskDataError("task.corpus: multihop needs a folder for its generated corpus (made there when missing)")
    return MultihopTask(cfg["corpus"], hops=tuple(cfg.get("hops") or (1, 2)), entities=cfg.get("entities", 300),
                        seed=cfg.get("corpus_seed", 0), test_fraction=cfg.get("test_fraction", 0.1),
                        search_k=cfg.get("search_k", 3))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlweave.agents.tasks.multihop",
                                 description="Generate the fictional multi-hop corpus and its questions.")
    ap.add_argument("--out", required=True, help="corpus folder to write")
    ap.add_argument("--entities", type=int, default=300, help="people (companies n/2, cities n/10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-fraction", type=float, default=0.1)
    args = ap.parse_args(argv)
    out = make_corpus(args.out, args.entities, args.seed, args.test_fraction)
    print(json.dumps(json.loads((out / "meta.json").read_text()), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
