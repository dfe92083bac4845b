"""What the robot server needs from a robot: :class:`RobotDriver`. A real robot implements it over
its own SDK; :class:`SimDriver` implements it over a gymnasium simulator (MuJoCo or any
registered id) so the whole remote path (server, limits, heartbeats, the trainer's env) runs and
is tested on a machine without a robot.

Why the driver knows nothing about networks, tokens or limits: those are the server's job, the
same for every robot. The driver only moves the robot, reads its sensors, and holds it still.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["RobotDriver", "StepOutcome", "DriverSpec", "SimDriver"]


@dataclass
class DriverSpec:
    """A robot's interface: its proprioceptive state, its cameras, its action box."""

    name: str
    state_shape: tuple[int, ...]
    state_low: np.ndarray
    state_high: np.ndarray
    action_low: np.ndarray  # the joint / actuator limits the server enforces
    action_high: np.ndarray
    cameras: dict[str, tuple[int, int]] = field(default_factory=dict)  # observation key -> (height, width)
    state_dtype: str = "float32"
    action_dtype: str = "float32"


@dataclass
class StepOutcome:
    obs: dict[str, np.ndarray]  # "state" and one HxWx3 uint8 image per camera key
    reward: float
    terminated: bool
    truncated: bool
    info: dict = field(default_factory=dict)


class RobotDriver(abc.ABC):
    """One robot. Calls come from one thread (the server's); none may run while another does."""

    @abc.abstractmethod
    def spec(self) -> DriverSpec: ...

    @abc.abstractmethod
    def reset(self, seed: int | None) -> dict[str, np.ndarray]:
        """Brings the robot to a start state and returns the first observation. May block for as
        long as a person needs (placing objects, clearing the workspace after an e-stop)."""

    @abc.abstractmethod
    def apply(self, action: np.ndarray) -> StepOutcome:
        """Applies one (already limited) action for one control period."""

    @abc.abstractmethod
    def hold(self, reason: str) -> None:
        """E-stop: stop moving and keep the current pose, now. Must be safe to call at any time,
        repeatedly, and fast (the heartbeat watchdog calls it)."""

    def release(self) -> None:
        """Lets :meth:`apply` move the robot again after :meth:`hold`."""

    def close(self) -> None:
        """Frees the robot's resources."""


class SimDriver(RobotDriver):
    """A gymnasium env as a robot: ``state`` is its (flat) observation, cameras are rendered with
    the env's own ``rgb_array`` renderer (MuJoCo envs render at the asked size, offscreen and
    without shadows or reflections). Holding a simulator freezes it: no step runs until released,
    which is what a real robot's brakes do to its pose. ``reset_wait`` (seconds) stands in for a
    person resetting the scene."""

    def __init__(self, env_id: str, camera: dict | None = None, max_episode_steps: int | None = None,
                 reset_wait: float = 0.0, reward_fn: Callable[[Any], float] | None = None):
        from rlweave.envs.gym_suite import make_env

        self.env_id, self.reset_wait = env_id, float(reset_wait)
        self.camera = dict(camera) if camera else None
        kwargs: dict[str, Any] = {}
        if self.camera:
            import gymnasium as gym

            from rlweave.envs import gym_suite

            spec = gym.spec(env_id)
            if not gym_suite._is_mujoco(spec):
                raise ValueError(f"camera: '{env_id}' is not a MuJoCo env; cameras are rendered for MuJoCo envs only")
            kwargs = {"render_mode": "rgb_array", "width": int(self.camera.get("width", 64)), "height": int(self.camera.get("height", 64))}
        self.env = make_env(env_id, max_episode_steps=max_episode_steps, **kwargs)
        if self.camera:
            from rlweave.envs import gym_suite

            gym_suite._fast_render(self.env)
        space = self.env.observation_space
        act = self.env.action_space
        if len(space.shape or ()) != 1 or act.shape is None or len(act.shape) != 1:
            raise ValueError(f"SimDriver: '{env_id}' needs flat Box observations and actions")
        self._spec = DriverSpec(
            name=f"sim:{env_id}", state_shape=tuple(space.shape), state_low=np.asarray(space.low, np.float64),
            state_high=np.asarray(space.high, np.float64), action_low=np.asarray(act.low, np.float64),
            action_high=np.asarray(act.high, np.float64),
            cameras={"image": (kwargs["height"], kwargs["width"])} if self.camera else {},
        )
        self.held: str | None = None
        self.holds = 0
        self.reward_fn = reward_fn

    def spec(self) -> DriverSpec:
        return self._spec

    def _obs(self, state: np.ndarray) -> dict[str, np.ndarray]:
        obs = {"state": np.asarray(state, dtype=np.float32)}
        if self.camera:
            obs["image"] = np.ascontiguousarray(self.env.render(), dtype=np.uint8)
        return obs

    def reset(self, seed: int | None) -> dict[str, np.ndarray]:
        if self.reset_wait:
            time.sleep(self.reset_wait)
        state, _ = self.env.reset(seed=seed)
        self.held = None
        return self._obs(state)

    def apply(self, action: np.ndarray) -> StepOutcome:
        if self.held is not None:  # the server never does this; a driver still refuses to move while held
            raise RuntimeError(f"robot held ({self.held}): release first")
        state, reward, terminated, truncated, info = self.env.step(action)
        return StepOutcome(self._obs(state), float(reward), bool(terminated), bool(truncated),
                           {k: v for k, v in info.items() if isinstance(v, (bool, int, float, str))})

    def hold(self, reason: str) -> None:
        if self.held is None:
            self.holds += 1
        self.held = reason

    def release(self) -> None:
        self.held = None

    def close(self) -> None:
        self.env.close()
