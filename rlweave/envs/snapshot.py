"""Snapshots of gymnasium envs in the middle of an episode, for exact resume.

A checkpoint taken at an iteration boundary usually falls in the middle of episodes. Restarting
them from a reset would make a resumed run differ from an uninterrupted one; instead each env's
state is saved and put back:

* every layer of the wrapper chain and the core env: their plain attributes (numbers, strings,
  arrays, tuples and lists of those: ``TimeLimit``'s elapsed steps, CartPole's ``state``,
  Pendulum's last torque, ...), skipping what is fixed at construction;
* the core env's random generator (``np_random``: the next reset's noise);
* for MuJoCo envs, the simulator's full integration state (``mj_getState`` with
  ``mjSTATE_INTEGRATION``: time, positions, velocities, actuator state, controls, warm-start
  accelerations), which MuJoCo documents as what an exact replay needs. Their pickling
  (``EzPickle``) re-creates a fresh env from the constructor's arguments, so it cannot be used.

An env whose state lives elsewhere (a C++ simulator other than MuJoCo, a remote robot) can define
``get_snapshot()`` / ``set_snapshot(state)`` on its core class; those are used instead.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["snapshot_env", "restore_env"]

# set at construction (or rebuilt by gymnasium), never part of an episode's state
_SKIP = {
    "env", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "spec", "_cached_spec", "metadata", "_metadata",
    "action_space", "observation_space", "_action_space", "_observation_space", "model", "data", "mujoco_renderer",
    "_np_random", "render_mode", "fullpath", "observation_structure",
}
_PLAIN = (type(None), bool, int, float, str, np.ndarray, np.generic)


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, list, collections.deque)):
        return all(_plain(v) for v in value)
    return False


def _layers(env: gym.Env) -> list:
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def _attributes(obj: Any) -> dict:
    return {k: copy.deepcopy(v) for k, v in vars(obj).items() if k not in _SKIP and _plain(v)}


def _is_mujoco(core: Any) -> bool:
    return hasattr(core, "model") and hasattr(core, "data") and type(core.data).__module__.startswith("mujoco")


def snapshot_env(env: gym.Env) -> dict:
    """The state of ``env`` (wrappers included) needed to continue its episode exactly."""
    layers = _layers(env)
    core = layers[-1]
    state: dict = {"layers": [_attributes(layer) for layer in layers]}
    if hasattr(core, "get_snapshot"):
        state["custom"] = core.get_snapshot()
    rng = getattr(core, "_np_random", None)
    state["np_random"] = copy.deepcopy(rng) if rng is not None else None
    if _is_mujoco(core):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        buf = np.empty(mujoco.mj_stateSize(core.model, spec), dtype=np.float64)
        mujoco.mj_getState(core.model, core.data, buf, spec)
        state["mujoco"] = buf
    return state


def restore_env(env: gym.Env, state: dict) -> None:
    """Puts ``env`` (built like the one snapshotted) into the snapshotted state."""
    layers = _layers(env)
    if len(layers) != len(state["layers"]):
        raise ValueError(f"env snapshot has {len(state['layers'])} layers, this env has {len(layers)}: not the same env")
    for layer, attrs in zip(layers, state["layers"]):
        for k, v in attrs.items():
            setattr(layer, k, copy.deepcopy(v))
    core = layers[-1]
    if "custom" in state:
        core.set_snapshot(state["custom"])
    if state.get("np_random") is not None:
        core._np_random = copy.deepcopy(state["np_random"])
    if "mujoco" in state:
        import mujoco

        buf = np.array(state["mujoco"], dtype=np.float64)  # a writeable copy: mj_setState insists
        mujoco.mj_setState(core.model, core.data, buf, mujoco.mjtState.mjSTATE_INTEGRATION)
