"""Checkpoints: atomic writes with a verified manifest, fallback past damaged ones, retention."""

from __future__ import annotations

import json

import pytest
import torch

from rlweave.utils.checkpoint import (
    CheckpointError,
    checkpoint_score,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def _save(run_dir, it, keep=10, score=None, keep_best=False):
    return save_checkpoint(run_dir, it, {"actor": {"w": torch.full((64,), float(it))}, "runner": {"iteration": it}},
                           keep=keep, score=score, keep_best=keep_best)


def test_manifest_names_every_file_with_size_and_hash(tmp_path):
    path = _save(tmp_path, 3, score=-1.5)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["iteration"] == 3 and manifest["score"] == -1.5
    assert sorted(manifest["files"]) == ["actor.pt", "runner.pt"]
    assert manifest["files"]["actor.pt"]["size"] == (path / "actor.pt").stat().st_size
    assert verify_checkpoint(path) is True
    assert load_checkpoint(path)["runner"] == {"iteration": 3}
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    data = (newest / "actor.pt").read_bytes()
    (newest / "actor.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"iter_00000002: actor.pt has \d+ bytes, the manifest says \d+"):
        verify_checkpoint(newest)
    skipped = []
    assert latest_checkpoint(tmp_path, on_skip=lambda p, why: skipped.append((p.name, why))).name == "iter_00000001"
    assert [name for name, _ in skipped] == ["iter_00000002"]
    with pytest.raises(CheckpointError):
        load_checkpoint(newest)


def test_same_size_corruption_and_missing_parts_are_detected(tmp_path):
    path = _save(tmp_path, 1)
    data = bytearray((path / "runner.pt").read_bytes())
    data[-5] ^= 0xFF
    (path / "runner.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="runner.pt does not match its SHA-256"):
        verify_checkpoint(path)
    other = _save(tmp_path, 2)
    (other / "actor.pt").unlink()
    with pytest.raises(CheckpointError, match="actor.pt is missing"):
        verify_checkpoint(other)
    assert latest_checkpoint(tmp_path) is None
    empty = tmp_path / "checkpoints" / "iter_00000003"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no parts and no manifest.json"):
        verify_checkpoint(empty)


def test_checkpoints_from_before_manifests_are_accepted_unverified(tmp_path):
    path = _save(tmp_path, 5)
    (path / "manifest.json").unlink()  # as an older rlweave wrote them
    assert verify_checkpoint(path) is False
    assert latest_checkpoint(tmp_path) == path
    assert load_checkpoint(path)["runner"] == {"iteration": 5}


def test_retention_keeps_the_newest_and_optionally_the_best(tmp_path):
    scores = {1: -300.0, 2: -120.0, 3: None, 4: -250.0, 5: -200.0}
    for it, s in scores.items():
        _save(tmp_path / "a", it, keep=2, score=s)
        _save(tmp_path / "b", it, keep=2, score=s, keep_best=True)
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["iter_00000004", "iter_00000005"]
    kept = list_checkpoints(tmp_path / "b")
    assert [p.name for p in kept] == ["iter_00000002", "iter_00000004", "iter_00000005"]
    assert checkpoint_score(kept[0]) == -120.0


def test_resaving_an_iteration_replaces_it_whole(tmp_path):
    _save(tmp_path, 4)
    path = save_checkpoint(tmp_path, 4, {"runner": {"iteration": 4, "again": True}})
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "runner.pt"]
    assert load_checkpoint(path)["runner"]["again"] is True
