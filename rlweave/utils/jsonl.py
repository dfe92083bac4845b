"""Reading JSONL files of objects with errors that name the file and line.

Why one reader: task data, SFT data and search corpora are all JSONL that users bring; each
caller wants the same guarantees (a bad line is named as ``file:line`` in one line, blank lines are
skipped) but raises its own error type, so the caller's configuration key stays in the message.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_jsonl"]


def read_jsonl(path: str | Path, error: type[Exception] = ValueError, allow_empty: bool = False) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line of a JSONL file of objects. ``error`` (built
    from a one-line message naming the file and line) is raised for a line that is not a JSON object,
    a missing file, and, unless ``allow_empty``, a file without records."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such file")
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise error(f"{path}:{lineno}: expected an object, got {type(rec).__name__}")
            out.append((lineno, rec))
    if not out and not allow_empty:
        raise error(f"{path}: no records")
    return out
