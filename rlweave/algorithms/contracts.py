"""The contracts of user-extensible algorithm pieces: one call signature per kind, and the typed
tables that hold them.

Why kinds: an embodied PPO minibatch, a language model's token batch, an off-policy replay batch
and an SFT batch carry different tensors, so one "loss" signature for all of them would either be
a bag of optional arguments or lie. Each *kind* has one signature, and every registry entry is
filed under its kind; a worker asks for ``(name, kind)``, so a loss written for another kind is
refused by name, with both signatures in the message, instead of failing deep in a minibatch.

Kinds of policy loss (each returns a ``dict`` whose ``loss_*`` entries are differentiable scalars,
summed by the trainer, and whose other entries are detached diagnostics, as in TorchRL):

* ``on_policy``: ``loss(inp: OnPolicyLossInput)``; embodied on-policy minibatches (PPO, GRPO).
* ``token``: ``loss(inp: TokenLossInput)``; on-policy language-model token batches ``[B, L]``.
* ``learner``: ``loss(batch, nets, opts, update_actor=True)``; off-policy, imitation and offline
  learners on replay batches (see :mod:`rlweave.algorithms.offpolicy`).
* ``sft``: ``loss(inp: SFTLossInput)``; supervised fine-tuning of a language model.
* ``policy_sft``: ``loss(inp: PolicySFTLossInput)``; supervised fine-tuning of an embodied policy
  (MLP, flow, VLA) on demonstrations: the policy's own imitation loss (token cross-entropy, L1,
  flow matching), optionally weighted per sample.

Kinds of advantage estimator (each returns :class:`Advantages`):

* ``on_policy``: ``estimator(inp: OnPolicyAdvantageInput)``; an actor rank's time-major trajectories.
* ``token``: ``estimator(inp: TokenAdvantageInput)``; a language-model batch's scores per response.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor

__all__ = [
    "LOSS_KINDS", "ESTIMATOR_KINDS", "KindedRegistry", "UnknownNameError", "WrongKindError",
    "OnPolicyAdvantageInput", "TokenAdvantageInput", "Advantages",
    "OnPolicyLossInput", "TokenLossInput", "SFTLossInput", "PolicySFTLossInput",
    "ADVANTAGE_ESTIMATORS", "POLICY_LOSSES",
]

F = TypeVar("F", bound=Callable[..., Any])

# kind -> (how it is called, positional arguments a call passes): the signature is checked at
# registration, so a function written for another kind is refused before any run starts
LOSS_KINDS: dict[str, tuple[str, int]] = {
    "on_policy": ("loss(inp: OnPolicyLossInput) -> dict[str, Tensor]", 1),
    "token": ("loss(inp: TokenLossInput) -> dict[str, Tensor]", 1),
    "learner": ("loss(batch, nets: LearnerNets, opts: LossOptions, update_actor=True) -> dict[str, Tensor]", 3),
    "sft": ("loss(inp: SFTLossInput) -> dict[str, Tensor]", 1),
    "policy_sft": ("loss(inp: PolicySFTLossInput) -> dict[str, Tensor]", 1),
}
ESTIMATOR_KINDS: dict[str, tuple[str, int]] = {
    "on_policy": ("estimator(inp: OnPolicyAdvantageInput) -> Advantages", 1),
    "token": ("estimator(inp: TokenAdvantageInput) -> Advantages", 1),
}


# ----------------------------------------------------------------------------- inputs and outputs
@dataclass
class OnPolicyAdvantageInput:
    """An embodied actor rank's trajectories, time-major ``[T, N]`` (T steps, N envs).

    ``rewards`` already hold ``gamma * V(final obs)`` on steps cut by a time limit when the
    algorithm has a critic (``uses_critic``), so an estimator never sees the final observations.
    ``values`` are the rollout's critic values (zeros without a critic), ``next_value`` ``[N]`` the
    value after the last step (critic only). Episodic collections (``episodic_groups``: every env
    runs one episode from a seeded reset) add ``mask`` (valid steps; the rest is padding),
    ``episode_return`` ``[N]`` and ``group_id`` ``[N]`` (envs that share a reset seed).
    ``cfg``: the ``algorithm`` config section (``gamma``, ``gae_lambda``, ...).
    """

    rewards: Tensor
    values: Tensor
    dones: Tensor
    next_value: Tensor | None
    cfg: Mapping[str, Any]
    mask: Tensor | None = None
    episode_return: Tensor | None = None
    group_id: Tensor | None = None


@dataclass
class TokenAdvantageInput:
    """A language-model batch: ``scores`` ``[B]`` (the verifier's reward per response), ``mask``
    ``[B, L]`` (1 on response tokens), ``group_ids`` ``[B]`` (responses to the same prompt),
    ``values`` ``[B, L]`` (a critic's, or None), ``kl`` ``[B, L]`` a per-token KL penalty to put in
    the reward with ``kl_coef`` (``algorithm.kl_mode=reward``; None otherwise), ``gamma`` and
    ``lam`` (GAE), ``norm`` (``algorithm.norm_adv``)."""

    scores: Tensor
    mask: Tensor
    group_ids: Tensor
    values: Tensor | None = None
    kl: Tensor | None = None
    kl_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 0.95
    norm: bool = True


@dataclass
class Advantages:
    """What an estimator returns. ``advantages`` have the input's layout (``[T, N]`` or
    ``[B, L]``); ``returns`` are the critic's regression targets (None without a critic);
    ``mask`` (on_policy) the steps to train on (None: all); ``whiten`` (on_policy) whether the
    trainer whitens each minibatch's advantages when ``algorithm.norm_adv`` (GAE's scale follows
    the reward's; GRPO's are already normalised within groups); ``info``: scalars to log."""

    advantages: Tensor
    returns: Tensor | None = None
    mask: Tensor | None = None
    whiten: bool = True
    info: dict[str, float] = field(default_factory=dict)


@dataclass
class OnPolicyLossInput:
    """One embodied on-policy minibatch, flat ``[B]``: the new ``log_prob`` (differentiable) and
    the rollout's ``old_log_prob``, the ``advantages``; ``entropy`` (differentiable; None when
    ``algorithm.ent_coef`` is 0, so it stays out of the graph); the critic's new ``values``, the
    rollout's ``old_values`` and the ``returns`` (all None without a critic); ``obs`` and
    ``action`` for losses that need more than log-probs; ``clip_eps`` after annealing;
    ``cfg``: the ``algorithm`` config section. A policy that reports one log-prob per factor of an
    action (a flow policy with ``ratio: step``: one per denoising step) gives ``log_prob`` and
    ``old_log_prob`` as ``[B, K]``; everything else stays ``[B]``."""

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    entropy: Tensor | None
    values: Tensor | None
    old_values: Tensor | None
    returns: Tensor | None
    obs: Tensor
    action: Tensor
    clip_eps: float
    cfg: Mapping[str, Any]


@dataclass
class TokenLossInput:
    """One language-model minibatch of responses ``[B, L]``: new ``log_prob`` (differentiable),
    the anchor ``old_log_prob``, ``advantages``, ``mask`` (bool, response tokens), ``entropy``;
    a critic's ``values`` / ``old_values`` / ``returns`` (or None); ``ref_log_prob`` when KL to the
    reference model is a loss term (``kl_mode=loss``, ``kl_coef`` > 0); ``behaviour_log_prob``
    when the tokens came from an older rollout policy (asynchronous PPO's importance correction);
    ``max_len`` the batch's response width; ``cfg``: the ``algorithm`` config section."""

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    mask: Tensor
    entropy: Tensor | None
    max_len: int
    cfg: Mapping[str, Any]
    values: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    ref_log_prob: Tensor | None = None
    behaviour_log_prob: Tensor | None = None


@dataclass
class SFTLossInput:
    """One SFT step: the model's ``log_prob`` of every next token ``[B, W-1]`` and ``mask``
    (True on the target tokens); ``cfg``: the ``algorithm`` config section (``loss_agg``)."""

    log_prob: Tensor
    mask: Tensor
    cfg: Mapping[str, Any]


@dataclass
class PolicySFTLossInput:
    """One supervised step of an embodied policy: ``obs`` (a tensor or a dict of tensors, [B, ...]),
    the demonstrated ``actions`` [B, chunk, *action_shape] (a chunk's steps past its episode's end
    repeat the last action), per-sample ``weights`` [B] or None; ``policy`` is the module trained,
    whose ``bc_loss(obs, actions)`` is its own imitation loss; ``cfg``: the ``algorithm`` section.
    ``extras``: per-row columns a loss's ``prepare_demonstrations`` added to the demonstrations
    (RECAP's advantage ``indicator`` [B]), sampled with the rows; empty for plain SFT."""

    policy: Any
    obs: Any
    actions: Tensor
    weights: Tensor | None
    cfg: Mapping[str, Any]
    extras: Mapping[str, Tensor] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the typed tables
class UnknownNameError(KeyError):
    """``KeyError`` whose ``str()`` is the plain message (``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WrongKindError(UnknownNameError):
    """The name is registered, but not under the kind asked for (a ``KeyError`` too, so callers
    that turn unknown names into config errors handle both)."""


class KindedRegistry:
    """``name -> {kind: function}``: one name may have one implementation per kind (``ppo`` is a
    clipped surrogate on embodied steps and on tokens), and a lookup names the kind it needs."""

    def __init__(self, what: str, kinds: Mapping[str, tuple[str, int]]):
        self.what = what
        self.kinds = dict(kinds)
        self.entries: dict[str, dict[str, Callable[..., Any]]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self, kind: str | None = None) -> list[str]:
        """Sorted names, of one kind or of all."""
        return sorted(n for n, by_kind in self.entries.items() if kind is None or kind in by_kind)

    def kinds_of(self, name: str) -> list[str]:
        return sorted(self.entries.get(name, {}))

    def signature(self, kind: str) -> str:
        return self.kinds[kind][0]

    def register(self, name: str, fn: F, kind: str) -> F:
        """File ``fn`` under ``(name, kind)``. Refuses an unknown kind, a taken ``(name, kind)``
        (``ValueError``) and a function that cannot be called the way its kind is (``TypeError``
        naming the kind's signature)."""
        if kind not in self.kinds:
            raise ValueError(f"{self.what} {name!r}: kind must be one of {', '.join(self.kinds)}; got {kind!r}")
        if kind in self.entries.get(name, {}):
            raise ValueError(f"{self.what} {name!r} ({kind}) is already registered")
        call, positional = self.kinds[kind]
        if not callable(fn):
            raise TypeError(f"{self.what} {name!r}: expected a function called as {call}, got {type(fn).__name__}")
        try:
            inspect.signature(fn).bind(*([None] * positional))
        except TypeError:
            raise TypeError(f"{self.what} {name!r} ({kind}) is called as {call}; "
                            f"{getattr(fn, '__name__', fn)!s}{_signature(fn)} cannot take that call") from None
        except ValueError:  # builtins without a signature: nothing to check
            pass
        self.entries.setdefault(name, {})[kind] = fn
        return fn

    def get(self, name: str, kind: str | None = None) -> Callable[..., Any]:
        """The function of ``(name, kind)``. ``kind=None``: the name's only implementation.

        Raises :class:`UnknownNameError` (one line listing the known names of that kind) or
        :class:`WrongKindError` (the name exists under other kinds: both signatures named)."""
        by_kind = self.entries.get(name)
        if by_kind is None:
            known = ", ".join(self.names(kind)) or "(none)"
            raise UnknownNameError(f"unknown {self.what} {name!r}; known{f' ({kind})' if kind else ''}: {known}")
        if kind is None:
            if len(by_kind) != 1:
                raise WrongKindError(f"{self.what} {name!r} has {' and '.join(sorted(by_kind))} versions; ask for one kind")
            return next(iter(by_kind.values()))
        if kind not in self.kinds:
            raise ValueError(f"{self.what} kind must be one of {', '.join(self.kinds)}; got {kind!r}")
        if kind not in by_kind:
            have = sorted(by_kind)
            raise WrongKindError(
                f"{self.what} {name!r} is of kind {' and '.join(have)} ({self.signature(have[0])}); "
                f"kind {kind} is needed here: {self.signature(kind)}"
            )
        return by_kind[kind]

    def unregister(self, name: str, kind: str | None = None) -> None:
        """Remove ``(name, kind)`` (every kind with ``None``); for tests and interactive sessions."""
        if kind is None:
            self.entries.pop(name, None)
            return
        by_kind = self.entries.get(name, {})
        by_kind.pop(kind, None)
        if not by_kind:
            self.entries.pop(name, None)


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


ADVANTAGE_ESTIMATORS = KindedRegistry("advantage estimator", ESTIMATOR_KINDS)
POLICY_LOSSES = KindedRegistry("policy loss", LOSS_KINDS)
