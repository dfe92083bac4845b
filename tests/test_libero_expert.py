"""The scripted LIBERO expert (rlweave.envs.libero_expert): it finds each row's task from its
instruction, and it puts the bowl on the plate from a fixed start state of LIBERO-Spatial tasks 0
and 1 (no pixels; ~10 s of CPU per task, most of it building the env and the expert's layout)."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("libero.libero")
os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco")

from rlweave.envs.libero_expert import expert, task_layout  # noqa: E402
from rlweave.envs.libero_suite import LiberoEnv  # noqa: E402
from rlweave.envs.manipulation import encode_instruction  # noqa: E402


def _batch(obs: dict) -> dict:
    return {k: v[None] for k, v in obs.items()}


# task 1's state 34: a ramekin beside the bowl's -y wall, so the expert must pinch the +y wall
@pytest.mark.parametrize("task,init_state", [(0, 0), (1, 34)])
def test_expert_puts_the_bowl_on_the_plate(task, init_state):
    env = LiberoEnv("libero_spatial", task, split="train")
    try:
        obs, _ = env.reset(options={"init_state": init_state})
        layout = task_layout("libero_spatial", task)
        core = env._core.env
        assert (layout.obj, layout.target) == tuple(core.parsed_problem["goal_state"][0][1:])
        bowl = core.sim.data.body_xpos[core.obj_body_id[layout.obj]]
        np.testing.assert_allclose(obs["privileged"][1 + layout.obj_qpos:][:3], bowl, atol=1e-5)
        for step in range(env.max_episode_steps):
            action = expert(_batch(obs))
            assert action.shape == (1, 7) and action.dtype == np.float32 and np.abs(action).max() <= 1.0
            obs, reward, terminated, truncated, info = env.step(action[0])
            if terminated or truncated:
                break
        assert info["success"] and reward == 1.0, f"not placed after {step + 1} steps"
    finally:
        env.close()


def test_unknown_instruction_is_named():
    obs = {"state": np.zeros((1, 8), np.float32), "privileged": np.zeros((1, 92), np.float32),
           "instruction": encode_instruction("juggle the plates", 128)[None]}
    with pytest.raises(ValueError, match="juggle the plates"):
        expert(obs)
