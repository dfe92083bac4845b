"""The built-in suite: any registered gymnasium id, optionally rendered to pixels.

Pixel observations use MuJoCo's offscreen renderer (``MUJOCO_GL=egl``) or the env's own
``rgb_array`` rendering. For MuJoCo envs, shadows and reflections are switched off: they cost about
8x in render time and carry no information for control.
"""

from __future__ import annotations

import importlib
import os

import gymnasium as gym
import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def make_env(task: str, pixels: dict | None = None, max_episode_steps: int | None = None, **kwargs) -> gym.Env:
    if ":" in task:  # "package.module:EnvId-v0": importing the module registers the env (as gym.make does)
        module, _, task = task.partition(":")
        importlib.import_module(module)
    try:
        spec = gym.spec(task)
    except gym.error.Error as e:
        raise ValueError(f"env.id: unknown gymnasium id '{task}' ({e})") from None
    if pixels:
        w, h = int(pixels.get("width", 64)), int(pixels.get("height", 64))
        extra = {"width": w, "height": h} if _is_mujoco(spec) else {}
        env = gym.make(task, render_mode="rgb_array", max_episode_steps=max_episode_steps, **extra, **kwargs)
        _fast_render(env)
        env = gym.wrappers.AddRenderObservation(env, render_only=True)
        if env.observation_space.shape[:2] != (h, w):
            raise ValueError(
                f"env.pixels: '{task}' renders {env.observation_space.shape[:2]}, asked for {(h, w)}; "
                "set env.pixels.width/height to the render size"
            )
        k = int(pixels.get("frame_stack", 1))
        if k > 1:
            env = gym.wrappers.FrameStackObservation(env, k)
            env = _StackOnChannels(env)
        return env
    return gym.make(task, max_episode_steps=max_episode_steps, **kwargs)


def _is_mujoco(spec) -> bool:
    return "mujoco" in str(spec.entry_point)


def _fast_render(env: gym.Env) -> None:
    renderer = getattr(env.unwrapped, "mujoco_renderer", None)
    if renderer is None:
        return
    import mujoco

    viewer = renderer._get_viewer("rgb_array")
    viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


class _StackOnChannels(gym.ObservationWrapper):
    """(k, H, W, C) frame stacks -> (H, W, k*C), the layout the CNN policy takes."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        k, h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (h, w, k * c), dtype=np.uint8)

    def observation(self, obs):
        k, h, w, c = obs.shape
        return np.ascontiguousarray(np.transpose(obs, (1, 2, 0, 3)).reshape(h, w, k * c))
