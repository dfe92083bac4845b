"""Policy-gradient losses (PPO family).

Every loss returns a ``dict[str, Tensor]`` in the TorchRL style: keys starting with ``loss_``
are differentiable scalar terms, already weighted by their coefficients, so a trainer's total
loss is just :func:`total_loss` (their sum); every other key is a detached scalar diagnostic
for logging. Advantages/returns come from :mod:`rlweave.algorithms.advantages`; the losses do
not estimate anything themselves.

All inputs are elementwise-aligned tensors of any shape (``[B]`` per step, ``[B, L]`` per
token, ...). ``mask`` (1 = valid step/token, 0 = padding) turns every mean into a masked mean
over the valid elements only, so padding never moves the loss or the diagnostics.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlweave.algorithms.contracts import OnPolicyLossInput

__all__ = [
    "ppo_objective",
    "masked_mean",
    "ppo_policy_loss",
    "value_loss",
    "entropy_bonus",
    "ppo_loss",
    "total_loss",
    "weighted_value_loss",
    "ppo_value_objective",
    "value_part_of",
]


def masked_mean(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of ``x`` over all elements, or over the elements where ``mask != 0``.

    Invalid entries are selected away with ``torch.where`` (not multiplied by 0), so NaN/inf in
    padding cannot leak into the result. An all-zero mask gives 0, not NaN.
    """
    if mask is None:
        return x.mean()
    valid = torch.broadcast_to(mask, x.shape).bool()
    total = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    return total / valid.sum().clamp_min(1).to(x.dtype)


def ppo_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    mask: Tensor | None = None,
    importance_weights: Tensor | None = None,
    reduce: Callable[[Tensor, Tensor | None], Tensor] | None = None,
) -> dict[str, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017), with clip-higher and dual clip.

    ``ratio = exp(log_prob - old_log_prob)``; per element the loss is
    ``max(-A * ratio, -A * clamp(ratio, 1 - clip_eps, 1 + clip_eps_high))``: the pessimistic
    bound, so the update gains nothing from pushing the ratio outside the trust region.

    * ``clip_eps_high`` (DAPO, Yu et al. 2025) widens only the upper bound, letting
      low-probability tokens/actions with positive advantage grow faster, which fights entropy
      collapse. Defaults to ``clip_eps`` (symmetric clip).
    * ``dual_clip`` (Ye et al. 2020) caps the loss of negative-advantage elements at
      ``-dual_clip * A``: for A < 0 the plain surrogate is unbounded in the ratio, so one very
      stale sample with a huge ratio could dominate the batch. Must be > 1.
    * ``importance_weights`` (detached, elementwise) multiply the per-element loss: asynchronous
      PPO's correction for samples drawn by an older behaviour policy than ``old_log_prob``'s.
    * ``reduce(loss, mask)`` turns per-element losses into the scalar (default: masked mean over
      every valid element; language models choose per-token or per-sequence weighting, see
      :func:`rlweave.algorithms.llm.aggregate`). Diagnostics are always masked means.

    Returns:
        ``loss_policy`` (differentiable), and detached diagnostics: ``clip_fraction`` (share of
        elements where the clipped term was taken, i.e. whose gradient was cut),
        ``approx_kl`` (k3 estimator ``mean((ratio - 1) - log ratio)`` of KL(old || new)),
        ``ratio_mean``; plus ``dual_clip_fraction`` when ``dual_clip`` is set.
    """
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0, got {clip_eps}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if high < 0:
        raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (it caps the loss at dual_clip * |A|), got {dual_clip}")

    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    surr_unclipped = -advantages * ratio
    surr_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    loss = torch.maximum(surr_unclipped, surr_clipped)
    capped = None
    if dual_clip is not None:
        cap = -dual_clip * advantages
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
    if importance_weights is not None:
        loss = loss * importance_weights.detach()

    out = {"loss_policy": (reduce or masked_mean)(loss, mask)}
    with torch.no_grad():
        out["clip_fraction"] = masked_mean((surr_clipped > surr_unclipped).to(loss.dtype), mask)
        out["approx_kl"] = masked_mean((ratio - 1.0) - log_ratio, mask)
        out["ratio_mean"] = masked_mean(ratio, mask)
        if capped is not None:
            out["dual_clip_fraction"] = masked_mean(capped.to(loss.dtype), mask)
    return out


def value_loss(
    values: Tensor,
    returns: Tensor,
    old_values: Tensor | None = None,
    clip_eps: float | None = None,
    mask: Tensor | None = None,
) -> dict[str, Tensor]:
    """Critic regression loss ``0.5 * mean((V - R)^2)``, optionally PPO-clipped.

    With ``clip_eps`` and ``old_values``, the prediction is also clipped to
    ``old + clamp(V - old, -clip_eps, clip_eps)`` and the larger of the two squared errors is
    used, so (as for the policy) the critic gains nothing from moving far from the values that
    produced the advantages. Passing ``clip_eps`` without ``old_values`` is an error rather than
    a silent fall-back to the unclipped loss.

    Returns:
        ``loss_value`` (unweighted; :func:`ppo_loss` applies ``vf_coef``), plus the detached
        ``value_clip_fraction`` when clipping is on.
    """
    if clip_eps is not None and old_values is None:
        raise ValueError("value clipping (clip_eps) needs old_values")
    err = (values - returns) ** 2
    out: dict[str, Tensor] = {}
    if clip_eps is not None:
        assert old_values is not None
        v_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        err_clipped = (v_clipped - returns) ** 2
        out["value_clip_fraction"] = masked_mean((err_clipped > err).to(err.dtype), mask).detach()
        err = torch.maximum(err, err_clipped)
    return {"loss_value": 0.5 * masked_mean(err, mask), **out}


def entropy_bonus(entropy: Tensor, coef: float, mask: Tensor | None = None) -> dict[str, Tensor]:
    """Entropy regulariser: ``loss_entropy = -coef * mean(entropy)``.

    Negative because the trainer *minimises* the summed loss while we want to *keep* entropy
    (exploration). ``entropy`` is the detached mean, for logging.
    """
    mean = masked_mean(entropy, mask)
    return {"loss_entropy": -coef * mean, "entropy": mean.detach()}


def ppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    entropy: Tensor | None,
    values: Tensor | None = None,
    old_values: Tensor | None = None,
    returns: Tensor | None = None,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    value_clip: float | None = None,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    mask: Tensor | None = None,
    importance_weights: Tensor | None = None,
    reduce: Callable[[Tensor, Tensor | None], Tensor] | None = None,
) -> dict[str, Tensor]:
    """Full PPO objective: clipped policy loss + weighted value loss + entropy bonus.

    Critic-free algorithms (GRPO) pass ``values=None``: the result then has no ``loss_value``
    key. Otherwise ``loss_value`` is already multiplied by ``vf_coef`` and the unweighted
    ``0.5 * MSE`` is reported as ``value_mse``. ``entropy`` may be None only when
    ``ent_coef == 0`` (no ``loss_entropy``/``entropy`` keys then).

    The total loss is ``total_loss(result)``.
    """
    out = ppo_policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        mask=mask,
        importance_weights=importance_weights,
        reduce=reduce,
    )
    if entropy is not None:
        out.update(entropy_bonus(entropy, ent_coef, mask))
    elif ent_coef != 0.0:
        raise ValueError(f"ent_coef={ent_coef} needs an entropy tensor")
    if values is not None:
        if returns is None:
            raise ValueError("a value loss needs returns (got values but returns=None)")
        out.update(weighted_value_loss(values, returns, old_values, value_clip, vf_coef, mask))
    return out


def weighted_value_loss(values: Tensor, returns: Tensor, old_values: Tensor | None, value_clip: float | None,
                        vf_coef: float, mask: Tensor | None = None) -> dict[str, Tensor]:
    """:func:`ppo_loss`'s value terms: ``loss_value`` (``vf_coef`` x the value loss), the unweighted
    ``value_mse`` and, when clipped, ``value_clip_fraction``."""
    v = value_loss(values, returns, old_values=old_values, clip_eps=value_clip, mask=mask)
    mse = v.pop("loss_value")
    return {"loss_value": vf_coef * mse, "value_mse": mse.detach(), **v}


def total_loss(terms: dict[str, Tensor]) -> Tensor:
    """Sum of every entry whose key starts with ``loss_`` (the differentiable terms)."""
    losses = [v for k, v in terms.items() if k.startswith("loss_")]
    if not losses:
        raise ValueError(f"no 'loss_*' terms in {sorted(terms)}")
    return torch.as_tensor(sum(losses[1:], losses[0]))


def ppo_objective(inp: OnPolicyLossInput) -> dict[str, Tensor]:
    """Registry entry ``ppo`` (kind on_policy): :func:`ppo_loss` with the ``algorithm`` section's
    settings (``clip_eps`` arrives annealed); a value loss when the minibatch has a critic's values.
    A log-prob with more axes than the advantages ([B, K] against [B]) is taken factor by factor."""
    c = inp.cfg
    adv = inp.advantages
    if inp.log_prob.dim() > adv.dim():
        # a log-prob of several factors per row (a flow policy's denoising steps, ``ratio: step``):
        # one ratio per factor, each with its row's advantage
        adv = adv.reshape(*adv.shape, *[1] * (inp.log_prob.dim() - adv.dim())).expand_as(inp.log_prob)
    return ppo_loss(
        inp.log_prob, inp.old_log_prob, adv, inp.entropy,
        values=inp.values, old_values=inp.old_values, returns=inp.returns,
        clip_eps=inp.clip_eps, clip_eps_high=c.get("clip_eps_high"), dual_clip=c.get("dual_clip"),
        value_clip=c.get("value_clip"), vf_coef=c["vf_coef"], ent_coef=c["ent_coef"],
    )


def ppo_value_objective(values: Tensor, old_values: Tensor, returns: Tensor, cfg) -> dict[str, Tensor]:
    """:func:`ppo_objective`'s value terms alone, from the critic's values: what a learner computes
    apart from the policy terms (``ppo_objective`` with ``values=None``) when the value loss runs in
    a helper process (``actor.update_threads=2``). The two parts sum to ``ppo_objective``."""
    return weighted_value_loss(values, returns, old_values, cfg.get("value_clip"), cfg["vf_coef"])


def value_part_of(loss: Callable) -> Callable | None:
    """The value terms an on-policy loss declares it can compute apart (its ``value_part``
    attribute: ``value_part(values, old_values, returns, cfg) -> dict``), or None. A loss that
    declares one must give no value terms when called with ``values=None``."""
    return getattr(loss, "value_part", None)


# declared on the loss: its value terms may be computed apart (actor.update_threads=2)
ppo_objective.value_part = ppo_value_objective
