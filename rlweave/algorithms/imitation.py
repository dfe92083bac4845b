"""Imitation losses: behaviour cloning on expert-labelled states (BC, DAgger, HG-DAgger share it;
they differ in which states get labelled, which is the env worker's and the registry's business).

Same convention as the other losses: ``loss_*`` terms plus detached diagnostics.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["bc_loss"]


def bc_loss(batch: dict[str, Tensor], actor, critic=None, target_critic=None, log_alpha=None, target_entropy: float = 0.0,
            update_actor: bool = True, autotune_alpha: bool = False) -> dict[str, Tensor]:
    """Mean squared error between the actor's deterministic action and the expert's label
    (``batch["action"]``), in the env's action units. The critic arguments are unused: the learner
    calls every registered loss the same way."""
    action, _ = actor.sample(batch["obs"], deterministic=True)
    err = (action - batch["action"].to(action.dtype)).square().sum(-1)
    return {"loss_bc": err.mean(), "action_error": err.detach().mean().sqrt()}
