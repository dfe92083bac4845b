"""A state-based flow-matching policy (registry name ``flow_mlp``): an MLP velocity field over
action chunks, conditioned on a 1-D observation, with a separate value MLP for PPO.

Actions come from K Euler steps from Gaussian noise (:mod:`rlweave.models.flow_matching`). For
on-policy RL the sampler is made stochastic (πRL's ``flow_sde`` or ``flow_noise``), and the
log-probability PPO needs is that of the whole denoising chain, which needs every intermediate
state, not only the final action.

**Where the chain lives (the choice made here).** ``act`` returns, as its ``action``, the *stored
action*: the chain ``[B, K + 1, chunk, *action_shape]`` (x_0 first, the executed action last), and
``env_action(stored) -> [B, chunk, *action_shape]`` gives the action to execute. ``evaluate(obs,
stored)`` recomputes the chain's log-prob under the current weights. Why this option:

* the actor and the trajectory buffers need no change: the env worker sizes its ``action`` buffer
  from the reply's shape, the actor reshapes ``[T, N, ...] -> [T * N, ...]`` and hands the rows to
  ``evaluate`` unchanged, so the chain reaches the loss as an opaque per-row tensor;
* the alternatives are worse: recomputing the chain in the actor from the stored seed needs an
  extra K-step pass before every update and bit-identical inference across devices (rollout on one
  GPU, actor on another), or the ratio at the first epoch is not exactly 1; storing only the
  executed action makes the chain's density intractable;
* the one place the executed action must be extracted is where it is handed to an env (rollout
  reply, evaluation, serving), and there ``policy.env_action`` is identity for every other policy.

``store_chain=False`` makes ``act`` return the executed action instead (serving, demonstrations,
evaluation loops that do not call ``env_action``); ``evaluate`` then cannot be used on its output.
``env_action`` accepts either form, so it is safe to call twice. ``deterministic=True`` runs the
ODE from x_0 = 0 (or from the first block of a given ``noise``, the x_0 a stochastic call with the
same noise would use) and reports log-prob 0 (the ODE chain has no density).

Noise layout (``sample_noise``): ``[batch, (K + 1) * chunk * act_dim]`` standard normal, read as
``[batch, K + 1, chunk, act_dim]``: x_0, then one draw per step. Actions are in env units, not
squashed; the env layer clips to the Box (keep BC targets in a range of order one).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flow_matching import TIME_SAMPLING, chain_stats, flow_matching_loss, flow_sde_sigmas, sample_chain
from .normalizer import RunningMeanStd
from .policies import _FUNCTIONAL, Policy, _activation, _init_layer, _mlp_body

__all__ = ["FlowPolicy"]

_STOCHASTIC = ("flow_sde", "flow_noise")
_RATIOS = ("chain", "step")


class FlowPolicy(Policy):
    """Flow-matching actor (MLP velocity with a sinusoidal time embedding) and MLP critic.

    The velocity's first layer is split into an observation part (computed once per decision and
    reused by all K steps), a noisy-action part and a time part, so a K-step ``act`` costs one
    observation projection plus K small MLP passes.

    ``sampler``: ``"flow_sde"`` (fixed πRL schedule of level ``noise_level``) or ``"flow_noise"``
    (learned noise: one log-std per step and action element initialised at ``noise_std``, or, with
    ``noise_net=True``, a state-dependent std head on the velocity trunk, bounded to
    ``noise_std_bounds``). ``steps``: K Euler steps. ``time_sampling``: the BC loss's t
    distribution (``"uniform"`` or π0's ``"beta"``). ``ratio``: what ``act`` and ``evaluate`` report
    as the log-prob, so what PPO takes its ratio of: ``"chain"`` (the whole denoising chain's [B],
    πRL's) or ``"step"`` (one per denoising step [B, K], each step a decision of the denoising MDP
    sharing the chunk's advantage, as DPPO: a ratio of one Gaussian transition moves less than
    that of K of them, so fewer rows are clipped away).
    """

    def __init__(self, obs_dim: int, action_space: gym.spaces.Space, hidden: Sequence[int] = (256, 256),
                 activation: str = "silu", chunk: int = 1, critic: bool = True, normalize_obs: bool = False,
                 steps: int = 10, sampler: str = "flow_sde", noise_level: float = 0.5, noise_std: float = 0.1,
                 noise_net: bool = False, noise_std_bounds: tuple[float, float] = (0.02, 0.5),
                 time_dim: int = 32, critic_hidden: Sequence[int] | None = None, ortho_init: bool = True,
                 time_sampling: str = "uniform", store_chain: bool = True, ratio: str = "chain"):
        if not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"FlowPolicy needs a Box action space, got {action_space}")
        super().__init__(action_space, chunk=chunk, critic=critic)
        self.log_std = None  # the base class's Gaussian parameter: the flow has its own noise
        if sampler not in _STOCHASTIC:
            raise ValueError(f"sampler must be one of {_STOCHASTIC} (deterministic=True uses the ODE), got {sampler!r}")
        if time_sampling not in TIME_SAMPLING:
            raise ValueError(f"time_sampling must be one of {TIME_SAMPLING}, got {time_sampling!r}")
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps!r}")
        if ratio not in _RATIOS:
            raise ValueError(f"ratio must be one of {_RATIOS}, got {ratio!r}")
        if noise_net and sampler != "flow_noise":
            raise ValueError("noise_net=True needs sampler='flow_noise'")
        hidden = tuple(int(h) for h in hidden)
        if not hidden:
            raise ValueError("FlowPolicy needs at least one hidden layer")
        self.obs_dim = int(obs_dim)
        self.steps = int(steps)
        self.sampler = sampler
        self.time_sampling = time_sampling
        self.store_chain = bool(store_chain)
        self.ratio = ratio
        self.noise_net = bool(noise_net)
        self.stored_action_shape = (self.steps + 1, self.chunk, *self.action_shape)
        self.action_dim_stored = (self.steps + 1) * self.head_dim
        act_cls = _activation(activation)
        # exact type match, as MLPPolicy: a subclass or parametrised activation goes through modules
        self._act_fn = _FUNCTIONAL.get(act_cls) if isinstance(activation, str) else None
        self.vel_act = act_cls()  # after the split first layer
        self.obs_rms = RunningMeanStd((self.obs_dim,)) if normalize_obs else None

        # velocity field: [obs | x_t | emb(t)] -> hidden -> v (and a raw noise head)
        half = max(1, int(time_dim) // 2)
        # angular frequencies 1..1000 (geometric): t in [0, 1] is resolved from coarse to fine
        self.register_buffer("time_freqs", torch.exp(torch.linspace(0.0, math.log(1000.0), half)), persistent=False)
        self.in_obs = nn.Linear(self.obs_dim, hidden[0])
        self.in_x = nn.Linear(self.head_dim, hidden[0], bias=False)
        self.in_t = nn.Linear(2 * half, hidden[0], bias=False)
        self.vel_body = _mlp_body(hidden[0], hidden[1:], act_cls, ortho=False)
        self.vel_head = nn.Linear(hidden[-1], self.head_dim * (2 if self.noise_net else 1))
        if self.noise_net:
            lo, hi = (math.log(float(b)) for b in noise_std_bounds)
            if not lo < math.log(noise_std) < hi:
                raise ValueError(f"noise_std {noise_std} must lie inside noise_std_bounds {noise_std_bounds}")
            self.noise_log_bounds = (lo, hi)
            frac = (math.log(noise_std) - lo) / (hi - lo)
            with torch.no_grad():  # the std head starts at noise_std everywhere
                self.vel_head.weight[self.head_dim:].zero_()
                self.vel_head.bias[self.head_dim:].fill_(math.log(frac / (1.0 - frac)))
        self.noise_log_std = (nn.Parameter(torch.full((self.steps, self.head_dim), math.log(noise_std)))
                              if sampler == "flow_noise" and not self.noise_net else None)
        self.register_buffer("sde_sigmas", flow_sde_sigmas(self.steps, float(noise_level)), persistent=False)

        if self.has_critic:
            ch = tuple(int(h) for h in (critic_hidden if critic_hidden is not None else hidden))
            self.critic_body = _mlp_body(self.obs_dim, ch, act_cls, ortho_init)
            self.critic_head = _init_layer(nn.Linear(ch[-1] if ch else self.obs_dim, 1), 1.0, ortho_init)

    # ---- building blocks ----------------------------------------------------------------------
    def _prep(self, obs: Tensor) -> Tensor:
        dtype = self.in_obs.weight.dtype
        obs = obs.to(dtype) if obs.dtype != dtype else obs
        return self.obs_rms.normalize(obs) if self.obs_rms is not None else obs

    def _run(self, body: nn.Sequential, x: Tensor) -> Tensor:
        fn = self._act_fn
        if fn is None or body._forward_hooks or body._forward_pre_hooks:
            return body(x)
        for i, m in enumerate(body._modules.values()):  # skip Module.__call__ on the K-step hot path
            x = F.linear(x, m.weight, m.bias) if i % 2 == 0 else fn(x)
        return x

    def velocity_fn(self, obs_n: Tensor) -> Callable[[Tensor, Tensor], Tensor | tuple[Tensor, Tensor]]:
        """The velocity closure over normalised observations [B, obs_dim] (conditioning computed
        once). It accepts [n * B, chunk, act_dim] (steps folded, step-major) as well as B rows,
        and returns ``(v, std)`` when the noise head is on."""
        B = obs_n.shape[0]
        h_obs = F.linear(obs_n, self.in_obs.weight, self.in_obs.bias)
        shape = (self.chunk, self.act_dim)
        act = self._act_fn if self._act_fn is not None else self.vel_act

        def velocity(x: Tensor, t: Tensor):
            n = x.shape[0]
            if n % B:
                raise ValueError(f"velocity: {n} rows is not a multiple of the {B} observations")
            ho = h_obs if n == B else h_obs.repeat(n // B, 1)
            ang = t.to(ho.dtype).unsqueeze(-1) * self.time_freqs
            emb = torch.cat([ang.sin(), ang.cos()], dim=-1)
            h = ho + F.linear(x.reshape(n, -1).to(ho.dtype), self.in_x.weight) + F.linear(emb, self.in_t.weight)
            h = self._run(self.vel_body, act(h))
            out = F.linear(h, self.vel_head.weight, self.vel_head.bias)
            if not self.noise_net:
                return out.view(n, *shape)
            lo, hi = self.noise_log_bounds
            log_std = lo + (hi - lo) * torch.sigmoid(out[:, self.head_dim:])
            return out[:, :self.head_dim].view(n, *shape), log_std.exp().view(n, *shape)

        return velocity

    def _noise_std(self):
        if self.sampler == "flow_sde":
            return self.sde_sigmas
        if self.noise_net:
            return None  # the velocity returns it
        return self.noise_log_std.exp().view(self.steps, self.chunk, self.act_dim)

    def _value(self, obs: Tensor) -> Tensor:
        return self._critic(self._prep(obs))

    def _critic(self, obs_n: Tensor) -> Tensor:
        h = self._run(self.critic_body, obs_n)
        return F.linear(h, self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    # ---- contract -----------------------------------------------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Standard normal [batch, (K + 1) * head_dim]: x_0 then one draw per denoising step."""
        return torch.randn(batch, self.action_dim_stored, generator=generator)

    def env_action(self, stored: Tensor) -> Tensor:
        """The executed action [B, chunk, *action_shape] of a stored action (the chain's last
        state). Takes the chain in any layout with the right size per row (flattened included),
        torch or numpy; an executed action is returned as it is (reshaped)."""
        B, per_row = stored.shape[0], math.prod(stored.shape[1:])
        if per_row == self.head_dim:
            return stored.reshape(B, self.chunk, *self.action_shape)
        return stored.reshape(B, *self.stored_action_shape)[:, -1]

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(stored action, log-prob of the chain given x_0 [B], value [B]); the stored action is
        the chain [B, K + 1, chunk, *action_shape] (or the executed action with
        ``store_chain=False``). ``noise``: rows of :meth:`sample_noise`."""
        obs_n = self._prep(obs)
        B = obs_n.shape[0]
        dtype = obs_n.dtype
        eps = None
        if noise is not None:
            eps = noise.to(device=obs_n.device, dtype=dtype).view(B, self.steps + 1, self.chunk, self.act_dim)
        elif not deterministic:
            eps = torch.randn(B, self.steps + 1, self.chunk, self.act_dim, device=obs_n.device, dtype=dtype)
        x0 = eps[:, 0] if eps is not None else obs_n.new_zeros(B, self.chunk, self.act_dim)
        velocity = self.velocity_fn(obs_n)
        if deterministic:
            s = sample_chain(velocity, x0, self.steps, "ode")
        else:
            s = sample_chain(velocity, x0, self.steps, self.sampler, self._noise_std(), step_noise=eps[:, 1:])
        value = self._critic(obs_n) if self.has_critic else obs_n.new_zeros(B)
        log_prob = s.log_prob if self.ratio == "chain" else s.step_log_prob
        if self.store_chain:
            return s.chain.view(B, *self.stored_action_shape), log_prob, value
        return s.actions.view(B, self.chunk, *self.action_shape), log_prob, value

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-prob [B] of the stored chains ``action`` under the current weights (one folded
        velocity call for all K steps), the chain entropy proxy [B] and values [B]."""
        B = obs.shape[0]
        if action.dim() == 2 + len(self.action_shape) or action[0].numel() != self.action_dim_stored:
            raise ValueError(f"FlowPolicy.evaluate needs the stored chain [B, {self.steps + 1}, {self.chunk}, "
                             f"*{self.action_shape}] that act returned, got shape {tuple(action.shape)}")
        obs_n = self._prep(obs)
        chain = action.to(obs_n.dtype).reshape(B, self.steps + 1, self.chunk, self.act_dim)
        stats = chain_stats(self.velocity_fn(obs_n), chain, self.sampler, self._noise_std(), fold_steps=True)
        value = self._critic(obs_n) if self.has_critic else obs_n.new_zeros(B)
        return (stats.log_prob if self.ratio == "chain" else stats.step_log_prob), stats.entropy, value

    def distribution_params(self, obs: Tensor) -> Tensor:
        """The deterministic action (ODE from x_0 = 0) [B, chunk, *action_shape]: the flow has no
        closed-form distribution parameters."""
        obs_n = self._prep(obs)
        x0 = obs_n.new_zeros(obs_n.shape[0], self.chunk, self.act_dim)
        s = sample_chain(self.velocity_fn(obs_n), x0, self.steps, "ode")
        return s.actions.view(-1, self.chunk, *self.action_shape)

    def bc_loss(self, obs: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Behaviour cloning: the flow-matching loss of demonstration chunks ``actions``
        [B, chunk, *action_shape] (``loss_flow``)."""
        obs_n = self._prep(obs)
        target = actions.to(obs_n.dtype).reshape(obs_n.shape[0], self.chunk, self.act_dim)
        loss = flow_matching_loss(self.velocity_fn(obs_n), target, generator=generator, time_sampling=self.time_sampling)
        return {"loss_flow": loss}

