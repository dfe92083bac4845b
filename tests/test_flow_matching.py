"""Tests for the flow-matching math (rlweave.models.flow_matching) and FlowPolicy (``flow_mlp``).

The chain log-probs are checked against transition densities written out here independently with
torch.distributions.Normal; the flow-SDE drift correction against a Gaussian target whose exact
velocity is known in closed form."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Normal

from rlweave.models import build_policy
from rlweave.models.flow_matching import (
    chain_entropy,
    chain_log_prob,
    chain_stats,
    flow_matching_loss,
    flow_sde_sigmas,
    sample_chain,
)
from rlweave.models.flow_policy import FlowPolicy

B, H, A, K = 5, 3, 2, 6
OBS = gym.spaces.Box(-5.0, 5.0, (7,), np.float32)
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
BOX2D = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class _Vel(nn.Module):
    """A small nonlinear velocity conditioned on per-row features (captured like a closure)."""

    def __init__(self, with_std: bool = False):
        super().__init__()
        self.lin = nn.Linear(H * A + 1, H * A * (2 if with_std else 1)).double()
        self.with_std = with_std
        self.cond = torch.randn(B, H * A, dtype=torch.float64)

    def forward(self, x, t):
        n = x.shape[0]
        cond = self.cond.repeat(n // B, 1)
        out = self.lin(torch.cat([torch.tanh(x.reshape(n, -1) + cond), t.unsqueeze(-1)], -1))
        if not self.with_std:
            return out.view(n, H, A)
        return out[:, :H * A].view(n, H, A), (0.05 + torch.sigmoid(out[:, H * A:])).view(n, H, A)


def _reference_log_prob(vel, chain, sampler, std_of):
    """Independent recomputation: Normal transition densities, one step at a time."""
    steps = chain.shape[1] - 1
    dt = 1.0 / steps
    total = torch.zeros(chain.shape[0], dtype=chain.dtype)
    for k in range(steps):
        x, t = chain[:, k], torch.full((chain.shape[0],), k * dt, dtype=chain.dtype)
        out = vel(x, t)
        v, head = out if isinstance(out, tuple) else (out, None)
        s = head if head is not None else std_of(k, x, t)
        s = torch.as_tensor(s, dtype=x.dtype).expand_as(x)
        if sampler == "flow_noise":
            dist = Normal(x + v * dt, s)
        else:  # flow-SDE: drift v + (s^2 / 2) * score, score = -(x - t v) / (1 - t)
            score = -(x - k * dt * v) / (1.0 - k * dt)
            dist = Normal(x + (v + 0.5 * s ** 2 * score) * dt, s * math.sqrt(dt))
        total = total + dist.log_prob(chain[:, k + 1]).sum((-2, -1))
    return total


_STD_CASES = {
    "float": (0.3, lambda k, x, t: 0.3),
    "per_step": (torch.linspace(0.1, 0.4, K, dtype=torch.float64), lambda k, x, t: 0.1 + 0.3 * k / (K - 1)),
    "per_step_elem": (torch.linspace(0.1, 0.4, K * H * A, dtype=torch.float64).view(K, H, A),
                      lambda k, x, t: torch.linspace(0.1, 0.4, K * H * A, dtype=torch.float64).view(K, H, A)[k]),
    "callable": (lambda x, t: 0.1 + 0.2 * torch.sigmoid(x), lambda k, x, t: 0.1 + 0.2 * torch.sigmoid(x)),
}


@pytest.mark.parametrize("sampler", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("std_case", list(_STD_CASES))
def test_chain_log_prob_matches_independent_normal_densities(sampler, std_case):
    noise_std, std_of = _STD_CASES[std_case]
    vel = _Vel()
    x0 = torch.randn(B, H, A, dtype=torch.float64)
    s = sample_chain(vel, x0, K, sampler, noise_std)
    assert s.chain.shape == (B, K + 1, H, A) and s.step_log_prob.shape == (B, K)
    assert torch.equal(s.chain[:, 0], x0) and torch.equal(s.chain[:, -1], s.actions)
    ref = _reference_log_prob(vel, s.chain, sampler, std_of)
    torch.testing.assert_close(s.log_prob, ref, rtol=0, atol=1e-5)
    for fold in (False, True):
        torch.testing.assert_close(chain_log_prob(vel, s.chain, sampler, noise_std, fold_steps=fold), s.log_prob,
                                   rtol=0, atol=1e-5)
    per = chain_log_prob(vel, s.chain, sampler, noise_std, per_step=True)
    torch.testing.assert_close(per, s.step_log_prob, rtol=0, atol=1e-8)


def test_velocity_with_noise_head_and_default_sde_schedule():
    vel = _Vel(with_std=True)
    x0 = torch.randn(B, H, A, dtype=torch.float64)
    s = sample_chain(vel, x0, K, "flow_noise")
    torch.testing.assert_close(s.log_prob, _reference_log_prob(vel, s.chain, "flow_noise", None), rtol=0, atol=1e-5)
    torch.testing.assert_close(chain_log_prob(vel, s.chain, "flow_noise", fold_steps=True), s.log_prob, rtol=0, atol=1e-5)
    # flow_sde with no noise_std: πRL's schedule at level 0.5
    vel = _Vel()
    s = sample_chain(vel, x0, K, "flow_sde")
    sig = flow_sde_sigmas(K, 0.5, torch.float64)
    ref = _reference_log_prob(vel, s.chain, "flow_sde", lambda k, x, t: sig[k])
    torch.testing.assert_close(s.log_prob, ref, rtol=0, atol=1e-5)
    assert torch.isfinite(sig).all() and sig[0] == pytest.approx(0.5 * math.sqrt(K))


def test_ode_is_deterministic_and_plain_euler():
    vel = _Vel()
    x0 = torch.randn(B, H, A, dtype=torch.float64)
    a, b = sample_chain(vel, x0, K, "ode"), sample_chain(vel, x0, K, "ode")
    assert torch.equal(a.chain, b.chain)
    assert torch.equal(a.log_prob, torch.zeros(B, dtype=torch.float64))
    x = x0
    for k in range(K):
        x = x + vel(x, torch.full((B,), k / K, dtype=torch.float64)) / K
    torch.testing.assert_close(a.actions, x, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="no log-density"):
        chain_log_prob(vel, a.chain, "ode")


def test_step_noise_and_generator_fix_the_sample():
    vel = _Vel()
    x0 = torch.randn(B, H, A, dtype=torch.float64)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(sample_chain(vel, x0, K, "flow_sde", generator=g1).chain,
                       sample_chain(vel, x0, K, "flow_sde", generator=g2).chain)
    eps = torch.randn(B, K, H, A, dtype=torch.float64)
    assert torch.equal(sample_chain(vel, x0, K, "flow_noise", 0.2, step_noise=eps).chain,
                       sample_chain(vel, x0, K, "flow_noise", 0.2, step_noise=eps).chain)


def test_gradients_flow_through_chain_log_prob():
    vel = _Vel()
    log_std = nn.Parameter(torch.full((K, H, A), -1.5, dtype=torch.float64))
    x0 = torch.randn(B, H, A, dtype=torch.float64)
    with torch.no_grad():
        s = sample_chain(vel, x0, K, "flow_noise", log_std.exp())
    stats = chain_stats(vel, s.chain, "flow_noise", log_std.exp(), fold_steps=True)
    (stats.log_prob.sum() + stats.entropy.sum()).backward()
    assert vel.lin.weight.grad is not None and vel.lin.weight.grad.abs().sum() > 0
    assert log_std.grad is not None and log_std.grad.abs().sum() > 0
    # entropy: sum of the transitions' Gaussian entropies
    expected = (log_std.detach() + 0.5 * math.log(2 * math.pi * math.e)).sum()
    torch.testing.assert_close(chain_entropy(vel, s.chain, "flow_noise", log_std.exp()),
                               expected.expand(B), rtol=0, atol=1e-9)


def _gaussian_target_velocity(mu: float, sd: float):
    """Exact velocity E[x_1 - x_0 | x_t] for data N(mu, sd^2), noise N(0, 1), x_t = (1-t) x_0 + t x_1."""
    def vel(x, t):
        tb = t.view(-1, 1, 1)
        var = (1 - tb) ** 2 + tb ** 2 * sd * sd
        return mu + (tb * sd * sd - (1 - tb)) / var * (x - tb * mu)
    return vel


def test_flow_sde_keeps_the_ode_marginal_flow_noise_does_not():
    mu, sd, steps = 1.5, 0.5, 50
    vel = _gaussian_target_velocity(mu, sd)
    x0 = torch.randn(20000, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    sde = sample_chain(vel, x0, steps, "flow_sde", 0.8, generator=gen).actions
    assert abs(sde.mean().item() - mu) < 0.02 and abs(sde.std().item() - sd) < 0.02
    # the same noise without the score correction widens the action distribution
    noisy = sample_chain(vel, x0, steps, "flow_noise", 0.8 / math.sqrt(steps), generator=gen).actions
    assert noisy.std().item() > 0.7


def test_flow_matching_loss_options():
    vel = _Vel()
    acts = torch.randn(B, H, A, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for ts in ("uniform", "beta"):
        loss = flow_matching_loss(vel, acts, generator=g, time_sampling=ts)
        assert loss.dim() == 0 and torch.isfinite(loss)
    per_row = flow_matching_loss(vel, acts, time_sampling="beta", reduction="none")
    assert per_row.shape == (B,)
    # with the exact target the loss is the regression's irreducible part: x_t alone fixes x_1 - x_0 at t=0
    noise = torch.randn(B, H, A, dtype=torch.float64)
    loss_fn = flow_matching_loss(lambda x, t: acts - noise, acts, noise=noise)
    assert loss_fn.item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="time_sampling"):
        flow_matching_loss(vel, acts, time_sampling="lognormal")


def test_bc_lands_ode_samples_on_both_modes():
    """Behaviour cloning on a 1-D bimodal target (actions +-1): the ODE from random x_0 must land
    near the modes, not on their mean (which a Gaussian regression would predict). About 2 s on
    one CPU thread; a Gaussian N(0, 1) would put only a quarter of its samples this near."""
    torch.manual_seed(0)
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    p = FlowPolicy(1, space, hidden=(64, 64), steps=10, critic=False)
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    obs = torch.zeros(256, 1)
    for _ in range(400):
        acts = (torch.randint(0, 2, (256, 1, 1)) * 2 - 1).float() + 0.05 * torch.randn(256, 1, 1)
        loss = p.bc_loss(obs, acts)["loss_flow"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    noise = p.sample_noise(1000, torch.Generator().manual_seed(5))
    a, lp, _ = p.act(torch.zeros(1000, 1), deterministic=True, noise=noise)
    a = p.env_action(a).flatten()
    near = (a.abs() - 1).abs() < 0.25
    assert near.float().mean() > 0.8, a[:20]
    assert 0.3 < (a > 0).float().mean() < 0.7
    assert torch.equal(lp, torch.zeros(1000))


@pytest.mark.parametrize("space", [BOX, BOX2D], ids=["box", "box2d"])
@pytest.mark.parametrize("kw", [{}, {"sampler": "flow_noise"}, {"sampler": "flow_noise", "noise_net": True},
                                {"normalize_obs": True, "critic": False}],
                         ids=["sde", "noise_param", "noise_net", "norm_nocritic"])
def test_policy_act_evaluate_contract(space, kw):
    chunk, steps, n = 3, 4, 6
    p = build_policy("flow_mlp", OBS, space, chunk=chunk, steps=steps, hidden=(32, 32), **kw)
    if p.obs_rms is not None:
        p.update_obs_stats(torch.randn(50, 7) * 3 + 1)
    obs = torch.randn(n, 7)
    shape = tuple(space.shape)
    noise = p.sample_noise(n, torch.Generator().manual_seed(0))
    assert noise.shape == (n, (steps + 1) * chunk * int(np.prod(shape))) and noise.shape[1] == p.action_dim_stored
    stored, lp, v = p.act(obs, noise=noise)
    assert stored.shape == (n, steps + 1, chunk, *shape) == (n, *p.stored_action_shape)
    assert lp.shape == (n,) and v.shape == (n,) and torch.isfinite(lp).all()
    executed = p.env_action(stored)
    assert executed.shape == (n, chunk, *shape) and torch.equal(p.env_action(executed), executed)
    flat = stored.reshape(n, -1)  # any layout with the right size per row, numpy too
    assert torch.equal(p.env_action(flat), executed)
    assert np.array_equal(p.env_action(flat.numpy()), executed.numpy())
    again, lp2, _ = p.act(obs, noise=noise)  # the noise fixes the sample
    assert torch.equal(again, stored) and torch.equal(lp2, lp)
    lp_e, ent, v_e = p.evaluate(obs, stored)
    torch.testing.assert_close(lp_e, lp, rtol=1e-5, atol=1e-4)
    assert ent.shape == (n,) and v_e.shape == (n,)
    torch.testing.assert_close(v_e, v)
    if not p.has_critic:
        assert torch.equal(v, torch.zeros(n)) and not any("critic" in k for k in p.state_dict())
    lp_e.sum().backward()  # gradients reach the velocity field
    assert p.in_x.weight.grad.abs().sum() > 0
    # deterministic: ODE from x_0 = 0 (or noise's first block); log-prob 0
    d1, dlp, _ = p.act(obs, deterministic=True)
    d2, _, _ = p.act(obs, deterministic=True)
    assert torch.equal(d1, d2) and torch.equal(d1[:, 0], torch.zeros_like(d1[:, 0])) and torch.equal(dlp, torch.zeros(n))
    dn, _, _ = p.act(obs, deterministic=True, noise=noise)
    assert torch.equal(dn[:, 0], stored[:, 0])
    torch.testing.assert_close(p.distribution_params(obs), p.env_action(d1))
    with pytest.raises(ValueError, match="stored chain"):
        p.evaluate(obs, executed)
    p.store_chain = False
    assert p.act(obs, noise=noise)[0].shape == (n, chunk, *shape)


def test_step_ratio_reports_one_log_prob_per_denoising_step():
    """``ratio: step`` (DPPO's denoising MDP): act and evaluate give [B, K] per-step log-probs that
    sum to the chain's, and PPO takes one clipped ratio per step with the row's advantage."""
    from omegaconf import OmegaConf

    from rlweave.algorithms.contracts import OnPolicyLossInput
    from rlweave.algorithms.losses import ppo_objective, ppo_policy_loss

    chunk, steps, n = 2, 4, 5
    chain_p = build_policy("flow_mlp", OBS, BOX, chunk=chunk, steps=steps, hidden=(32, 32))
    step_p = build_policy("flow_mlp", OBS, BOX, chunk=chunk, steps=steps, hidden=(32, 32), ratio="step")
    step_p.load_state_dict(chain_p.state_dict())
    obs, noise = torch.randn(n, 7), chain_p.sample_noise(n, torch.Generator().manual_seed(3))
    stored, lp_chain, _ = chain_p.act(obs, noise=noise)
    stored2, lp_steps, _ = step_p.act(obs, noise=noise)
    assert torch.equal(stored, stored2) and lp_steps.shape == (n, steps)
    torch.testing.assert_close(lp_steps.sum(-1), lp_chain, rtol=1e-5, atol=1e-4)
    new_lp, ent, _ = step_p.evaluate(obs, stored)
    assert new_lp.shape == (n, steps) and ent.shape == (n,)
    torch.testing.assert_close(new_lp, lp_steps, rtol=1e-5, atol=1e-4)
    # the registry's PPO objective: each step's ratio against the row's advantage
    adv = torch.randn(n)
    old = lp_steps + 0.3 * torch.randn(n, steps)  # ratios away from 1, some clipped
    cfg = OmegaConf.create({"vf_coef": 0.5, "ent_coef": 0.0})
    terms = ppo_objective(OnPolicyLossInput(log_prob=new_lp, old_log_prob=old, advantages=adv, entropy=None,
                                            values=None, old_values=None, returns=None, obs=obs, action=stored,
                                            clip_eps=0.2, cfg=cfg))
    by_hand = ppo_policy_loss(new_lp, old, adv[:, None].expand(n, steps), clip_eps=0.2)
    for k in ("loss_policy", "clip_fraction", "approx_kl"):
        torch.testing.assert_close(terms[k], by_hand[k])
    with pytest.raises(ValueError, match="ratio must be one of"):
        build_policy("flow_mlp", OBS, BOX, ratio="token")


def test_policy_state_dict_round_trip():
    kw = dict(chunk=2, steps=5, hidden=(32, 32), sampler="flow_noise", normalize_obs=True)
    p = build_policy("flow_mlp", OBS, BOX, **kw)
    p.update_obs_stats(torch.randn(40, 7) * 2)
    with torch.no_grad():
        p.noise_log_std.add_(torch.randn_like(p.noise_log_std) * 0.1)
    q = build_policy("flow_mlp", OBS, BOX, **kw)
    q.load_state_dict(p.state_dict())
    obs, noise = torch.randn(4, 7), p.sample_noise(4, torch.Generator().manual_seed(1))
    for x, y in zip(p.act(obs, noise=noise), q.act(obs, noise=noise)):
        assert torch.equal(x, y)
    assert "log_std" not in p.state_dict() and "noise_log_std" in p.state_dict()
    assert not any(k.startswith(("time_freqs", "sde_sigmas")) for k in p.state_dict())


def test_registry_spaces_and_config_kwargs():
    with pytest.raises(ValueError, match="policy 'flow_mlp' needs a Box action space, got Discrete"):
        build_policy("flow_mlp", OBS, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="policy 'flow_mlp' needs a 1-D Box observation space"):
        build_policy("flow_mlp", gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), BOX)
    # every policy.* setting a config carries reaches a user-registered builder
    p = build_policy("flow_mlp", OBS, BOX, hidden=(16,), activation="tanh", normalize_obs=False, log_std_init=0.0,
                     ortho_init=True, state_dependent_std=True, critic=True, chunk=2)
    assert isinstance(p, FlowPolicy) and p.has_critic and p.act(torch.randn(2, 7))[0].shape == (2, 11, 2, 2)
    with pytest.raises(ValueError, match="sampler"):
        build_policy("flow_mlp", OBS, BOX, sampler="ode")


@pytest.mark.parametrize("ratio", ["chain", "step"])
def test_ppo_trains_a_flow_policy_through_the_runner(ray_session, tmp_path, ratio):
    """The on-policy workers carry the stored chain (learner) and the executed chunk (env) apart;
    with ``ratio: step`` the per-step log-probs travel as [T, N, K] to the actor's batch."""
    from tests.helpers import QUIET, read_metrics, train

    rc, out = train(
        "ppo-halfcheetah", "env.id=Pendulum-v1", "policy.name=flow_mlp", "policy.kwargs.steps=3", f"policy.kwargs.ratio={ratio}",
        "policy.kwargs.hidden=[32,32]", "env.chunk=2", "env.num_envs=2", "train.rollout_steps=16",
        "train.total_env_steps=128", "algorithm.epochs=1", "train.eval_every=2", "train.eval_episodes=1",
        f"run.dir={tmp_path / 'run'}", *QUIET,
    )
    assert rc == 0, out
    # the recipe's actor.update_threads=2 needs a critic apart from the actor: a flow policy's update runs in one process
    assert "actor.update_threads=2: policy 'flow_mlp' has no critic apart from its actor, so its update runs in one process" in out
    rows = read_metrics(tmp_path / "run")
    assert rows[-1]["env_steps"] == 128
    assert all(math.isfinite(r["train/approx_kl"]) for r in rows if "train/approx_kl" in r)
