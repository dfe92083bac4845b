"""Imitation losses: behaviour cloning on expert-labelled states (BC, DAgger, HG-DAgger share it;
they differ in which states get labelled, which is the env worker's and the registry's business).

Same convention as the other losses: ``loss_*`` terms plus detached diagnostics.
"""

from __future__ import annotations

from torch import Tensor

from rlweave.algorithms.offpolicy import LearnerNets, LossOptions

__all__ = ["bc_loss"]


def bc_loss(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions | None = None, update_actor: bool = True) -> dict[str, Tensor]:
    """Mean squared error between the actor's deterministic action and the label
    (``batch["action"]``: the expert's, or the dataset's for offline BC), in the env's action
    units. Only ``nets.actor`` is used; the signature is every learner loss's."""
    action, _ = nets.actor.sample(batch["obs"], deterministic=True)
    err = (action - batch["action"].to(action.dtype)).square().sum(-1)
    return {"loss_bc": err.mean(), "action_error": err.detach().mean().sqrt()}
