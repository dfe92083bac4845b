"""Evaluation: deterministic episodes of a policy on separately seeded environments."""

from __future__ import annotations

import numpy as np
import torch

from rlweave.envs import VectorEnv
from rlweave.models import Policy
from rlweave.models.inputs import float_observations, policy_input


def evaluate_policy(policy: Policy, env_cfg: dict, episodes: int, seed: int, gamma: float = 0.99) -> dict:
    """Runs exactly one deterministic episode on each of ``episodes`` envs (no early stopping
    bias towards short episodes), made with ``env.kwargs`` updated by ``env.eval_kwargs``. Returns mean/std return, mean length and success rate."""
    env = VectorEnv(
        env_cfg["id"],
        episodes,
        seed=seed,
        chunk=env_cfg.get("chunk", 1),
        rank=-1,
        max_episode_steps=env_cfg.get("max_episode_steps"),
        pixels=env_cfg.get("pixels"),
        gamma=gamma,
        on_nonfinite=env_cfg.get("on_nonfinite", "error"),
        kwargs={**(env_cfg.get("kwargs") or {}), **(env_cfg.get("eval_kwargs") or {})},  # held-out starts
    )
    try:
        obs = env.reset()
        active = np.ones(episodes, dtype=bool)
        float_obs = float_observations(env.single_observation_space)
        policy.eval()
        while active.any():
            with torch.inference_mode():
                action, _, _ = policy.act(policy_input(obs, float_obs), deterministic=True)
            res = env.step(policy.env_action(action).numpy(), auto_reset=False, active=active)
            active &= ~(res.terminated | res.truncated)
            obs = res.obs
        stats = env.episode_stats()
    finally:
        env.close()
    returns = np.asarray(stats["return"], dtype=np.float64)
    if returns.size == 0:  # every episode was dropped for non-finite values: no return to report
        return {"eval/episode_return": None, "eval/episodes": 0, "eval/dropped_episodes": env.dropped_episodes}
    out = {
        "eval/episode_return": float(returns.mean()),
        "eval/episode_return_std": float(returns.std()),
        "eval/episode_length": float(np.mean(stats["length"])),
    }
    if stats["success"]:
        out["eval/success_rate"] = float(np.mean(stats["success"]))
    for task, flags in sorted((stats.get("success_by_task") or {}).items()):  # multi-task suites
        out[f"eval/success_rate/{task}"] = float(np.mean(flags))
    return out
