"""algorithm.micro_batch_size: gradient accumulation gives the update a whole minibatch gives."""

from __future__ import annotations

import pytest

from tests.helpers import QUIET, read_metrics, train


def _losses(tmp_path, micro: str) -> list[float]:
    rc, out = train("ppo-cartpole", "train.total_env_steps=1024", "env.num_envs=4", "train.rollout_steps=128",
                    "algorithm.epochs=2", "algorithm.minibatch_size=256", f"algorithm.micro_batch_size={micro}",
                    "train.eval_every=0", "run.deterministic=true", f"run.dir={tmp_path / micro}", *QUIET)
    assert rc == 0, out
    return [v for r in read_metrics(tmp_path / micro) for v in (r["train/loss_policy"], r["train/loss_value"])]


def test_micro_batches_change_memory_not_the_update(ray_session, tmp_path):
    whole = _losses(tmp_path, "null")
    assert _losses(tmp_path, "48") == pytest.approx(whole, rel=1e-4, abs=1e-6)  # 48 does not divide 256: uneven parts
