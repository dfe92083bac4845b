"""A flow-based actor for SAC (SAC Flow, Zhang et al. 2025): registry name ``flow_sac``.

The actor turns noise into an action with K Euler steps, and SAC trains it end to end: the actor
loss backpropagates through all K steps, and the entropy term needs the action's log-density.
Two things make that work.

**A noise-augmented rollout, so the log-density is exact.** Each step is a Gaussian transition,
``x_{k+1} = x_k + dt v_k + std * eps_k`` with ``dt = 1/K``, the drift ``v_k`` from the velocity
network and ``std`` from a state-dependent head. The chain ``x_0 -> x_K`` (x_0 ~ N(0, I)) then has
the closed-form density ``N(x_0; 0, I) prod_k N(x_{k+1}; x_k + dt v_k, std^2)``, and the action is
``tanh(x_K)`` rescaled to the Box, with the usual change-of-variables correction. The log-prob is
that of the whole path (x_0 included, as the paper does), not of the action's marginal, which has
no closed form; since ``H(path) >= H(x_K)`` its negative over-states the action's entropy, so SAC's
temperature sees a path entropy (``target_entropy`` keeps its meaning per action dimension only
approximately; tune it if exploration looks off).

**One std for all K steps** (per state and action dimension). With a std per step the path
entropy can be bought for nothing: a large noise at an early step, which later steps contract
away, adds its full log-std to the path's entropy without spreading the action (seen on
Pendulum, one action dimension: the path entropy climbed to ~12 nats within a few hundred
updates, against a target of -1, and alpha decayed without bringing it down). With one
std the path entropy only grows with the noise of the last step too, as the action's does. As in
:class:`~rlweave.models.offpolicy.SquashedGaussianPolicy`, log-probs are of the squashed action in
[-1, 1], whatever the Box's bounds. Everything is reparameterised through ``noise`` (x_0 and the K
step draws), so gradients reach every parameter through the sampled action and its log-prob.

**A velocity that keeps gradients stable through K steps.** An Euler rollout is a residual RNN
(``x_{k+1} = x_k + f(x_k)``), and backpropagating through it can blow up or vanish like one.
``velocity=``:

* ``"flow_g"`` (Flow-G): a GRU-style gate. ``v = g * (c - x)`` with gate ``g = sigmoid(.)`` and
  candidate ``c``, both from ``(obs features, x_k, step k)``, so a step is the convex blend
  ``x_{k+1} = (1 - dt g) x_k + dt g c`` (plus noise): along the direct path the state's Jacobian
  is ``1 - dt g``, inside (1 - dt, 1), so it neither grows nor vanishes over K steps, and the
  learned parts enter through a bounded gate. The gate's output layer starts at weight 0 and bias
  ``gate_bias`` (g ~ 1).
* ``"flow_t"`` (Flow-T): a small pre-LayerNorm transformer decoder over the sequence
  ``[obs token, step 0, ..., step K-1]``, causally masked: step k's token (its state x_k and a
  learned step embedding) attends to the observation token and to the earlier steps, and its
  output gives the drift. Sampling runs it incrementally with a key/value cache (the
  next token needs the previous step's output); :meth:`transitions` runs the same network over a
  stored chain in one causal pass. (The authors' reference code masks each step to itself plus the
  observation; attending to earlier steps, as here, keeps every transition Gaussian given the path
  so far, so the density stays exact.)
* ``"naive"``: a plain MLP velocity (the unstable baseline the paper starts from; for ablations).

Noise layout (``sample_noise``): ``[batch, (K + 1) * chunk * act_dim]`` standard normal, read as
``[batch, K + 1, chunk * act_dim]``: x_0, then one draw per step. ``deterministic=True`` uses zero
noise throughout (x_0 = 0, the mean path); its log-prob is the path density at that point.

Observations are normalised only by fixed statistics (``normalize_obs=True``): fitted once, on the
first data :meth:`update_obs_stats` sees (behaviour cloning's demonstrations, :mod:`policy_sft`), and
carried by the weights into an off-policy run (``init.checkpoint``), which never moves them: a
running normaliser would drift under replayed data, and the critics, which see raw observations,
would then value inputs the actor reads differently from one update to the next. Fine positions
(MetaWorld's object and goal differ by centimetres between starts) need them: BC of a flow policy
on push demonstrations reached 0/20 held-out successes unnormalised and 20/20 normalised.

**Behaviour cloning** (:meth:`bc_loss`, the offline half of SAC Flow's offline-to-online
recipe): the velocity is fitted by flow matching in the pre-tanh space, on the K Euler grid
``t_k = k/K``: along the straight path from x_0 to ``atanh`` of the demonstrated action, every
step's drift regresses the path's velocity (one causal pass over the path for Flow-T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .normalizer import RunningMeanStd
from .policies import _activation, _mlp_body

__all__ = ["FlowSACPolicy", "FlowChain", "VELOCITIES"]

VELOCITIES = ("flow_g", "flow_t", "naive")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG2 = math.log(2.0)
BC_EDGE = 0.999  # demonstrated actions are cloned inside [-BC_EDGE, BC_EDGE] of the Box (atanh 3.8)


@dataclass
class FlowChain:
    """A sampled rollout. ``chain[:, 0]`` is x_0 and ``chain[:, -1]`` the pre-tanh action x_K."""

    action: Tensor  # [B, head_dim], env units
    log_prob: Tensor  # [B]: path density (x_0, K transitions) with the tanh correction
    chain: Tensor  # [B, K + 1, head_dim]


def _head(layer: nn.Linear, h: Tensor) -> Tensor:
    """An output layer in float32 even under autocast (``actor.precision=bfloat16``): drifts and
    log-stds feed the recurrence, exp and the log-probs."""
    if torch.is_autocast_enabled(h.device.type):
        with torch.autocast(h.device.type, enabled=False):
            return F.linear(h.float(), layer.weight, layer.bias)
    return F.linear(h, layer.weight, layer.bias)


def _tanh_log_det(u: Tensor) -> Tensor:
    """sum log(1 - tanh(u)^2) over the last axis, as 2 (log 2 - u - softplus(-2u)) (stable)."""
    return (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1)


class _DecoderBlock(nn.Module):
    """Pre-LayerNorm transformer block with causal self-attention, run on a whole sequence or one
    token at a time against a key/value cache (incremental decoding)."""

    def __init__(self, d_model: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
        self.heads = int(heads)
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: Tensor, cache: list[Tensor] | None = None) -> Tensor:
        """``x`` [B, n, d]. ``cache=None``: the whole sequence, causally masked. A list: the keys
        and values of the earlier tokens (empty at first), which this call extends with those of
        ``x``; every cached token precedes ``x``, so no mask is needed."""
        B, n, d = x.shape
        q, k, v = (t.view(B, n, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        if cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1)
        else:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
            a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(B, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class FlowSACPolicy(nn.Module):
    """Flow actor for the off-policy learner: same contract as
    :class:`~rlweave.models.offpolicy.SquashedGaussianPolicy` (``sample``, ``sample_noise``,
    ``act``, ``env_action``, ``update_obs_stats``, ``chunk``, ``head_dim``).

    ``hidden``/``activation``: the observation trunk (computed once per decision, shared by all
    steps). ``steps``: K. ``velocity``: ``"flow_g"``, ``"flow_t"`` or ``"naive"`` (module
    docstring). ``step_hidden``: width of Flow-G's gate and candidate layers (and the naive
    velocity's). ``d_model``, ``heads``, ``layers``: Flow-T's decoder. ``log_std_bounds``: the
    steps' log-std is squashed into this range by a tanh (smooth, no dead clamp).
    """

    has_critic = False
    discrete = False

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.spaces.Box,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        chunk: int = 1,
        velocity: str = "flow_g",
        steps: int = 4,
        step_hidden: int = 128,
        velocity_activation: str = "silu",
        gate_bias: float = 5.0,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        log_std_bounds: tuple[float, float] = (-5.0, 2.0),
        normalize_obs: bool = False,
    ):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"needs a Box action space, got {action_space}")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ValueError(f"needs a bounded Box action space (tanh squashing), got {action_space}")
        if velocity not in VELOCITIES:
            raise ValueError(f"velocity must be one of {VELOCITIES}, got {velocity!r}")
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps!r}")
        lo, hi = (float(b) for b in log_std_bounds)
        if not lo < hi:
            raise ValueError(f"log_std_bounds must be (low, high) with low < high, got {log_std_bounds}")
        self.log_std_min, self.log_std_max = lo, hi
        self.chunk = int(chunk)
        self.action_shape = tuple(int(s) for s in action_space.shape)
        self.act_dim = int(np.prod(self.action_shape, dtype=np.int64))
        self.head_dim = D = self.chunk * self.act_dim
        self.velocity, self.steps = velocity, int(steps)
        self.dt = 1.0 / self.steps
        hidden = tuple(int(h) for h in hidden)
        self.obs_rms = RunningMeanStd((int(obs_dim),)) if normalize_obs else None
        self.trunk = _mlp_body(int(obs_dim), hidden, _activation(activation), ortho=False)
        feat = hidden[-1] if hidden else int(obs_dim)
        K = self.steps
        if velocity == "flow_t":
            self.obs_token = nn.Linear(feat, d_model)
            self.x_in = nn.Linear(D, d_model)
            self.step_emb = nn.Parameter(0.02 * torch.randn(K, d_model))
            self.blocks = nn.ModuleList([_DecoderBlock(d_model, heads) for _ in range(int(layers))])
            self.ln_out = nn.LayerNorm(d_model)
            self.out = nn.Linear(d_model, D)  # the drift
            with torch.no_grad():  # LayerNorm'd tokens have unit scale: start with small drifts
                self.out.weight.mul_(0.1)
                self.out.bias.zero_()
        else:
            act = _activation(velocity_activation)
            self.v_act = {nn.SiLU: F.silu, nn.ReLU: F.relu, nn.Tanh: torch.tanh, nn.GELU: F.gelu, nn.ELU: F.elu}.get(act)
            if self.v_act is None:
                raise ValueError(f"velocity_activation {velocity_activation!r} is not supported")
            # the first layer, split: obs features (once per decision) + state x_k + step k
            n_hidden = (2 if velocity == "flow_g" else 1) * int(step_hidden)
            self.v_obs = nn.Linear(feat, n_hidden)
            self.v_x = nn.Linear(D, n_hidden, bias=False)
            self.v_step = nn.Parameter(torch.zeros(K, n_hidden))
            self.cand = nn.Linear(int(step_hidden), D)
            if velocity == "flow_g":
                self.gate = nn.Linear(int(step_hidden), D)
                with torch.no_grad():  # g ~ sigmoid(gate_bias) everywhere at the start
                    self.gate.weight.zero_()
                    self.gate.bias.fill_(float(gate_bias))
        self.log_std_head = nn.Linear(feat, D)  # one std per dimension for all K steps, from the state
        low = np.tile(np.asarray(action_space.low, dtype=np.float32).reshape(-1), self.chunk)
        high = np.tile(np.asarray(action_space.high, dtype=np.float32).reshape(-1), self.chunk)
        self.register_buffer("action_scale", torch.from_numpy((high - low) / 2.0))
        self.register_buffer("action_bias", torch.from_numpy((high + low) / 2.0))

    # ---- the velocity networks ------------------------------------------------------------------
    def _log_std(self, raw: Tensor) -> Tensor:
        return self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw) + 1.0)

    def _features(self, obs: Tensor) -> Tensor:
        obs = obs.to(self.action_scale.dtype)
        return self.trunk(self.obs_rms.normalize(obs) if self.obs_rms is not None else obs)

    def _mlp_drift(self, h_obs: Tensor, x: Tensor, step_bias: Tensor) -> Tensor:
        """Flow-G's (or the naive) drift at states ``x`` [..., D]; ``h_obs`` and ``step_bias``
        broadcast against ``x``'s leading axes (one step, or all K of a stored chain)."""
        h = self.v_act(h_obs + F.linear(x.to(h_obs.dtype), self.v_x.weight) + step_bias)
        if self.velocity == "naive":
            return _head(self.cand, h)
        hg, hc = h.chunk(2, dim=-1)
        g = torch.sigmoid(_head(self.gate, hg))
        return g * (_head(self.cand, hc) - x)

    def _decode(self, h: Tensor) -> Tensor:
        """Flow-T's output tokens [..., d] -> drifts [..., D]."""
        return _head(self.out, self.ln_out(h))

    # ---- sampling -------------------------------------------------------------------------------
    def rollout(self, obs: Tensor, noise: Tensor | None = None, deterministic: bool = False) -> FlowChain:
        """K noisy Euler steps from x_0, keeping the chain; differentiable in the parameters.
        ``noise``: rows of :meth:`sample_noise` (default: drawn here); ignored when
        ``deterministic`` (zero noise)."""
        f = self._features(obs)
        B, K, D = f.shape[0], self.steps, self.head_dim
        dtype = self.action_scale.dtype
        if deterministic:
            eps = f.new_zeros(B, K + 1, D, dtype=dtype)
        elif noise is None:
            eps = torch.randn(B, K + 1, D, device=f.device, dtype=dtype)
        else:
            eps = noise.to(device=f.device, dtype=dtype).view(B, K + 1, D)
        x = eps[:, 0]
        states = [x]
        log_std = self._log_std(_head(self.log_std_head, f))
        std = log_std.exp()
        if self.velocity == "flow_t":
            caches: list[list[Tensor]] = [[] for _ in self.blocks]
            h = self.obs_token(f).unsqueeze(1)
            for blk, cache in zip(self.blocks, caches):  # the observation token's keys and values
                h = blk(h, cache)
            for k in range(K):
                h = (self.x_in(x.to(f.dtype)) + self.step_emb[k]).unsqueeze(1)
                for blk, cache in zip(self.blocks, caches):
                    h = blk(h, cache)
                x = x + self.dt * self._decode(h[:, 0]) + std * eps[:, k + 1]
                states.append(x)
        else:
            h_obs = F.linear(f, self.v_obs.weight, self.v_obs.bias)
            for k in range(K):
                x = x + self.dt * self._mlp_drift(h_obs, x, self.v_step[k]) + std * eps[:, k + 1]
                states.append(x)
        # x_{k+1} - mean_k = std eps_k, so each transition's density needs only eps and the log-std
        log_prob = (-0.5 * eps.square()).flatten(1).sum(-1) - K * log_std.sum(-1)
        log_prob = log_prob - (K + 1) * D * _HALF_LOG_2PI - _tanh_log_det(x)
        action = torch.tanh(x) * self.action_scale + self.action_bias
        return FlowChain(action=action, log_prob=log_prob, chain=torch.stack(states, 1))

    def transitions(self, obs: Tensor, chain: Tensor) -> tuple[Tensor, Tensor]:
        """Means and log-stds [B, K, D] of the K transitions of a stored ``chain`` [B, K + 1, D]
        under the current weights, all steps at once (Flow-T: one causal pass over the sequence).
        The same numbers :meth:`rollout` used, by another route (tested)."""
        f = self._features(obs)
        B, K, D = f.shape[0], self.steps, self.head_dim
        xs = chain[:, :K].to(self.action_scale.dtype)
        if self.velocity == "flow_t":
            seq = torch.cat([self.obs_token(f).unsqueeze(1), self.x_in(xs.to(f.dtype)) + self.step_emb], dim=1)
            for blk in self.blocks:
                seq = blk(seq)
            v = self._decode(seq[:, 1:])
        else:
            h_obs = F.linear(f, self.v_obs.weight, self.v_obs.bias).unsqueeze(1)
            v = self._mlp_drift(h_obs, xs, self.v_step)
        log_std = self._log_std(_head(self.log_std_head, f)).unsqueeze(1).expand(B, K, D)
        return xs + self.dt * v, log_std

    def chain_log_prob(self, obs: Tensor, chain: Tensor) -> Tensor:
        """Log-density [B] of a stored pre-tanh ``chain`` [B, K + 1, D] (x_0's prior, the K
        transitions, the tanh correction at x_K), with gradients; what :meth:`sample` reports
        for the chain it drew."""
        mean, log_std = self.transitions(obs, chain)
        z = (chain[:, 1:] - mean) * torch.exp(-log_std)
        x0, xK = chain[:, 0], chain[:, -1]
        lp = -0.5 * x0.square().sum(-1) + (-0.5 * z.square() - log_std).flatten(1).sum(-1)
        return lp - (self.steps + 1) * self.head_dim * _HALF_LOG_2PI - _tanh_log_det(xK)

    def sample(self, obs: Tensor, noise: Tensor | None = None, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Action in the env's bounds [B, head_dim] and its log-prob [B] (the path's, of the squashed
        action in [-1, 1]); differentiable with respect to the parameters."""
        s = self.rollout(obs, noise=noise, deterministic=deterministic)
        return s.action, s.log_prob

    # ---- the policy contract (rollout worker, evaluation) ---------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Standard normal [batch, (K + 1) * head_dim]: x_0, then one draw per step."""
        return torch.randn(batch, (self.steps + 1) * self.head_dim, generator=generator)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        action, log_prob = self.sample(obs, noise=noise, deterministic=deterministic)
        B = action.shape[0]
        return action.view(B, self.chunk, *self.action_shape), log_prob, action.new_zeros(B)

    def env_action(self, stored: Tensor) -> Tensor:
        """The executed action: the stored one (only the final action is stored; the learner
        resamples chains, it never re-scores stored ones)."""
        return stored

    def update_obs_stats(self, obs: Tensor) -> None:
        """Fits the fixed statistics (``normalize_obs``) on the first data given, once; later calls
        change nothing (module docstring)."""
        if self.obs_rms is not None and float(self.obs_rms.count) == 0:
            self.obs_rms.update(obs)

    # ---- behaviour cloning ----------------------------------------------------------------------
    def bc_loss(self, obs: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Flow matching of demonstrated actions [B, chunk, *action_shape] on the Euler grid
        (``loss_flow``): the chain ``x_k = (1 - k/K) x_0 + (k/K) z`` from noise x_0 to the
        demonstration's pre-tanh ``z`` is scored by :meth:`transitions`, and each step's drift
        regresses ``z - x_0``. Actions at the Box's bounds are pulled inside by ``BC_EDGE`` (atanh
        of +-1 is infinite)."""
        dtype = self.action_scale.dtype
        B, K = obs.shape[0], self.steps
        u = ((actions.reshape(B, self.head_dim).to(dtype) - self.action_bias) / self.action_scale).clamp(-BC_EDGE, BC_EDGE)
        z = torch.atanh(u)
        x0 = torch.randn(z.shape, generator=generator, device=z.device if generator is None else generator.device).to(z)
        t = torch.arange(K + 1, device=z.device, dtype=dtype).view(1, K + 1, 1) / K
        chain = (1.0 - t) * x0.unsqueeze(1) + t * z.unsqueeze(1)
        mean, _ = self.transitions(obs, chain)
        drift = (mean - chain[:, :K]) / self.dt
        return {"loss_flow": (drift - (z - x0).unsqueeze(1)).square().mean()}
