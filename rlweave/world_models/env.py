"""The world-model env suite: ``env.id: world_model/<model folder>``.

A trained world model becomes a gymnasium env, and through the ``world_model`` suite a batched
:class:`rlweave.envs.VectorEnv` like any other: every algorithm, runner, checkpoint and
evaluation path uses it unchanged (SAC trained "in imagination" is plain SAC with another env id).

Semantics of an imagined episode:

* **reset** draws a real observation from the model folder's start states (``starts: all``, every
  observation of the training episodes, as MBPO branches from replayed states; ``starts:
  initial``, only the episodes' first observations, which mimics the real env's reset) with the
  env's seeded generator, and encodes it;
* **step** asks the model for the next latent, observation, reward and termination; the
  observation is clipped to the observation box by the model; ``info["uncertainty"]`` is the
  ensemble disagreement, and ``uncertainty_penalty`` > 0 subtracts ``penalty * uncertainty`` from
  the reward (MOPO's pessimism: the agent is kept away from where the model guesses);
* **truncation** after ``horizon`` steps (``env.max_episode_steps`` overrides it): a fixed
  imagination horizon, so learners bootstrap through it; **termination** from the model's head.

``real: true`` (meant for ``env.eval_kwargs``) makes the *real* env the model was trained on (its
id and time limit come from the dataset the model was trained from) with the same observations
and actions: a policy trained only in imagination is evaluated in the real simulator by the
runners' ordinary evaluation, with no runner change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlweave.world_models.base import WorldModel, WorldModelError, is_image_space, load_world_model

__all__ = ["WorldModelEnv", "make_env", "load_starts", "model_pixels", "DEFAULT_HORIZON"]

DEFAULT_HORIZON = 50
STARTS = {"all": "starts_all.npy", "initial": "starts_initial.npy"}


class StartStates:
    """The start observations, held in an object rather than as a bare array attribute: env
    snapshots (:mod:`rlweave.envs.snapshot`, taken at every checkpoint) copy an env's plain array
    attributes, and these never change (for a pixel model they are tens of MB)."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows


class WorldModelEnv(gym.Env):
    """One imagined env over a shared :class:`WorldModel` (batch of one per step)."""

    metadata = {"render_modes": []}

    def __init__(self, model: WorldModel, starts: np.ndarray, horizon: int = DEFAULT_HORIZON, uncertainty_penalty: float = 0.0):
        if horizon < 1:
            raise WorldModelError(f"env.kwargs.horizon: must be >= 1, got {horizon}")
        if uncertainty_penalty < 0:
            raise WorldModelError(f"env.kwargs.uncertainty_penalty: must be >= 0, got {uncertainty_penalty}")
        if len(starts) == 0:
            raise WorldModelError("world model env: no start states")
        self.world_model = model
        self.observation_space = model.observation_space
        self.action_space = model.action_space
        self.starts = StartStates(starts)
        self.horizon, self.penalty = int(horizon), float(uncertainty_penalty)
        self.t = 0
        self.latent: np.ndarray | None = None  # plain numpy: env snapshots carry it across a resume

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs = self.starts.rows[int(self.np_random.integers(len(self.starts.rows)))]
        self.latent = self.world_model.encode(obs[None])
        self.t = 0
        return np.array(obs, dtype=self.observation_space.dtype), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.latent is None:
            raise RuntimeError("world model env: step() before reset()")
        s = self.world_model.step(self.latent, np.asarray(action, dtype=np.float32)[None])
        self.latent = s.latent
        self.t += 1
        u = float(s.uncertainty[0])
        reward = float(s.reward[0]) - self.penalty * u
        terminated = bool(s.terminated[0])
        truncated = self.t >= self.horizon and not terminated
        return s.obs[0].astype(self.observation_space.dtype), reward, terminated, truncated, {"uncertainty": u}


def load_starts(path: str | Path, which: str = "all") -> np.ndarray:
    """The model folder's start states (``all`` or ``initial``)."""
    if which not in STARTS:
        raise WorldModelError(f"env.kwargs.starts: expected one of {sorted(STARTS)}, got {which!r}")
    file = Path(path) / STARTS[which]
    if not file.is_file():
        raise WorldModelError(f"world model {path}: no {STARTS[which]} (the start states train-world-model writes)")
    return np.load(file)


def make_env(task: str, horizon: int = DEFAULT_HORIZON, starts: str = "all", uncertainty_penalty: float = 0.0,
             member: str | None = None, real: bool = False, max_episode_steps: int | None = None,
             pixels: dict | None = None, **kwargs: Any) -> gym.Env:
    """The ``world_model`` suite's maker: ``task`` is the model folder. ``real=True``: the real env
    the model's dataset was recorded on (its own time limit unless ``max_episode_steps`` is given;
    ``pixels`` and other keywords go to it). Otherwise an imagined env of ``horizon`` steps
    (``max_episode_steps``, when set, wins)."""
    model = load_world_model(task)
    image = is_image_space(model.observation_space)
    if real:
        from rlweave.envs.gym_suite import make_env as make_gym

        if image and not (pixels and pixels.get("enabled", True)):
            pixels = model_pixels(model)  # the policy sees what the model was trained on: camera images
        return make_gym(model.env_id, pixels=pixels,
                        max_episode_steps=max_episode_steps or getattr(model, "max_episode_steps", None), **kwargs)
    if pixels and pixels.get("enabled", True) and not image:
        raise WorldModelError(f"env.pixels: world model {task} is a state model ({model.kind}); it predicts no camera images")
    if kwargs:
        raise WorldModelError(f"env.kwargs: the world_model suite takes horizon, starts, uncertainty_penalty, member, real; "
                              f"got unknown {sorted(kwargs)}")
    if member is not None:
        if member not in ("mean", "random"):
            raise WorldModelError(f"env.kwargs.member: must be 'mean' or 'random', got {member!r}")
        if not hasattr(model, "member"):
            raise WorldModelError(f"env.kwargs.member: world model {task} ({model.kind}) has no ensemble members to choose")
        model.member = member  # the process's shared copy: every env of the worker steps the same way
    return WorldModelEnv(model, load_starts(task, starts), horizon=max_episode_steps or horizon,
                         uncertainty_penalty=uncertainty_penalty)


def model_pixels(model: WorldModel) -> dict:
    """The ``env.pixels`` settings that give the real env the images a pixel model was trained on."""
    h, w, c = model.observation_space.shape
    return {"enabled": True, "width": int(w), "height": int(h), "frame_stack": int(c) // 3}
