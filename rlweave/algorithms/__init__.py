"""Algorithms layer: advantage estimators, losses, and the algorithm registry.

Pure functions on tensors (see ``advantages`` and ``losses``), the call signatures a registered
piece of each kind follows (``contracts``), plus one registry (``registry``) that maps config
names to them. Runners and workers use this layer; it imports nothing above it.
"""

from rlweave.algorithms.advantages import (
    discounted_returns,
    gae,
    group_normalized_advantages,
    normalize,
)
from rlweave.algorithms.losses import (
    entropy_bonus,
    masked_mean,
    ppo_loss,
    ppo_objective,
    ppo_policy_loss,
    total_loss,
    value_loss,
)
from rlweave.algorithms.imitation import bc_loss
from rlweave.algorithms.offpolicy import (
    ActorCriticLoss, LearnerNets, LossOptions, crossq_loss, has_concurrent_parts, iql_loss, rlpd_loss, sac_loss, soft_update,
)
from rlweave.algorithms.contracts import (
    Advantages,
    OnPolicyAdvantageInput,
    OnPolicyLossInput,
    SFTLossInput,
    TokenAdvantageInput,
    TokenLossInput,
)
from rlweave.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHM_KINDS,
    ALGORITHMS,
    POLICY_LOSSES,
    AlgorithmSpec,
    UnknownNameError,
    WrongKindError,
    algorithm_estimator,
    algorithm_loss,
    estimator_kind,
    get_advantage_estimator,
    get_algorithm,
    get_policy_loss,
    load_algorithm,
    loss_kind,
    register_advantage_estimator,
    register_algorithm,
    register_policy_loss,
)
from rlweave.algorithms import recap as _recap  # noqa: F401,E402 - registers the recap loss and algorithm

__all__ = [
    "gae",
    "discounted_returns",
    "group_normalized_advantages",
    "normalize",
    "masked_mean",
    "ppo_policy_loss",
    "value_loss",
    "entropy_bonus",
    "ppo_loss",
    "ppo_objective",
    "total_loss",
    "sac_loss",
    "crossq_loss",
    "rlpd_loss",
    "iql_loss",
    "ActorCriticLoss",
    "has_concurrent_parts",
    "LearnerNets",
    "LossOptions",
    "bc_loss",
    "soft_update",
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHM_KINDS",
    "ALGORITHMS",
    "POLICY_LOSSES",
    "AlgorithmSpec",
    "UnknownNameError",
    "WrongKindError",
    "Advantages",
    "OnPolicyAdvantageInput",
    "OnPolicyLossInput",
    "SFTLossInput",
    "TokenAdvantageInput",
    "TokenLossInput",
    "algorithm_estimator",
    "algorithm_loss",
    "estimator_kind",
    "load_algorithm",
    "loss_kind",
    "get_advantage_estimator",
    "get_algorithm",
    "get_policy_loss",
    "register_advantage_estimator",
    "register_algorithm",
    "register_policy_loss",
]
