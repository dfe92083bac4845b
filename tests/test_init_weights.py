"""init.checkpoint on the on-policy runner: the policy starts from another run's weights, and keeps
the observation statistics it was trained with unless init.obs_stats=update."""

from __future__ import annotations

import torch

from tests.helpers import QUIET, train
from rlweave.utils.checkpoint import load_checkpoint

_RUN = ["train.total_env_steps=512", "env.num_envs=4", "train.rollout_steps=128", "algorithm.epochs=1",
        "algorithm.minibatch_size=256", "train.eval_every=0", "policy.normalize_obs=true"]


def _stats(run_dir) -> dict[str, torch.Tensor]:
    ckpt = sorted((run_dir / "checkpoints").iterdir())[-1]
    return {k: v for k, v in load_checkpoint(ckpt)["actor"]["policy"].items() if k.startswith("obs_rms.")}


def test_a_policy_started_from_a_run_keeps_its_observation_statistics_unless_asked(ray_session, tmp_path):
    base = tmp_path / "base"
    rc, out = train("ppo-cartpole", *_RUN, f"run.dir={base}", *QUIET)
    assert rc == 0, out
    before = _stats(base)
    assert before["obs_rms.count"].item() == 512  # the base run folded its own 512 observations in

    rc, out = train("ppo-cartpole", *_RUN, f"init.checkpoint={base}", f"run.dir={tmp_path / 'keep'}", *QUIET)
    assert rc == 0, out
    kept = _stats(tmp_path / "keep")
    assert all(torch.equal(kept[k], before[k]) for k in before)  # the function it was trained as

    rc, out = train("ppo-cartpole", *_RUN, f"init.checkpoint={base}", "init.obs_stats=update", f"run.dir={tmp_path / 'update'}", *QUIET)
    assert rc == 0, out
    assert _stats(tmp_path / "update")["obs_rms.count"].item() == 1024
