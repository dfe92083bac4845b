"""Run outputs: metrics.jsonl (and through it the experiment trackers), a Chrome trace of stage
timings, the progress line."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlweave.utils.trackers import Trackers


class MetricsWriter:
    """Appends one JSON object per logged iteration and hands it to the run's experiment trackers
    (TensorBoard, W&B, MLflow: :mod:`rlweave.utils.trackers`), which outlive this writer across a
    restart after a worker failure.

    Each line is written and flushed whole, so a crash leaves at most a missing last line, never
    a corrupt earlier one.
    """

    def __init__(self, run_dir: Path, trackers: Trackers | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")
        self.trackers = trackers

    def log(self, record: dict) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.log(clean)

    def close(self) -> None:
        """Closes metrics.jsonl; the trackers are closed by whoever made them (the runner)."""
        self._file.close()


def _jsonable(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a crash: ignore it
    return out


def write_text_atomic(path: str | Path, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it over ``path``: a reader
    (or a crash) never sees a half-written file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def truncate_metrics(run_dir: str | Path, last_iteration: int) -> None:
    """Keeps only lines up to ``last_iteration`` (resume rewinds to a checkpoint). Atomic."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return
    keep = [r for r in read_metrics(run_dir) if r.get("iteration", 0) <= last_iteration]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


class Trace:
    """Chrome trace-event file (opens in Perfetto / chrome://tracing): one track per worker group."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "trace.json"
        self.events: list[dict] = []
        self.t0 = time.perf_counter()
        self._tids: dict[str, int] = {}

    def span(self, track: str, name: str, start: float, duration: float, args: dict | None = None) -> None:
        tid = self._tids.setdefault(track, len(self._tids) + 1)
        self.events.append(
            {"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": (start - self.t0) * 1e6, "dur": duration * 1e6, "args": args or {}}
        )

    def write(self) -> None:
        meta = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}} for name, tid in self._tids.items()]
        write_text_atomic(self.path, json.dumps({"traceEvents": meta + self.events[-20000:]}))


class Progress:
    """One live line per run: iteration, env steps (or ``unit``: gradient updates of an offline
    run), their rate, latest return, ETA."""

    def __init__(self, total_steps: int, enabled: bool = True, unit: str = "steps", labels: tuple[str, str] = ("return", "eval")):
        self.total = total_steps
        self.unit = unit
        self.labels = labels  # what the two shown values are: training and evaluation figures
        self.enabled = enabled
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last_print = 0.0

    def update(self, iteration: int, env_steps: int, ret: float | None, eval_ret: float | None = None) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not self.tty and now - self._last_print < 10.0 and env_steps < self.total:
            return  # a log file gets a line every 10 s, not one per iteration
        self._last_print = now
        elapsed = time.perf_counter() - self.start
        rate = env_steps / elapsed if elapsed > 0 else 0.0
        eta = (self.total - env_steps) / rate if rate > 0 else float("nan")
        parts = [f"it {iteration}", f"{self.unit} {env_steps}/{self.total}", f"{rate:,.0f} {self.unit}/s"]
        for label, value in zip(self.labels, (ret, eval_ret)):
            if value is not None:
                parts.append(f"{label} {value:.1f}" if abs(value) >= 10 else f"{label} {value:.3g}")
        parts.append(f"ETA {_fmt_time(eta)}")
        line = " | ".join(parts)
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
