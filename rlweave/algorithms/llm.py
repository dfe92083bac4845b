"""The token-level pieces of language-model RL: advantage shaping, KL estimators, loss
aggregation, DAPO's sampling and length rules, and the importance correction of asynchronous PPO.

Pure functions on ``[B, L]`` tensors (B responses, L response tokens, ``mask`` 1 on real tokens),
sharing the conventions of :mod:`rlweave.algorithms.losses`: terms named ``loss_*`` are
differentiable; everything else is a detached diagnostic. Sequence-level scores (a verifier's
reward) are ``[B]``; ``group_ids`` ``[B]`` say which responses answer the same prompt.

* :func:`kl_penalty`: per-token estimators of KL(policy || reference): ``k1`` (log-ratio), ``k2``
  (half squared log-ratio), ``k3`` (Schulman's unbiased, non-negative ``exp(-x) - 1 + x``).
* :func:`aggregate`: how per-token losses become one number: ``token_mean`` (every token of the
  batch weighs the same: DAPO), ``seq_mean_token_mean`` (each response weighs the same: the
  original GRPO), ``seq_mean_token_sum_norm`` (token sums divided by a constant length: Dr. GRPO,
  no length bias).
* :func:`reinforce_pp_advantages`: REINFORCE++ (Hu 2025): per-token returns of the sequence reward
  minus a per-token KL penalty, normalised over the *global* batch; with ``baseline=True`` the
  group mean of the reward is subtracted first (REINFORCE++-baseline).
* :func:`token_gae`: PPO's token-level GAE with a critic, one reward at the last token.
* :func:`dynamic_sampling_mask` and :func:`overlong_penalty`: DAPO's filter of groups whose
  rewards are all equal (no signal) and its soft penalty for responses near the length limit.
* :func:`truncated_importance_weights`: asynchronous PPO trains on tokens a stale policy sampled;
  the weight ``min(pi_old / pi_behaviour, cap)`` corrects for the gap (decoupled PPO).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from rlweave.algorithms.advantages import gae, group_normalized_advantages, normalize
from rlweave.algorithms.contracts import (ADVANTAGE_ESTIMATORS, Advantages, SFTLossInput, TokenAdvantageInput,
                                          TokenLossInput)
from rlweave.algorithms.losses import ppo_loss

__all__ = [
    "KL_ESTIMATORS",
    "kl_penalty",
    "AGGREGATIONS",
    "aggregate",
    "reinforce_pp_advantages",
    "token_gae",
    "sequence_to_tokens",
    "dynamic_sampling_mask",
    "overlong_penalty",
    "truncated_importance_weights",
    "kl_loss",
    "llm_policy_loss",
    "sft_loss",
    "token_advantages",
    "grpo_token_estimator",
    "gae_token_estimator",
    "reinforce_pp_token_estimator",
    "reinforce_pp_baseline_token_estimator",
    "ppo_token_loss",
    "sft_objective",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from log-probs of the sampled tokens (sampled from
    pi). ``k1 = x``, ``k2 = x^2 / 2``, ``k3 = exp(-x) - 1 + x`` with ``x = log pi - log pi_ref``."""
    x = log_prob - ref_log_prob
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.square()
    if kind == "k3":
        return torch.expm1(-x) + x
    raise ValueError(f"algorithm.kl_estimator: {kind!r} is not one of {', '.join(KL_ESTIMATORS)}")


def aggregate(x: Tensor, mask: Tensor, mode: str = "token_mean", max_len: int | None = None) -> Tensor:
    """One scalar from per-token values ``x`` [B, L] over ``mask``; see the module docstring for
    the modes. ``max_len`` is Dr. GRPO's constant (default: L)."""
    m = mask.to(x.dtype)
    x = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    if mode == "token_mean":
        return x.sum() / m.sum().clamp_min(1.0)
    if mode == "seq_mean_token_mean":
        per_seq = x.sum(-1) / m.sum(-1).clamp_min(1.0)
        return per_seq.mean()
    if mode == "seq_mean_token_sum_norm":
        return (x.sum(-1) / float(max_len or x.shape[-1])).mean()
    raise ValueError(f"algorithm.loss_agg: {mode!r} is not one of {', '.join(AGGREGATIONS)}")


def sequence_to_tokens(values: Tensor, mask: Tensor) -> Tensor:
    """A per-response value [B] on every real token of its response [B, L] (0 on padding)."""
    return values.float()[:, None] * mask.float()


def _last_token(mask: Tensor) -> Tensor:
    """[B, L] one-hot of each response's last real token."""
    lengths = mask.long().sum(-1)
    idx = (lengths - 1).clamp(min=0)
    out = torch.zeros_like(mask, dtype=torch.bool)
    out[torch.arange(mask.shape[0], device=mask.device), idx] = lengths > 0
    return out


def reinforce_pp_advantages(scores: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0,
                            gamma: float = 1.0, baseline: bool = False, group_ids: Tensor | None = None) -> Tensor:
    """REINFORCE++ token advantages [B, L].

    Per-token reward: ``-kl_coef * kl`` on every token plus the sequence score on the last token;
    the advantage of a token is the (``gamma``-discounted) sum of rewards from it to the end,
    whitened over every real token of the global batch. ``baseline=True`` first subtracts each
    group's mean score (needs ``group_ids``)."""
    if baseline:
        if group_ids is None:
            raise ValueError("REINFORCE++-baseline needs group_ids (responses to the same prompt)")
        scores = group_normalized_advantages(scores.float(), group_ids, scale=False)
    m = mask.bool()
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * torch.where(m, kl.float(), 0.0)
    rewards = rewards + _last_token(mask) * scores.float()[:, None]
    returns = torch.zeros_like(rewards)
    running = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    for t in range(mask.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return normalize(returns, mask=mask)


def token_gae(scores: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95,
              kl: Tensor | None = None, kl_coef: float = 0.0) -> tuple[Tensor, Tensor]:
    """PPO with a critic on tokens: the sequence score at the last real token (minus an optional
    per-token KL penalty), GAE over the response, nothing after its end. Returns (advantages,
    returns), both [B, L], 0 on padding."""
    m = mask.to(torch.float32)
    last = _last_token(mask)
    rewards = last * scores.float()[:, None]
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * m
    v = values.float() * m
    # time-major for :func:`gae`; the response ends after its last token (done), padding is inert
    adv, ret = gae(rewards.T, v.T, (last | ~mask.bool()).T.float(), torch.zeros(mask.shape[0]), gamma, lam)
    return adv.T * m, ret.T * m


def dynamic_sampling_mask(scores: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO's dynamic sampling: True for responses whose group has some spread in reward; groups
    where every response scored the same carry no gradient under group-normalised advantages and
    are dropped (the runner samples more prompts to refill the batch)."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for g in torch.unique(group_ids):
        sel = group_ids == g
        keep[sel] = bool(scores[sel].max() > scores[sel].min())
    return keep


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment [B]: 0 up to ``max_len - buffer`` tokens, then falling
    linearly to ``-penalty`` at ``max_len`` (and beyond)."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"algorithm.overlong_buffer: must be in (0, max_len={max_len}], got {buffer}")
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0) / buffer
    return -penalty * over.clamp(max=1.0)


def truncated_importance_weights(old_log_prob: Tensor, behaviour_log_prob: Tensor, cap: float = 2.0) -> Tensor:
    """``min(pi_old / pi_behaviour, cap)`` per token, detached: the correction asynchronous PPO
    multiplies into the clipped surrogate when the tokens were sampled by an older rollout policy
    than the one the update is anchored to (``cap`` bounds the variance)."""
    if cap <= 0:
        raise ValueError(f"algorithm.is_cap: must be > 0, got {cap}")
    return torch.exp(old_log_prob - behaviour_log_prob).clamp(max=cap).detach()


def kl_loss(log_prob: Tensor, ref_log_prob: Tensor, mask: Tensor, coef: float, estimator: str = "k3",
            loss_agg: str = "token_mean") -> dict[str, Tensor]:
    """GRPO's KL term in the loss: ``loss_kl = coef * aggregate(kl)`` (differentiable through
    ``log_prob``), and the detached mean ``kl``."""
    kl = kl_penalty(log_prob, ref_log_prob.detach(), estimator)
    return {"loss_kl": coef * aggregate(kl, mask, loss_agg), "kl": aggregate(kl.detach(), mask, "token_mean")}


def llm_policy_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *,
                    clip_eps: float = 0.2, clip_eps_high: float | None = None, loss_agg: str = "token_mean",
                    max_len: int | None = None, ref_log_prob: Tensor | None = None, kl_coef: float = 0.0,
                    kl_estimator: str = "k3", behaviour_log_prob: Tensor | None = None, is_cap: float = 2.0,
                    entropy: Tensor | None = None, ent_coef: float = 0.0, values: Tensor | None = None,
                    old_values: Tensor | None = None, returns: Tensor | None = None, value_clip: float | None = None,
                    vf_coef: float = 0.5) -> dict[str, Tensor]:
    """The language-model update of every PPO-family algorithm on [B, L] token tensors: PPO's
    clipped surrogate (clip-higher with ``clip_eps_high``) aggregated by ``loss_agg``, a KL loss
    towards the reference model when ``kl_coef`` > 0 and ``ref_log_prob`` is given, truncated
    importance weights when the tokens came from an older behaviour policy
    (``behaviour_log_prob``: async PPO), and PPO's value loss when a critic's ``values`` are given.
    GRPO, DAPO, REINFORCE++ and PPO differ in their advantages and settings, not here."""
    weights = truncated_importance_weights(old_log_prob, behaviour_log_prob, is_cap) if behaviour_log_prob is not None else None
    out = ppo_loss(log_prob, old_log_prob, advantages, entropy, values, old_values, returns, clip_eps=clip_eps,
                   clip_eps_high=clip_eps_high, value_clip=value_clip, vf_coef=vf_coef, ent_coef=ent_coef, mask=mask,
                   importance_weights=weights, reduce=partial(aggregate, mode=loss_agg, max_len=max_len))
    if ref_log_prob is not None and kl_coef:
        out.update(kl_loss(log_prob, ref_log_prob, mask, kl_coef, kl_estimator, loss_agg))
    if weights is not None:
        out["is_weight_mean"] = aggregate(weights, mask, "token_mean")
    return out


def sft_loss(log_prob: Tensor, mask: Tensor, loss_agg: str = "token_mean", max_len: int | None = None) -> dict[str, Tensor]:
    """Supervised fine-tuning: the negative log-likelihood of the target (response) tokens,
    aggregated by ``loss_agg`` (``token_mean``: every target token weighs the same)."""
    return {"loss_sft": -aggregate(log_prob, mask, loss_agg, max_len)}


def token_advantages(estimator: str, scores: Tensor, mask: Tensor, group_ids: Tensor, *, values: Tensor | None = None,
                     kl: Tensor | None = None, kl_coef: float = 0.0, gamma: float = 1.0, lam: float = 0.95,
                     norm: bool = True) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages [B, L] (and returns, for a critic) of a language-model batch by the
    registry's ``token`` estimator of that name (built in: ``grpo``, ``gae``, ``reinforce_pp``,
    ``reinforce_pp_baseline``). ``kl``/``kl_coef``: a per-token KL penalty in the reward
    (``algorithm.kl_mode=reward``); GRPO takes KL as a loss instead.

    A ``mask`` with holes (multi-turn agent rows: tool observations inside the response, 0 in the
    mask) is compacted first: each row's model tokens are moved together, the estimator runs on
    them as on a single-turn response (the last model token gets the score; reward-to-go and GAE
    never step through observation tokens), and the results go back to their columns (0 on
    observations). Prefix masks (single-turn rows) are passed through untouched."""
    estimate = ADVANTAGE_ESTIMATORS.get(estimator, "token")
    holes = _has_holes(mask)
    if holes:
        order, mask, (values, kl) = _compact(mask, values, kl)
    out = estimate(TokenAdvantageInput(scores, mask, group_ids, values=values, kl=kl, kl_coef=kl_coef, gamma=gamma,
                                       lam=lam, norm=norm))
    if not holes:
        return out.advantages, out.returns
    return _scatter(out.advantages, order), None if out.returns is None else _scatter(out.returns, order)


def _has_holes(mask: Tensor) -> bool:
    """Whether some row's real tokens are not a prefix (a 0 before a 1)."""
    m = mask.bool()
    return bool((~m[:, :-1] & m[:, 1:]).any())


def _compact(mask: Tensor, *tensors: Tensor | None) -> tuple[Tensor, Tensor, list[Tensor | None]]:
    """Each row's masked-in columns moved to the front, in order: the column order [B, L], the
    compacted (prefix) mask, and ``tensors`` gathered the same way."""
    m = mask.bool()
    L = m.shape[1]
    key = (~m).long() * L + torch.arange(L, device=m.device)  # real tokens first, each group in column order
    order = key.argsort(-1)
    packed = m.gather(1, order)
    return order, packed.to(mask.dtype), [None if t is None else t.gather(1, order) * packed for t in tensors]


def _scatter(x: Tensor, order: Tensor) -> Tensor:
    """Inverse of :func:`_compact` for one [B, L] tensor (the compacted tail is 0)."""
    return torch.zeros_like(x).scatter_(1, order, x)


# ----------------------------------------------------------------------------- registry entries (kinds token, sft)
def grpo_token_estimator(inp: TokenAdvantageInput) -> Advantages:
    """``grpo``: the response's score against its prompt group's (``norm=False``: Dr. GRPO's
    mean-only baseline), on every token of the response."""
    adv = group_normalized_advantages(inp.scores.float(), inp.group_ids, scale=inp.norm)
    return Advantages(sequence_to_tokens(adv, inp.mask))


def gae_token_estimator(inp: TokenAdvantageInput) -> Advantages:
    """``gae``: token-level GAE on a value head, whitened over the batch's tokens when ``norm``."""
    if inp.values is None:
        raise ValueError("token-level GAE needs the critic's values")
    adv, ret = token_gae(inp.scores, inp.values, inp.mask, inp.gamma, inp.lam, inp.kl, inp.kl_coef)
    return Advantages(normalize(adv, mask=inp.mask) * inp.mask if inp.norm else adv, ret)


def reinforce_pp_token_estimator(inp: TokenAdvantageInput) -> Advantages:
    """``reinforce_pp``: discounted reward-to-go whitened over the global batch."""
    return Advantages(reinforce_pp_advantages(inp.scores, inp.mask, inp.kl, inp.kl_coef, inp.gamma,
                                              group_ids=inp.group_ids) * inp.mask)


def reinforce_pp_baseline_token_estimator(inp: TokenAdvantageInput) -> Advantages:
    """``reinforce_pp_baseline``: REINFORCE++ after subtracting each prompt group's mean score."""
    return Advantages(reinforce_pp_advantages(inp.scores, inp.mask, inp.kl, inp.kl_coef, inp.gamma, baseline=True,
                                              group_ids=inp.group_ids) * inp.mask)


def ppo_token_loss(inp: TokenLossInput) -> dict[str, Tensor]:
    """``ppo`` / ``llm_ppo`` (kind token): :func:`llm_policy_loss` with the ``algorithm``
    section's settings; KL and importance terms when the input carries their log-probs."""
    c = inp.cfg
    return llm_policy_loss(
        inp.log_prob, inp.old_log_prob, inp.advantages, inp.mask,
        clip_eps=c["clip_eps"], clip_eps_high=c.get("clip_eps_high"), loss_agg=c.get("loss_agg", "token_mean"),
        max_len=inp.max_len, ref_log_prob=inp.ref_log_prob,
        kl_coef=c.get("kl_coef", 0.0) if inp.ref_log_prob is not None else 0.0, kl_estimator=c.get("kl_estimator", "k3"),
        behaviour_log_prob=inp.behaviour_log_prob, is_cap=c.get("is_cap", 2.0), entropy=inp.entropy,
        ent_coef=c.get("ent_coef", 0.0), values=inp.values, old_values=inp.old_values, returns=inp.returns,
        value_clip=c.get("value_clip"), vf_coef=c.get("vf_coef", 0.5),
    )


def sft_objective(inp: SFTLossInput) -> dict[str, Tensor]:
    """``sft`` (kind sft): :func:`sft_loss` aggregated by ``algorithm.loss_agg``."""
    return sft_loss(inp.log_prob, inp.mask, inp.cfg.get("loss_agg", "token_mean"))
