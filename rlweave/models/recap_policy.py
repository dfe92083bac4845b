"""A flow policy conditioned on RECAP's advantage indicator (registry name ``recap_flow_mlp``).

RECAP trains one policy on all of a run's experience (demonstrations, autonomous rollouts of any
quality, corrections) with its ordinary imitation loss, and tells it, per sample, whether the
action was better than the value function expected ("good", indicator 1) or not (0). At inference
the policy is asked for "good" actions only. The indicator is therefore an *input*, not a loss
weight: the bad rows still teach the policy what the states look like and how to move, and the
conditioning keeps their actions apart from the good ones.

**Where the indicator enters.** The velocity field's first layer is a linear map of the
observation; the indicator is a one-hot of three slots (0 not good, 1 good, 2 unknown: rows
trained without it, ``algorithm.recap.indicator_dropout``) appended to the normalised observation
of that layer only. That is exactly a learned embedding added to the observation features, and it
leaves the normaliser, the critic and every caller of ``act``/``evaluate`` untouched: they see
the env's observation, and the indicator defaults to ``condition`` (1, "good"). The indicator's
columns start at zero, so the untrained conditioning changes nothing (a BC checkpoint loaded
through ``init.checkpoint`` acts as before).

``guidance`` > 1 mixes in classifier-free guidance when acting, ``v = v_unknown + guidance *
(v_good - v_unknown)``; it needs the unknown slot trained (indicator dropout > 0).
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flow_matching import flow_matching_loss
from .flow_policy import FlowPolicy

__all__ = ["RecapFlowPolicy", "INDICATOR_SLOTS", "GOOD", "NOT_GOOD", "UNKNOWN"]

NOT_GOOD, GOOD, UNKNOWN = 0, 1, 2
INDICATOR_SLOTS = 3


class RecapFlowPolicy(FlowPolicy):
    """:class:`FlowPolicy` whose velocity also sees an advantage indicator (0, 1 or 2 = unknown).

    ``condition``: the indicator used wherever none is given (acting, evaluating, the DSRL
    decoder): 1, "good". ``guidance``: classifier-free guidance weight when acting with the
    default condition (1 = plain conditioning)."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Space, condition: int = GOOD, guidance: float = 1.0,
                 **kwargs):
        super().__init__(obs_dim, action_space, **kwargs)
        if condition not in (NOT_GOOD, GOOD, UNKNOWN):
            raise ValueError(f"condition must be 0 (not good), 1 (good) or 2 (unknown), got {condition!r}")
        if guidance < 0:
            raise ValueError(f"guidance must be >= 0, got {guidance!r}")
        self.condition = int(condition)
        self.guidance = float(guidance)
        base = self.in_obs
        self.in_obs = nn.Linear(self.obs_dim + INDICATOR_SLOTS, base.out_features)
        with torch.no_grad():  # the observation part as FlowPolicy initialises it; the indicator's columns at 0
            self.in_obs.weight.zero_()
            self.in_obs.weight[:, :self.obs_dim].copy_(base.weight)
            self.in_obs.bias.copy_(base.bias)

    def _with_indicator(self, obs_n: Tensor, indicator: Tensor | int) -> Tensor:
        if not torch.is_tensor(indicator):
            indicator = torch.full((obs_n.shape[0],), int(indicator), device=obs_n.device, dtype=torch.long)
        onehot = F.one_hot(indicator.to(device=obs_n.device, dtype=torch.long).reshape(-1), INDICATOR_SLOTS)
        return torch.cat([obs_n, onehot.to(obs_n.dtype)], dim=-1)

    def velocity_fn(self, obs_n: Tensor, indicator: Tensor | int | None = None) -> Callable:
        """The velocity closure over normalised observations [B, obs_dim] and an indicator ([B]
        or one value; default ``condition``), with classifier-free guidance when ``guidance`` != 1
        and no indicator is given."""
        if indicator is not None or self.guidance == 1.0:
            cond = self.condition if indicator is None else indicator
            return super().velocity_fn(self._with_indicator(obs_n, cond))
        good = super().velocity_fn(self._with_indicator(obs_n, self.condition))
        free = super().velocity_fn(self._with_indicator(obs_n, UNKNOWN))
        w = self.guidance

        def guided(x: Tensor, t: Tensor):
            g, u = good(x, t), free(x, t)
            if isinstance(g, tuple):  # noise head: guide the velocity, keep the conditioned std
                return u[0] + w * (g[0] - u[0]), g[1]
            return u + w * (g - u)

        return guided

    def bc_loss(self, obs: Tensor, actions: Tensor, indicator: Tensor | None = None,
                generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Flow matching of demonstration chunks ``actions`` given each row's ``indicator`` [B]
        (None: the default condition, i.e. plain BC of "good" actions)."""
        obs_n = self._prep(obs)
        target = actions.to(obs_n.dtype).reshape(obs_n.shape[0], self.chunk, self.act_dim)
        velocity = self.velocity_fn(obs_n, self.condition if indicator is None else indicator)
        return {"loss_flow": flow_matching_loss(velocity, target, generator=generator, time_sampling=self.time_sampling)}
