"""Dict observations through the env layer (rlweave.utils.tree, VectorEnv), multi-task slots and
per-task success, the manipulation contract's helpers. A small fake dict env stands in for a
simulator, so nothing here needs MetaWorld."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlweave.envs import SUITES, EnvError, VectorEnv, register_suite
from rlweave.envs.manipulation import decode_instruction, decode_instructions, encode_instruction, fast_offscreen, fast_scene
from rlweave.utils.tree import (
    tree_concat, tree_copy, tree_index, tree_len, tree_map, tree_set, tree_shapes, tree_stack, tree_to_torch, tree_zeros,
)


# --------------------------------------------------------------------------- a fake manipulation env
class DictEnv(gym.Env):
    """Counts steps: image filled with t, state [t, slot]; reward 1 per step; succeeds (terminates)
    at step ``success_at``, truncates at ``length``; ``nan_at`` puts a NaN into the state."""

    def __init__(self, task: str, length: int = 5, success_at: int | None = None, nan_at: int | None = None, slot: int = 0):
        self.slot, self.length, self.success_at, self.nan_at = slot, length, success_at, nan_at
        self.task_name = f"{task}{slot % 2}"
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "state": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "instruction": gym.spaces.Box(0, 255, (64,), np.uint8),
        })
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.t = 0

    def _obs(self) -> dict:
        state = np.array([self.t, self.slot], dtype=np.float32)
        if self.nan_at is not None and self.t == self.nan_at:
            state[0] = np.nan
        return {"image": np.full((4, 4, 3), self.t, np.uint8), "state": state,
                "instruction": encode_instruction(self.task_name)}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        success = self.success_at is not None and self.t >= self.success_at
        info = {"success": success, "task_name": self.task_name}
        return self._obs(), 1.0, success, self.t >= self.length and not success, info


def make_dict_env(task: str, slot: int = 0, **kwargs) -> DictEnv:
    return DictEnv(task, slot=slot, **kwargs)


def make_dict_env_no_slot(task: str, **kwargs) -> DictEnv:
    return DictEnv(task, **kwargs)


def make_nested_dict_env(task: str) -> DictEnv:
    env = DictEnv(task)
    env.observation_space = gym.spaces.Dict({"inner": env.observation_space})
    return env


register_suite("dicttest", "tests.test_manipulation_env:make_dict_env")
register_suite("dicttest_nested", "tests.test_manipulation_env:make_nested_dict_env")
register_suite("dicttest_noslot", "tests.test_manipulation_env:make_dict_env_no_slot")


def act(n: int, chunk: int = 1) -> np.ndarray:
    return np.zeros((n, chunk, 1), np.float32)


# --------------------------------------------------------------------------- tree helpers
def test_tree_helpers_on_dicts():
    items = [{"a": np.full(2, i, np.float64), "b": np.full((2, 2), i, np.uint8)} for i in range(3)]
    batch = tree_stack(items)
    assert tree_shapes(batch) == {"a": (3, 2), "b": (3, 2, 2)} and tree_len(batch) == 3
    row = tree_index(batch, 1)
    assert row["a"].tolist() == [1, 1] and row["b"].shape == (2, 2)
    assert tree_len(tree_index(batch, slice(1, 3))) == 2
    copy = tree_copy(batch)
    tree_set(copy, 0, {"a": np.array([9.0, 9.0]), "b": np.full((2, 2), 9, np.uint8)})
    assert copy["a"][0, 0] == 9 and batch["a"][0, 0] == 0  # the copy shares no memory
    tree_set(copy, slice(1, 3), 0)
    assert copy["b"][1:].sum() == 0
    assert tree_shapes(tree_concat([batch, batch])) == {"a": (6, 2), "b": (6, 2, 2)}
    assert tree_map(lambda v: v.dtype, batch) == {"a": np.float64, "b": np.uint8}
    space = gym.spaces.Dict({"x": gym.spaces.Box(0, 255, (3,), np.uint8), "y": gym.spaces.Box(-1, 1, (2,), np.float32)})
    zeros = tree_zeros((4, 5), space)
    assert zeros["x"].shape == (4, 5, 3) and zeros["x"].dtype == np.uint8 and zeros["y"].dtype == np.float32
    t = tree_to_torch(batch)
    assert t["a"].dtype == torch.float32 and t["b"].dtype == torch.uint8  # floats to float32, bytes stay
    assert tree_to_torch(batch, float_keys=["b"])["a"].dtype == torch.float64


def test_tree_helpers_pass_plain_arrays_through():
    x = np.arange(12.0).reshape(4, 3)
    assert np.shares_memory(tree_index(x, slice(1, 3)), x)  # a view, as x[1:3]
    assert tree_map(lambda v: v * 2, x) is not x and tree_stack([x, x]).shape == (2, 4, 3)
    y = tree_copy(x)
    tree_set(y, 0, -1.0)
    assert y[0].tolist() == [-1, -1, -1] and x[0, 0] == 0
    assert tree_len(x) == 4 and tree_shapes(x) == (4, 3)
    assert tree_zeros(2, gym.spaces.Box(0, 1, (3,), np.float32)).shape == (2, 3)
    t = tree_to_torch(x)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64  # dtype kept for arrays


# --------------------------------------------------------------------------- dict observations in VectorEnv
def test_dict_obs_are_stacked_per_key():
    env = VectorEnv("dicttest/t", 3, seed=0)
    obs = env.reset()
    assert set(obs) == {"image", "state", "instruction"}
    assert obs["image"].shape == (3, 4, 4, 3) and obs["image"].dtype == np.uint8
    assert obs["state"].shape == (3, 2) and obs["state"].dtype == np.float32
    assert decode_instructions(obs["instruction"]) == ["t0", "t1", "t0"]
    res = env.step(act(3))
    assert res.obs["state"][:, 0].tolist() == [1, 1, 1] and res.obs["image"][:, 0, 0, 0].tolist() == [1, 1, 1]


def test_dict_obs_chunk_sums_rewards_and_stops_at_success():
    env = VectorEnv("dicttest/t", 2, seed=0, chunk=4, kwargs={"success_at": 3, "length": 10})
    env.reset()
    res = env.step(act(2, 4))
    assert res.reward.tolist() == [3.0, 3.0]  # 3 steps, not 4: stepping stopped at success
    assert res.terminated.all() and not res.truncated.any() and env.steps == 6
    assert res.obs["state"][:, 0].tolist() == [0, 0]  # auto-reset: the next episode's first observation
    stats = env.episode_stats()
    assert stats["success"] == [1.0, 1.0] and stats["length"] == [3, 3]


def test_dict_final_obs_on_truncation():
    env = VectorEnv("dicttest/t", 2, seed=0, chunk=2, kwargs={"length": 3})
    env.reset()
    env.step(act(2, 2))
    res = env.step(act(2, 2))  # truncated at t=3, the chunk's first step
    assert res.truncated.all()
    assert set(res.final_obs) == {0, 1}
    assert res.final_obs[1]["state"].tolist() == [3, 1] and res.final_obs[0]["image"].shape == (4, 4, 3)
    assert res.obs["state"][:, 0].tolist() == [0, 0]


def test_dict_obs_slices_update_only_their_envs():
    env = VectorEnv("dicttest/t", 4, seed=0, kwargs={"length": 50})
    first = env.reset()
    res = env.step(act(2), envs=slice(1, 3))
    assert res.obs["state"][:, 0].tolist() == [1, 1]
    assert env.obs["state"][:, 0].tolist() == [0, 1, 1, 0]
    assert first["state"][:, 0].tolist() == [0, 0, 0, 0]  # what was handed out earlier never changes
    env.step(act(1), envs=slice(3, 4))
    assert env.obs["state"][:, 0].tolist() == [0, 1, 1, 1] and env.obs["image"][3, 0, 0, 0] == 1


def test_dict_obs_state_round_trip():
    a = VectorEnv("dicttest/t", 2, seed=0, chunk=2, kwargs={"length": 5})
    a.reset()
    a.step(act(2, 2))
    state = a.state_dict()
    b = VectorEnv("dicttest/t", 2, seed=99, chunk=2, kwargs={"length": 5})
    b.load_state_dict(state)
    for key in ("image", "state", "instruction"):
        np.testing.assert_array_equal(b.obs[key], a.obs[key])
    ra, rb = a.step(act(2, 2)), b.step(act(2, 2))
    for key in ("image", "state"):
        np.testing.assert_array_equal(ra.obs[key], rb.obs[key])
    assert ra.reward.tolist() == rb.reward.tolist()
    state["episodes"]["obs"]["state"][0, 0] = 123.0  # loading copied it
    assert b.obs["state"][0, 0] != 123.0


def test_non_finite_float_leaf_is_caught_and_bytes_are_not_checked():
    env = VectorEnv("dicttest/t", 1, seed=0, kwargs={"nan_at": 2, "length": 9})
    env.reset()
    env.step(act(1))
    with pytest.raises(EnvError, match="non-finite observation"):
        env.step(act(1))


def test_dict_obs_of_the_wrong_shape_raises():
    env = VectorEnv("dicttest/t", 1, seed=0)
    env.reset()
    orig = env.envs[0]._obs
    env.envs[0]._obs = lambda: {**orig(), "state": np.zeros(3, np.float32)}
    with pytest.raises(EnvError, match="observation of shape"):
        env.step(act(1))


def test_nested_dict_spaces_are_refused_at_construction():
    with pytest.raises(EnvError, match="'inner'.*not Box"):
        VectorEnv("dicttest_nested/t", 1, seed=0)


# --------------------------------------------------------------------------- multi-task
def test_slot_is_passed_globally_and_only_to_makers_that_take_it():
    env = VectorEnv("dicttest/t", 3, seed=0, rank=2)
    assert [e.slot for e in env.envs] == [6, 7, 8]
    plain = VectorEnv("dicttest_noslot/t", 2, seed=0, rank=1)
    assert [e.slot for e in plain.envs] == [0, 0]  # the maker never saw slot=


def test_success_by_task():
    env = VectorEnv("dicttest/t", 4, seed=0, kwargs={"success_at": 2, "length": 9})
    env.reset()
    for _ in range(2):
        env.step(act(4))
    stats = env.episode_stats()
    assert stats["success"] == [1.0] * 4
    assert stats["success_by_task"] == {"t0": [1.0, 1.0], "t1": [1.0, 1.0]}
    assert env.episode_stats()["success_by_task"] == {}  # popped; the key stays for multi-task envs


def test_training_metrics_give_each_tasks_success_across_env_workers():
    from rlweave.runners.common import RunnerBase

    def report(success, by_task):
        return {"episodes": {"return": success, "length": [5] * len(success), "success": success,
                             "success_by_task": by_task}, "dropped_episodes": 0}

    out = RunnerBase._episode_metrics([report([1.0, 0.0], {"reach": [1.0], "push": [0.0]}),
                                       report([1.0, 1.0, 0.0], {"reach": [1.0, 0.0], "push": [1.0]})])
    assert out["train/success_rate"] == 0.6
    assert out["train/success_rate/reach"] == pytest.approx(2 / 3) and out["train/success_rate/push"] == 0.5
    single = RunnerBase._episode_metrics([{"episodes": {"return": [1.0], "length": [5], "success": [1.0]}, "dropped_episodes": 0}])
    assert not any(k.startswith("train/success_rate/") for k in single)


def test_single_task_array_envs_keep_the_plain_keys():
    env = VectorEnv("CartPole-v1", 1, seed=0)
    env.reset()
    assert set(env.episode_stats()) == {"return", "length", "success"}


# --------------------------------------------------------------------------- contract helpers
def test_instruction_round_trip_and_too_long():
    for text in ("reach the goal", "pick up the puck and place it at the goal", "greif den Würfel", ""):
        enc = encode_instruction(text)
        assert enc.shape == (64,) and enc.dtype == np.uint8
        assert decode_instruction(enc) == text
        assert decode_instruction(torch.as_tensor(enc)) == text
    assert decode_instructions(np.stack([encode_instruction("a"), encode_instruction("bc")])) == ["a", "bc"]
    encode_instruction("x" * 64)
    with pytest.raises(ValueError, match="longer than 64"):
        encode_instruction("x" * 65)
    with pytest.raises(ValueError, match="longer than 8"):
        encode_instruction("ü" * 5, length=8)  # bytes, not characters


def test_fast_render_settings():
    mujoco = pytest.importorskip("mujoco")
    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='1'/></worldbody></mujoco>")
    fast_offscreen(model, 96, 72)
    assert model.vis.quality.offsamples == 0
    assert (model.vis.global_.offwidth, model.vis.global_.offheight) == (96, 72)
    scene = mujoco.MjvScene(model, maxgeom=10)
    fast_scene(scene)
    assert scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] == 0 and scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] == 0


def test_missing_metaworld_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "metaworld", None)  # import metaworld -> ImportError
    monkeypatch.delitem(sys.modules, "rlweave.envs.metaworld_suite", raising=False)
    assert SUITES["metaworld"][1] == "metaworld"
    with pytest.raises(EnvError, match=r"pip install 'rlweave\[metaworld\]'"):
        VectorEnv("metaworld/reach-v3", 1, seed=0)


def test_a_chunk_renders_once_unless_the_episode_ends():
    """Inside an action chunk only the last observation is read: the suite renders that one (and
    the final one of an episode that ends mid-chunk), not every step."""
    from rlweave.envs import VectorEnv
    import rlweave.envs.metaworld_suite as mw

    renders = []
    real = mw.MetaWorldEnv._render_all
    env = VectorEnv("metaworld/reach-v3", 1, seed=0, chunk=4, pixels={"enabled": True, "width": 16, "height": 16},
                    max_episode_steps=6)
    try:
        env.reset()
        mw.MetaWorldEnv._render_all = lambda self: renders.append(1) or real(self)
        first = env.step(np.zeros((1, 4, 4), dtype=np.float32))
        assert len(renders) == 1 and not first.truncated[0]
        second = env.step(np.zeros((1, 4, 4), dtype=np.float32))  # ends at step 6, mid-chunk: its final frame + the reset's
        assert second.truncated[0] and len(renders) == 3
    finally:
        mw.MetaWorldEnv._render_all = real
        env.close()
