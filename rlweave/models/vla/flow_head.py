"""pi0's flow-matching action head for the VLA policy: a small action expert that reads the
backbone's prefix and predicts the velocity of a noisy action chunk.

The expert is ``expert_layers`` pre-norm transformer decoder layers of width ``expert_hidden``: the
H action tokens attend to each other (bidirectionally, as pi0's action block) and, by
cross-attention, to the prefix's last hidden states projected to the expert's width. pi0 instead
shares attention with the VLM layer by layer (a mixture of two transformers); cross-attending to
the final prefix states is the cheaper variant (the prefix is encoded once per decision and only
the expert runs K times), and it keeps the LM a stock Hugging Face model. A token's input is
``W_a x_t + W_t emb(t) + pos``: the noisy action, a sinusoidal time embedding, and a learned
position per chunk step.

The math (loss, samplers, chain log-density) is :mod:`rlweave.models.flow_matching`, shared with
the state-based ``flow_mlp`` policy, and so is its convention for RL: with a stochastic sampler
(``flow_sde``, ``flow_noise``) ``act`` returns as its action the whole denoising chain
[B, K + 1, H, A] (the stored action), ``env_action`` picks the executed [B, H, A] out of it, and
``evaluate(obs, chain)`` recomputes the chain's log-density (one folded expert call for all K
steps). ``deterministic=True`` integrates the ODE from x_0 = 0 (or the first block of a given
noise) and reports log-prob 0. ``flow_store_chain=False`` returns executed actions (serving).
Noise layout: [B, (K + 1) * H * A] standard normal, x_0 then one draw per step.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..flow_matching import chain_stats, flow_matching_loss, flow_sde_sigmas, sample_chain
from .backbone import Prefix, VLABackbone
from .config import VLAConfig
from .heads import ActionHead, register_head

__all__ = ["FlowHead", "ActionExpert"]

_STOCHASTIC = ("flow_sde", "flow_noise")


class ActionExpert(nn.Module):
    """Velocity network over [n, H, A] noisy chunks, conditioned on a projected prefix."""

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        E, H, A = cfg.expert_hidden, cfg.chunk, cfg.action_dim
        half = max(1, E // 4)
        self.register_buffer("time_freqs", torch.exp(torch.linspace(0.0, math.log(1000.0), half)), persistent=False)
        self.context = nn.Linear(cfg.lm_hidden, E)
        self.in_action = nn.Linear(A, E)
        self.in_time = nn.Sequential(nn.Linear(2 * half, E), nn.SiLU(), nn.Linear(E, E))
        self.position = nn.Parameter(torch.randn(H, E) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(E, cfg.expert_heads, dim_feedforward=2 * E, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(cfg.expert_layers))
        self.norm = nn.LayerNorm(E)
        self.out = nn.Linear(E, A)

    def forward(self, x: Tensor, t: Tensor, memory: Tensor, pad: Tensor) -> Tensor:
        """``x`` [n, H, A], ``t`` [n], ``memory`` [n, P, E] (already projected), ``pad`` [n, P]
        True where the prefix is padding -> velocity [n, H, A]."""
        ang = t.to(memory.dtype).unsqueeze(-1) * self.time_freqs
        temb = self.in_time(torch.cat([ang.sin(), ang.cos()], -1)).unsqueeze(1)
        h = self.in_action(x.to(memory.dtype)) + temb + self.position
        for layer in self.layers:
            h = layer(h, memory, memory_key_padding_mask=pad)
        return self.out(self.norm(h))


@register_head
class FlowHead(ActionHead):
    """pi0-style flow matching on action chunks (see the module docstring)."""

    name = "flow"

    def __init__(self, cfg: VLAConfig, backbone: VLABackbone):
        super().__init__(cfg, backbone)
        if cfg.flow_sampler not in _STOCHASTIC:
            raise ValueError(f"vla: flow_sampler must be one of {_STOCHASTIC} (deterministic=True uses the ODE), "
                             f"got {cfg.flow_sampler!r}")
        self.steps = int(cfg.flow_steps)
        self.sampler = cfg.flow_sampler
        self.store_chain = bool(cfg.flow_store_chain)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 3)
            self.expert = ActionExpert(cfg)
        self.noise_log_std = (nn.Parameter(torch.full((self.steps, self.H, self.A), math.log(cfg.flow_noise_std)))
                              if self.sampler == "flow_noise" else None)
        self.register_buffer("sde_sigmas", flow_sde_sigmas(self.steps, float(cfg.flow_noise_level)), persistent=False)

    def _noise_std(self) -> Tensor:
        return self.sde_sigmas if self.noise_log_std is None else self.noise_log_std.exp()

    def velocity_fn(self, prefix: Prefix, hidden: Tensor):
        """The velocity closure over one encoded prefix (projected once). Accepts a multiple of
        the batch (steps folded, step-major) by repeating the conditioning."""
        memory = self.expert.context(hidden[:, : prefix.length])
        pad = prefix.mask == 0
        B = memory.shape[0]

        def velocity(x: Tensor, t: Tensor) -> Tensor:
            n = x.shape[0]
            if n == B:
                return self.expert(x, t, memory, pad)
            r = n // B
            return self.expert(x, t, memory.repeat(r, 1, 1), pad.repeat(r, 1))

        return velocity

    # ---- contract -----------------------------------------------------------------------------
    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(batch, (self.steps + 1) * self.H * self.A, generator=generator)

    def env_action(self, stored: Tensor) -> Tensor:
        return stored if stored.dim() == 3 else stored[:, -1]

    def act(self, bb, obs, deterministic, noise):
        p, hidden = bb.encode(obs)
        B = hidden.shape[0]
        eps = None
        if noise is not None:
            eps = noise.to(hidden).view(B, self.steps + 1, self.H, self.A)
        elif not deterministic:
            eps = torch.randn(B, self.steps + 1, self.H, self.A, device=hidden.device, dtype=hidden.dtype)
        x0 = eps[:, 0] if eps is not None else hidden.new_zeros(B, self.H, self.A)
        velocity = self.velocity_fn(p, hidden)
        if deterministic:
            s = sample_chain(velocity, x0, self.steps, "ode")
        else:
            s = sample_chain(velocity, x0, self.steps, self.sampler, self._noise_std(), step_noise=eps[:, 1:])
        action = s.chain if self.store_chain else s.actions
        return action, s.log_prob.float(), bb.pooled(p, hidden)

    def evaluate(self, bb, obs, action):
        if action.dim() != 4 or action.shape[1] != self.steps + 1:
            raise ValueError(f"the flow head's evaluate needs the stored chain [B, {self.steps + 1}, {self.H}, {self.A}] "
                             f"that act returned, got shape {tuple(action.shape)}")
        p, hidden = bb.encode(obs)
        stats = chain_stats(self.velocity_fn(p, hidden), action.to(hidden.dtype), self.sampler, self._noise_std(),
                            fold_steps=True)
        return stats.log_prob.float(), stats.entropy.float(), bb.pooled(p, hidden)

    def bc_loss(self, bb, obs, actions, generator=None):
        p, hidden = bb.encode(obs)
        target = self.env_action(actions).to(hidden.dtype)
        loss = flow_matching_loss(self.velocity_fn(p, hidden), target, generator=generator,
                                  time_sampling=self.cfg.flow_time_sampling)
        return {"loss_flow": loss}
