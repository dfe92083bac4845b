"""RECAP (rlweave.algorithms.recap, policy recap_flow_mlp): returns, advantages and the indicator
on a toy dataset; the conditioned flow policy acts as "good"; the loss refuses an unconditioned
policy; and mixed-quality data -> recap-push trains end to end on Ray."""

from __future__ import annotations

import importlib.util
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from helpers import QUIET, read_metrics, train
from rlweave.algorithms import get_algorithm
from rlweave.algorithms.contracts import PolicySFTLossInput
from rlweave.algorithms.recap import (advantage_targets, indicator_of, prepare_demonstrations, recap_loss,
                                      returns_to_go)
from rlweave.algorithms.registry import algorithm_loss
from rlweave.data.demos import Demonstrations
from rlweave.models import build_policy
from rlweave.models.flow_matching import sample_chain

# two episodes: a success after 3 steps (reward 1 on its last step), a failure of 2 steps
REWARDS = np.array([0, 0, 1, 0, 0], dtype=np.float32)
EPISODE = np.array([0, 0, 0, 1, 1])


def test_returns_are_discounted_to_each_episodes_end():
    g = returns_to_go(REWARDS, EPISODE, 0.5)
    np.testing.assert_allclose(g, [0.25, 0.5, 1.0, 0.0, 0.0])


def test_n_step_targets_bootstrap_inside_the_episode_only():
    values = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    np.testing.assert_allclose(advantage_targets(REWARDS, EPISODE, values, 0.5, n_step=0), [0.25, 0.5, 1.0, 0.0, 0.0])
    # N=1: r_t + gamma V(s_{t+1}) inside an episode; the last row of an episode keeps its MC return
    np.testing.assert_allclose(advantage_targets(REWARDS, EPISODE, values, 0.5, n_step=1), [0.1, 0.15, 1.0, 0.25, 0.0])


def test_the_indicator_marks_the_top_share_of_advantages():
    adv = np.array([-1.0, 0.5, 2.0, 0.1, 3.0, -0.2, 0.0, 1.0, -3.0, 0.2])
    ind, eps = indicator_of(adv, 0.3)
    assert ind.tolist() == [0, 0, 1, 0, 1, 0, 0, 1, 0, 0] and 0.5 <= eps < 1.0
    assert indicator_of(adv, 1.0)[0].all()


def test_prepare_labels_the_better_episodes_good():
    """Uninformative states (V = the mean return): the rows whose returns beat the mean are the
    good ones, whatever episode they are in; every row gets an indicator."""
    n_ep, length = 6, 5
    rewards = np.zeros(n_ep * length, dtype=np.float32)
    rewards[length - 1::length][:2] = 1.0  # the first two episodes succeed at their last step
    demos = Demonstrations(obs=np.zeros((n_ep * length, 3), np.float32), actions=np.zeros((n_ep * length, 1, 2), np.float32),
                           episode=np.repeat(np.arange(n_ep), length), episodes=n_ep, success_rate=None, rewards=rewards)
    info = prepare_demonstrations(demos, {"gamma": 0.9, "recap": {"value_updates": 200, "value_hidden": [8], "value_folds": 1,
                                                                  "positive_fraction": 0.3}}, seed=0)
    ind = demos.columns["indicator"]
    assert ind.shape == (n_ep * length,) and ind.dtype == np.int64
    assert ind[:2 * length].sum() >= 8 and ind[2 * length:].sum() == 0  # 9 of the 10 successful rows are in the top 30%
    assert abs(info["recap/good_share"] - ind.mean()) < 1e-9 and "recap/threshold" in info


def _policy(seed: int = 0):
    torch.manual_seed(seed)
    obs = gym.spaces.Box(-1, 1, (5,), np.float32)
    act = gym.spaces.Box(-1, 1, (2,), np.float32)
    return build_policy("recap_flow_mlp", obs, act, chunk=2, steps=3, hidden=(16, 16), critic=False).eval()


def test_the_conditioned_policy_acts_as_good():
    policy = _policy()
    with torch.no_grad():  # make the indicator matter (it starts at zero: an untrained conditioning changes nothing)
        policy.in_obs.weight[:, -3:].normal_()
    obs = torch.randn(4, 5)
    acted = policy.env_action(policy.act(obs, deterministic=True)[0])
    x0 = torch.zeros(4, 2, 2)
    for ind, same in ((1, True), (0, False), (2, False)):
        got = sample_chain(policy.velocity_fn(policy._prep(obs), torch.full((4,), ind)), x0, policy.steps, "ode").actions
        assert torch.allclose(got.view_as(acted), acted) == same, ind


def test_untrained_conditioning_leaves_the_flow_policy_unchanged():
    torch.manual_seed(0)
    plain = build_policy("flow_mlp", gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32),
                         chunk=2, steps=3, hidden=(16, 16), critic=False).eval()
    obs = torch.randn(3, 5)
    a = plain.act(obs, deterministic=True)[0]
    b = _policy(0).act(obs, deterministic=True)[0]
    assert torch.allclose(a, b)


def test_the_loss_conditions_on_the_indicator_and_refuses_an_unconditioned_policy():
    loss = algorithm_loss(get_algorithm("recap"), "policy_sft")
    assert loss is recap_loss and get_algorithm("recap").runners == ("policy_sft",)
    policy = _policy()
    obs, actions = torch.randn(8, 5), torch.rand(8, 2, 2) * 2 - 1
    ind = torch.tensor([0, 1] * 4)
    terms = loss(PolicySFTLossInput(policy, obs, actions, None, {"recap": {}}, extras={"indicator": ind}))
    assert terms["loss_flow"].requires_grad and float(terms["good_share"]) == 0.5
    terms["loss_flow"].backward()
    assert policy.in_obs.weight.grad[:, -3:-1].abs().sum() > 0  # the indicator's columns learn
    torch.manual_seed(0)
    plain = build_policy("flow_mlp", gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32),
                         chunk=2, steps=3, hidden=(16, 16), critic=False)
    with pytest.raises(TypeError, match="recap_flow_mlp"):
        loss(PolicySFTLossInput(plain, obs, actions, None, {}, extras={"indicator": ind}))
    with pytest.raises(RuntimeError, match="indicator"):
        loss(PolicySFTLossInput(policy, obs, actions, None, {}))


needs_metaworld = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="metaworld is not installed")
TINY_ENV = ["env.max_episode_steps=24"]
TINY = ["train.total_updates=4", "train.updates_per_iteration=2", "algorithm.minibatch_size=16", "train.eval_every=2",
        "train.eval_episodes=1", "policy.hidden=[32,32]", "policy.kwargs.steps=2", "algorithm.recap.value_updates=20",
        "algorithm.recap.value_hidden=[16]", "algorithm.recap.value_folds=2", "algorithm.recap.indicator_dropout=0.2",
        "cluster.num_cpus=2"]


@needs_metaworld
def test_mixed_data_then_recap_push_trains_end_to_end(tmp_path, ray_session, capsys):
    from rlweave.data.mixed_quality import main as collect_mixed

    data = tmp_path / "mixed"
    rc = collect_mixed(["recap-push", *TINY_ENV, "-o", str(data), "--part", "expert:2", "--part", "noisy=0.5:1",
                        "--part", "wrong_goal=0.15:2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    info = json.loads(out.strip().splitlines()[-1])
    assert info["episodes"] == 5 and set(info["success_by_source"]) == {"expert", "noisy=0.5", "wrong_goal=0.15"}
    assert len(json.loads((data / "sources.json").read_text())) == 5
    rc, out = train("recap-push", f"data.path={data}", f"run.dir={tmp_path / 'run'}", *TINY_ENV, *TINY, *QUIET)
    assert rc == 0, out
    assert "recap/good_share" in out and "recap/threshold" in out
    rows = read_metrics(tmp_path / "run")
    assert any("train/good_share" in r for r in rows) and any("eval/success_rate" in r for r in rows)
    assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)
