"""Off-policy and offline actor-critic losses: SAC, CrossQ, RLPD (SAC's with a LayerNorm
ensemble) and IQL.

Same convention as :mod:`rlweave.algorithms.losses`: a loss returns a dict whose ``loss_*`` terms
are differentiable scalars and whose other entries are detached diagnostics. The terms are built
so that their gradients touch disjoint parameters, which lets a learner take *one* backward pass
over their sum and one optimiser step:

* ``loss_qvalue`` trains the critic (targets are computed without gradient);
* ``loss_actor`` trains the actor through the critic used as a constant function
  (``critic(..., detach=True)``): no critic gradient is computed for it;
* ``loss_alpha`` trains the temperature ``log_alpha`` against detached log-probs.

SAC, RLPD and CrossQ are :class:`ActorCriticLoss` objects: the critic's term and the actor's
(with the temperature's) come from two functions, which a learner may also run on two threads at
the same time, since they read the same weights and write disjoint gradients.

Compared with SB3's SAC, which steps alpha, then the critic, then computes the actor loss on the
updated critic, the actor here sees the critic from before this step's update (one step apart, as
in several JAX implementations); everything else (min over critics, target entropy, SB3's
0.5-weighted sum of per-critic MSEs) matches.

Every loss has the signature ``loss(batch, nets, opts, update_actor=True)``: ``nets`` are the
learner's modules (:class:`LearnerNets`; a loss uses those it needs) and ``opts`` the algorithm's
scalar settings (:class:`LossOptions`), so the learner calls every registered loss the same way
and a new algorithm with a new module (IQL's value network) adds a field, not a parameter to
every loss.

Batches come from the replay buffer with ``discount = gamma**k * (1 - terminated)`` already folded
in for k-step returns (``k`` <= n), so the losses know nothing about n-step or episode ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

__all__ = [
    "ActorCriticLoss", "LearnerNets", "LossOptions", "has_concurrent_parts", "sac_critic_terms", "sac_actor_terms", "crossq_critic_terms",
    "sac_loss", "crossq_loss", "rlpd_loss", "iql_loss", "soft_update",
]


@dataclass
class LearnerNets:
    """The modules an off-policy or offline learner holds; ``None`` where its algorithm has none.

    ``actor``: :class:`~rlweave.models.SquashedGaussianPolicy`; ``critic`` / ``target``:
    :class:`~rlweave.models.QEnsemble` ``Q(s, a) -> [E, B]`` and its Polyak copy; ``value``: a
    one-member ensemble on states alone ``V(s) -> [1, B]`` (IQL); ``log_alpha``: SAC's temperature.
    """

    actor: nn.Module
    critic: nn.Module | None = None
    target: nn.Module | None = None
    value: nn.Module | None = None
    log_alpha: Tensor | None = None


@dataclass(frozen=True)
class LossOptions:
    """Scalar settings of the losses (from ``algorithm.*``). ``target_entropy`` and
    ``autotune_alpha``: SAC's temperature; ``expectile``, ``temperature`` and ``max_weight``:
    IQL's value expectile, advantage inverse temperature (beta) and weight clip. ``bc_coef``: the
    weight of SAC's action regularisation towards the batch's actions (:func:`sac_actor_terms`)."""

    target_entropy: float = 0.0
    autotune_alpha: bool = True
    expectile: float = 0.7
    temperature: float = 3.0
    max_weight: float = 100.0
    bc_coef: float = 0.0


def _critic_regression(q: Tensor, target: Tensor, alpha: Tensor) -> dict[str, Tensor]:
    """The critics' regression onto their (detached) targets, SB3's 0.5-weighted sum of per-critic
    MSEs over ``q`` [E, B]."""
    return {"loss_qvalue": 0.5 * (q - target).square().mean(1).sum(), "q_mean": q.detach().mean(), "alpha": alpha}


def sac_critic_terms(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions,
                     target_subset: int | None = None) -> dict[str, Tensor]:
    """SAC's critic part: ``Q(s, a)`` regresses ``r + discount * (min Q_target(s', a') - alpha log pi(a'|s'))``
    with ``a'`` sampled from the actor. The minimum is over the target ensemble, or over a random
    subset of ``target_subset`` of its members (REDQ/RLPD)."""
    obs, next_obs = batch["obs"], batch["next_obs"]
    alpha = nets.log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = nets.actor.sample(next_obs)
        next_qs = nets.target(next_obs, next_action)
        if target_subset is not None and target_subset < next_qs.shape[0]:
            next_qs = next_qs[torch.randperm(next_qs.shape[0], device=next_qs.device)[:target_subset]]
        next_q = next_qs.min(0).values - alpha * next_log_prob
        target = batch["reward"] + batch["discount"] * next_q
    return _critic_regression(nets.critic(obs, batch["action"]), target, alpha)


def sac_actor_terms(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions, reduce: str = "min",
                    batch_stats: bool = True) -> dict[str, Tensor]:
    """SAC's actor part: the actor maximises the critics' ``min`` (or ``mean``) at its own
    reparameterised action minus ``alpha log pi``, through the critic with detached weights
    (``batch_stats=False``: BatchNorm critics use their running statistics); the temperature is
    tuned towards ``opts.target_entropy`` against detached log-probs; with ``opts.bc_coef`` the
    action is also pulled towards the batch's (``loss_bc``). The action's noise is
    ``batch["actor_noise"]`` when given (:meth:`ActorCriticLoss.prepare`)."""
    obs = batch["obs"]
    alpha = nets.log_alpha.detach().exp()
    action, log_prob = nets.actor.sample(obs, noise=batch.get("actor_noise"))
    qs = nets.critic(obs, action, detach=True, batch_stats=batch_stats)
    q_pi = qs.mean(0) if reduce == "mean" else qs.min(0).values
    out = {"loss_actor": (alpha * log_prob - q_pi).mean(), "entropy": -log_prob.detach().mean()}
    if opts.bc_coef:  # offline-to-online: stay near the data's actions while the critics learn (SAC Flow's)
        out["loss_bc"] = opts.bc_coef * (action - batch["action"].to(action.dtype)).square().mean()
    if opts.autotune_alpha:
        out["loss_alpha"] = -(nets.log_alpha * (log_prob.detach() + opts.target_entropy)).mean()
    return out


def crossq_critic_terms(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions) -> dict[str, Tensor]:
    """CrossQ's critic part: no target network; the critic (with BatchNorm) sees the current and the
    next state-actions in *one* forward pass, so both are normalised with the same batch statistics
    (and the running ones move), and the next-state values (detached) serve as the target."""
    obs, next_obs = batch["obs"], batch["next_obs"]
    B = obs.shape[0]
    alpha = nets.log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = nets.actor.sample(next_obs)
    q_all = nets.critic(torch.cat([obs, next_obs]), torch.cat([batch["action"].to(next_action.dtype), next_action]))
    q, next_q = q_all[:, :B], q_all[:, B:].detach()
    target = batch["reward"] + batch["discount"] * (next_q.min(0).values - alpha * next_log_prob)
    return _critic_regression(q, target, alpha)


@dataclass(frozen=True)
class ActorCriticLoss:
    """A loss in two parts: ``critic(batch, nets, opts)`` (the critics' regression) and
    ``actor(batch, nets, opts)`` (the actor's and the temperature's terms, through the critic with
    detached weights), each a dict of ``loss_*`` terms and diagnostics.

    Called like any loss, ``loss(batch, nets, opts, update_actor=True)``, it runs the critic part
    and then, on actor steps, the actor part. When ``concurrent``, neither part reads anything the
    other writes before the optimiser step (parameters change only in the step; gradients land on
    disjoint parameters), so a learner may run them at the same time on two threads
    (``actor.update_threads=2``). Either way, :meth:`prepare` draws the actor's noise first, so the
    random stream, and with it the update, does not depend on which part runs first. CrossQ is not
    concurrent: its actor part reads the BatchNorm statistics the critic part's forward pass moves.
    """

    critic: Callable[..., dict[str, Tensor]]
    actor: Callable[..., dict[str, Tensor]]
    concurrent: bool = True

    @staticmethod
    def prepare(batch: dict[str, Tensor], nets: LearnerNets) -> dict[str, Tensor]:
        """``batch`` with the noise of the actor's reparameterised action drawn (``actor_noise``)."""
        noise = nets.actor.sample_noise(batch["obs"].shape[0]).to(batch["obs"].device)
        return {**batch, "actor_noise": noise}

    def __call__(self, batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions,
                 update_actor: bool = True) -> dict[str, Tensor]:
        if update_actor:
            batch = self.prepare(batch, nets)
        out = self.critic(batch, nets, opts)
        if update_actor:
            out.update(self.actor(batch, nets, opts))
        return out


def has_concurrent_parts(loss) -> bool:
    """Whether a registered loss is an :class:`ActorCriticLoss` whose parts may run at the same
    time (what ``actor.update_threads=2`` needs)."""
    return isinstance(loss, ActorCriticLoss) and loss.concurrent


# Soft actor-critic (Haarnoja et al. 2018, with automatic entropy tuning). ``batch``: ``obs`` [B, O],
# ``action`` [B, A], ``reward`` [B], ``next_obs`` [B, O], ``discount`` [B]; uses ``nets.actor``,
# ``nets.critic``, ``nets.target`` and ``nets.log_alpha``.
sac_loss = ActorCriticLoss(critic=sac_critic_terms, actor=sac_actor_terms)

# RLPD (Ball et al. 2023): SAC's update with the target taken as the minimum of 2 randomly chosen
# members of a (LayerNorm) critic ensemble and the actor trained on the ensemble mean. The rest of
# RLPD is data and config: symmetric offline/online batches (``replay.offline_share=0.5``), a high
# update-to-data ratio, ``critic.norm=layer``, ``critic.num_q=10``.
rlpd_loss = ActorCriticLoss(critic=partial(sac_critic_terms, target_subset=2), actor=partial(sac_actor_terms, reduce="mean"))

# CrossQ (Bhatt et al. 2024): no target network, BatchNorm critics (see crossq_critic_terms); the
# actor's loss uses the critic with its running statistics. ``nets.target`` is not used.
crossq_loss = ActorCriticLoss(critic=crossq_critic_terms, actor=partial(sac_actor_terms, batch_stats=False), concurrent=False)


def iql_loss(batch: dict[str, Tensor], nets: LearnerNets, opts: LossOptions, update_actor: bool = True) -> dict[str, Tensor]:
    """Implicit Q-learning (Kostrikov et al. 2022): never queries the critic on actions outside the
    data.

    * ``loss_value``: expectile regression of ``V(s)`` towards the target critics' minimum
      ``Q(s, a)`` on dataset actions (``opts.expectile`` > 0.5 leans towards the best actions);
    * ``loss_qvalue``: ``Q(s, a)`` regresses ``r + discount * V(s')`` (sum of per-critic MSEs);
    * ``loss_actor``: advantage-weighted regression, ``-exp(beta * (Q - V))`` (clipped at
      ``opts.max_weight``) times the log-density of the dataset action
      (:meth:`~rlweave.models.SquashedGaussianPolicy.mean_log_prob`).

    The three terms touch disjoint modules (value, critic, actor) and the targets are detached, so
    one backward pass serves them all; the reference implementation instead steps V, then Q with
    the new V, then the actor, which differs by one update of V in Q's target."""
    obs, action = batch["obs"], batch["action"]
    with torch.no_grad():
        q_target = nets.target(obs, action).min(0).values
        next_v = nets.value(batch["next_obs"])[0]
        target = batch["reward"] + batch["discount"] * next_v
    v = nets.value(obs)[0]
    diff = q_target - v
    weight = torch.where(diff < 0, 1.0 - opts.expectile, opts.expectile)
    out: dict[str, Tensor] = {"loss_value": (weight * diff.square()).mean()}
    q = nets.critic(obs, action)
    out["loss_qvalue"] = (q - target).square().mean(1).sum()
    out["q_mean"] = q.detach().mean()
    out["v_mean"] = v.detach().mean()
    if update_actor:
        with torch.no_grad():
            adv_weight = torch.exp(opts.temperature * diff.detach()).clamp(max=opts.max_weight)
        out["loss_actor"] = -(adv_weight * nets.actor.mean_log_prob(obs, action)).mean()
        out["adv_weight"] = adv_weight.mean()
    return out


@torch.no_grad()
def soft_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """Polyak averaging ``target <- (1 - tau) target + tau online`` over parameters, in one
    multi-tensor call (buffers such as BatchNorm statistics are copied)."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
    for tb, ob in zip(target.buffers(), online.buffers()):
        tb.copy_(ob)
