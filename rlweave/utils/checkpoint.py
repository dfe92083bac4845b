"""Checkpoints: atomic, verified, with a retention policy.

A checkpoint is one folder ``checkpoints/iter_XXXXXXXX`` with one ``torch.save`` file per part
(``actor.pt``, ``replay.pt``, ``runner.pt``, ...) and a ``manifest.json`` naming every file with
its size and SHA-256. It is written under a temporary name, every file fsynced, the manifest
written last, and renamed into place: a crash while writing never leaves a partial checkpoint
under a real name. Reading verifies the manifest first, so a checkpoint damaged afterwards (a
truncated file, a disk that filled, a copy that stopped half-way) is detected, and
:func:`latest_checkpoint` falls back to the newest one that verifies, saying why it skipped the
others.

Retention keeps the newest ``keep`` checkpoints and, with ``keep_best``, also the one with the
highest score (the run's evaluation return at that iteration).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = [
    "CheckpointError",
    "MANIFEST",
    "checkpoint_dir",
    "file_sha256",
    "save_checkpoint",
    "list_checkpoints",
    "verify_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "checkpoint_score",
]

_NAME = re.compile(r"^iter_(\d{8})$")
MANIFEST = "manifest.json"
_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names its folder and what is wrong."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 4 MB blocks (checkpoint manifests, a run's data fingerprints)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, iteration: int, parts: dict[str, Any], keep: int = 3,
                    score: float | None = None, keep_best: bool = False) -> Path:
    """Writes ``parts`` (name -> object) as the checkpoint of ``iteration`` and applies the
    retention policy. Re-saving an iteration that exists replaces it whole."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:08d}"
    tmp = root / f".tmp-iter_{iteration:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    files = {}
    for name, obj in parts.items():
        path = tmp / f"{name}.pt"
        with open(path, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        files[path.name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = {"format": _FORMAT, "iteration": int(iteration), "score": None if score is None else float(score), "files": files}
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        old = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    _retain(run_dir, keep, keep_best)
    return final


def _retain(run_dir: str | Path, keep: int, keep_best: bool) -> None:
    ckpts = list_checkpoints(run_dir)
    if keep <= 0 or len(ckpts) <= keep:
        return
    kept = set(ckpts[-keep:])
    if keep_best:
        scored = [(s, p) for p in ckpts if (s := checkpoint_score(p)) is not None]
        if scored:
            kept.add(max(scored, key=lambda sp: (sp[0], _iteration_of(sp[1])))[1])
    for stale in ckpts:
        if stale not in kept:
            shutil.rmtree(stale, ignore_errors=True)


def _iteration_of(path: Path) -> int:
    return int(_NAME.match(path.name).group(1))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Every checkpoint folder under ``run_dir`` (verified or not), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=_iteration_of)


def _manifest(path: Path) -> dict | None:
    """The manifest, or None for a checkpoint written before manifests existed (a folder under a
    final name is complete by construction, so a missing manifest means an older writer)."""
    try:
        return json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({e})") from None


def verify_checkpoint(path: str | Path) -> bool:
    """True when every file matches the manifest; False for a checkpoint without a manifest
    (an older rlweave's: accepted, unverified). Raises :class:`CheckpointError` naming the first
    file whose presence, size or SHA-256 differs from the manifest."""
    path = Path(path)
    manifest = _manifest(path)
    if manifest is None:
        if not any(path.glob("*.pt")):
            raise CheckpointError(f"checkpoint {path}: no parts and no {MANIFEST}")
        return False
    files = manifest.get("files", {})
    if not files:
        raise CheckpointError(f"checkpoint {path}: the manifest lists no files")
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        size = f.stat().st_size
        if size != meta["size"]:
            raise CheckpointError(f"checkpoint {path}: {name} has {size} bytes, the manifest says {meta['size']}")
        if file_sha256(f) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its SHA-256 in the manifest")
    return True


def checkpoint_score(path: str | Path) -> float | None:
    """The score recorded with a checkpoint (None if none, or if the manifest is unreadable)."""
    try:
        return (_manifest(Path(path)) or {}).get("score")
    except CheckpointError:
        return None


def latest_checkpoint(run_dir: str | Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest checkpoint that verifies; ``on_skip(path, reason)`` hears of each newer one
    that does not. None when there is none."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            if on_skip is not None:
                on_skip(path, str(e))
            continue
        return path
    return None


def load_checkpoint(path: str | Path, verify: bool = True) -> dict[str, Any]:
    """Every part of the checkpoint at ``path`` (name -> object), verified against its manifest
    first unless ``verify=False``."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    return {p.stem: torch.load(p, map_location="cpu", weights_only=False) for p in sorted(path.glob("*.pt"))}
