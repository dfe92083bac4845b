"""Tiny gymnasium envs for the runtime and env-layer tests.

Importing this module registers them; Ray workers import it through the job's
``worker_process_setup_hook`` (see tests/test_runtime.py) or through a ``module:EnvId`` id.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

NAN_ENV_ID = "RlweaveNanReward-v0"
FIXED_ENV_ID = "RlweaveFixedLength-v0"


class NanRewardEnv(gym.Env):
    """Episodes of ``length`` steps, reward 1.0, except a NaN reward at episode step ``nan_at``
    (and, with ``bad_shape_at``, an observation of the wrong shape at that step)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, nan_at: int = 5, length: int = 10, bad_shape_at: int = 0):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.nan_at, self.length, self.t = nan_at, length, 0
        self.bad_shape_at = bad_shape_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float("nan") if self.t == self.nan_at else 1.0
        obs = np.full(2 if self.t == self.bad_shape_at else 3, self.t / 100.0, dtype=np.float32)
        return obs, reward, self.t >= self.length, False, {}


class FixedLengthEnv(gym.Env):
    """Terminates after exactly ``length`` steps; the reward of step t (1-based) is t.

    ``calls`` counts every step() on this instance, so tests can see that a finished episode is
    not stepped further.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, length: int = 3, truncate: bool = False):
        self.observation_space = gym.spaces.Box(-100.0, 100.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.truncate = length, truncate
        self.t = 0
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, -1.0], dtype=np.float32), {}

    def step(self, action):
        self.calls += 1
        self.t += 1
        obs = np.array([float(self.t), float(action)], dtype=np.float32)
        end = self.t >= self.length
        return obs, float(self.t), end and not self.truncate, end and self.truncate, {}


def register() -> None:
    """Registers the test envs (idempotent); also the Ray worker set-up hook."""
    if NAN_ENV_ID not in gym.registry:
        gym.register(NAN_ENV_ID, entry_point="tests.nan_env:NanRewardEnv")
    if FIXED_ENV_ID not in gym.registry:
        gym.register(FIXED_ENV_ID, entry_point="tests.nan_env:FixedLengthEnv")


register()
