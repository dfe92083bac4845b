"""Checkpoints: one folder per checkpoint, written to a temporary folder and renamed into place, so
a crash while writing never leaves a partial checkpoint under a real name."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^iter_(\d{8})$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, iteration: int, parts: dict[str, Any], keep: int = 3) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:08d}"
    tmp = root / f".tmp-iter_{iteration:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, obj in parts.items():
        with open(tmp / f"{name}.pt", "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    if final.exists():  # re-saving the same iteration (e.g. after a resume): replace it whole
        old = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    for stale in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return {p.stem: torch.load(p, map_location="cpu", weights_only=False) for p in sorted(path.glob("*.pt"))}
