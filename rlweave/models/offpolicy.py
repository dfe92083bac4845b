"""Models of the off-policy actor-critic algorithms (SAC, CrossQ, RLPD, IQL).

* :class:`SquashedGaussianPolicy`: the actor. A Gaussian with state-dependent standard deviation,
  squashed by ``tanh`` and rescaled to the env's Box. It follows the policy contract of
  :mod:`rlweave.models.policies` (``act`` / ``sample_noise``), so the rollout worker, the evaluator
  and weight sync treat it like any other policy; the learner uses :meth:`sample`, which keeps the
  graph (reparameterisation trick).
* :class:`QEnsemble`: ``E`` Q-functions stored as stacked weights ``[E, in, out]`` and evaluated
  with one batched matmul per layer, so two (SAC) or ten (RLPD) critics cost one call each layer
  instead of one per critic. Optional LayerNorm (RLPD) or BatchNorm (CrossQ) after each hidden
  layer, BatchNorm also on the input (CrossQ).

Log-probabilities are those of the squashed action in [-1, 1] (as in SB3), so the usual target
entropy ``-action_dim`` has its usual meaning whatever the env's action bounds.
"""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .policies import _activation, _mlp_body

__all__ = ["SquashedGaussianPolicy", "QEnsemble"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG2 = math.log(2.0)


def _full_precision(t: Tensor):
    """Autocast switched off for an output layer (``actor.precision=bfloat16`` trains the hidden
    layers under autocast; heads and losses stay float32)."""
    return torch.autocast(t.device.type, enabled=False)


class SquashedGaussianPolicy(nn.Module):
    """tanh-squashed Gaussian actor on flat observations (SAC/SB3 layout: MLP trunk, one linear head for
    means and log-stds, log-stds clamped to ``log_std_bounds``)."""

    has_critic = False
    discrete = False
    obs_rms = None

    def __init__(
        self,
        obs_dim: int,
        action_space: gym.spaces.Box,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        chunk: int = 1,
        log_std_bounds: tuple[float, float] = (-20.0, 2.0),
        state_dependent_std: bool = True,
    ):
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"needs a Box action space, got {action_space}")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ValueError(f"needs a bounded Box action space (tanh squashing), got {action_space}")
        self.chunk = int(chunk)
        self.action_shape = tuple(int(s) for s in action_space.shape)
        self.act_dim = int(np.prod(self.action_shape, dtype=np.int64))
        self.head_dim = self.chunk * self.act_dim
        hidden = tuple(int(h) for h in hidden)
        self.body = _mlp_body(int(obs_dim), hidden, _activation(activation), ortho=False)
        feat = hidden[-1] if hidden else int(obs_dim)
        # means, then log-stds: one matmul for both; or means only, with one free log-std per
        # action dimension (IQL's policy: the likelihood cannot shrink the spread state by state)
        self.head = nn.Linear(feat, (2 if state_dependent_std else 1) * self.head_dim)
        self.log_std = None if state_dependent_std else nn.Parameter(torch.zeros(self.head_dim))
        self.log_std_min, self.log_std_max = (float(b) for b in log_std_bounds)
        low = np.tile(np.asarray(action_space.low, dtype=np.float32).reshape(-1), self.chunk)
        high = np.tile(np.asarray(action_space.high, dtype=np.float32).reshape(-1), self.chunk)
        self.register_buffer("action_scale", torch.from_numpy((high - low) / 2.0))
        self.register_buffer("action_bias", torch.from_numpy((high + low) / 2.0))

    def _mean_log_std(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        features = self.body(obs.to(self.head.weight.dtype))
        with _full_precision(features):  # means and log-stds feed exp, tanh and log-probs
            out = self.head(features.to(self.head.weight.dtype))
        if self.log_std is None:
            return out.chunk(2, dim=-1)
        return out, self.log_std.expand_as(out)

    def mean_log_prob(self, obs: Tensor, action: Tensor, log_std_min: float = -5.0) -> Tensor:
        """Log-density [B] of ``action`` (env units) under a Gaussian centred on the *squashed*
        mean, ``N(tanh(mean), std)`` in [-1, 1] units, with log-stds clamped below at
        ``log_std_min``: IQL's policy extraction. Unlike the squashed density it is finite for
        dataset actions on the bounds (a clipped behaviour policy puts many there), and its mode
        is the deterministic action this policy takes (``tanh(mean)``)."""
        mean, log_std = self._mean_log_std(obs)
        log_std = log_std.clamp(max(self.log_std_min, log_std_min), self.log_std_max)
        unit = (action.reshape(action.shape[0], -1).to(mean.dtype) - self.action_bias) / self.action_scale
        z = (unit - torch.tanh(mean)) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std).sum(-1) - self.head_dim * _HALF_LOG_2PI

    def sample(self, obs: Tensor, noise: Tensor | None = None, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Action in the env's bounds [B, head_dim] and its log-prob [B] (of the squashed action
        in [-1, 1]); differentiable with respect to the parameters."""
        mean, log_std = self._mean_log_std(obs)
        log_std = log_std.clamp(self.log_std_min, self.log_std_max)
        if deterministic:
            u = mean
            eps = torch.zeros_like(mean)
        else:
            eps = torch.randn_like(mean) if noise is None else noise.to(mean)
            u = mean + eps * log_std.exp()
        # log N(u) - log|d tanh(u)/du|, with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (stable)
        log_prob = (-0.5 * eps.square() - log_std).sum(-1) - self.head_dim * _HALF_LOG_2PI
        log_prob = log_prob - (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1)
        action = torch.tanh(u) * self.action_scale + self.action_bias
        return action, log_prob

    # ---- the policy contract (rollout worker, evaluation) ------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(batch, self.head_dim, generator=generator)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        action, log_prob = self.sample(obs, noise=noise, deterministic=deterministic)
        B = action.shape[0]
        return action.view(B, self.chunk, *self.action_shape), log_prob, action.new_zeros(B)

    def env_action(self, stored: Tensor) -> Tensor:
        """The executed action: the stored one (the policy contract's hook; see Policy.env_action)."""
        return stored

    def update_obs_stats(self, obs: Tensor) -> None:  # no normaliser: replayed data would drift
        return None


class QEnsemble(nn.Module):
    """``num_q`` MLP Q-functions Q(s, a) evaluated together: ``forward(obs, act) -> [E, B]``.
    With ``act_dim=0`` it is an ensemble of state values ``V(s)`` (``forward(obs)``; IQL).

    ``norm``: ``None``, ``"layer"`` (LayerNorm after each hidden linear layer, RLPD) or ``"batch"``
    (BatchNorm on the input and after each hidden linear layer, CrossQ; running statistics with
    ``bn_momentum``). Linear layers are initialised like ``nn.Linear`` (uniform +-1/sqrt(fan_in)).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        num_q: int = 2,
        activation: str = "relu",
        norm: str | None = None,
        bn_momentum: float = 0.01,
        bn_eps: float = 1e-3,
    ):
        super().__init__()
        if norm not in (None, "layer", "batch"):
            raise ValueError(f"critic norm must be None, 'layer' or 'batch'; got {norm!r}")
        if int(num_q) < 1:
            raise ValueError(f"num_q must be >= 1, got {num_q}")
        self.num_q = E = int(num_q)
        self.norm = norm
        self.bn_momentum, self.bn_eps = float(bn_momentum), float(bn_eps)
        act_cls = _activation(activation)
        # in place where the activation allows it: the matmul output it overwrites is not needed
        # by the matmul's backward, and the activation's backward needs only its own output
        self.act_fn = act_cls(inplace=True) if act_cls in (nn.ReLU, nn.ELU, nn.LeakyReLU) else act_cls()
        dims = [int(obs_dim) + int(act_dim), *(int(h) for h in hidden), 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for din, dout in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(din)
            self.weights.append(nn.Parameter(torch.empty(E, din, dout).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(E, 1, dout).uniform_(-bound, bound)))
        # one normaliser per hidden layer (and, for BatchNorm, one on the input)
        norm_dims = ([dims[0]] if norm == "batch" else []) + dims[1:-1] if norm else []
        self.norm_weight = nn.ParameterList([nn.Parameter(torch.ones(E, 1, d)) for d in norm_dims])
        self.norm_bias = nn.ParameterList([nn.Parameter(torch.zeros(E, 1, d)) for d in norm_dims])
        if norm == "batch":
            for i, d in enumerate(norm_dims):
                self.register_buffer(f"running_mean_{i}", torch.zeros(E, 1, d))
                self.register_buffer(f"running_var_{i}", torch.ones(E, 1, d))

    def forward(self, obs: Tensor, act: Tensor | None = None, detach: bool = False, batch_stats: bool = True) -> Tensor:
        """Q-values [E, B]. ``detach``: use the weights as constants (the actor's loss, which must
        not train the critic; gradients still flow to ``act``). ``batch_stats`` (BatchNorm only):
        normalise with this batch's statistics and update the running ones (True), or use the
        running statistics (False: the actor's loss, evaluation)."""
        dtype = self.weights[0].dtype
        x = obs.to(dtype) if act is None else torch.cat([obs.to(dtype), act.to(dtype)], -1)
        h = x.unsqueeze(0).expand(self.num_q, *x.shape)
        p = (lambda t: t.detach()) if detach else (lambda t: t)
        k = 0  # normaliser index
        if self.norm == "batch":
            h = self._batch_norm(h, 0, p, batch_stats)
            k = 1
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            h = torch.baddbmm(p(b), h, p(w))
            if self.norm == "layer":
                h = F.layer_norm(h, h.shape[-1:]) * p(self.norm_weight[k]) + p(self.norm_bias[k])
                k += 1
            elif self.norm == "batch":
                h = self._batch_norm(h, k, p, batch_stats)
                k += 1
            h = self.act_fn(h)
        w, b = self.weights[-1], self.biases[-1]  # [E, H, 1], [E, 1, 1]
        with _full_precision(h):  # the values regress onto targets of order 1e3: never in bf16
            # one output column as multiply-and-sum: on CPU a one-column batched matmul (and its
            # backward) takes ~5x as long (143 against 27 us forward for [2, 256, 256] rows)
            return (h.to(w.dtype) * p(w).transpose(1, 2)).sum(-1) + p(b).squeeze(-1)

    def _batch_norm(self, h: Tensor, k: int, p, batch_stats: bool) -> Tensor:
        mean_buf, var_buf = getattr(self, f"running_mean_{k}"), getattr(self, f"running_var_{k}")
        if batch_stats:
            # statistics in float32 also when the layer ran in bf16 (actor.precision)
            var, mean = torch.var_mean(h.float(), dim=1, keepdim=True, correction=0)
            with torch.no_grad():
                n = h.shape[1]
                mean_buf.lerp_(mean.detach(), self.bn_momentum)
                var_buf.lerp_(var.detach() * (n / max(n - 1, 1)), self.bn_momentum)
        else:
            mean, var = mean_buf, var_buf
        # (h - mean) / sqrt(var + eps) * w + b as one pass over h: the per-feature scale and shift
        # are [E, 1, H], so only the final multiply-add touches the whole batch
        scale = torch.rsqrt(var + self.bn_eps) * p(self.norm_weight[k])
        return torch.addcmul(p(self.norm_bias[k]) - mean * scale, h, scale)
