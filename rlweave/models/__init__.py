"""Models: the policy contract, MLP/CNN policies, off-policy actor and critic ensembles, observation normalisation, and the registry."""
from .normalizer import RunningMeanStd
from .offpolicy import QEnsemble, SquashedGaussianPolicy
from .policies import ACTIVATIONS, CNNPolicy, MLPPolicy, Policy, flat_params_checksum, state_dict_checksum
from .registry import POLICIES, SpaceMismatchError, build_policy, register_policy

__all__ = [
    "ACTIVATIONS",
    "CNNPolicy",
    "MLPPolicy",
    "POLICIES",
    "QEnsemble",
    "SquashedGaussianPolicy",
    "Policy",
    "RunningMeanStd",
    "SpaceMismatchError",
    "build_policy",
    "flat_params_checksum",
    "register_policy",
    "state_dict_checksum",
]
