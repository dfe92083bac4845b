"""Environment layer: one batched contract over gymnasium, simulator suites registered lazily."""

from rlweave.envs.vector import SUITES, EnvError, EpisodeStats, RewardScaler, StepResult, VectorEnv, env_maker, register_suite, space_info

__all__ = ["SUITES", "EnvError", "EpisodeStats", "RewardScaler", "StepResult", "VectorEnv", "env_maker", "register_suite", "space_info"]
