"""Policy registry: build a policy by name from gymnasium observation and action spaces.

A builder is ``builder(observation_space, action_space, **kwargs) -> Policy``. When the spaces do
not fit, it raises :class:`SpaceMismatchError` with the requirement and the space (``"needs a 1-D
Box observation space, got Box(...)"``); :func:`build_policy` prefixes the policy name, giving one
line such as ``policy 'mlp' needs a 1-D Box observation space, got Box(0, 255, (64, 64, 3), uint8)``.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import gymnasium as gym
import numpy as np

from rlweave.utils.plugins import import_plugins

from .flow_policy import FlowPolicy
from .flow_sac import FlowSACPolicy
from .offpolicy import SquashedGaussianPolicy
from .policies import CNNPolicy, MLPPolicy, Policy
from .recap_policy import RecapFlowPolicy

__all__ = ["POLICIES", "SpaceMismatchError", "register_policy", "build_policy"]


class SpaceMismatchError(ValueError):
    """A builder's spaces do not fit the policy; the message is '<requirement>, got <space>'."""


def _check_action_space(action_space) -> None:
    if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise SpaceMismatchError(f"needs a Box or Discrete action space, got {action_space}")


def _build_mlp(observation_space, action_space, **kwargs) -> MLPPolicy:
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    _check_action_space(action_space)
    return MLPPolicy(int(observation_space.shape[0]), action_space, **kwargs)


def _build_cnn(observation_space, action_space, **kwargs) -> CNNPolicy:
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 3
            and observation_space.dtype == np.uint8):
        raise SpaceMismatchError(
            f"needs a 3-D uint8 Box observation space (H, W, C), got {observation_space}"
        )
    _check_action_space(action_space)
    return CNNPolicy(tuple(observation_space.shape), action_space, **kwargs)


def _build_squashed_mlp(observation_space, action_space, critic: bool = False, **kwargs) -> SquashedGaussianPolicy:
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    if not (isinstance(action_space, gym.spaces.Box) and np.all(np.isfinite(action_space.low))
            and np.all(np.isfinite(action_space.high))):
        raise SpaceMismatchError(f"needs a bounded Box action space, got {action_space}")
    if critic:
        raise SpaceMismatchError("has no value head (its critics live with the off-policy learner), got critic=True")
    return SquashedGaussianPolicy(int(observation_space.shape[0]), action_space, **kwargs)


def _build_flow_mlp(observation_space, action_space, log_std_init: float | None = None,
                    state_dependent_std: bool | None = None, **kwargs) -> FlowPolicy:
    # log_std_init / state_dependent_std: Gaussian-policy settings every policy.* config carries
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    if not isinstance(action_space, gym.spaces.Box):
        raise SpaceMismatchError(f"needs a Box action space, got {action_space}")
    return FlowPolicy(int(observation_space.shape[0]), action_space, **kwargs)


def _build_recap_flow_mlp(observation_space, action_space, log_std_init: float | None = None,
                          state_dependent_std: bool | None = None, **kwargs) -> RecapFlowPolicy:
    # flow_mlp with RECAP's advantage indicator as an input (rlweave.models.recap_policy)
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    if not isinstance(action_space, gym.spaces.Box):
        raise SpaceMismatchError(f"needs a Box action space, got {action_space}")
    return RecapFlowPolicy(int(observation_space.shape[0]), action_space, **kwargs)


def _build_flow_sac(observation_space, action_space, critic: bool = False, normalize_obs: bool = False,
                    log_std_init: float | None = None, ortho_init: bool | None = None,
                    state_dependent_std: bool | None = None, **kwargs) -> FlowSACPolicy:
    # log_std_init / ortho_init / state_dependent_std: settings every policy.* config carries; the
    # flow actor's stds are always state-dependent (policy.kwargs.log_std_bounds bounds them)
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    if not (isinstance(action_space, gym.spaces.Box) and np.all(np.isfinite(action_space.low))
            and np.all(np.isfinite(action_space.high))):
        raise SpaceMismatchError(f"needs a bounded Box action space, got {action_space}")
    if critic:
        raise SpaceMismatchError("has no value head (its critics live with the off-policy learner), got critic=True")
    return FlowSACPolicy(int(observation_space.shape[0]), action_space, normalize_obs=normalize_obs, **kwargs)


def _build_vla(observation_space, action_space, **kwargs):
    """Vision-language-action policy (``rlweave.models.vla``: imported on first use, so rlweave
    itself never needs transformers)."""
    from .vla.space import build_vla_policy
    return build_vla_policy(observation_space, action_space, **kwargs)


POLICIES: dict[str, Callable[..., Policy]] = {"mlp": _build_mlp, "cnn": _build_cnn, "squashed_mlp": _build_squashed_mlp,
                                              "flow_mlp": _build_flow_mlp, "flow_sac": _build_flow_sac,
                                              "vla": _build_vla, "recap_flow_mlp": _build_recap_flow_mlp}


def register_policy(name: str, builder: Callable[..., Policy] | None = None):
    """Register ``builder`` under ``name`` (replacing any previous one). Without ``builder``,
    returns a decorator: ``@register_policy("mine")``."""
    if builder is None:
        def deco(fn: Callable[..., Policy]) -> Callable[..., Policy]:
            POLICIES[name] = fn
            return fn
        return deco
    POLICIES[name] = builder
    return builder


def build_policy(name: str, observation_space, action_space, plugins: Iterable[str] = (), **kwargs) -> Policy:
    """Build policy ``name`` for the given spaces; extra kwargs go to the policy constructor.
    ``plugins``: modules imported first (``algorithm.plugins``), so a name a user's module
    registers is known in whichever process builds the policy (Ray workers are fresh processes).

    Raises ``KeyError`` (listing known policies) for an unknown name and ``ValueError`` (one line
    naming the policy and the space) when the spaces do not fit.
    """
    import_plugins(plugins)
    try:
        builder = POLICIES[name]
    except KeyError:
        raise KeyError(
            f"unknown policy {name!r}; known policies: {', '.join(sorted(POLICIES))}"
        ) from None
    try:
        return builder(observation_space, action_space, **kwargs)
    except SpaceMismatchError as e:
        raise ValueError(f"policy {name!r} {e}") from None
