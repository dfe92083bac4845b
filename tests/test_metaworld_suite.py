"""The MetaWorld suite (rlweave.envs.metaworld_suite): ids and tasks, the observation contract,
upright images, renderers surviving other envs' lifetimes, seeded and held-out resets, exact
resume, and the scripted expert."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("metaworld")
os.environ.setdefault("MUJOCO_GL", "egl")
mujoco = pytest.importorskip("mujoco")

from rlweave.envs import VectorEnv  # noqa: E402
from rlweave.envs.manipulation import decode_instruction, decode_instructions, encode_instruction  # noqa: E402
from rlweave.envs.metaworld_suite import CAMERAS, INSTRUCTIONS, MetaWorldEnv, expert, make_env, parse_tasks  # noqa: E402

PIX = {"enabled": True, "width": 64, "height": 64, "cameras": ["corner"]}


@pytest.fixture(scope="module")
def pix_env():
    """One rendering env shared by the image tests (building one costs ~0.5 s)."""
    env = MetaWorldEnv("reach-v3", pixels={**PIX, "cameras": ["corner", "corner4", "gripperPOV"]})
    yield env
    env.close()


# --------------------------------------------------------------------------- ids, tasks, instructions
def test_task_specs():
    assert parse_tasks("reach-v3") == ["reach-v3"]
    assert len(parse_tasks("mt10")) == 10 and len(parse_tasks("mt50")) == 50
    assert parse_tasks("reach-v3,push-v3, pick-place-v3") == ["reach-v3", "push-v3", "pick-place-v3"]
    with pytest.raises(ValueError, match="unknown MetaWorld task.*reach-v9"):
        parse_tasks("reach-v3,reach-v9")


def test_every_task_has_a_unique_instruction_that_fits():
    tasks = parse_tasks("mt50")
    assert set(tasks) == set(INSTRUCTIONS)
    texts = [INSTRUCTIONS[t] for t in tasks]
    assert len(set(texts)) == 50  # the expert finds the task from the instruction
    for text in texts:
        assert decode_instruction(encode_instruction(text)) == text


def test_slots_assign_tasks_round_robin():
    env = VectorEnv("metaworld/reach-v3,push-v3", 3, seed=0, rank=1)  # slots 3, 4, 5
    try:
        assert [e.task_name for e in env.envs] == ["push-v3", "reach-v3", "push-v3"]
        obs = env.reset()
        push, reach = "push the puck to the goal", "reach the goal"
        assert decode_instructions(obs["instruction"]) == [push, reach, push]
        assert set(obs) == {"state", "instruction", "privileged"}
        assert obs["state"].shape == (3, 4) and obs["privileged"].shape == (3, 39) and obs["state"].dtype == np.float32
        np.testing.assert_array_equal(obs["state"], obs["privileged"][:, :4])
    finally:
        env.close()


def test_flat_observations():
    env = make_env("push-v3", obs="flat")
    obs, info = env.reset(seed=1)
    assert obs.shape == (39,) and obs.dtype == np.float32 and info["task_name"] == "push-v3"
    assert np.abs(obs[-3:]).sum() > 0  # the goal is observable
    with pytest.raises(ValueError, match="flat"):
        make_env("push-v3", obs="flat", pixels=PIX)


# --------------------------------------------------------------------------- images
def _red_rows(img: np.ndarray) -> float:
    """Mean row of the robot's (red) pixels."""
    im = img.astype(int)
    red = (im[..., 0] > 120) & (im[..., 1] < 60) & (im[..., 2] < 60)
    assert red.sum() > 50
    return float(np.nonzero(red)[0].mean())


def _hand_at(env: MetaWorldEnv, z: float) -> dict:
    env.reset(seed=0)
    env._core.hand_init_pos = np.array([0.0, 0.6, z])
    env._core._reset_hand()
    return env._observe(env._core._get_obs())


def test_images_are_upright(pix_env):
    """Raising the hand moves the arm up in the image (towards row 0). MetaWorld's corner cameras
    are mounted upside down, so on their raw frames the arm would move down."""
    low, high = _hand_at(pix_env, 0.1), _hand_at(pix_env, 0.35)
    assert set(low) == {"image", "image_corner4", "image_gripperPOV", "state", "instruction", "privileged"}
    for key in ("image", "image_corner4"):
        assert low[key].shape == (64, 64, 3) and low[key].dtype == np.uint8
        assert _red_rows(high[key]) < _red_rows(low[key]) - 1.5, key
    # and the image is exactly the raw render turned 180 degrees
    r = pix_env._renderer
    r.update_scene(pix_env._core.data, camera="corner")
    raw = r.render()
    np.testing.assert_array_equal(high["image"], raw[::-1, ::-1])


def test_fast_render_settings_applied(pix_env):
    model = pix_env._core.model
    assert model.vis.quality.offsamples == 0
    assert (model.vis.global_.offwidth, model.vis.global_.offheight) == (64, 64)
    assert pix_env._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] == 0


def test_renderers_survive_other_envs_coming_and_going():
    a, b = MetaWorldEnv("reach-v3", pixels=PIX), MetaWorldEnv("push-v3", pixels=PIX)
    try:
        before = [e.reset(seed=3)[0]["image"] for e in (a, b)]
        assert all(img.max() > 0 for img in before)
        c = MetaWorldEnv("pick-place-v3", pixels=PIX)
        assert c.reset(seed=3)[0]["image"].max() > 0
        c.close()
        c.close()  # twice is harmless
        after = [e.reset(seed=3)[0]["image"] for e in (a, b)]
        for x, y in zip(before, after):
            np.testing.assert_array_equal(x, y)  # not black, and the very same frame
        a.close()
        assert b.step(np.zeros(4))[0]["image"].max() > 0
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- seeds, splits, resume
def test_resets_are_seeded_and_splits_disjoint():
    train, again, test = (make_env("push-v3", split=s) for s in ("train", "train", "test"))
    p = lambda env, seed: env.reset(seed=seed)[0]["privileged"]  # noqa: E731
    np.testing.assert_array_equal(p(train, 5), p(again, 5))
    assert not np.allclose(p(train, 5), p(train, 6))  # object and goal positions vary with the seed
    assert not np.allclose(p(train, 5), p(test, 5))  # the held-out split draws other initial states
    np.testing.assert_array_equal(p(test, 5), p(make_env("push-v3", split="test"), 5))


def test_exact_resume_mid_episode_with_images():
    def run(env, steps, log):
        for _ in range(steps):
            res = env.step(expert(env.obs)[:, None])
            log.append((res.obs["privileged"].copy(), res.obs["image"].copy(), res.reward.copy()))

    a = VectorEnv("metaworld/push-v3,pick-place-v3", 2, seed=0, pixels=PIX)
    b = VectorEnv("metaworld/push-v3,pick-place-v3", 2, seed=1, pixels=PIX)
    try:
        a.reset()
        run(a, 8, [])
        state = a.state_dict()
        la, lb = [], []
        run(a, 12, la)
        b.load_state_dict(state)
        run(b, 12, lb)
        for (pa, ia, ra), (pb, ib, rb) in zip(la, lb):
            np.testing.assert_array_equal(pa, pb)
            np.testing.assert_array_equal(ia, ib)
            np.testing.assert_array_equal(ra, rb)
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- the scripted expert
def test_expert_solves_reach():
    env = VectorEnv("metaworld/reach-v3", 3, seed=0, max_episode_steps=150)
    obs = env.reset()
    active = np.ones(3, dtype=bool)
    for _ in range(150):
        res = env.step(expert(obs)[:, None], auto_reset=False, active=active)
        active &= ~(res.terminated | res.truncated)
        obs = res.obs
        if not active.any():
            break
    stats = env.episode_stats()
    assert stats["success"] == [1.0, 1.0, 1.0]
    assert stats["success_by_task"] == {"reach-v3": [1.0, 1.0, 1.0]}
    assert max(stats["length"]) < 150  # ended on success, not on the time limit


def test_expert_refuses_unknown_instructions():
    obs = {"privileged": np.zeros((1, 39), np.float32), "instruction": encode_instruction("dance")[None]}
    with pytest.raises(ValueError, match="dance"):
        expert(obs)
    assert expert(obs["privileged"], task="reach-v3").shape == (1, 4)


def test_cameras_are_validated():
    with pytest.raises(ValueError, match="unknown MetaWorld camera"):
        make_env("reach-v3", pixels={**PIX, "cameras": ["nope"]})
    assert "gripperPOV" in CAMERAS
