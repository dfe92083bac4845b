"""``VLAPolicy``: a vision-language-action model behind rlweave's policy contract.

Same calls as :class:`rlweave.models.policies.Policy` (``act``, ``evaluate``, ``value``,
``sample_noise``, ``update_obs_stats``, ``forward``), so workers and losses do not know they hold a
VLA; observations are dicts (``"image"``/``"image_<camera>"`` uint8 [B, H, W, 3], ``"state"``
float [B, S], ``"instruction"`` uint8 [B, 64]) of numpy arrays or tensors, and actions are
[B, chunk, A]. Plus ``bc_loss(obs, actions)`` for imitation, returning TorchRL-style ``loss_*``
keys (their sum is the loss) beside metrics.

The policy is three parts: the :class:`~.backbone.VLABackbone` (vision tower, projector, LM), one
action head from :data:`~.heads.HEADS` chosen by ``VLAConfig.head``, and an optional value head
(an MLP on the masked mean of the prefix's hidden states: PPO's critic shares the backbone pass
that ``evaluate`` already makes).
"""
from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from .backbone import VLABackbone, as_tensor, build_tokenizer
from .config import VLAConfig
from .heads import build_head

__all__ = ["VLAPolicy"]

Obs = Mapping[str, Any]


class VLAPolicy(nn.Module):
    """A VLA as an RL / imitation policy. Build with ``VLAPolicy(cfg, tokenizer)`` (or through the
    ``vla`` entry of the policy registry, which trains the tokenizer on the suite's instructions);
    ``tokenizer=None`` trains one on ``instructions`` (or the fallback corpus)."""

    discrete = False  # actions are continuous [B, H, A] whatever the head's internals

    def __init__(self, cfg: VLAConfig, tokenizer=None, instructions: list[str] | None = None):
        super().__init__()
        if tokenizer is None:
            tokenizer = build_tokenizer(instructions, vocab_size=cfg.tokenizer_vocab)
        cfg = cfg.replace(text_vocab=max(int(cfg.text_vocab), len(tokenizer)))
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.chunk = int(cfg.chunk)
        self.act_dim = int(cfg.action_dim)
        self.action_shape = (self.act_dim,)
        self.head_dim = self.chunk * self.act_dim
        self.has_critic = bool(cfg.value_head)
        self.obs_rms = None
        self.action_space = gym.spaces.Box(np.array(cfg.action_low, np.float32), np.array(cfg.action_high, np.float32))
        self.backbone = VLABackbone(cfg, tokenizer)
        self.head = build_head(cfg, self.backbone)
        if self.has_critic:
            D = cfg.lm_hidden
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed + 2)
                self.value_head: nn.Module | None = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 1))
        else:
            self.value_head = None
        if cfg.lora_rank > 0:
            from .lora import apply_vla_lora
            apply_vla_lora(self)

    # ---- helpers --------------------------------------------------------------------------------
    def _batch(self, obs: Obs) -> int:
        return int(obs[self.cfg.cameras[0]].shape[0])

    def _value_of(self, pooled: Tensor) -> Tensor:
        if self.value_head is None:
            return pooled.new_zeros(pooled.shape[0])
        return self.value_head(pooled).squeeze(-1).float()

    def _action(self, action: Any) -> Tensor:
        return as_tensor(action, self.backbone.device).float()

    # ---- contract -------------------------------------------------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """The randomness ``act`` consumes for ``batch`` rows (layout depends on the head)."""
        return self.head.sample_noise(batch, generator)

    def env_action(self, stored: Tensor) -> Tensor:
        """The executed actions [B, H, A] of what ``act`` returned: identity for the discrete and
        chunk heads, the chain's last state for the flow head (see :mod:`.flow_head`)."""
        return self.head.env_action(stored)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Actions [B, H, A], their log-probs [B] and values [B]. ``noise``: rows of
        :meth:`sample_noise` (default: drawn from torch's global generator)."""
        if noise is not None:
            noise = noise.to(self.backbone.device)
        action, log_prob, pooled = self.head.act(self.backbone, obs, deterministic, noise)
        return action, log_prob, self._value_of(pooled)

    def evaluate(self, obs: Obs, action: Any) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probs [B], entropies [B] and values [B] of stored actions, with gradients."""
        log_prob, entropy, pooled = self.head.evaluate(self.backbone, obs, self._action(action))
        return log_prob, entropy, self._value_of(pooled)

    def value(self, obs: Obs) -> Tensor:
        """Values [B] from one prefix pass (zeros without a value head)."""
        if self.value_head is None:
            return torch.zeros(self._batch(obs), device=self.backbone.device)
        p, hidden = self.backbone.encode(obs)
        return self._value_of(self.backbone.pooled(p, hidden))

    def bc_loss(self, obs: Obs, actions: Any, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Behaviour-cloning terms for expert ``actions`` [B, H, A]: ``loss_*`` keys (token
        cross-entropy, L1 or flow matching, by head) and detached metrics; ``loss`` is their sum.
        ``generator``: the flow head's noise and times (a fixed one gives a comparable loss)."""
        out = self.head.bc_loss(self.backbone, obs, self._action(actions), generator=generator)
        out["loss"] = sum(v for k, v in out.items() if k.startswith("loss_"))
        return out

    def update_obs_stats(self, obs: Obs) -> None:
        """No running statistics: images are normalised by fixed mean/std inside the model."""

    def forward(self, obs: Obs, action: Any = None, deterministic: bool = False):
        """``evaluate`` when an action is given, else ``act`` (lets DDP see the call)."""
        if action is None:
            return self.act(obs, deterministic)
        return self.evaluate(obs, action)

    # ---- sizes and adapters ---------------------------------------------------------------------
    def num_parameters(self, trainable: bool = False) -> int:
        """Parameter count (tied embeddings once), of the trainable ones only if asked."""
        seen: set[int] = set()
        total = 0
        for p in self.parameters():
            if id(p) in seen or (trainable and not p.requires_grad):
                continue
            seen.add(id(p))
            total += p.numel()
        return total

    def merge_lora(self) -> "VLAPolicy":
        """Folds LoRA adapters into the base weights (export; what a rollout engine loads).
        In place; the config then says ``lora_rank=0``, so a saved merged policy loads plain."""
        from .lora import merge_vla_lora
        return merge_vla_lora(self)
