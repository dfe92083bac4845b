"""Action heads of the VLA policy: how a chunk of actions is read out of the backbone.

One interface, selected by ``VLAConfig.head`` through :data:`HEADS` (``register_head`` adds one),
so the policy class holds no per-head branches:

* ``discrete`` (OpenVLA): every action dimension is cut into ``bins`` uniform bins, each bin one
  LM token after the text vocabulary; the H*A tokens of a chunk are decoded autoregressively with
  the KV cache. The distribution over a token is the softmax over the action tokens only (a
  proper distribution whose every outcome is a valid action; OpenVLA decodes over the full
  vocabulary, where a non-action token is possible). ``act`` returns bin centres, so ``evaluate`` (one teacher-forced
  pass) re-bins them to the same tokens and reproduces the log-prob.
* ``chunk`` (OpenVLA-OFT): H learned query embeddings appended after the prefix, read in one
  parallel pass, an MLP per query -> [B, H, A] means; behaviour cloning by L1 (OFT's choice); for
  RL a diagonal Gaussian around the mean with a state-independent learned ``log_std`` (as
  :class:`rlweave.models.policies.Policy`'s Gaussian), log-probs in closed form.
* ``flow`` (pi0): see :mod:`.flow_head`.

Heads do not own the backbone (it would appear twice in the state dict); the policy passes it in.
Every method returns the pooled prefix state beside its result, so the value head rides on the
same pass.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backbone import VLABackbone
from .config import VLAConfig

__all__ = ["ActionHead", "DiscreteHead", "ChunkHead", "HEADS", "register_head", "build_head"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
Obs = Mapping[str, Any]


class ActionHead(nn.Module):
    """The contract each head implements (shapes: B rows, chunk H, action dim A)."""

    name: ClassVar[str] = ""

    def __init__(self, cfg: VLAConfig, backbone: VLABackbone):
        super().__init__()
        self.cfg = cfg
        self.H, self.A = int(cfg.chunk), int(cfg.action_dim)

    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """The randomness ``act`` consumes for ``batch`` rows (drawn apart from ``act`` so actions
        depend on the caller's seed, not on how rows were batched)."""
        raise NotImplementedError

    def env_action(self, stored: Tensor) -> Tensor:
        """The executed [B, H, A] of what ``act`` returned (identity unless a head stores more)."""
        return stored

    def act(self, bb: VLABackbone, obs: Obs, deterministic: bool, noise: Tensor | None
            ) -> tuple[Tensor, Tensor, Tensor]:
        """(stored action, log_prob [B], pooled prefix state [B, D]); the stored action is
        [B, H, A] except where a head needs more for ``evaluate`` (the flow head's chain)."""
        raise NotImplementedError

    def evaluate(self, bb: VLABackbone, obs: Obs, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log_prob [B], entropy [B], pooled [B, D]) of stored actions, with gradients."""
        raise NotImplementedError

    def bc_loss(self, bb: VLABackbone, obs: Obs, actions: Tensor, generator: torch.Generator | None = None
                ) -> dict[str, Tensor]:
        """Behaviour-cloning terms: ``loss_*`` keys (summed by the caller) and metrics.
        ``generator``: for heads whose loss is random (flow matching's noise and times)."""
        raise NotImplementedError


HEADS: dict[str, type[ActionHead]] = {}


def register_head(cls: type[ActionHead]) -> type[ActionHead]:
    """Class decorator: makes ``cls`` selectable as ``VLAConfig(head=cls.name)``."""
    HEADS[cls.name] = cls
    return cls


def build_head(cfg: VLAConfig, backbone: VLABackbone) -> ActionHead:
    if cfg.head not in HEADS and cfg.head == "flow":
        from . import flow_head  # noqa: F401  (registers itself)
    try:
        cls = HEADS[cfg.head]
    except KeyError:
        raise ValueError(f"vla: unknown head {cfg.head!r}; known: {', '.join(sorted(HEADS))}") from None
    return cls(cfg, backbone)


def _gaussian_log_prob(x: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    z = (x - mean) * torch.exp(-log_std)
    return -0.5 * z.square().sum(-1) - log_std.sum() - x.shape[-1] * _HALF_LOG_2PI


@register_head
class DiscreteHead(ActionHead):
    """OpenVLA's tokenised actions, decoded autoregressively (KV cache), scored by teacher forcing."""

    name = "discrete"

    def __init__(self, cfg: VLAConfig, backbone: VLABackbone):
        super().__init__(cfg, backbone)
        self.bins = int(cfg.bins)
        self.first_token = backbone.text_vocab  # action tokens: first_token .. first_token + bins - 1
        low = torch.tensor(cfg.action_low, dtype=torch.float32)
        high = torch.tensor(cfg.action_high, dtype=torch.float32)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
            raise ValueError("vla: the discrete head needs finite action bounds with high > low")
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("width", (high - low) / self.bins, persistent=False)

    # ---- bins <-> actions ---------------------------------------------------------------------
    def to_bins(self, action: Tensor) -> Tensor:
        """[B, H, A] actions -> [B, H*A] bin indices (values outside the bounds clamp to the edge bins)."""
        b = torch.floor((action.to(self.low.dtype) - self.low) / self.width)
        return b.clamp_(0, self.bins - 1).long().reshape(action.shape[0], -1)

    def from_bins(self, bins: Tensor) -> Tensor:
        """[B, H*A] bin indices -> [B, H, A] bin centres."""
        a = self.low + (bins.view(-1, self.H, self.A).to(self.low.dtype) + 0.5) * self.width
        return a

    def _logits(self, bb: VLABackbone, hidden: Tensor) -> Tensor:
        """Logits over the action tokens only: the tied output embedding's action rows."""
        w = bb.output_embeddings()[self.first_token: self.first_token + self.bins]
        return F.linear(hidden, w).float()

    # ---- contract -----------------------------------------------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.rand(batch, self.H * self.A, generator=generator)  # inverse-CDF per token

    def act(self, bb, obs, deterministic, noise):
        p = bb.prefix(obs)
        B, n = p.embeds.shape[0], self.H * self.A
        if not deterministic and noise is None:
            noise = self.sample_noise(B)
        hidden, cache = bb.run(p.embeds, p.mask, p.positions, use_cache=True)
        pooled = bb.pooled(p, hidden)
        mask, pos = p.mask, p.next_position.unsqueeze(1)
        h = hidden[:, -1]
        bins, log_prob = [], hidden.new_zeros(B, dtype=torch.float32)
        for j in range(n):
            logp = self._logits(bb, h).log_softmax(-1)  # [B, bins]
            if deterministic:
                b = logp.argmax(-1)
            else:
                cdf = logp.exp().cumsum(-1)
                b = (cdf < noise[:, j].to(cdf).unsqueeze(-1)).sum(-1).clamp_(max=self.bins - 1)
            log_prob = log_prob + logp.gather(-1, b.unsqueeze(-1)).squeeze(-1)
            bins.append(b)
            if j + 1 < n:
                emb = bb.token_embeddings((b + self.first_token).unsqueeze(1))
                mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
                out, cache = bb.run(emb, mask, pos + j, cache=cache, use_cache=True)
                h = out[:, -1]
        return self.from_bins(torch.stack(bins, 1)), log_prob, pooled

    def _teacher_forced(self, bb, obs, action):
        """Log-softmax over action tokens at each of the chunk's H*A positions, and the targets."""
        bins = self.to_bins(action)
        suffix = bb.token_embeddings(bins[:, :-1] + self.first_token)
        p, hidden = bb.encode(obs, suffix)
        P = p.length
        logp = self._logits(bb, hidden[:, P - 1:]).log_softmax(-1)  # [B, H*A, bins]
        return p, hidden, logp, bins

    def evaluate(self, bb, obs, action):
        p, hidden, logp, bins = self._teacher_forced(bb, obs, action)
        log_prob = logp.gather(-1, bins.unsqueeze(-1)).squeeze(-1).sum(-1)
        entropy = -(logp.exp() * logp).sum(-1).sum(-1)
        return log_prob, entropy, bb.pooled(p, hidden)

    def bc_loss(self, bb, obs, actions, generator=None):
        _, _, logp, bins = self._teacher_forced(bb, obs, actions)
        token_logp = logp.gather(-1, bins.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            pred = logp.argmax(-1)
            accuracy = (pred == bins).float().mean()
            l1 = (self.from_bins(pred) - actions.to(self.low.dtype)).abs().mean()
        return {"loss_action_ce": -token_logp.mean(), "token_accuracy": accuracy, "action_l1": l1}


@register_head
class ChunkHead(ActionHead):
    """OpenVLA-OFT's parallel decoding: H learned queries after the prefix, one pass, an MLP ->
    means; a Gaussian with state-independent ``log_std`` for RL. Queries attend causally (to the
    prefix and the earlier queries): OFT's bidirectional variant needs a custom 4-D mask, which
    costs a kernel path on CPU and did not matter at these sizes."""

    name = "chunk"

    def __init__(self, cfg: VLAConfig, backbone: VLABackbone):
        super().__init__(cfg, backbone)
        D = cfg.lm_hidden
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 1)
            self.queries = nn.Parameter(torch.randn(self.H, D) * 0.02)
            self.mlp = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, self.A))
        self.log_std = nn.Parameter(torch.full((self.H * self.A,), float(cfg.log_std_init)))

    def means(self, bb: VLABackbone, obs: Obs) -> tuple[Tensor, Tensor]:
        """Action means [B, H, A] and the pooled prefix state."""
        B = obs_batch(obs, self.cfg)
        p, hidden = bb.encode(obs, self.queries.unsqueeze(0).expand(B, -1, -1))
        return self.mlp(hidden[:, p.length:]).float(), bb.pooled(p, hidden)

    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(batch, self.H * self.A, generator=generator)

    def act(self, bb, obs, deterministic, noise):
        mean, pooled = self.means(bb, obs)
        B = mean.shape[0]
        mean = mean.reshape(B, -1)
        if deterministic:
            action = mean
        else:
            eps = self.sample_noise(B) if noise is None else noise
            action = torch.addcmul(mean, eps.to(mean), self.log_std.exp())
        log_prob = _gaussian_log_prob(action, mean, self.log_std)
        return action.view(B, self.H, self.A), log_prob, pooled

    def evaluate(self, bb, obs, action):
        mean, pooled = self.means(bb, obs)
        B = mean.shape[0]
        log_prob = _gaussian_log_prob(action.reshape(B, -1).to(mean), mean.reshape(B, -1), self.log_std)
        entropy = (self.log_std.sum() + self.log_std.numel() * (0.5 + _HALF_LOG_2PI)).expand(B)
        return log_prob, entropy, pooled

    def bc_loss(self, bb, obs, actions, generator=None):
        mean, _ = self.means(bb, obs)
        err = mean - actions.to(mean)
        return {"loss_l1": err.abs().mean(), "action_mse": err.detach().square().mean()}


def obs_batch(obs: Obs, cfg: VLAConfig) -> int:
    """Rows in an observation dict (from its first camera)."""
    return int(obs[cfg.cameras[0]].shape[0])

