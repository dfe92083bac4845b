"""Policies for embodied RL: the policy contract, MLP and CNN policies, and a weight checksum.

Contract (called by the rollout and actor workers)::

    action, log_prob, value = policy.act(obs, deterministic=False)   # no grad
    log_prob, entropy, value = policy.evaluate(obs, action)          # with grad
    value = policy.value(obs)
    policy.update_obs_stats(obs)

Shapes: ``action`` is [B, chunk, *action_shape] (float) for a Box action space and [B, chunk]
(long) for Discrete; ``log_prob``, ``entropy`` and ``value`` are [B]; log-probs and entropies are
summed over the chunk and action dimensions. One decision emits ``chunk`` env actions. Actions are
not clipped or squashed here; the env layer clips to the Box.

Distributions are computed in closed form (diagonal Gaussian with a state-independent learned
``log_std``; categorical through ``log_softmax``) rather than through ``torch.distributions``
objects, which keeps ``act`` on small batches cheap.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from .normalizer import RunningMeanStd

__all__ = ["Policy", "MLPPolicy", "CNNPolicy", "flat_params_checksum", "state_dict_checksum", "ACTIVATIONS"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}


def _activation(activation: str | type[nn.Module]) -> type[nn.Module]:
    if isinstance(activation, str):
        try:
            return ACTIVATIONS[activation.lower()]
        except KeyError:
            raise ValueError(
                f"unknown activation {activation!r}; known: {', '.join(sorted(ACTIVATIONS))}"
            ) from None
    if isinstance(activation, type) and issubclass(activation, nn.Module):
        return activation
    raise TypeError(f"activation must be a name or an nn.Module class, got {activation!r}")


def _init_layer(layer: nn.Module, gain: float, ortho: bool = True) -> nn.Module:
    if ortho:
        nn.init.orthogonal_(layer.weight, gain)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return layer


# Activation modules whose functional form is applied directly on the MLP fast path.
_FUNCTIONAL: dict[type[nn.Module], Callable[[Tensor], Tensor]] = {
    nn.Tanh: torch.tanh,
    nn.ReLU: torch.relu,
    nn.ELU: torch.nn.functional.elu,
    nn.GELU: torch.nn.functional.gelu,
    nn.SiLU: torch.nn.functional.silu,
    nn.LeakyReLU: torch.nn.functional.leaky_relu,
}


def _mlp_body(in_dim: int, hidden: Sequence[int], act_cls: type[nn.Module], ortho: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_init_layer(nn.Linear(in_dim, int(h)), math.sqrt(2.0), ortho), act_cls()]
        in_dim = int(h)
    return nn.Sequential(*layers)


class Policy(nn.Module):
    """Abstract base: action-space bookkeeping and the action distributions.

    Subclasses implement ``_forward(obs, with_value) -> (head_out [B, head_dim], value [B] | None)``
    and ``_value(obs) -> [B]``; they set ``self.actor_head`` output size to ``self.head_dim`` and,
    if they normalise observations, ``self.obs_rms`` to a :class:`RunningMeanStd`.
    """

    chunk: int
    obs_rms: RunningMeanStd | None

    def __init__(self, action_space: gym.spaces.Space, chunk: int = 1, critic: bool = True,
                 log_std_init: float = 0.0):
        super().__init__()
        if int(chunk) < 1 or int(chunk) != chunk:
            raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
        self.chunk = int(chunk)
        self.has_critic = bool(critic)
        self.action_space = action_space
        self.obs_rms = None
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete = True
            self.n = int(action_space.n)
            self.action_shape: tuple[int, ...] = ()
            self.act_dim = 1
            self.head_dim = self.chunk * self.n
            self.log_std = None
        elif isinstance(action_space, gym.spaces.Box):
            self.discrete = False
            self.n = 0
            self.action_shape = tuple(int(s) for s in action_space.shape)
            self.act_dim = int(np.prod(self.action_shape, dtype=np.int64))
            self.head_dim = self.chunk * self.act_dim
            self.log_std = nn.Parameter(torch.full((self.head_dim,), float(log_std_init)))
        else:
            raise TypeError(
                f"{type(self).__name__} needs a Box or Discrete action space, got {action_space}"
            )

    # ---- to implement -------------------------------------------------------------------------
    def _forward(self, obs: Tensor, with_value: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def _value(self, obs: Tensor) -> Tensor:
        raise NotImplementedError

    def _heads(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Head output, value (zeros without a critic) and, for discrete actions, log-probs of
        every action per chunk element: the part ``act`` and ``evaluate`` share."""
        out, value = self._forward(obs, self.has_critic)
        B = out.shape[0]
        if value is None:
            value = out.new_zeros(B)
        logp_all = out.view(B, self.chunk, self.n).log_softmax(-1) if self.discrete else None
        return out, value, logp_all

    # ---- contract -----------------------------------------------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """The randomness ``act`` consumes for ``batch`` rows: standard normal [batch, head_dim]
        (Gaussian policies) or uniform [batch, chunk] (categorical, inverse-CDF sampling). Drawing
        it separately lets a caller make actions depend only on its own seed, not on how requests
        were batched or which replica served them."""
        if self.discrete:
            return torch.rand(batch, self.chunk, generator=generator)
        return torch.randn(batch, self.head_dim, generator=generator)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Actions, their log-probs and values. ``noise``: rows of :meth:`sample_noise` to use
        (default: drawn from torch's global generator)."""
        out, value, logp_all = self._heads(obs)
        B = out.shape[0]
        if self.discrete:
            if deterministic:
                action = logp_all.argmax(-1)
            else:
                u = self.sample_noise(B) if noise is None else noise.to(out.device)
                cdf = logp_all.exp().cumsum(-1)  # [B, chunk, n]
                action = (cdf < u.unsqueeze(-1)).sum(-1).clamp_(max=self.n - 1)
            log_prob = logp_all.gather(-1, action.unsqueeze(-1)).view(B, self.chunk).sum(-1)
            return action, log_prob, value
        log_std = self.log_std
        const = log_std.sum() + self.head_dim * _HALF_LOG_2PI
        if deterministic:
            action = out
            log_prob = (-const).expand(B).clone()
        else:
            eps = self.sample_noise(B).to(out) if noise is None else noise.to(out)
            action = torch.addcmul(out, eps, log_std.exp())
            log_prob = eps.square().sum(-1).mul_(-0.5).sub_(const)
        return action.view(B, self.chunk, *self.action_shape), log_prob, value

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, value, logp_all = self._heads(obs)
        log_prob, entropy = self._log_prob_entropy(out, logp_all, action)
        return log_prob, entropy, value

    def _log_prob_entropy(self, out: Tensor, logp_all: Tensor | None, action: Tensor) -> tuple[Tensor, Tensor]:
        B = out.shape[0]
        if self.discrete:
            a = action.reshape(B, self.chunk, 1).long()
            log_prob = logp_all.gather(-1, a).view(B, self.chunk).sum(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1).sum(-1)
            return log_prob, entropy
        log_std = self.log_std
        z = (action.reshape(B, self.head_dim).to(out.dtype) - out) * torch.exp(-log_std)
        log_prob = -0.5 * z.square().sum(-1) - log_std.sum() - self.head_dim * _HALF_LOG_2PI
        entropy = (log_std.sum() + self.head_dim * (0.5 + _HALF_LOG_2PI)).expand(B)
        return log_prob, entropy

    # ---- a critic apart from the actor (the value loss in a helper process: actor.update_threads=2)
    @property
    def split_critic(self) -> bool:
        """Whether the value reads only :meth:`prepare`'s output and parameters of its own, so the
        value loss can run apart from the policy loss, on the same prepared input. Off here; a
        policy class that has such a critic says so."""
        return False

    def prepare(self, obs: Tensor) -> Tensor:
        """The input both heads read (normalised observations); only with :attr:`split_critic`."""
        raise NotImplementedError(f"{type(self).__name__} has no critic apart from its actor")

    def evaluate_prepared(self, x: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """``evaluate``'s log-probs and entropies from ``prepare(obs)``, without the value: the
        same operations on the actor's side, so the same numbers."""
        out, _ = self._forward_prepared(x, False)
        logp_all = out.view(out.shape[0], self.chunk, self.n).log_softmax(-1) if self.discrete else None
        return self._log_prob_entropy(out, logp_all, action)

    def value_prepared(self, x: Tensor) -> Tensor:
        """``evaluate``'s value from ``prepare(obs)`` (the same operations on the critic's side)."""
        raise NotImplementedError(f"{type(self).__name__} has no critic apart from its actor")

    def _forward_prepared(self, x: Tensor, with_value: bool) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError(f"{type(self).__name__} has no critic apart from its actor")

    def env_action(self, stored: Tensor) -> Tensor:
        """The action to execute for an action ``act`` returned. Identity here; a policy whose
        stored action carries more than the env needs (a flow policy's denoising chain, kept so
        the learner can recompute its log-prob) returns the executed part."""
        return stored

    def value(self, obs: Tensor) -> Tensor:
        if not self.has_critic:
            return torch.zeros(obs.shape[0], device=obs.device)
        return self._value(obs)

    def update_obs_stats(self, obs: Tensor) -> None:
        if self.obs_rms is not None:
            self.obs_rms.update(obs)

    def forward(self, obs: Tensor, action: Tensor | None = None, deterministic: bool = False):
        """``evaluate(obs, action)`` when an action is given, else ``act(obs, deterministic)``.

        Going through ``forward`` lets wrappers such as DistributedDataParallel see the call.
        """
        if action is None:
            return self.act(obs, deterministic)
        return self.evaluate(obs, action)

    def distribution_params(self, obs: Tensor) -> Tensor:
        """Raw head output: Gaussian means [B, chunk, *action_shape] or logits [B, chunk, n]."""
        out, _ = self._forward(obs, False)
        B = out.shape[0]
        if self.discrete:
            return out.view(B, self.chunk, self.n)
        return out.view(B, self.chunk, *self.action_shape)


class MLPPolicy(Policy):
    """Actor and critic MLPs on flat observations (CleanRL/SB3 PPO layout and initialisation).

    Hidden layers are orthogonally initialised with gain sqrt(2), the policy head with 0.01 and the
    value head with 1.0. ``shared_backbone=True`` puts both heads on one trunk. ``normalize_obs``
    keeps a :class:`RunningMeanStd` over observations as buffers (``obs_rms``), updated only through
    ``update_obs_stats``.
    """

    def __init__(self, obs_dim: int, action_space: gym.spaces.Space, hidden: Sequence[int] = (64, 64),
                 activation: str | type[nn.Module] = "tanh", chunk: int = 1, critic: bool = True,
                 normalize_obs: bool = False, log_std_init: float = 0.0, ortho_init: bool = True,
                 shared_backbone: bool = False):
        super().__init__(action_space, chunk=chunk, critic=critic, log_std_init=log_std_init)
        self.obs_dim = int(obs_dim)
        hidden = tuple(int(h) for h in hidden)
        act_cls = _activation(activation)
        # exact type match: subclasses or parametrised activations go through the modules
        self._act_fn = _FUNCTIONAL.get(act_cls) if isinstance(activation, str) else None
        self.shared_backbone = bool(shared_backbone)
        self.obs_rms = RunningMeanStd((self.obs_dim,)) if normalize_obs else None
        feat = hidden[-1] if hidden else self.obs_dim
        self.actor_body = _mlp_body(self.obs_dim, hidden, act_cls, ortho_init)
        self.actor_head = _init_layer(nn.Linear(feat, self.head_dim), 0.01, ortho_init)
        if self.has_critic:
            if not self.shared_backbone:
                self.critic_body = _mlp_body(self.obs_dim, hidden, act_cls, ortho_init)
            self.critic_head = _init_layer(nn.Linear(feat, 1), 1.0, ortho_init)

    def _prep(self, obs: Tensor) -> Tensor:
        dtype = self.actor_head.weight.dtype
        if obs.dtype != dtype:
            obs = obs.to(dtype)
        if self.obs_rms is not None:
            return self.obs_rms.normalize(obs)
        return obs

    def _run(self, body: nn.Sequential, x: Tensor) -> Tensor:
        # Fast path: F.linear + functional activation, skipping nn.Module.__call__ overhead
        # (a third of act()'s time on small batches). Same parameters, same results.
        fn = self._act_fn
        if fn is None or body._forward_hooks or body._forward_pre_hooks:
            return body(x)
        linear = torch.nn.functional.linear
        for i, m in enumerate(body._modules.values()):
            x = linear(x, m.weight, m.bias) if i % 2 == 0 else fn(x)
        return x

    def _forward(self, obs: Tensor, with_value: bool) -> tuple[Tensor, Tensor | None]:
        return self._forward_prepared(self._prep(obs), with_value)

    def _forward_prepared(self, x: Tensor, with_value: bool) -> tuple[Tensor, Tensor | None]:
        h = self._run(self.actor_body, x)
        head = self.actor_head
        out = torch.nn.functional.linear(h, head.weight, head.bias)
        if not with_value:
            return out, None
        if self.shared_backbone:
            return out, torch.nn.functional.linear(h, self.critic_head.weight, self.critic_head.bias).squeeze(-1)
        return out, self.value_prepared(x)

    @property
    def split_critic(self) -> bool:
        return self.has_critic and not self.shared_backbone

    def prepare(self, obs: Tensor) -> Tensor:
        return self._prep(obs)

    def value_prepared(self, x: Tensor) -> Tensor:
        head = self.critic_head
        return torch.nn.functional.linear(self._run(self.critic_body, x), head.weight, head.bias).squeeze(-1)

    def _value(self, obs: Tensor) -> Tensor:
        x = self._prep(obs)
        body = self.actor_body if self.shared_backbone else self.critic_body
        return self.critic_head(self._run(body, x)).squeeze(-1)


def _conv_specs(h: int, w: int, n_layers: int) -> list[tuple[int, int, int]]:
    """(kernel, stride, padding) per conv layer: Nature-CNN 8/4, 4/2, 3/1 (then 3/1) when the image
    is large enough (>= 36 px for three layers: 64 and 84 both fit), else padded 3x3 convs."""
    nature = [(8, 4, 0), (4, 2, 0)] + [(3, 1, 0)] * max(0, n_layers - 2)
    nature = nature[:n_layers]
    sh, sw = h, w
    for k, s, p in nature:
        sh, sw = (sh + 2 * p - k) // s + 1, (sw + 2 * p - k) // s + 1
        if sh < 1 or sw < 1:
            return [(3, 2, 1), (3, 2, 1)][:n_layers] + [(3, 1, 1)] * max(0, n_layers - 2)
    return nature


class CNNPolicy(Policy):
    """Nature-CNN-like policy on uint8 images [B, H, W, C] (frames may be stacked on C).

    The model scales inputs by 1/255 and permutes HWC -> CHW itself. One encoder (convs + a
    ``hidden``-wide linear layer) is shared by the actor head and the critic head.
    """

    def __init__(self, obs_shape: Sequence[int], action_space: gym.spaces.Space,
                 channels: Sequence[int] = (16, 32, 32), hidden: int = 256, chunk: int = 1,
                 critic: bool = True, log_std_init: float = 0.0, ortho_init: bool = True):
        super().__init__(action_space, chunk=chunk, critic=critic, log_std_init=log_std_init)
        obs_shape = tuple(int(s) for s in obs_shape)
        if len(obs_shape) != 3:
            raise ValueError(f"CNNPolicy needs obs_shape (H, W, C), got {obs_shape}")
        self.obs_shape = obs_shape
        H, W, C = obs_shape
        channels = tuple(int(c) for c in channels)
        if not channels:
            raise ValueError("CNNPolicy needs at least one conv layer")
        layers: list[nn.Module] = []
        in_ch = C
        for out_ch, (k, s, p) in zip(channels, _conv_specs(H, W, len(channels))):
            layers += [_init_layer(nn.Conv2d(in_ch, out_ch, k, s, p), math.sqrt(2.0), ortho_init), nn.ReLU()]
            in_ch = out_ch
        layers.append(nn.Flatten())
        convs = nn.Sequential(*layers)
        with torch.no_grad():
            flat = convs(torch.zeros(1, C, H, W)).shape[1]
        self.encoder = nn.Sequential(
            *layers, _init_layer(nn.Linear(flat, int(hidden)), math.sqrt(2.0), ortho_init), nn.ReLU()
        )
        self.actor_head = _init_layer(nn.Linear(int(hidden), self.head_dim), 0.01, ortho_init)
        if self.has_critic:
            self.critic_head = _init_layer(nn.Linear(int(hidden), 1), 1.0, ortho_init)

    def _encode(self, obs: Tensor) -> Tensor:
        dtype = self.actor_head.weight.dtype
        x = obs.permute(0, 3, 1, 2).to(dtype) * (1.0 / 255.0)  # not in place: obs may be float
        return self.encoder(x)

    def _forward(self, obs: Tensor, with_value: bool) -> tuple[Tensor, Tensor | None]:
        h = self._encode(obs)
        out = self.actor_head(h)
        if not with_value:
            return out, None
        return out, self.critic_head(h).squeeze(-1)

    def _value(self, obs: Tensor) -> Tensor:
        return self.critic_head(self._encode(obs)).squeeze(-1)


def flat_params_checksum(module: nn.Module) -> str:
    """blake2b (16-byte digest, hex) over every state_dict entry (parameters and persistent
    buffers) in state_dict order: name, dtype, shape and raw bytes. Equal on two processes iff
    their weights and statistics are bit-identical."""
    return state_dict_checksum(module.state_dict())


def state_dict_checksum(state: Mapping[str, Any]) -> str:
    """:func:`flat_params_checksum` of a state dict (e.g. a sharded model's gathered full one)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in state.items():
        h.update(name.encode())
        if not isinstance(t, Tensor):  # extra state objects
            h.update(repr(t).encode())
            continue
        t = t.detach()
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        flat = t.to("cpu").contiguous().reshape(-1)
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
