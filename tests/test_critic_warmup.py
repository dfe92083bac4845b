"""algorithm.critic_warmup_iterations: the critic learns first, the policy's weights do not move."""

from __future__ import annotations

import torch

from tests.helpers import QUIET, read_metrics, train
from rlweave.utils.checkpoint import load_checkpoint

_RUN = ["train.total_env_steps=1536", "env.num_envs=4", "train.rollout_steps=128", "algorithm.epochs=2",
        "algorithm.minibatch_size=128", "train.eval_every=0", "train.checkpoint_every=1", "train.keep_checkpoints=5",
        "run.deterministic=true"]


def _policy(run_dir, iteration: int) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / f"iter_{iteration:08d}")["actor"]["policy"]


def test_warm_up_trains_the_critic_alone_then_both(ray_session, tmp_path):
    rc, out = train("ppo-cartpole", *_RUN, "algorithm.critic_warmup_iterations=2", f"run.dir={tmp_path}", *QUIET)
    assert rc == 0, out
    flags = [r["train/critic_warmup"] for r in read_metrics(tmp_path)]
    assert flags == [1.0, 1.0, 0.0]
    w1, w2, w3 = (_policy(tmp_path, i) for i in (1, 2, 3))
    actor = [k for k in w1 if k.startswith(("actor_", "log_std"))]
    critic = [k for k in w1 if k.startswith("critic_")]
    assert actor and critic
    assert all(torch.equal(w1[k], w2[k]) for k in actor)  # warm-up: the policy stays as it was
    assert any(not torch.equal(w1[k], w2[k]) for k in critic)  # the critic learns
    assert any(not torch.equal(w2[k], w3[k]) for k in actor)  # then the policy trains too


def test_warm_up_of_a_critic_free_algorithm_is_refused_on_one_line_before_start(tmp_path, capsys):
    rc, _ = train("ppo-cartpole", *_RUN, "algorithm.name=grpo", "algorithm.group_size=4", "algorithm.critic_warmup_iterations=2",
                  f"run.dir={tmp_path}", *QUIET)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "algorithm.critic_warmup_iterations: grpo trains no critic" in err[0]
    assert not (tmp_path / "metrics.jsonl").exists()
