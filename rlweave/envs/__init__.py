"""Environment layer: one batched contract over gymnasium, simulator suites registered lazily."""

from rlweave.envs.manipulation import decode_instruction, decode_instructions, encode_instruction
from rlweave.envs.vector import SUITES, EnvError, EpisodeStats, RewardScaler, StepResult, VectorEnv, env_maker, register_suite, space_info

__all__ = [
    "SUITES", "EnvError", "EpisodeStats", "RewardScaler", "StepResult", "VectorEnv", "env_maker", "register_suite", "space_info",
    "encode_instruction", "decode_instruction", "decode_instructions",
]
