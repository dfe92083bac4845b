"""Trajectories for world-model training, read from the project's dataset format (Minari folders
written by ``rlweave collect``, demonstrations included).

Kept as whole episodes, not shuffled transitions, because the model is judged on what the env
will ask of it: multi-step open-loop prediction along a real trajectory. Episodes (not steps) are
split into training and held-out sets, so the held-out error measures trajectories the model has
never seen a step of.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlweave.data.datasets import DatasetError, open_dataset
from rlweave.world_models.base import WorldModelError

__all__ = ["Trajectories", "load_trajectories", "dataset_env_id"]


@dataclass
class Trajectories:
    """Episodes of one dataset: per episode ``obs`` [T+1, *obs] (float32 states or uint8 images),
    ``actions`` [T, act],
    ``rewards`` [T], ``terminated`` [T] (the real termination flag of each step)."""

    obs: list[np.ndarray]
    actions: list[np.ndarray]
    rewards: list[np.ndarray]
    terminated: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def steps(self) -> int:
        return int(sum(len(a) for a in self.actions))

    def subset(self, idx) -> "Trajectories":
        return Trajectories(*[[part[i] for i in idx] for part in (self.obs, self.actions, self.rewards, self.terminated)])

    def transitions(self) -> dict[str, np.ndarray]:
        """Every step as one row: ``obs``, ``action``, ``next_obs``, ``reward``, ``terminated``."""
        return {
            "obs": np.concatenate([o[:-1] for o in self.obs]),  # state datasets (images are sampled as windows)
            "action": np.concatenate(self.actions),
            "next_obs": np.concatenate([o[1:] for o in self.obs]),
            "reward": np.concatenate(self.rewards),
            "terminated": np.concatenate(self.terminated).astype(np.float32),
        }

    def window_starts(self, horizon: int) -> np.ndarray:
        """(episode, step) of every ``horizon``-step window that stays inside its episode and
        ends at or before its termination: [N, 2] int64."""
        starts = []
        for e, (a, te) in enumerate(zip(self.actions, self.terminated)):
            end = int(np.argmax(te)) + 1 if te.any() else len(a)  # steps up to and including the end
            starts += [(e, s) for s in range(0, end - horizon + 1)]
        return np.asarray(starts, dtype=np.int64).reshape(-1, 2)

    def gather(self, starts: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
        """The windows at ``starts`` (from :meth:`window_starts`): ``obs0`` [N, *obs], ``actions``
        [N, H, *act], ``obs`` [N, H, *obs] (the real observations after each action), ``rewards``
        [N, H], ``terminated`` [N, H]. Copies only these windows (image datasets are large)."""
        o0, acts, obs, rews, terms = [], [], [], [], []
        for e, s in starts:
            o = self.obs[e]
            o0.append(o[s])
            acts.append(self.actions[e][s:s + horizon])
            obs.append(o[s + 1:s + horizon + 1])
            rews.append(self.rewards[e][s:s + horizon])
            terms.append(self.terminated[e][s:s + horizon])
        return {"obs0": np.stack(o0), "actions": np.stack(acts), "obs": np.stack(obs), "rewards": np.stack(rews),
                "terminated": np.stack(terms)}

    def windows(self, horizon: int, max_windows: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """Every ``horizon``-step window (at most ``max_windows``, drawn at random), gathered."""
        starts = self.window_starts(horizon)
        if len(starts) == 0:
            raise WorldModelError(f"no held-out window of {horizon} steps: the held-out episodes are shorter; lower --horizon")
        if max_windows is not None and len(starts) > max_windows:
            starts = starts[np.sort(np.random.default_rng(seed).choice(len(starts), max_windows, replace=False))]
        return self.gather(starts, horizon)


def load_trajectories(path: str | Path) -> tuple[Trajectories, object, object]:
    """The episodes of the Minari dataset at ``path`` and its (observation, action) spaces.
    Refuses, on one line, datasets this module cannot model: observations that are not one flat
    box (dict observations need a pixel/multi-key model kind), or a dataset without steps."""
    try:
        ds = open_dataset(path)
    except DatasetError as e:
        raise WorldModelError(str(e)) from None
    obs_space, act_space = ds.observation_space, ds.action_space
    if getattr(obs_space, "shape", None) is None or getattr(obs_space, "spaces", None) is not None:
        raise WorldModelError(f"dataset {path}: observation space {obs_space} is not one box; world models here take "
                              "state vectors (kind mlp_ensemble) or camera images (kind pixel_rnn)")
    if getattr(act_space, "shape", None) is None or not hasattr(act_space, "low"):
        raise WorldModelError(f"dataset {path}: action space {act_space} is not a box; world models need continuous actions")
    parts: tuple[list, list, list, list] = ([], [], [], [])
    for ep in ds.iterate_episodes():
        n = len(ep.actions)
        if n == 0:
            continue
        obs = np.asarray(ep.observations)[: n + 1]  # images stay uint8 [T+1, H, W, C]; states become float32
        parts[0].append(obs if obs.dtype == np.uint8 else obs.astype(np.float32).reshape(n + 1, *obs_space.shape))
        parts[1].append(np.asarray(ep.actions, dtype=np.float32).reshape(n, -1))
        parts[2].append(np.asarray(ep.rewards, dtype=np.float32).reshape(n))
        parts[3].append(np.asarray(ep.terminations, dtype=bool).reshape(n))
    if not parts[1]:
        raise WorldModelError(f"dataset {path}: no steps in it")
    return Trajectories(*parts), obs_space, act_space


def dataset_env_id(path: str | Path) -> tuple[str, int | None]:
    """The gymnasium id and time limit of the env the dataset at ``path`` was recorded on (Minari
    keeps its spec): where policies trained in the model are evaluated."""
    spec = open_dataset(path).spec.env_spec
    if spec is None:
        raise WorldModelError(f"dataset {path}: records no env spec; cannot tell which real env to evaluate in")
    return spec.id, spec.max_episode_steps
