"""Environment layer: one batched contract over gymnasium, simulator suites registered lazily."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before any suite imports mujoco: offscreen rendering, no display

from rlweave.envs.manipulation import decode_instruction, decode_instructions, encode_instruction  # noqa: E402
from rlweave.envs.vector import SUITES, EnvError, EpisodeStats, RewardScaler, StepResult, VectorEnv, env_maker, register_suite, space_info  # noqa: E402

__all__ = [
    "SUITES", "EnvError", "EpisodeStats", "RewardScaler", "StepResult", "VectorEnv", "env_maker", "register_suite", "space_info",
    "encode_instruction", "decode_instruction", "decode_instructions",
]
