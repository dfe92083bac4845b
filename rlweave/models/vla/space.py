"""The registry's ``vla`` builder: a :class:`VLAPolicy` sized from gymnasium spaces.

The observation space must be the manipulation-env contract (``rlweave.envs.manipulation``): a
``Dict`` with ``"image"`` (uint8 H x W x 3; more cameras as ``"image_<name>"``), ``"instruction"``
(uint8, the UTF-8 bytes) and optionally ``"state"`` (1-D proprioception) and ``"privileged"``
(ignored). Anything else is refused with one line saying what is needed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import gymnasium as gym
import numpy as np

from ..registry import SpaceMismatchError
from .config import VLAConfig
from .policy import VLAPolicy

__all__ = ["build_vla_policy", "REQUIREMENT"]

REQUIREMENT = ("needs a Dict observation space with 'image' (uint8 Box H x W x 3), 'instruction' (uint8 1-D Box) "
               "and optionally 'state' (1-D Box)")
# generic ``policy.*`` settings every recipe carries; meaningless for a VLA, so not errors
_IGNORED = {"hidden", "activation", "normalize_obs", "ortho_init", "state_dependent_std", "shared_backbone"}
_FIELDS = {f.name for f in dataclasses.fields(VLAConfig)}


def _is_image(space: Any) -> bool:
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and space.shape[-1] == 3)


def _cameras(space: gym.spaces.Dict) -> list[str]:
    names = [k for k in space.spaces if k == "image" or k.startswith("image_")]
    if "image" not in names or not all(_is_image(space[k]) for k in names):
        raise SpaceMismatchError(f"{REQUIREMENT}, got {space}")
    return ["image"] + sorted(k for k in names if k != "image")


def build_vla_policy(observation_space: Any, action_space: Any, chunk: int = 1, head: str = "chunk",
                     instructions: Iterable[str] | None = None, critic: bool = True, **sizes: Any) -> VLAPolicy:
    """A VLA policy for the spaces. ``sizes``: any :class:`VLAConfig` field (``lm_hidden=...``,
    ``cameras=[...]`` to use a subset, ``image_size=...``; by default the env's own square size
    when it is a multiple of the patch, else 64). ``critic`` switches the value head."""
    if not isinstance(observation_space, gym.spaces.Dict):
        raise SpaceMismatchError(f"{REQUIREMENT}, got {observation_space}")
    cameras = _cameras(observation_space)
    instr = observation_space.spaces.get("instruction")
    if not (isinstance(instr, gym.spaces.Box) and instr.dtype == np.uint8 and len(instr.shape) == 1):
        raise SpaceMismatchError(f"{REQUIREMENT}, got {observation_space}")
    state = observation_space.spaces.get("state")
    if state is not None and not (isinstance(state, gym.spaces.Box) and len(state.shape) == 1):
        raise SpaceMismatchError(f"{REQUIREMENT}, got {observation_space}")
    if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
        raise SpaceMismatchError(f"needs a 1-D Box action space, got {action_space}")
    unknown = sorted(set(sizes) - _FIELDS - _IGNORED)
    if unknown:
        raise TypeError(f"vla: unknown settings {', '.join(unknown)}")
    sizes = {k: v for k, v in sizes.items() if k in _FIELDS}
    A = int(action_space.shape[0])
    low = np.where(np.isfinite(action_space.low), action_space.low, -1.0).astype(float).tolist()
    high = np.where(np.isfinite(action_space.high), action_space.high, 1.0).astype(float).tolist()
    H_img = observation_space["image"].shape[0]
    patch = int(sizes.get("patch_size", VLAConfig.patch_size))
    default_size = H_img if H_img == observation_space["image"].shape[1] and H_img % patch == 0 else 64
    settings: dict[str, Any] = dict(
        head=head, chunk=int(chunk), action_dim=A, action_low=low, action_high=high, cameras=cameras,
        state_dim=int(state.shape[0]) if state is not None else 0, instruction_bytes=int(instr.shape[0]),
        image_size=default_size, value_head=bool(critic))
    settings.update(sizes)
    missing = [c for c in settings["cameras"] if c not in cameras]
    if missing:
        raise SpaceMismatchError(f"{REQUIREMENT} and the cameras {missing}, got {observation_space}")
    return VLAPolicy(VLAConfig(**settings), instructions=list(instructions) if instructions else None)
