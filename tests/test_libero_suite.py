"""The LIBERO suite (rlweave.envs.libero_suite): ids and tasks, the observation contract, upright
images, fast rendering, train/test initial states, success, chunked steps through VectorEnv,
exact resume, and the one-line error when the package is missing.

One VectorEnv of two tasks (32x32, both cameras) is shared: building a LIBERO env costs ~4 s of
CPU (robosuite compiles the scene's XML)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("libero.libero")
os.environ.setdefault("MUJOCO_GL", "egl")
mujoco = pytest.importorskip("mujoco")

from rlweave.envs import VectorEnv  # noqa: E402
from rlweave.envs.manipulation import decode_instruction, decode_instructions, encode_instruction  # noqa: E402
from rlweave.envs.libero_suite import INSTRUCTION_BYTES, parse_tasks, split_indices, task_info  # noqa: E402
from rlweave.envs.snapshot import restore_env, snapshot_env  # noqa: E402

PIX = {"enabled": True, "width": 32, "height": 32, "cameras": ["agentview", "wrist"]}
NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)


@pytest.fixture(scope="module")
def vec():
    env = VectorEnv("libero/libero_spatial", 2, seed=0, chunk=2, pixels=PIX)
    env.reset()
    yield env
    env.close()


# --------------------------------------------------------------------------- ids and tasks
def test_task_specs():
    assert parse_tasks("libero_spatial") == ("libero_spatial", list(range(10)))
    assert parse_tasks("libero_object/3") == ("libero_object", [3])
    name = task_info("libero_spatial", 4)["name"]
    assert parse_tasks(f"libero_spatial/{name},0") == ("libero_spatial", [4, 0])
    with pytest.raises(ValueError, match="unknown LIBERO suite"):
        parse_tasks("libero_nothing/0")
    with pytest.raises(ValueError, match="no task '10' in libero_spatial"):
        parse_tasks("libero_spatial/10")


def test_instructions_fit_and_round_trip():
    for suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10"):
        for i in range(10):
            text = task_info(suite, i)["instruction"]
            assert decode_instruction(encode_instruction(text, INSTRUCTION_BYTES)) == text


def test_train_and_test_initial_states_are_disjoint():
    train, test, every = split_indices(50, "train"), split_indices(50, "test"), split_indices(50, "all")
    assert len(train) == 40 and len(test) == 10 and not set(train) & set(test)
    assert sorted(set(train) | set(test)) == list(every) == list(range(50))
    with pytest.raises(ValueError, match="split"):
        split_indices(50, "val")


# --------------------------------------------------------------------------- the contract
def test_observations_and_two_tasks_by_slot(vec):
    space = vec.single_observation_space
    assert set(space.spaces) == {"image", "image_wrist", "state", "instruction", "privileged"}
    obs = vec.obs
    assert obs["image"].shape == (2, 32, 32, 3) and obs["image"].dtype == np.uint8
    assert obs["image_wrist"].shape == (2, 32, 32, 3) and obs["image_wrist"].dtype == np.uint8
    assert obs["state"].shape == (2, 8) and obs["state"].dtype == np.float32
    assert obs["instruction"].shape == (2, INSTRUCTION_BYTES) and obs["instruction"].dtype == np.uint8
    assert obs["privileged"].dtype == np.float32 and obs["privileged"].shape[0] == 2
    assert vec.single_action_space.shape == (7,)
    assert [e.task_index for e in vec.envs] == [0, 1]  # libero/<suite>: tasks round-robin over slots
    assert decode_instructions(obs["instruction"]) == [task_info("libero_spatial", i)["instruction"] for i in (0, 1)]
    assert obs["image"].std() > 10  # a rendered scene, not a blank frame
    # state = eef position, axis-angle, finger positions, read from the simulator
    env = vec.envs[0]
    np.testing.assert_allclose(obs["state"][0, :3], env._data.site_xpos[env._eef_site], atol=1e-6)


def test_images_are_upright(vec):
    """The target bowl, painted red, appears where the camera's geometry puts it with the top of
    the scene at row 0: LIBERO's raw (bottom-row-first) image would put it mirrored vertically."""
    env = vec.envs[0]
    m, d = env._model, env._data
    bowl = env._core.env.obj_body_id["akita_black_bowl_1"]
    geoms = [g for g in range(m.ngeom) if m.geom_bodyid[g] == bowl and m.geom_group[g] == 1]
    saved = m.geom_matid[geoms].copy(), m.geom_rgba[geoms].copy()
    try:
        m.geom_matid[geoms] = -1
        m.geom_rgba[geoms] = [1, 0, 0, 1]
        img = env._observe()["image"].astype(int)
    finally:
        m.geom_matid[geoms], m.geom_rgba[geoms] = saved
    red = (img[..., 0] > 120) & (img[..., 1] < 60) & (img[..., 2] < 60)
    assert red.sum() >= 3
    rows, cols = np.nonzero(red)
    cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, "agentview")
    v = d.cam_xmat[cam].reshape(3, 3).T @ (d.xpos[bowl] - d.cam_xpos[cam])  # camera frame: x right, y up, -z ahead
    f = 16 / np.tan(np.deg2rad(m.cam_fovy[cam]) / 2)
    row, col = 16 - f * v[1] / -v[2], 16 + f * v[0] / -v[2]
    assert abs(row - 16) > 3  # off the middle row, so a vertical flip would be seen
    assert abs(rows.mean() + 0.5 - row) < 3 and abs(cols.mean() + 0.5 - col) < 3


def test_fast_render_settings_applied(vec):
    env = vec.envs[0]
    assert env._model.vis.quality.offsamples == 0
    assert (env._model.vis.global_.offwidth, env._model.vis.global_.offheight) == (32, 32)
    assert env._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] == 0
    assert env._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] == 0
    assert env._core.env.sim._render_context_offscreen is None  # robosuite's 640x480 renderer never made


def test_reset_draws_from_the_split_and_is_seeded(vec):
    env = vec.envs[1]
    picks = []
    for seed in (0, 1, 2):
        obs, info = env.reset(seed=seed)
        assert info == {"success": False, "task_name": env.task_name}
        picks.append((env.init_state_index, obs["privileged"].copy()))
    assert all(i in split_indices(50, "train") for i, _ in picks)
    again, _ = env.reset(seed=1)
    assert env.init_state_index == picks[1][0]
    np.testing.assert_array_equal(again["privileged"], picks[1][1])  # fixtures placed from the seed too
    env.reset(options={"init_state": 45})
    assert env.init_state_index == 45
    vec.reset()


# --------------------------------------------------------------------------- stepping
def test_chunked_step_and_success(vec):
    """A chunk of 2 actions per decision; env 0's bowl is put on the plate, so its episode ends in
    success at once (reward 1, terminated), counted per task; env 1 steps on."""
    env = vec.envs[0]
    core = env._core.env
    _, obj, target = core.parsed_problem["goal_state"][0]
    plate = core.sim.data.body_xpos[core.obj_body_id[target]].copy()
    joint = core.objects_dict[obj].joints[-1]
    core.sim.data.set_joint_qpos(joint, np.concatenate([plate + [0, 0, 0.05], [1, 0, 0, 0]]))
    core.sim.data.set_joint_qvel(joint, np.zeros(6))
    steps = vec.steps
    out = vec.step(np.broadcast_to(NOOP, (2, 2, 7)).copy())
    assert out.terminated.tolist() == [True, False] and out.reward[0] == 1.0
    assert vec.steps - steps in (3, 4)  # env 0 stops at its success, env 1 steps the whole chunk
    stats = vec.episode_stats()
    assert stats["success"] == [1.0] and stats["success_by_task"] == {env.task_name: [1.0]}
    assert out.obs["image"].shape == (2, 32, 32, 3)
    _, reward, terminated, truncated, info = vec.envs[1].step(NOOP)
    assert info["success"] is False and info["task_name"] == vec.envs[1].task_name and reward == 0.0


def test_exact_resume_mid_episode(vec):
    env = vec.envs[1]
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for a in rng.uniform(-1, 1, (3, 7)):
        env.step(a)
    snap = snapshot_env(env)
    actions = rng.uniform(-1, 1, (4, 7))
    first = [env.step(a)[0] for a in actions]
    env.step(actions[0])  # wander off before restoring
    restore_env(env, snap)
    second = [env.step(a)[0] for a in actions]
    for a, b in zip(first, second):
        for key in ("privileged", "state", "image", "image_wrist"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_missing_package_names_the_extra():
    code = ("import sys; sys.modules['libero'] = None\n"
            "from rlweave.envs.vector import EnvError, env_maker\n"
            "try:\n    env_maker('libero/libero_spatial/0')\nexcept EnvError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'rlweave[libero]'" in out.stdout, out.stdout + out.stderr
