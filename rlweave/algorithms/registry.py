"""One registry for every algorithm rlweave knows.

Three name -> object tables, filled at import time and extended by later modules (off-policy
updates such as SAC/CrossQ/IQL, imitation such as SFT/DAgger) through the ``register_*``
functions:

* ``ADVANTAGE_ESTIMATORS``: name -> estimator function (``gae``, ``grpo``, ...).
* ``POLICY_LOSSES``: name -> loss function returning a ``dict`` of ``loss_*`` terms; every
  algorithm's update rule lives here, whatever its kind.
* ``ALGORITHMS``: name -> :class:`AlgorithmSpec`, the recipe tying an estimator and a loss
  together plus the facts a runner needs to wire it (on/off-policy, critic, grouping).

Lookups fail with a one-line ``KeyError`` naming the known entries, so a typo in a config says
what would have been accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlweave.algorithms.advantages import gae, group_normalized_advantages
from rlweave.algorithms.losses import ppo_loss
from rlweave.algorithms.imitation import bc_loss
from rlweave.algorithms.llm import llm_policy_loss, reinforce_pp_advantages, sft_loss
from rlweave.algorithms.offpolicy import crossq_loss, iql_loss, rlpd_loss, sac_loss

__all__ = [
    "ALGORITHM_KINDS",
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "ALGORITHMS",
    "AlgorithmSpec",
    "UnknownNameError",
    "register_algorithm",
    "register_advantage_estimator",
    "register_policy_loss",
    "get_algorithm",
    "get_advantage_estimator",
    "get_policy_loss",
]

ALGORITHM_KINDS = ("on_policy", "off_policy", "imitation", "offline")
# the runner an algorithm of each kind runs with, unless its spec names others
DEFAULT_RUNNERS = {"on_policy": ("onpolicy",), "off_policy": ("offpolicy",), "imitation": ("offpolicy",),
                   "offline": ("offpolicy",)}

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Any]] = {
    "gae": gae,
    "grpo": group_normalized_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce_pp_baseline": reinforce_pp_advantages,  # with baseline=True
}

POLICY_LOSSES: dict[str, Callable[..., Any]] = {
    "ppo": ppo_loss,
    "sac": sac_loss,
    "crossq": crossq_loss,
    "rlpd": rlpd_loss,
    "bc": bc_loss,
    "iql": iql_loss,
    "llm_ppo": llm_policy_loss,
    "sft": sft_loss,
}


class UnknownNameError(KeyError):
    """``KeyError`` whose ``str()`` is the plain message (``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class AlgorithmSpec:
    """Static description of an algorithm: which pieces to use and how a runner must feed them.

    Attributes:
        name: registry key, as written in configs.
        kind: ``"on_policy"`` | ``"off_policy"`` | ``"imitation"`` | ``"offline"`` (learns from a
            dataset alone; the env only evaluates); picks the runner loop.
        advantage: key in ``ADVANTAGE_ESTIMATORS``, or None (off-policy / imitation).
        loss: key in ``POLICY_LOSSES``.
        uses_critic: whether a value head/critic is trained (the runner then computes values).
        episodic_groups: True when advantages compare whole episodes grouped by reset seed
            (GRPO), so the rollout must run each group to episode end from identical resets.
        description: one line for ``--help`` and docs.
        target_network: off-policy: the learner keeps a Polyak-averaged copy of the critic.
        value_network: the learner also trains a state-value network V(s) (IQL).
        needs_dataset: learns from an offline dataset (``replay.offline_dataset``), beside online
            data or (kind ``offline``) alone.
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


def _unknown(what: str, name: str, table: dict[str, Any]) -> UnknownNameError:
    known = ", ".join(sorted(table)) or "(none)"
    return UnknownNameError(f"unknown {what} {name!r}; known: {known}")


def _register(what: str, table: dict[str, Any], name: str, obj: Any) -> None:
    if name in table:
        raise ValueError(f"{what} {name!r} is already registered")
    table[name] = obj


def register_advantage_estimator(name: str, fn: F) -> F:
    """Add an advantage estimator under ``name``; ``ValueError`` if the name is taken."""
    _register("advantage estimator", ADVANTAGE_ESTIMATORS, name, fn)
    return fn


def register_policy_loss(name: str, fn: F) -> F:
    """Add a loss (returning a dict of ``loss_*`` terms) under ``name``; ``ValueError`` if taken."""
    _register("policy loss", POLICY_LOSSES, name, fn)
    return fn


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to ``ALGORITHMS``.

    Raises ``ValueError`` on a duplicate name, and ``KeyError`` if the spec names an estimator or
    loss that is not registered (register those first), so a broken recipe fails at import time
    rather than mid-training.
    """
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    if spec.advantage is not None and spec.advantage not in ADVANTAGE_ESTIMATORS:
        raise _unknown("advantage estimator", spec.advantage, ADVANTAGE_ESTIMATORS)
    if spec.loss not in POLICY_LOSSES:
        raise _unknown("policy loss", spec.loss, POLICY_LOSSES)
    ALGORITHMS[spec.name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    """Look up an algorithm; unknown names raise ``KeyError`` listing the known ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise _unknown("algorithm", name, ALGORITHMS) from None


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """Look up an advantage estimator; unknown names raise ``KeyError`` listing the known ones."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise _unknown("advantage estimator", name, ADVANTAGE_ESTIMATORS) from None


def get_policy_loss(name: str) -> Callable[..., Any]:
    """Look up a policy loss; unknown names raise ``KeyError`` listing the known ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise _unknown("policy loss", name, POLICY_LOSSES) from None


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
    AlgorithmSpec(name="sft", kind="offline", advantage=None, loss="sft", uses_critic=False, episodic_groups=False,
                  description="supervised fine-tuning of a language model on prompt-response data (full or LoRA)",
                  needs_dataset=True, runners=("llm",))
)
