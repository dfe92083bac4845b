"""Observations as policy inputs: one place that turns what an env hands out (an array, or the
flat dict of arrays of the manipulation contract) into the tensors a policy takes.

Why one place: the rollout worker, the trainer, evaluation, the planner's profile and experts all
feed policies; each used to cast on its own (``float()`` unless the space is uint8 pixels). Dict
observations keep their uint8 images and instruction bytes as they are (a quarter of the bytes;
the model normalises them) and make float leaves float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlweave.utils.tree import is_dict, tree_to_torch

__all__ = ["float_observations", "policy_input"]


def float_observations(observation_space: Any) -> bool:
    """Whether an array observation of this space is cast to float (not for uint8 pixels). Dict
    spaces are cast leaf by leaf in :func:`policy_input`, so the answer for them is unused."""
    return getattr(observation_space, "dtype", None) != np.uint8


def policy_input(obs: Any, float_obs: bool = True, device: Any = None, copy: bool = False) -> Any:
    """``obs`` as torch: a tensor (float32 when ``float_obs``) or a dict of tensors. ``copy``: take a
    writable copy first (Ray hands out read-only arrays; torch warns on those)."""
    if is_dict(obs):
        return tree_to_torch({k: np.array(v) if copy else v for k, v in obs.items()}, device)
    x = torch.as_tensor(np.array(obs) if copy else obs, device=device)
    return x.float() if float_obs and x.dtype != torch.float32 else x
