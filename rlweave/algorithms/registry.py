"""One registry for every algorithm rlweave knows.

Three name -> object tables, filled here at import time and extended by users through the
``register_*`` functions (in a module that ``algorithm.plugins`` names, so that Ray worker
processes import it too; see :mod:`rlweave.utils.plugins`):

* ``ADVANTAGE_ESTIMATORS``: name -> {kind: estimator}; kinds ``on_policy`` (embodied
  trajectories) and ``token`` (language-model responses), see :mod:`rlweave.algorithms.contracts`.
* ``POLICY_LOSSES``: name -> {kind: loss}; kinds ``on_policy``, ``token``, ``learner``
  (off-policy, imitation, offline) and ``sft``, one call signature each.
* ``ALGORITHMS``: name -> :class:`AlgorithmSpec`, the recipe tying an estimator and a loss
  together plus the facts a runner needs to wire it (on/off-policy, critic, grouping).

Workers never branch on an algorithm's name: they ask for ``(spec.advantage, kind)`` and
``(spec.loss, kind)``, the kind following from the algorithm's kind and the runner
(:func:`loss_kind`). :func:`register_algorithm` checks every runner a spec names has the pieces of
the kinds it will ask for, so a loss of the wrong kind is refused when the algorithm is registered.
Lookups fail with a one-line ``KeyError`` naming the known entries, so a typo in a config says
what would have been accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rlweave.algorithms.advantages import gae_estimator, grpo_estimator
from rlweave.algorithms.contracts import (ADVANTAGE_ESTIMATORS, ESTIMATOR_KINDS, LOSS_KINDS, POLICY_LOSSES, UnknownNameError,
                                          WrongKindError)
from rlweave.algorithms.imitation import bc_loss, policy_sft_loss
from rlweave.algorithms.llm import (gae_token_estimator, grpo_token_estimator, ppo_token_loss, reinforce_pp_baseline_token_estimator,
                                    reinforce_pp_token_estimator, sft_objective)
from rlweave.algorithms.losses import ppo_objective
from rlweave.algorithms.offpolicy import crossq_loss, iql_loss, rlpd_loss, sac_loss
from rlweave.utils.plugins import import_plugins

__all__ = [
    "ALGORITHM_KINDS",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "ALGORITHMS",
    "AlgorithmSpec",
    "UnknownNameError",
    "WrongKindError",
    "register_algorithm",
    "register_advantage_estimator",
    "register_policy_loss",
    "get_algorithm",
    "get_advantage_estimator",
    "get_policy_loss",
    "loss_kind",
    "estimator_kind",
    "algorithm_loss",
    "algorithm_estimator",
    "load_algorithm",
]

ALGORITHM_KINDS = ("on_policy", "off_policy", "imitation", "offline", "sft")
# the runner an algorithm of each kind runs with, unless its spec names others
DEFAULT_RUNNERS = {"on_policy": ("onpolicy",), "off_policy": ("offpolicy",), "imitation": ("offpolicy",),
                   "offline": ("offpolicy",), "sft": ("llm",)}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class AlgorithmSpec:
    """Static description of an algorithm: which pieces to use and how a runner must feed them.

    Attributes:
        name: registry key, as written in configs.
        kind: ``"on_policy"`` | ``"off_policy"`` | ``"imitation"`` | ``"offline"`` (offline RL:
            learns from a dataset alone, the env only evaluates) | ``"sft"`` (supervised
            fine-tuning of a language model); picks the runner loop and the kinds of its pieces.
        advantage: name in ``ADVANTAGE_ESTIMATORS``, or None (off-policy / imitation / SFT).
        loss: name in ``POLICY_LOSSES``.
        uses_critic: whether a value head/critic is trained (the runner then computes values).
        episodic_groups: True when advantages compare whole episodes grouped by reset seed
            (GRPO), so the rollout must run each group to episode end from identical resets.
        description: one line for ``--help`` and docs.
        target_network: off-policy: the learner keeps a Polyak-averaged copy of the critic.
        value_network: the learner also trains a state-value network V(s) (IQL).
        needs_dataset: learns from a dataset (``replay.offline_dataset``; SFT: ``data.*``),
            beside online data or (kinds ``offline``, ``sft``) alone.
        labelling: imitation: which visited states the expert labels and who acts. ``"expert"``
            (the expert acts and labels: behaviour cloning), ``"mixture"`` (the expert acts with
            probability beta, decaying; every state labelled: DAgger), ``"gated"`` (the learner
            acts; a gate hands control to the expert, and only those states are labelled:
            HG-DAgger).
        runners: the runners it runs with (``onpolicy``, ``offpolicy``, ``llm``); default: the
            one of its kind. GRPO and PPO run on embodied episodes and on language models alike.
        asynchronous: generation of the next batch overlaps the update of this one (async PPO):
            tokens may come from a policy up to ``train.max_staleness`` versions old, and the
            update corrects for it with importance weights against the behaviour log-probs.
    """

    name: str
    kind: str
    advantage: str | None
    loss: str
    uses_critic: bool
    episodic_groups: bool
    description: str
    target_network: bool = False
    value_network: bool = False
    needs_dataset: bool = False
    labelling: str | None = None
    runners: tuple[str, ...] = ()
    asynchronous: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ALGORITHM_KINDS:
            raise ValueError(
                f"algorithm {self.name!r}: kind must be one of {', '.join(ALGORITHM_KINDS)}; got {self.kind!r}"
            )
        if not self.runners:
            object.__setattr__(self, "runners", DEFAULT_RUNNERS[self.kind])


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def loss_kind(spec: AlgorithmSpec, runner: str | None = None) -> str:
    """The kind of loss ``spec`` calls on ``runner`` (default: its first): ``on_policy`` on
    embodied on-policy runs, ``token`` for on-policy language models, ``sft``, else ``learner``."""
    runner = runner or spec.runners[0]
    if spec.kind == "on_policy":
        return "token" if runner == "llm" else "on_policy"
    if spec.kind == "sft":
        return "policy_sft" if runner == "policy_sft" else "sft"
    return "learner"


def estimator_kind(spec: AlgorithmSpec, runner: str | None = None) -> str | None:
    """The kind of advantage estimator ``spec`` calls on ``runner``; None for kinds without one."""
    kind = loss_kind(spec, runner)
    return kind if kind in ESTIMATOR_KINDS else None


def register_advantage_estimator(name: str, fn: F | None = None, *, kind: str = "on_policy") -> Any:
    """Add an advantage estimator of ``kind`` (``on_policy`` | ``token``) under ``name``; without
    ``fn``, a decorator. ``ValueError`` if ``(name, kind)`` is taken, ``TypeError`` if ``fn``
    cannot be called the way its kind is (``estimator(inp) -> Advantages``)."""
    if fn is None:
        return lambda f: ADVANTAGE_ESTIMATORS.register(name, f, kind)
    return ADVANTAGE_ESTIMATORS.register(name, fn, kind)


def register_policy_loss(name: str, fn: F | None = None, *, kind: str = "on_policy") -> Any:
    """Add a loss of ``kind`` (``on_policy`` | ``token`` | ``learner`` | ``sft``; returning a dict
    of ``loss_*`` terms) under ``name``; without ``fn``, a decorator. ``ValueError`` if
    ``(name, kind)`` is taken, ``TypeError`` if ``fn`` cannot be called the way its kind is."""
    if fn is None:
        return lambda f: POLICY_LOSSES.register(name, f, kind)
    return POLICY_LOSSES.register(name, fn, kind)


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to ``ALGORITHMS``.

    Raises ``ValueError`` on a duplicate name, and ``KeyError`` if, for a runner the spec names,
    its estimator or loss is not registered under the kind that runner calls (register those
    first), so a broken recipe, or a loss written for another kind, fails at import time rather
    than mid-training.
    """
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    for runner in spec.runners:
        est_kind = estimator_kind(spec, runner)
        if est_kind is not None and spec.advantage is None:
            raise ValueError(f"algorithm {spec.name!r}: an on-policy algorithm needs an advantage estimator")
        try:
            if est_kind is not None:
                ADVANTAGE_ESTIMATORS.get(spec.advantage, est_kind)
            POLICY_LOSSES.get(spec.loss, loss_kind(spec, runner))
        except KeyError as e:
            raise type(e)(f"algorithm {spec.name!r} (runner {runner}): {e}") from None
    ALGORITHMS[spec.name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up an algorithm; unknown names raise ``KeyError`` listing the known ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS)) or "(none)"
        raise UnknownNameError(f"unknown algorithm {name!r}; known: {known}") from None


def get_advantage_estimator(name: str, kind: str | None = None) -> Callable[..., Any]:
    """Look up an advantage estimator of ``kind`` (None: the name's only one); unknown names raise
    ``KeyError`` listing the known ones, a name of another kind says which kinds it has."""
    return ADVANTAGE_ESTIMATORS.get(name, kind)


def get_policy_loss(name: str, kind: str | None = None) -> Callable[..., Any]:
    """Look up a policy loss of ``kind`` (None: the name's only one); unknown names raise
    ``KeyError`` listing the known ones, a name of another kind says which kinds it has."""
    return POLICY_LOSSES.get(name, kind)


def algorithm_loss(spec: AlgorithmSpec, runner: str | None = None) -> Callable[..., Any]:
    """The loss ``spec`` trains with on ``runner`` (default: its first)."""
    return POLICY_LOSSES.get(spec.loss, loss_kind(spec, runner))


def algorithm_estimator(spec: AlgorithmSpec, runner: str | None = None) -> Callable[..., Any]:
    """The advantage estimator ``spec`` uses on ``runner``; ``ValueError`` for kinds without one."""
    kind = estimator_kind(spec, runner)
    if kind is None or spec.advantage is None:
        raise ValueError(f"algorithm {spec.name!r} ({spec.kind}) has no advantage estimator")
    return ADVANTAGE_ESTIMATORS.get(spec.advantage, kind)


def load_algorithm(cfg: Mapping[str, Any]) -> AlgorithmSpec:
    """The spec an ``algorithm`` config section names, after importing its ``plugins``: every
    worker process calls this before its lookups, so what a user's plugin module registers is
    known in Ray worker processes too, not only in the driver."""
    import_plugins(cfg.get("plugins") or ())
    return get_algorithm(cfg["name"])


# ----------------------------------------------------------------------------- built-in pieces
for _name, _fn in (("gae", gae_estimator), ("grpo", grpo_estimator)):
    ADVANTAGE_ESTIMATORS.register(_name, _fn, "on_policy")
for _name, _fn in (("gae", gae_token_estimator), ("grpo", grpo_token_estimator), ("reinforce_pp", reinforce_pp_token_estimator),
                   ("reinforce_pp_baseline", reinforce_pp_baseline_token_estimator)):
    ADVANTAGE_ESTIMATORS.register(_name, _fn, "token")
POLICY_LOSSES.register("ppo", ppo_objective, "on_policy")
POLICY_LOSSES.register("ppo", ppo_token_loss, "token")
POLICY_LOSSES.register("llm_ppo", ppo_token_loss, "token")  # the language-model-only algorithms' name for it
POLICY_LOSSES.register("sft", sft_objective, "sft")
POLICY_LOSSES.register("sft", policy_sft_loss, "policy_sft")
for _name, _fn in (("sac", sac_loss), ("crossq", crossq_loss), ("rlpd", rlpd_loss), ("bc", bc_loss), ("iql", iql_loss)):
    POLICY_LOSSES.register(_name, _fn, "learner")

register_algorithm(
    AlgorithmSpec(
        name="ppo",
        kind="on_policy",
        advantage="gae",
        loss="ppo",
        uses_critic=True,
        episodic_groups=False,
        description="PPO: GAE advantages, clipped surrogate, learned critic (token-level GAE on language models)",
        runners=("onpolicy", "llm"),
    )
)
register_algorithm(
    AlgorithmSpec(
        name="grpo",
        kind="on_policy",
        advantage="grpo",
        loss="ppo",
        uses_critic=False,
        episodic_groups=True,
        description="GRPO: critic-free, scores normalised within groups sharing a reset seed or a prompt",
        runners=("onpolicy", "llm"),
    )
)
for _name, _target, _dataset, _desc in (
    ("sac", True, False, "SAC: squashed-Gaussian actor, twin critics with a Polyak target, automatic entropy tuning"),
    ("crossq", False, False, "CrossQ: SAC without a target network; BatchNorm critics see current and next state-actions jointly"),
    ("rlpd", True, True, "RLPD: SAC on symmetric offline/online batches, LayerNorm critic ensemble, min of 2 random target critics"),
):
    register_algorithm(
        AlgorithmSpec(name=_name, kind="off_policy", advantage=None, loss=_name, uses_critic=True, episodic_groups=False,
                      description=_desc, target_network=_target, needs_dataset=_dataset)
    )
register_algorithm(  # DSRL-SAC: the noise space is the env's action space (rlweave.envs.dsrl), the learner is SAC's
    AlgorithmSpec(name="dsrl", kind="off_policy", advantage=None, loss="sac", uses_critic=True, episodic_groups=False,
                  description="DSRL: SAC over the initial noise of a frozen flow policy (env.id dsrl/<id>, "
                              "env.kwargs.base_policy RUN_DIR), which decodes each noise into an action chunk",
                  target_network=True)
)
for _name, _labelling, _desc in (
    ("bc", "expert", "behaviour cloning: the expert acts and labels every state; the actor regresses its actions"),
    ("dagger", "mixture", "DAgger: the learner acts (the expert with a decaying probability), the expert labels every visited state"),
    ("hg_dagger", "gated", "HG-DAgger: the learner acts, a gate hands control to the expert, only those states are labelled"),
):
    register_algorithm(
        AlgorithmSpec(name=_name, kind="imitation", advantage=None, loss="bc", uses_critic=False,
                      episodic_groups=False, description=_desc, labelling=_labelling)
    )
register_algorithm(
    AlgorithmSpec(name="iql", kind="offline", advantage=None, loss="iql", uses_critic=True, episodic_groups=False,
                  description="IQL: expectile value regression, Q towards r + V(s'), advantage-weighted policy extraction (offline)",
                  target_network=True, value_network=True, needs_dataset=True)
)
register_algorithm(
    AlgorithmSpec(name="offline_bc", kind="offline", advantage=None, loss="bc", uses_critic=False, episodic_groups=False,
                  description="behaviour cloning on a dataset: the actor regresses the dataset's actions (offline)",
                  needs_dataset=True)
)

# language models only (runner=llm); how they differ is data: estimator, loss and the recipe's settings
for _name, _adv, _critic, _async, _desc in (
    ("dapo", "grpo", False, False,
     "DAPO: GRPO with clip-higher, dynamic sampling of informative groups, token-level loss, overlong penalty"),
    ("reinforce_pp", "reinforce_pp", False, False,
     "REINFORCE++: reward-to-go with a per-token KL penalty, whitened over the global batch; no critic, no groups"),
    ("reinforce_pp_baseline", "reinforce_pp_baseline", False, False,
     "REINFORCE++ with baseline: each score minus its prompt group's mean, then global whitening"),
    ("async_ppo", "grpo", False, True,
     "asynchronous PPO: generation overlaps training within a staleness bound, importance-corrected against the behaviour policy"),
):
    register_algorithm(
        AlgorithmSpec(name=_name, kind="on_policy", advantage=_adv, loss="llm_ppo", uses_critic=_critic,
                      episodic_groups=True, description=_desc, runners=("llm",), asynchronous=_async)
    )
register_algorithm(
    AlgorithmSpec(name="sft", kind="sft", advantage=None, loss="sft", uses_critic=False, episodic_groups=False,
                  description="supervised fine-tuning of a language model on prompt-response data (full or LoRA), "
                              "or of an embodied policy on demonstrations (runner policy_sft)",
                  needs_dataset=True, runners=("llm", "policy_sft"))
)
