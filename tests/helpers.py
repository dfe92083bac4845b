"""Helpers the end-to-end test modules share: run the ``rlweave`` command in-process, read a run's
metrics."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

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


def other_local_address() -> tuple[str, callable]:
    """A local IPv4 address that is not loopback, and a clean-up: an existing one, else a dummy
    interface made for the test (root only)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout if has_ip_command() else ""
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("127."):
            return addr, lambda: None
    name, addr = f"rlwsec{os.getpid() % 10000}", "10.213.77.1"
    if not has_ip_command() or subprocess.run(["ip", "link", "add", name, "type", "dummy"], capture_output=True).returncode:
        pytest.skip("no non-loopback local address and cannot create a dummy interface (needs root and `ip`)")
    subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    return addr, lambda: subprocess.run(["ip", "link", "del", name], capture_output=True)


def has_ip_command() -> bool:
    return subprocess.run(["sh", "-c", "command -v ip"], capture_output=True).returncode == 0
