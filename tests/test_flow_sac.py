"""Tests for the SAC Flow actor (``flow_sac``, rlweave.models.flow_sac): exact path log-probs,
determinism, gradients through all K steps, the registry's errors, and SAC end to end."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.distributions import Normal, TanhTransform

from helpers import QUIET, read_metrics, train
from rlweave.algorithms import LearnerNets, LossOptions, sac_loss
from rlweave.config import ConfigError
from rlweave.models import QEnsemble, build_policy
from rlweave.models.flow_sac import VELOCITIES
from rlweave.runners.checks import _check_off_policy

OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
# asymmetric bounds: the tanh correction is taken in [-1, 1] units, whatever the Box's scale
ACT = gym.spaces.Box(np.array([-1.0, -2.0, 0.0], np.float32), np.array([1.0, 2.0, 3.0], np.float32))
SMALL = dict(hidden=(32, 32), step_hidden=16, d_model=16, heads=2, layers=2)


def _policy(velocity: str, chunk: int = 1, steps: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return build_policy("flow_sac", OBS, ACT, chunk=chunk, velocity=velocity, steps=steps, **SMALL)


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_path_log_prob_equals_torch_distributions_recomputation(velocity):
    """The log-prob ``sample`` reports is the density of the path it drew: N(x_0; 0, I), then
    each step's Gaussian transition (means and stds recomputed from the stored chain in one pass,
    Flow-T's causal decoder included, not its key/value cache), then the tanh of x_K."""
    p = _policy(velocity, chunk=2)
    obs = torch.randn(9, 5)
    noise = p.sample_noise(9, torch.Generator().manual_seed(1))
    s = p.rollout(obs, noise=noise)
    action, log_prob = p.sample(obs, noise=noise)
    assert torch.equal(action, s.action) and torch.equal(log_prob, s.log_prob)
    K, D = p.steps, p.head_dim
    assert s.chain.shape == (9, K + 1, D) and action.shape == (9, D)
    with torch.no_grad():
        mean, log_std = p.transitions(obs, s.chain)
    ref = Normal(torch.zeros(D), torch.ones(D)).log_prob(s.chain[:, 0]).sum(-1)
    for k in range(K):
        ref = ref + Normal(mean[:, k], log_std[:, k].exp()).log_prob(s.chain[:, k + 1]).sum(-1)
    # the change of variables of y = tanh(x_K), from x_K (inverting a saturated tanh would lose it)
    y = torch.tanh(s.chain[:, -1])
    ref = ref - TanhTransform().log_abs_det_jacobian(s.chain[:, -1], y).sum(-1)
    assert torch.allclose(log_prob, ref, atol=1e-3, rtol=1e-5), (log_prob, ref)
    assert torch.allclose(p.chain_log_prob(obs, s.chain), log_prob, atol=1e-4)
    # the action is tanh(x_K) rescaled to the Box, inside its bounds
    low, high = torch.tensor(np.tile(ACT.low, 2)), torch.tensor(np.tile(ACT.high, 2))
    assert torch.allclose(action, low + (y + 1) * (high - low) / 2, atol=1e-5)
    assert bool(((action >= low) & (action <= high)).all())


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_deterministic_is_deterministic_and_noise_reparameterises(velocity):
    p = _policy(velocity)
    obs = torch.randn(6, 5)
    a1, lp1 = p.sample(obs, deterministic=True)
    torch.manual_seed(123)  # the global RNG plays no part
    a2, lp2 = p.sample(obs, deterministic=True)
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2)
    # deterministic = the zero-noise path, whatever noise is passed
    a3, _ = p.sample(obs, noise=torch.zeros(6, (p.steps + 1) * p.head_dim))
    a4, _ = p.sample(obs, noise=p.sample_noise(6), deterministic=True)
    assert torch.allclose(a1, a3) and torch.equal(a1, a4)
    # a given noise fixes the sample; another noise moves it
    n = p.sample_noise(6, torch.Generator().manual_seed(0))
    assert n.shape == (6, (p.steps + 1) * p.head_dim)
    assert torch.equal(p.sample(obs, noise=n)[0], p.sample(obs, noise=n.clone())[0])
    assert not torch.allclose(p.sample(obs, noise=n)[0], a1)
    # the rollout worker's contract: act -> [B, chunk, *shape], log-prob, zero values; env_action identity
    action, log_prob, value = p.act(obs, noise=n)
    assert action.shape == (6, 1, 3) and log_prob.shape == (6,) and torch.equal(value, torch.zeros(6))
    assert p.env_action(action) is action and not action.requires_grad
    assert p.has_critic is False and p.discrete is False and p.chunk == 1 and p.update_obs_stats(obs) is None


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_sac_actor_loss_reaches_every_parameter_through_all_steps(velocity):
    """SAC's loss (critic part with the actor sampling next actions under no_grad, actor part
    reparameterised through the prepared noise): the actor's gradient is finite and nonzero on
    every parameter, the step embeddings of all K steps and x_0's projection included."""
    p = _policy(velocity)
    critic = QEnsemble(5, p.head_dim, hidden=(32, 32))
    nets = LearnerNets(actor=p, critic=critic, target=QEnsemble(5, p.head_dim, hidden=(32, 32)),
                       log_alpha=torch.nn.Parameter(torch.tensor(math.log(0.2))))
    B = 16
    batch = {"obs": torch.randn(B, 5), "action": torch.rand(B, 3), "reward": torch.randn(B), "next_obs": torch.randn(B, 5),
             "discount": torch.full((B,), 0.99)}
    out = sac_loss(batch, nets, LossOptions(target_entropy=-3.0))
    assert all(torch.isfinite(v).all() for v in out.values())
    (out["loss_actor"] + out["loss_alpha"]).backward()
    for name, param in p.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name  # Flow-G's gate too, though it starts saturated (g ~ 0.993)
    if velocity != "flow_t":
        assert (p.v_step.grad.abs().sum(-1) > 0).all()  # every step's embedding
    else:
        assert (p.step_emb.grad.abs().sum(-1) > 0).all()
    assert nets.log_alpha.grad is not None and all(q.grad is None for q in critic.parameters())


@pytest.mark.parametrize("velocity", VELOCITIES)
def test_bfloat16_autocast_keeps_the_chain_and_log_probs_in_float32(velocity):
    """actor.precision=bfloat16 runs the learner's losses under autocast: the hidden layers take
    bf16 operands, but the chain's states, drifts, stds and log-probs stay float32."""
    p = _policy(velocity)
    obs, noise = torch.randn(8, 5), p.sample_noise(8, torch.Generator().manual_seed(2))
    ref = p.rollout(obs, noise=noise)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = p.rollout(obs, noise=noise)
    assert s.action.dtype == s.log_prob.dtype == s.chain.dtype == torch.float32
    assert torch.allclose(s.action, ref.action, atol=0.05) and torch.allclose(s.log_prob, ref.log_prob, rtol=0.05, atol=0.5)


def test_registry_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^policy 'flow_sac' needs a bounded Box action space, got Discrete\(3\)$"):
        build_policy("flow_sac", OBS, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="policy 'flow_sac' needs a bounded Box action space"):
        build_policy("flow_sac", OBS, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))
    with pytest.raises(ValueError, match="policy 'flow_sac' needs a 1-D Box observation space"):
        build_policy("flow_sac", gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), ACT)
    with pytest.raises(ValueError, match="policy 'flow_sac' has no value head"):
        build_policy("flow_sac", OBS, ACT, critic=True)
    with pytest.raises(ValueError, match=r"velocity must be one of \('flow_g', 'flow_t', 'naive'\), got 'lstm'"):
        build_policy("flow_sac", OBS, ACT, velocity="lstm")
    # the settings every policy.* section carries are taken (and ignored), as run_policy passes them
    p = build_policy("flow_sac", OBS, ACT, hidden=(8,), activation="tanh", normalize_obs=False, log_std_init=0.0,
                     ortho_init=True, state_dependent_std=True, velocity="flow_t", d_model=8, heads=2)
    assert p.velocity == "flow_t"
    # the off-policy runner accepts it, except for IQL (no density of dataset actions)
    cfg = OmegaConf.create({"actor": {"num_workers": 1}, "train": {"max_staleness": 1, "sync_every": 1},
                            "policy": {"name": "flow_sac"}, "algorithm": {"name": "sac", "adam_betas": [0.9, 0.999]}})
    _check_off_policy(cfg)
    cfg.algorithm.name = "iql"
    with pytest.raises(ConfigError, match="policy.name: iql"):
        _check_off_policy(cfg)


def test_sac_flow_trains_end_to_end_with_finite_losses_and_grad_norms(ray_session, tmp_path):
    """The recipe on Pendulum-v1, a few hundred steps: the flow actor goes through the rollout
    worker, weight sync, the learner's helper process (actor.update_threads=2, the base recipe's)
    and evaluation; losses and the actor's gradient norms are reported and finite."""
    run_dir = tmp_path / "run"
    rc, out = train("sac-flow-halfcheetah", "env.id=Pendulum-v1", "policy.hidden=[32,32]", "critic.hidden=[32,32]",
                    "policy.kwargs.step_hidden=16", "algorithm.batch_size=32", "algorithm.learning_starts=100",
                    "train.rollout_steps=50", "train.total_env_steps=300", "train.eval_every=3", "train.eval_episodes=1",
                    "env.num_envs=2", "train.checkpoint_every=0", f"run.dir={run_dir}", *QUIET)
    assert rc == 0, out
    rows = read_metrics(run_dir)
    trained = [r for r in rows if r.get("samples/updates", 0) > 0]
    assert trained and rows[-1]["train/updates"] > 0
    for r in trained:
        for k in ("train/loss_qvalue", "train/loss_actor", "train/loss_alpha", "train/actor_grad_norm",
                  "train/actor_grad_norm_max", "train/critic_grad_norm"):
            assert math.isfinite(r[k]), (k, r)
        assert 0 < r["train/actor_grad_norm"] <= r["train/actor_grad_norm_max"]
    assert math.isfinite(rows[-1]["eval/episode_return"])
