"""The one loader of a trained run's policy (rlweave.models.run_policy), as eval, collect and the
imitation experts use it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlweave.config import load_config
from rlweave.data.experts import ExpertError, load_expert
from rlweave.models import build_policy
from rlweave.models.run_policy import RunPolicyError, load_run_policy, policy_kwargs, read_run_config
from rlweave.utils.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder as a trained sac-pendulum run leaves it: config.yaml and two checkpoints."""
    path = tmp_path_factory.mktemp("sac")
    cfg = load_config("sac-pendulum", [f"run.dir={path}"])
    (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = gym.make(cfg.env.id)
    for it in (2, 4):
        torch.manual_seed(it)
        policy = build_policy(observation_space=env.observation_space, action_space=env.action_space, chunk=1,
                              **policy_kwargs(cfg))
        save_checkpoint(path, it, {"actor": {"policy": policy.state_dict()}})
    return path


def _weights(policy):
    return torch.cat([p.detach().reshape(-1) for p in policy.state_dict().values() if p.dtype.is_floating_point])


def test_latest_or_named_checkpoint(run_dir):
    latest = load_run_policy(run_dir)
    assert latest.checkpoint.name == "iter_00000004" and latest.cfg.algorithm.name == "sac"
    assert not latest.policy.training
    first = load_run_policy(run_dir, "iter_00000002")
    assert first.checkpoint.name == "iter_00000002"
    assert not torch.equal(_weights(first.policy), _weights(latest.policy))
    with pytest.raises(RunPolicyError, match=r"no checkpoint iter_00000009 \(have: iter_00000002, iter_00000004\)"):
        load_run_policy(run_dir, "iter_00000009")


def test_not_a_run_folder_and_a_misfit_env(run_dir, tmp_path):
    with pytest.raises(RunPolicyError, match="no config.yaml"):
        read_run_config(tmp_path)
    with pytest.raises(RunPolicyError, match="no checkpoint to load"):
        (tmp_path / "config.yaml").write_text((run_dir / "config.yaml").read_text())
        load_run_policy(tmp_path)
    wide = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    with pytest.raises(RunPolicyError, match="its policy does not fit this env"):
        load_run_policy(run_dir, observation_space=wide, action_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32))


def test_expert_from_a_run_folder_acts_deterministically(run_dir):
    env = gym.make("Pendulum-v1")
    expert = load_expert(str(run_dir), env.observation_space, env.action_space)
    obs = np.stack([env.observation_space.sample() for _ in range(3)])
    assert expert(obs).shape == (3, 1)
    assert np.array_equal(expert(obs), expert(obs))
    with pytest.raises(ExpertError, match="expert run .*its policy does not fit this env"):
        load_expert(str(run_dir), gym.spaces.Box(-1.0, 1.0, (5,), np.float32), env.action_space)
