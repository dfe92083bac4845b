"""Evaluation: deterministic episodes of a policy on separately seeded environments, optionally
recorded as videos of their camera images (:mod:`rlweave.utils.video`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from rlweave.envs import VectorEnv
from rlweave.envs.vector import draw_seeds
from rlweave.models import Policy
from rlweave.models.inputs import float_observations, policy_input

MAX_VIDEO_FPS = 25.0  # GIF viewers play frame delays under 20 ms slowly; fast sims are sped down to this


def evaluate_policy(
    policy: Policy,
    env_cfg: dict,
    episodes: int,
    seed: int,
    gamma: float = 0.99,
    videos: int = 0,
    video_dir: Path | None = None,
    tag: str = "",
    max_envs: int | None = None,
) -> dict:
    """Runs exactly one deterministic episode on each of ``episodes`` envs (no early stopping
    bias towards short episodes), made with ``env.kwargs`` updated by ``env.eval_kwargs``. Returns
    mean/std return, mean length and success rate.

    ``max_envs``: at most this many envs exist at once (``train.eval_max_envs``); the episodes
    run in batches of envs, each episode with the seed and env slot (the task of a multi-task
    suite) it has when all run at once, so the result does not depend on the batching. Why: a
    LIBERO env with its renderer holds ~1 GB, and 40 held-out episodes at once filled the machine.

    ``videos > 0`` records the episodes of the first ``videos`` envs to
    ``video_dir/{tag}_ep{i}.gif`` (``.mp4`` where imageio-ffmpeg is installed), listed under
    ``eval/videos``; envs without camera images record nothing. A frame is the observation each
    policy decision saw (plus the episode's last), so with action chunks (``env.chunk > 1``) a
    video shows every ``chunk``-th env step: the policy's view, at no extra render cost."""
    if videos > 0 and video_dir is None:
        raise ValueError("evaluate_policy: videos > 0 needs a video_dir")
    if max_envs is not None and max_envs < 1:
        raise ValueError(f"train.eval_max_envs: must be >= 1, got {max_envs}")
    batch = episodes if max_envs is None else min(episodes, int(max_envs))
    seeds = draw_seeds(np.random.default_rng(seed), episodes)  # a VectorEnv of all the episodes' first reset
    stats: dict[str, Any] = {"return": [], "length": [], "success": [], "success_by_task": {}}
    frames: list[list[np.ndarray]] = []
    instructions: list[str | None] = []
    success = np.full(episodes, np.nan)
    dropped, fps = 0, MAX_VIDEO_FPS
    for first in range(0, episodes, batch):
        n = min(batch, episodes - first)
        part = _run_batch(policy, env_cfg, seeds[first:first + n], first - episodes, gamma, max(0, min(n, videos - first)))
        for key in ("return", "length", "success"):
            stats[key] += list(part["stats"].get(key) or [])
        for task, flags in (part["stats"].get("success_by_task") or {}).items():
            stats["success_by_task"].setdefault(task, []).extend(flags)
        frames += part["frames"]
        instructions += part["instructions"]
        success[first:first + n] = part["success"]
        dropped += part["dropped"]
        fps = part["fps"]
    paths = _write_videos(frames, instructions, success, fps, video_dir, tag)
    returns = np.asarray(stats["return"], dtype=np.float64)
    if returns.size == 0:  # every episode was dropped for non-finite values: no return to report
        return {"eval/episode_return": None, "eval/episodes": 0, "eval/dropped_episodes": dropped, **paths}
    out = {
        "eval/episode_return": float(returns.mean()),
        "eval/episode_return_std": float(returns.std()),
        "eval/episode_length": float(np.mean(stats["length"])),
    }
    if stats["success"]:
        out["eval/success_rate"] = float(np.mean(stats["success"]))
    for task, flags in sorted(stats["success_by_task"].items()):  # multi-task suites
        out[f"eval/success_rate/{task}"] = float(np.mean(flags))
    return {**out, **paths}


def _run_batch(policy: Policy, env_cfg: dict, seeds: list[int], first_slot: int, gamma: float, videos: int) -> dict:
    """One episode on each of ``len(seeds)`` envs (slots from ``first_slot``), the first
    ``videos`` of them recorded; the envs are closed before it returns."""
    n = len(seeds)
    env = VectorEnv(
        env_cfg["id"],
        n,
        seed=0,  # every env is reset with its own seed below
        chunk=env_cfg.get("chunk", 1),
        rank=-1,  # evaluation (in error messages)
        first_slot=first_slot,
        max_episode_steps=env_cfg.get("max_episode_steps"),
        pixels=env_cfg.get("pixels"),
        gamma=gamma,
        on_nonfinite=env_cfg.get("on_nonfinite", "error"),
        kwargs={**(env_cfg.get("kwargs") or {}), **(env_cfg.get("eval_kwargs") or {})},  # held-out starts
    )
    camera = _camera(env.single_observation_space) if videos > 0 else None
    recorded = min(videos, n) if camera is not None else 0
    frames: list[list[np.ndarray]] = [[] for _ in range(recorded)]
    try:
        obs = env.reset(seed=seeds)
        instructions = _instructions(obs, recorded)
        active = np.ones(n, dtype=bool)
        float_obs = float_observations(env.single_observation_space)
        policy.eval()
        while active.any():
            for i in np.flatnonzero(active[:recorded]):
                frames[i].append(camera(obs, i))
            with torch.inference_mode():
                action, _, _ = policy.act(policy_input(obs, float_obs), deterministic=True)
            res = env.step(policy.env_action(action).numpy(), auto_reset=False, active=active)
            obs = res.obs
            for i in np.flatnonzero(active[:recorded] & (res.terminated | res.truncated)[:recorded]):
                frames[i].append(camera(obs, i))  # the episode's last observation
            active &= ~(res.terminated | res.truncated)
        return {"stats": env.episode_stats(), "success": env.last_success.copy(), "frames": frames,
                "instructions": instructions, "dropped": env.dropped_episodes,
                "fps": min(MAX_VIDEO_FPS, float(env.envs[0].metadata.get("render_fps") or 15) / env.chunk)}
    finally:
        env.close()


# --------------------------------------------------------------------------- videos
def _camera(space: gym.Space) -> Callable[[Any, int], np.ndarray] | None:
    """How to take env ``i``'s camera image (uint8 ``[H, W, 3]``) from a batch of observations, or
    None when the observations hold none: the ``image`` key of a manipulation observation, or a
    pixel observation itself (of a frame stack ``[H, W, 3k]``, the newest frame: the last 3
    channels)."""
    if isinstance(space, gym.spaces.Dict):
        space, key = space.spaces.get("image"), "image"
    else:
        key = None
    if not (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and space.shape[2] >= 3 and space.shape[2] % 3 == 0):
        return None
    if key is not None:
        return lambda obs, i: np.array(obs[key][i][..., -3:])
    return lambda obs, i: np.array(obs[i][..., -3:])


def _instructions(obs: Any, n: int) -> list[str | None]:
    """The first ``n`` envs' instructions (manipulation observations carry them as bytes)."""
    if not isinstance(obs, dict) or "instruction" not in obs:
        return [None] * n
    from rlweave.envs.manipulation import decode_instruction

    return [decode_instruction(obs["instruction"][i]) for i in range(n)]


def _write_videos(frames: list[list[np.ndarray]], instructions: list[str | None], success: np.ndarray,
                  fps: float, video_dir: Path | None, tag: str) -> dict:
    """One video per recorded episode; ``{"eval/videos": [paths]}``, or nothing when none was recorded."""
    if not frames:
        return {}
    from rlweave.utils.video import write_episode_video

    paths = []
    for i, episode in enumerate(frames):
        ok = None if np.isnan(success[i]) else bool(success[i])
        paths.append(str(write_episode_video(Path(video_dir) / f"{tag}_ep{i}", episode, instructions[i], ok, fps=fps)))
    return {"eval/videos": paths}
