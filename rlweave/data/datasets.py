"""Offline datasets in the Minari format: writing them from rlweave policies, reading them as replay
transitions.

Nothing can be downloaded on the machines rlweave is developed on, so datasets are made locally:
``rlweave collect RUN_DIR --episodes N -o DATASET`` rolls a run's policy (a checkpoint of chosen
quality: early = medium, last = expert; or uniform random actions) through Minari's
``DataCollector`` and writes a standard Minari dataset folder. Any Minari dataset folder, made here
or elsewhere, loads into a replay source with :func:`load_transitions`, which first checks that its
spaces match the env's.

Minari is an optional extra (``pip install 'rlweave[offline]'``); importing rlweave never needs it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np

__all__ = ["DatasetError", "require_minari", "open_dataset", "dataset_spaces", "collect_dataset", "load_transitions"]

OFFLINE_VERSION = -2  # policy_version of transitions that came from a dataset


class DatasetError(ValueError):
    """A dataset that cannot be used; the message is one line naming the dataset."""


def require_minari():
    try:
        import minari
    except ImportError:
        raise ImportError("offline datasets need Minari: pip install 'rlweave[offline]' (minari[create,hdf5])") from None
    return minari


def _data_dir(path: str | Path) -> Path:
    """The folder holding a Minari dataset's ``metadata.json``: ``path`` itself or its ``data``."""
    path = Path(path)
    for candidate in (path / "data", path):
        if (candidate / "metadata.json").is_file():
            return candidate
    raise DatasetError(f"dataset {path}: not a Minari dataset folder (no metadata.json in it or in its data/)")


def open_dataset(path: str | Path):
    """The dataset at ``path``: a Minari dataset folder, or a LeRobot v3 folder (``meta/info.json``;
    :mod:`rlweave.data.lerobot_format`, read with the same interface, without Minari)."""
    from rlweave.data.lerobot_format import is_lerobot_dataset
    from rlweave.data.lerobot_reader import LeRobotEpisodes

    if is_lerobot_dataset(path):
        return LeRobotEpisodes(path)
    minari = require_minari()
    return minari.MinariDataset(_data_dir(path))


def dataset_spaces(path: str | Path):
    """(observation_space, action_space) of the dataset at ``path``."""
    ds = open_dataset(path)
    return ds.observation_space, ds.action_space


def check_spaces(path: str | Path, observation_space, action_space) -> None:
    """Refuses a dataset whose spaces do not match the env's, naming both shapes."""
    obs, act = dataset_spaces(path)
    if tuple(obs.shape) != tuple(observation_space.shape) or tuple(act.shape) != tuple(action_space.shape):
        raise DatasetError(
            f"dataset {path}: observation shape {tuple(obs.shape)} and action shape {tuple(act.shape)} do not match "
            f"the env's observation shape {tuple(observation_space.shape)} and action shape {tuple(action_space.shape)}"
        )


def collect_dataset(
    make_env: Callable[..., "object"],
    act: Callable[[np.ndarray], np.ndarray] | None,
    episodes: int,
    out: str | Path,
    name: str,
    seed: int = 0,
    description: str = "",
    slots: int = 1,
) -> dict:
    """Runs ``episodes`` episodes of ``act(obs) -> action`` (None: uniform random actions) on the
    env ``make_env()`` and writes them as a Minari dataset folder at ``out`` (which must not exist).
    ``slots`` > 1: episodes take turns over the envs ``make_env(slot=i)``, i < slots (a multi-task
    suite gives each slot its task, so the dataset covers every task evenly).
    Returns the dataset's episode count, steps, mean/std episode return and, where the env
    reports success, the success rate."""
    minari = require_minari()
    out = Path(out)
    if out.exists():
        raise DatasetError(f"dataset {out}: already exists; choose another -o")
    env = minari.DataCollector(make_env() if slots == 1 else _SlotCycle([make_env(slot=i) for i in range(slots)]))
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    returns, successes, steps = [], [], 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=int(rng.integers(0, 2**31 - 1)))
        done, total, info = False, 0.0, {}
        while not done:
            action = env.action_space.sample() if act is None else act(obs)
            obs, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        if "success" in info:
            successes.append(float(info["success"]))
    dataset_id = f"rlweave/{name}-v0"
    previous = os.environ.get("MINARI_DATASETS_PATH")
    with tempfile.TemporaryDirectory(prefix="rlweave-minari-") as root:
        os.environ["MINARI_DATASETS_PATH"] = root  # Minari writes under its root; the folder then moves to ``out``
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=UserWarning, module="minari")  # optional metadata (email, permalink)
                env.create_dataset(dataset_id=dataset_id, eval_env=env.spec, algorithm_name="rlweave", author="rlweave",
                                   description=description or None)
        finally:
            if previous is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(root) / "rlweave" / f"{name}-v0"), str(out))
    env.close()
    return {"episodes": episodes, "steps": steps, "return_mean": float(np.mean(returns)),
            "return_std": float(np.std(returns)), "success_rate": float(np.mean(successes)) if successes else None,
            "dataset_id": dataset_id, "path": str(out)}


class _SlotCycle(gym.Env):
    """Several envs with one observation and action space behind one env interface: each reset
    moves to the next (a dataset collector records one env)."""

    def __init__(self, envs: list):
        self.envs, self.index = envs, -1
        first = envs[0]
        self.observation_space, self.action_space = first.observation_space, first.action_space
        self.spec = first.spec

    @property
    def env(self):
        return self.envs[self.index]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.index = (self.index + 1) % len(self.envs)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        return self.env.step(action)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def load_transitions(path: str | Path, observation_space, action_space, gamma: float) -> tuple[dict[str, np.ndarray], dict]:
    """Every step of the dataset at ``path`` as one-step transitions (the replay format of
    :mod:`rlweave.data.replay`), after checking its spaces against the env's. Also returns the
    dataset's statistics (episodes, steps, mean/std/min/max episode return)."""
    check_spaces(path, observation_space, action_space)
    ds = open_dataset(path)
    parts: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "next_obs", "discount")}
    returns = []
    for ep in ds.iterate_episodes():
        obs = np.asarray(ep.observations, dtype=np.float32)
        n = len(ep.rewards)
        parts["obs"].append(obs[:n])
        parts["next_obs"].append(obs[1 : n + 1])
        parts["action"].append(np.asarray(ep.actions, dtype=np.float32).reshape(n, -1))
        parts["reward"].append(np.asarray(ep.rewards, dtype=np.float32))
        parts["discount"].append((gamma * (1.0 - np.asarray(ep.terminations, dtype=np.float32))).astype(np.float32))
        returns.append(float(np.sum(ep.rewards)))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["policy_version"] = np.full(len(out["reward"]), OFFLINE_VERSION, dtype=np.int64)
    stats = {"episodes": len(returns), "steps": int(len(out["reward"])), "return_mean": float(np.mean(returns)),
             "return_std": float(np.std(returns)), "return_min": float(np.min(returns)), "return_max": float(np.max(returns))}
    return out, stats
