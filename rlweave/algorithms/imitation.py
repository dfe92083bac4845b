"""Imitation losses: behaviour cloning on expert-labelled states (BC, DAgger, HG-DAgger share it;
they differ in which states get labelled, which is the env worker's and the registry's business).

Same convention as the other losses: ``loss_*`` terms plus detached diagnostics.
"""

from __future__ import annotations

import inspect

from torch import Tensor

from rlweave.algorithms.contracts import PolicySFTLossInput
from rlweave.algorithms.offpolicy import LearnerNets, LossOptions

__all__ = ["bc_loss", "policy_sft_loss"]


def bc_loss(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions | None = None, update_actor: bool = True) -> dict[str, Tensor]:
    """Mean squared error between the actor's deterministic action and the label
    (``batch["action"]``: the expert's, or the dataset's for offline BC), in the env's action
    units. Only ``nets.actor`` is used; the signature is every learner loss's."""
    action, _ = nets.actor.sample(batch["obs"], deterministic=True)
    err = (action - batch["action"].to(action.dtype)).square().sum(-1)
    return {"loss_bc": err.mean(), "action_error": err.detach().mean().sqrt()}


def policy_sft_loss(inp: PolicySFTLossInput) -> dict[str, Tensor]:
    """``sft`` (kind policy_sft): the policy's own imitation loss, ``policy.bc_loss(obs, actions)``.
    Why the policy's: what "imitate this action" means depends on the head (cross-entropy over
    action tokens, L1 on a parallel chunk, flow matching on a velocity field), and the head knows.
    Per-sample ``weights`` go to policies whose ``bc_loss`` takes them."""
    bc = getattr(inp.policy, "bc_loss", None)
    if bc is None:
        raise TypeError(f"policy {type(inp.policy).__name__} has no bc_loss(obs, actions): it cannot be trained by algorithm sft")
    if inp.weights is None:
        return bc(inp.obs, inp.actions)
    if "weights" not in inspect.signature(bc).parameters:
        raise TypeError(f"policy {type(inp.policy).__name__}.bc_loss takes no per-sample weights")
    return bc(inp.obs, inp.actions, weights=inp.weights)
