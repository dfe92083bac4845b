"""Real vs imagined, side by side: one episode of the real simulator and the world model's
open-loop prediction of it under the *same* actions, as one video.

A pixel model's observations are images: its decoded frames are shown beside the real camera
images. A state world model predicts numbers, not pictures; to show them, a second copy of the
real env is put into each predicted state and rendered (the simulator is the decoder). Which numbers make
a simulator state is env-specific, so it is a registry (:data:`STATE_SETTERS`): Pendulum's angle
and velocity from (cos, sin, velocity); MuJoCo envs whose observation is ``qpos[k:]`` followed by
``qvel`` (the gymnasium locomotion and pendulum tasks without contact forces), the skipped ``k``
leading positions (the x of a walker) taken from the real simulator at the same step.

The actions come from a policy acting on the *real* observations; the model is never corrected by
the real env after the first observation, so the right half drifts exactly as far as the model's
multi-step error does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np

from rlweave.world_models.base import WorldModel, WorldModelError, is_image_space

__all__ = ["STATE_SETTERS", "set_sim_state", "real_vs_imagined", "write_real_vs_imagined"]


def _pendulum(env: gym.Env, obs: np.ndarray, action: np.ndarray, real: gym.Env) -> None:
    core = env.unwrapped
    core.state = np.array([np.arctan2(obs[1], obs[0]), obs[2]], dtype=np.float64)
    core.last_u = float(np.asarray(action).reshape(-1)[0]) if action is not None else None


def _mujoco(env: gym.Env, obs: np.ndarray, action: np.ndarray, real: gym.Env) -> None:
    core = env.unwrapped
    nq, nv = core.model.nq, core.model.nv
    skipped = nq + nv - obs.size
    if not 0 <= skipped <= nq:
        raise WorldModelError(f"video: observation of {obs.size} numbers is not qpos[k:] + qvel of this MuJoCo env (nq {nq}, nv {nv})")
    qpos = np.concatenate([real.unwrapped.data.qpos[:skipped], obs[: nq - skipped]])
    core.set_state(qpos, obs[nq - skipped: nq - skipped + nv])


# env id (or "mujoco" for any MuJoCo env) -> setter(render_env, predicted obs, action, real_env)
STATE_SETTERS: dict[str, Callable] = {"Pendulum-v1": _pendulum, "mujoco": _mujoco}


def set_sim_state(env: gym.Env, env_id: str, obs: np.ndarray, action: np.ndarray | None, real: gym.Env) -> None:
    """Puts ``env`` into the simulator state observation ``obs`` stands for."""
    setter = STATE_SETTERS.get(env_id) or (STATE_SETTERS["mujoco"] if hasattr(env.unwrapped, "set_state") else None)
    if setter is None:
        raise WorldModelError(f"video: no state setter for env '{env_id}' (known: {', '.join(STATE_SETTERS)}); "
                              "add one to rlweave.world_models.video.STATE_SETTERS")
    setter(env, np.asarray(obs, dtype=np.float64), action, real)


def _render_env(env_id: str, max_episode_steps: int | None) -> gym.Env:
    try:
        return gym.make(env_id, render_mode="rgb_array", max_episode_steps=max_episode_steps)
    except gym.error.DependencyNotInstalled as e:
        raise WorldModelError(f"video: '{env_id}' cannot render ({str(e).splitlines()[0]}); "
                              "pip install 'rlweave[world_models]'") from None


def real_vs_imagined(model: WorldModel, act: Callable[[np.ndarray], np.ndarray], seed: int = 0,
                     steps: int | None = None) -> dict:
    """Plays one real episode (``steps`` steps at most; default: the env's time limit) with
    ``act(obs) -> action`` and the model's open-loop prediction from its first observation under
    the same actions. Returns ``frames`` (side-by-side uint8 images), ``real``/``imagined``
    observations [T+1, ...], ``real_return`` and ``imagined_return``."""
    limit = getattr(model, "max_episode_steps", None)
    if is_image_space(model.observation_space):  # a pixel model decodes images itself: show observations
        from rlweave.envs.gym_suite import make_env as make_gym
        from rlweave.world_models.env import model_pixels

        real, shadow = make_gym(model.env_id, pixels=model_pixels(model), max_episode_steps=limit), None
    else:  # a state model: a second simulator, put into each predicted state, renders it
        real, shadow = _render_env(model.env_id, limit), _render_env(model.env_id, limit)

    def frame() -> np.ndarray:
        if shadow is None:
            return _side_by_side(np.asarray(real_obs[-1])[..., -3:], np.asarray(imag_obs[-1])[..., -3:])
        set_sim_state(shadow, model.env_id, imag_obs[-1], action, real)
        return _side_by_side(real.render(), shadow.render())

    try:
        obs, _ = real.reset(seed=seed)
        if shadow is not None:
            shadow.reset(seed=seed)
        latent = model.encode(obs[None])
        real_obs, imag_obs, frames = [obs], [model.decode(latent)[0]], []
        real_ret = imag_ret = 0.0
        action = None
        for t in range(steps or limit or 1000):
            frames.append(frame())
            action = np.asarray(act(obs), dtype=np.float32)
            obs, r, terminated, truncated, _ = real.step(action)
            s = model.step(latent, action[None])
            latent = s.latent
            real_obs.append(obs)
            imag_obs.append(s.obs[0])
            real_ret += float(r)
            imag_ret += float(s.reward[0])
            if terminated or truncated:
                break
        frames.append(frame())
        fps = float(real.metadata.get("render_fps") or 30)
    finally:
        real.close()
        if shadow is not None:
            shadow.close()
    return {"frames": frames, "real": np.stack(real_obs), "imagined": np.stack(imag_obs), "real_return": real_ret,
            "imagined_return": imag_ret, "fps": fps}


def _side_by_side(left: np.ndarray, right: np.ndarray, gap: int = 4) -> np.ndarray:
    h = max(left.shape[0], right.shape[0])
    pad = lambda im: np.pad(im, ((0, h - im.shape[0]), (0, 0), (0, 0)))  # noqa: E731
    return np.concatenate([pad(left), np.full((h, gap, 3), 32, np.uint8), pad(right)], axis=1)


def write_real_vs_imagined(path: str | Path, model: WorldModel, act: Callable[[np.ndarray], np.ndarray],
                           seed: int = 0, steps: int | None = None) -> dict:
    """:func:`real_vs_imagined` written as a video at ``path`` (GIF, or MP4 where imageio-ffmpeg
    is installed); returns the path and the episode's figures."""
    from rlweave.utils.video import write_episode_video

    out = real_vs_imagined(model, act, seed=seed, steps=steps)
    diff = out["real"].astype(np.float32) - out["imagined"].astype(np.float32)
    err = np.mean(diff ** 2, axis=tuple(range(1, diff.ndim)))
    written = write_episode_video(path, out["frames"], instruction="left: real simulator | right: world model, same actions",
                                  fps=min(25.0, out["fps"]))
    return {"video": str(written), "steps": len(out["frames"]) - 1, "real_return": out["real_return"],
            "imagined_return": out["imagined_return"], "obs_mse_by_step": err.tolist()}
