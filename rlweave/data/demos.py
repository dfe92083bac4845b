"""Demonstrations for supervised fine-tuning of embodied policies (``algorithm.name=sft``,
``runner: policy_sft``): a Minari dataset folder read into memory as (observation, action chunk)
samples.

Why chunks: policies that act in chunks of H actions (OpenVLA-OFT, π0, flow policies) learn to
predict the H demonstrated actions that follow each observation. Near an episode's end the chunk
runs past the last action; those steps repeat the last action (the usual choice: it keeps the
target a plausible continuation rather than padding with zeros the policy would learn to emit).

Observations are one array or the flat dict of the manipulation contract (camera images, state,
instruction bytes); both are held as numpy, sampled by row and handed to the trainer as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlweave.data.datasets import DatasetError, open_dataset
from rlweave.utils.tree import is_dict, tree_index

__all__ = ["Demonstrations", "check_demonstration_spaces", "load_demonstrations"]


@dataclass
class Demonstrations:
    """Every step of a dataset: ``obs`` [N, ...] (array or dict of arrays), ``actions`` [N, H, A]
    (the H actions from each step on), ``episode`` [N] (which episode each row came from),
    ``rewards`` [N] (the reward of each row's step: RECAP's returns come from them) and
    ``columns``: further per-row arrays a loss adds (RECAP's advantage indicator), sampled with
    the rows."""

    obs: Any
    actions: np.ndarray
    episode: np.ndarray
    episodes: int
    success_rate: float | None
    rewards: np.ndarray | None = None
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.actions)

    def sample(self, n: int, rng: np.random.Generator) -> dict:
        """``n`` rows drawn uniformly with replacement: ``{"obs": ..., "actions": ...}``, plus
        ``"columns"`` (those rows of each column) when there are columns."""
        idx = rng.integers(0, len(self), size=n)
        out = {"obs": tree_index(self.obs, idx), "actions": self.actions[idx]}
        if self.columns:
            out["columns"] = {k: v[idx] for k, v in self.columns.items()}
        return out


def load_demonstrations(path: str | Path, chunk: int = 1, observation_space=None, action_space=None) -> Demonstrations:
    """Reads the Minari dataset at ``path``; checks its observation keys/shapes and action shape
    against the env's spaces when given (one line naming both on a mismatch)."""
    if chunk < 1:
        raise ValueError(f"env.chunk: must be >= 1, got {chunk}")
    ds = open_dataset(path)
    if observation_space is not None and action_space is not None:
        check_demonstration_spaces(path, observation_space, action_space, ds)
    obs_parts: list = []
    act_parts, ep_parts, rew_parts = [], [], []
    successes: list[float] = []
    for i, ep in enumerate(ds.iterate_episodes()):
        n = len(ep.actions)
        if n == 0:
            continue
        obs = ep.observations
        obs_parts.append({k: np.asarray(v)[:n] for k, v in obs.items()} if is_dict(obs) else np.asarray(obs)[:n])
        actions = np.asarray(ep.actions, dtype=np.float32).reshape(n, -1)
        idx = np.minimum(np.arange(n)[:, None] + np.arange(chunk)[None, :], n - 1)  # past the end: the last action
        act_parts.append(actions[idx])
        ep_parts.append(np.full(n, i, dtype=np.int64))
        rew_parts.append(np.asarray(ep.rewards, dtype=np.float32).reshape(-1)[:n])
        infos = getattr(ep, "infos", None) or {}
        if "success" in infos:
            successes.append(float(np.any(np.asarray(infos["success"]))))
    if not act_parts:
        raise DatasetError(f"dataset {path}: no steps in it")
    obs = ({k: np.concatenate([p[k] for p in obs_parts]) for k in obs_parts[0]} if is_dict(obs_parts[0])
           else np.concatenate(obs_parts))
    return Demonstrations(obs=obs, actions=np.concatenate(act_parts), episode=np.concatenate(ep_parts),
                          episodes=len(act_parts), success_rate=float(np.mean(successes)) if successes else None,
                          rewards=np.concatenate(rew_parts))


def check_demonstration_spaces(path: str | Path, observation_space, action_space, ds=None) -> None:
    """Refuses a dataset whose observation keys/shapes or action shape differ from the env's, on
    one line naming both."""
    ds = ds if ds is not None else open_dataset(path)
    _check_space(path, "observation", ds.observation_space, observation_space)
    _check_space(path, "action", ds.action_space, action_space)


def _check_space(path, what: str, got, want) -> None:
    def shapes(space):
        spaces = getattr(space, "spaces", None)
        if spaces is not None:
            return {k: tuple(s.shape) for k, s in spaces.items()}
        return tuple(space.shape) if space.shape is not None else ()

    if shapes(got) != shapes(want):
        raise DatasetError(f"dataset {path}: {what} space {shapes(got)} does not match the env's {shapes(want)}")
