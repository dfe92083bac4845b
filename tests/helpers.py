"""Helpers the end-to-end test modules share: run the ``rlweave`` command in-process, read a run's
metrics."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from rlweave.cli import main

QUIET = ["run.progress=false", "run.tensorboard=false"]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_cli(*args: str) -> tuple[int, str]:
    """``rlweave ARGS...`` in this process; returns (exit code, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, out.getvalue()


def train(*args: str) -> tuple[int, str]:
    """``rlweave train ...`` in this process; returns (exit code, stdout)."""
    return run_cli("train", *args)
