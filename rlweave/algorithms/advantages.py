"""Advantage and return estimators.

Estimators are kept apart from losses (as in TorchRL): a runner first turns a rollout into
advantages/returns with one of these functions, then feeds them to a loss from
:mod:`rlweave.algorithms.losses`. Every function here is pure: tensors in, tensors out, no
hidden state, no gradients needed (callers usually pass detached tensors).

Time-major layout: rollout tensors are ``[T, N]`` (T steps, N parallel environments), the layout
vectorised environments produce, so the backward recursions below loop over T only and are
vectorised over N.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlweave.algorithms.contracts import Advantages, OnPolicyAdvantageInput

__all__ = ["gae", "discounted_returns", "group_normalized_advantages", "normalize", "gae_estimator", "grpo_estimator"]


def _check_time_major(name: str, x: Tensor, like: Tensor) -> None:
    if x.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(like.shape)} ([T, N])")


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_value: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016).

    Args:
        rewards, values, dones: ``[T, N]``. ``dones[t] = 1`` means the episode ended *after*
            step ``t``, so step ``t`` must not bootstrap from ``values[t + 1]`` (which belongs
            to the next episode after an auto-reset).
        next_value: ``[N]``, value of the observation that follows the last step; it closes
            the recursion for environments still running at the end of the rollout.
        gamma: discount factor.
        lam: GAE lambda; ``lam=1`` gives Monte-Carlo returns minus V, ``lam=0`` one-step TD.

    Returns:
        ``(advantages, returns)``, both ``[T, N]``, with ``returns = advantages + values`` (the
        lambda-return, used as the critic's regression target).

    Recursion::

        delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    """
    if values.dim() != 2:
        raise ValueError(f"values must be [T, N], got shape {tuple(values.shape)}")
    _check_time_major("rewards", rewards, values)
    _check_time_major("dones", dones, values)
    if next_value.shape != values.shape[1:]:
        raise ValueError(
            f"next_value has shape {tuple(next_value.shape)}, expected {tuple(values.shape[1:])} ([N])"
        )
    dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    rewards = rewards.to(dtype)
    values = values.to(dtype)
    not_done = 1.0 - dones.to(dtype)
    next_values = torch.cat([values[1:], next_value.to(dtype).unsqueeze(0)], dim=0)

    deltas = rewards + gamma * next_values * not_done - values
    advantages = torch.empty_like(values)
    running = torch.zeros_like(next_value, dtype=dtype)
    # The recursion is inherently sequential in time; it is vectorised over environments.
    for t in range(values.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


def discounted_returns(rewards: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """Discounted reward-to-go without bootstrapping: ``G_t = r_t + gamma * (1 - done_t) * G_{t+1}``.

    Used by critic-free estimators (GRPO episode scores, REINFORCE-style baselines), which have no
    value function to bootstrap with; the tail after the last step counts as zero.

    Args:
        rewards, dones: ``[T, N]``; ``dones[t] = 1`` cuts the sum after step ``t``.
        gamma: discount factor.

    Returns:
        ``[T, N]`` returns.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [T, N], got shape {tuple(rewards.shape)}")
    _check_time_major("dones", dones, rewards)
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    rewards = rewards.to(dtype)
    not_done = 1.0 - dones.to(dtype)
    returns = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * not_done[t] * running
        returns[t] = running
    return returns


def group_normalized_advantages(
    scores: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    scale: bool = True,
) -> Tensor:
    """GRPO advantages (Shao et al. 2024): each score relative to the others in its group.

    A group is the set of samples that share a prompt (language models) or a reset seed
    (embodied episodes), so the group mean is a baseline that needs no critic.

    ``A_i = (s_i - mean_g) / (std_g + eps)`` with the population std (``unbiased=False``) of the
    group ``g`` of sample ``i``. With ``scale=False`` only the mean is subtracted ("Dr. GRPO",
    Liu et al. 2025), which removes the std's bias toward groups with low spread.

    Groups whose scores are all equal (including singletons) carry no learning signal and get
    advantage exactly 0.

    Args:
        scores: ``[M]`` one scalar per sample (e.g. episode return or verifier reward).
        group_ids: ``[M]`` integer group labels; any values, in any order.
        eps: added to the std to avoid division by zero.
        scale: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        ``[M]`` advantages, same floating dtype as ``scores`` (default dtype for integer scores).
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be [M], got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    if not scores.is_floating_point():
        scores = scores.to(torch.get_default_dtype())
    if scores.numel() == 0:
        return scores.clone()
    # Map arbitrary labels to 0..G-1, then reduce per group with index_add (no Python loop).
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(scores.dtype)
    sums = torch.zeros(counts.shape[0], dtype=scores.dtype, device=scores.device)
    means = sums.index_add(0, inverse, scores) / counts
    centred = scores - means[inverse]
    if not scale:
        return centred
    # Two-pass variance (mean of squared deviations) is stable where E[x^2] - E[x]^2 is not.
    var = sums.index_add(0, inverse, centred * centred) / counts
    return centred / (var.sqrt()[inverse] + eps)


def normalize(x: Tensor, eps: float = 1e-8, mask: Tensor | None = None) -> Tensor:
    """Whiten ``x``: ``(x - mean) / (std + eps)`` over all elements (or over ``mask != 0``).

    Per-batch advantage normalisation keeps the policy-gradient scale independent of the reward
    scale. The std is the sample (unbiased) std, as in CleanRL / SB3; a single element has no
    spread, so it normalises to 0 instead of NaN. Masked-out entries are returned as 0.
    """
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    if mask is None:
        if x.numel() < 2:
            return x - x.mean() if x.numel() else x.clone()
        return (x - x.mean()) / (x.std() + eps)
    valid = torch.broadcast_to(mask, x.shape).bool()
    count = valid.sum().to(x.dtype)
    mean = torch.where(valid, x, 0.0).sum() / count.clamp_min(1.0)
    centred = torch.where(valid, x - mean, 0.0)
    var = (centred * centred).sum() / (count - 1.0).clamp_min(1.0)
    return centred / (var.sqrt() + eps)


# ----------------------------------------------------------------------------- registry entries (kind on_policy)
def gae_estimator(inp: OnPolicyAdvantageInput) -> Advantages:
    """``gae`` on an actor rank's trajectories: :func:`gae` with ``algorithm.gamma`` and
    ``algorithm.gae_lambda``; the trainer whitens each minibatch (``algorithm.norm_adv``)."""
    if inp.next_value is None:
        raise ValueError("advantage estimator 'gae' needs a critic (the algorithm's uses_critic)")
    adv, returns = gae(inp.rewards, inp.values, inp.dones, inp.next_value, inp.cfg["gamma"], inp.cfg["gae_lambda"])
    return Advantages(adv, returns)


def grpo_estimator(inp: OnPolicyAdvantageInput) -> Advantages:
    """``grpo`` on episodic trajectories: each env's episode return against its reset-seed group,
    the same advantage on every step of the episode; padding steps are left out of training."""
    if inp.mask is None or inp.episode_return is None or inp.group_id is None:
        raise ValueError("advantage estimator 'grpo' needs episodic trajectories (the algorithm's episodic_groups)")
    scores = inp.episode_return
    ep_adv = group_normalized_advantages(scores, inp.group_id)
    adv = ep_adv.expand(*inp.mask.shape) * inp.mask
    info = {"train/group_return_std": float(scores.std()) if len(scores) > 1 else 0.0}
    return Advantages(adv, None, mask=inp.mask, whiten=False, info=info)
