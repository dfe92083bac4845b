"""SAC Flow offline-to-online (#27): the flow actor behaviour-cloned by flow matching on its Euler
grid, its fixed observation statistics, the action regulariser of SAC's actor loss, and the recipe
pair bc-flow-sac-push -> sac-flow-push end to end (the off-policy run starts from the BC run's
weights, acts with them from the first step, and keeps the demonstrations in its batches)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

from helpers import QUIET, read_metrics, run_cli, train
from rlweave.algorithms import LearnerNets, LossOptions, sac_loss
from rlweave.algorithms.offpolicy import sac_actor_terms
from rlweave.config import ConfigError
from rlweave.models import QEnsemble, build_policy

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


@pytest.mark.parametrize("velocity", ["flow_g", "flow_t"])
def test_bc_by_flow_matching_makes_the_mean_path_reach_the_demonstrated_actions(velocity):
    torch.manual_seed(0)
    policy = build_policy("flow_sac", OBS, ACT, hidden=(32,), velocity=velocity, steps=4, step_hidden=32, d_model=16, heads=2)
    obs = torch.tensor([[0.5, -0.5, 0.0], [-0.5, 0.5, 0.5]])
    actions = torch.tensor([[1.0, 0.8], [-1.5, 0.2]]).unsqueeze(1)  # [B, chunk, A], inside the Box
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    first = None
    for _ in range(400):
        loss = policy.bc_loss(obs, actions)["loss_flow"]
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first
    with torch.no_grad():
        mean_action, _ = policy.sample(obs, deterministic=True)  # x_0 = 0, no step noise
    assert torch.allclose(mean_action, actions.squeeze(1), atol=0.1), mean_action


def test_fixed_observation_statistics_are_fitted_once_and_travel_with_the_weights():
    policy = build_policy("flow_sac", OBS, ACT, hidden=(8,), normalize_obs=True)
    first = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    policy.update_obs_stats(first)
    mean = policy.obs_rms.mean.clone()
    policy.update_obs_stats(torch.full((5, 3), 100.0))  # replayed or online data never moves them
    assert torch.equal(policy.obs_rms.mean, mean) and torch.allclose(mean, torch.tensor([2.0, 2.0, 2.0], dtype=mean.dtype))
    other = build_policy("flow_sac", OBS, ACT, hidden=(8,), normalize_obs=True)
    other.load_state_dict(policy.state_dict())
    o = torch.randn(4, 3)
    torch.manual_seed(1)
    a, _ = policy.sample(o, deterministic=True)
    b, _ = other.sample(o, deterministic=True)
    assert torch.equal(a, b)
    plain = build_policy("flow_sac", OBS, ACT, hidden=(8,))
    assert plain.obs_rms is None and "obs_rms.mean" not in plain.state_dict()


def test_the_action_regulariser_pulls_only_the_actor_towards_the_batch_actions():
    torch.manual_seed(0)
    policy = build_policy("flow_sac", OBS, ACT, hidden=(8,), step_hidden=8)
    critic = QEnsemble(3, 2, num_q=2, hidden=(8,))
    nets = LearnerNets(actor=policy, critic=critic, target=QEnsemble(3, 2, num_q=2, hidden=(8,)),
                       log_alpha=torch.nn.Parameter(torch.tensor(-2.0)))
    batch = {"obs": torch.randn(6, 3), "action": torch.rand(6, 2), "reward": torch.zeros(6), "next_obs": torch.randn(6, 3),
             "discount": torch.full((6,), 0.99)}
    assert "loss_bc" not in sac_loss(batch, nets, LossOptions())
    batch = sac_loss.prepare(batch, nets)  # the actor's noise, fixed: both calls below see the same action
    plain = sac_actor_terms(batch, nets, LossOptions())
    out = sac_actor_terms(batch, nets, LossOptions(bc_coef=2.5))
    action, _ = policy.sample(batch["obs"], noise=batch["actor_noise"])
    assert out["loss_bc"].item() == pytest.approx(2.5 * (action - batch["action"]).square().mean().item(), rel=1e-5)
    assert out["loss_actor"].item() == pytest.approx(plain["loss_actor"].item())
    out["loss_bc"].backward()
    assert all(p.grad is None for p in critic.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


def test_normalising_off_policy_actor_without_a_bc_start_is_refused_on_one_line(tmp_path):
    from rlweave.config import load_config
    from rlweave.runners.checks import _check_off_policy

    cfg = load_config("sac-flow-push", ["init.sft_recipe=null"])
    with pytest.raises(ConfigError, match=r"^policy.normalize_obs: an off-policy actor normalises by fixed statistics"):
        _check_off_policy(cfg)
    _check_off_policy(load_config("sac-flow-push", ["init.sft_recipe=null", f"init.checkpoint={tmp_path}"]))


# --------------------------------------------------------------------------- the recipes end to end
needs_metaworld = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="metaworld is not installed")
TINY_ENV = ["env.max_episode_steps=24"]
TINY_POLICY = ["policy.hidden=[32,32]", "policy.kwargs.step_hidden=16"]


@needs_metaworld
def test_bc_then_sac_flow_starts_from_the_bc_weights_acts_with_them_and_keeps_the_demonstrations(tmp_path, ray_session):
    from rlweave.models.run_policy import initial_policy_state
    from rlweave.utils.checkpoint import load_checkpoint

    demos, bc, run = tmp_path / "demos", tmp_path / "bc", tmp_path / "sac"
    rc, out = run_cli("collect", "sac-flow-push", *TINY_ENV, "--expert", "rlweave.envs.dsrl:metaworld_push_expert",
                      "--episodes", "2", "-o", str(demos))
    assert rc == 0, out
    rc, out = train("bc-flow-sac-push", f"data.path={demos}", f"run.dir={bc}", *TINY_ENV, *TINY_POLICY, "train.total_updates=4",
                    "train.updates_per_iteration=2", "algorithm.minibatch_size=16", "train.eval_every=2", "train.eval_episodes=1",
                    "cluster.local=true", *QUIET)
    assert rc == 0, out
    rc, out = train("sac-flow-push", f"init.checkpoint={bc}", f"replay.offline_dataset={demos}", f"run.dir={run}", *TINY_ENV,
                    *TINY_POLICY, "critic.hidden=[16,16]", "train.rollout_steps=8", "train.total_env_steps=32",
                    "algorithm.learning_starts=8", "algorithm.batch_size=8", "train.max_staleness=0", "train.eval_every=4",
                    "train.eval_episodes=1", "train.checkpoint_every=1", "train.keep_checkpoints=10", "cluster.num_cpus=2", *QUIET)
    assert rc == 0, out
    assert f"policy starts from {bc} (critics fresh)" in out and "offline dataset" in out
    rows = read_metrics(run)
    assert rows[0]["samples/random_actions"] == 0 and rows[0]["samples/updates"] == 0  # the BC policy acts from step one
    start = load_checkpoint(run / "checkpoints" / "iter_00000001")["actor"]["policy"]
    bc_state = initial_policy_state(bc)
    assert set(start) == set(bc_state) and all(torch.equal(start[k], bc_state[k]) for k in start)  # statistics included
    trained = [r for r in rows if r.get("samples/updates", 0) > 0]
    assert trained and all(np.isfinite(r["train/loss_bc"]) and r["train/loss_bc"] > 0 for r in trained)
    end = load_checkpoint(sorted((run / "checkpoints").glob("iter_*"))[-1])["actor"]["policy"]
    assert torch.equal(end["obs_rms.mean"], bc_state["obs_rms.mean"])  # the fixed statistics never moved
    assert not torch.equal(end["trunk.0.weight"], bc_state["trunk.0.weight"])  # the actor did learn
