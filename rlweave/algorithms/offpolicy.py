"""Off-policy actor-critic losses: SAC and CrossQ (RLPD reuses SAC's with a LayerNorm ensemble).

Same convention as :mod:`rlweave.algorithms.losses`: a loss returns a dict whose ``loss_*`` terms
are differentiable scalars and whose other entries are detached diagnostics. The terms are built
so that their gradients touch disjoint parameters, which lets a learner take *one* backward pass
over their sum and one optimiser step:

* ``loss_qvalue`` trains the critic (targets are computed without gradient);
* ``loss_actor`` trains the actor through the critic used as a constant function
  (``critic(..., detach=True)``): no critic gradient is computed for it;
* ``loss_alpha`` trains the temperature ``log_alpha`` against detached log-probs.

Compared with SB3's SAC, which steps alpha, then the critic, then computes the actor loss on the
updated critic, the actor here sees the critic from before this step's update (one step apart, as
in several JAX implementations); everything else (min over critics, target entropy, SB3's
0.5-weighted sum of per-critic MSEs) matches.

Batches come from the replay buffer with ``discount = gamma**k * (1 - terminated)`` already folded
in for k-step returns (``k`` <= n), so the losses know nothing about n-step or episode ends.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sac_loss", "crossq_loss", "rlpd_loss", "soft_update"]


def _shared_terms(out: dict, q: Tensor, target: Tensor, alpha: Tensor, actor, critic, obs: Tensor, log_alpha: Tensor,
                  target_entropy: float, update_actor: bool, autotune: bool, actor_reduce: str = "min",
                  batch_stats: bool = True) -> dict[str, Tensor]:
    """The terms SAC and its variants share once their critic values ``q`` [E, B] and targets are
    known: the critics' regression (SB3's 0.5-weighted sum of per-critic MSEs), and, on actor
    steps, the actor's loss through the critic with detached weights (reduced over the ensemble by
    ``min`` or ``mean``) and the temperature's loss."""
    out["loss_qvalue"] = 0.5 * (q - target).square().mean(1).sum()
    out["q_mean"] = q.detach().mean()
    if update_actor:
        action, log_prob = actor.sample(obs)
        qs = critic(obs, action, detach=True, batch_stats=batch_stats)
        q_pi = qs.mean(0) if actor_reduce == "mean" else qs.min(0).values
        out["loss_actor"] = (alpha * log_prob - q_pi).mean()
        if autotune:
            out["loss_alpha"] = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
        out["entropy"] = -log_prob.detach().mean()
    out["alpha"] = alpha
    return out


def sac_loss(
    batch: dict[str, Tensor],
    actor,
    critic,
    target_critic,
    log_alpha: Tensor,
    target_entropy: float,
    update_actor: bool = True,
    autotune_alpha: bool = True,
    target_subset: int | None = None,
    actor_reduce: str = "min",
) -> dict[str, Tensor]:
    """Soft actor-critic (Haarnoja et al. 2018, with automatic entropy tuning).

    ``batch``: ``obs`` [B, O], ``action`` [B, A], ``reward`` [B], ``next_obs`` [B, O],
    ``discount`` [B]. ``critic`` / ``target_critic``: :class:`~rlweave.models.QEnsemble`
    (``[E, B]`` outputs). The target is the minimum over the target ensemble, or over a random
    subset of ``target_subset`` of its members (REDQ/RLPD); the actor maximises the minimum
    (``actor_reduce="min"``) or the mean (``"mean"``) of the critics."""
    obs, next_obs = batch["obs"], batch["next_obs"]
    alpha = log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = actor.sample(next_obs)
        next_qs = target_critic(next_obs, next_action)
        if target_subset is not None and target_subset < next_qs.shape[0]:
            next_qs = next_qs[torch.randperm(next_qs.shape[0], device=next_qs.device)[:target_subset]]
        next_q = next_qs.min(0).values - alpha * next_log_prob
        target = batch["reward"] + batch["discount"] * next_q
    q = critic(obs, batch["action"])
    return _shared_terms({}, q, target, alpha, actor, critic, obs, log_alpha, target_entropy, update_actor, autotune_alpha,
                         actor_reduce=actor_reduce)


def rlpd_loss(batch: dict[str, Tensor], actor, critic, target_critic, log_alpha: Tensor, target_entropy: float,
              update_actor: bool = True, autotune_alpha: bool = True) -> dict[str, Tensor]:
    """RLPD (Ball et al. 2023): SAC's update with the target taken as the minimum of 2 randomly
    chosen members of a (LayerNorm) critic ensemble and the actor trained on the ensemble mean. The
    rest of RLPD is data and config: symmetric offline/online batches (``replay.offline_share=0.5``),
    a high update-to-data ratio, ``critic.norm=layer``, ``critic.num_q=10``."""
    return sac_loss(batch, actor, critic, target_critic, log_alpha, target_entropy, update_actor, autotune_alpha,
                    target_subset=2, actor_reduce="mean")


def crossq_loss(
    batch: dict[str, Tensor],
    actor,
    critic,
    target_critic,
    log_alpha: Tensor,
    target_entropy: float,
    update_actor: bool = True,
    autotune_alpha: bool = True,
) -> dict[str, Tensor]:
    """CrossQ (Bhatt et al. 2024): no target network; the critic (with BatchNorm) sees the
    current and the next state-actions in *one* forward pass, so both are normalised with the same
    batch statistics, and the next-state values (detached) serve as the target. The actor's loss
    uses the critic with its running statistics. ``target_critic`` is ignored."""
    obs, next_obs = batch["obs"], batch["next_obs"]
    B = obs.shape[0]
    alpha = log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = actor.sample(next_obs)
    q_all = critic(torch.cat([obs, next_obs]), torch.cat([batch["action"].to(next_action.dtype), next_action]))
    q, next_q = q_all[:, :B], q_all[:, B:].detach()
    target = batch["reward"] + batch["discount"] * (next_q.min(0).values - alpha * next_log_prob)
    return _shared_terms({}, q, target, alpha, actor, critic, obs, log_alpha, target_entropy, update_actor, autotune_alpha,
                         batch_stats=False)


@torch.no_grad()
def soft_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """Polyak averaging ``target <- (1 - tau) target + tau online`` over parameters, in one
    multi-tensor call (buffers such as BatchNorm statistics are copied)."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
    for tb, ob in zip(target.buffers(), online.buffers()):
        tb.copy_(ob)
