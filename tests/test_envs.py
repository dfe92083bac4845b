"""The environment contract (rlweave.envs.VectorEnv): shapes, episode statistics, action chunks,
truncation, reward scaling, non-finite values, pixel observations. No Ray here."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlweave.envs import EnvError, RewardScaler, VectorEnv
from tests.nan_env import FIXED_ENV_ID, NAN_ENV_ID  # registers the test envs


def discrete_actions(n: int, chunk: int, value: int | list = 0) -> np.ndarray:
    a = np.zeros((n, chunk), dtype=np.int64)
    a[:] = np.asarray(value).reshape(-1, 1) if np.ndim(value) else value
    return a


def raw_env(venv: VectorEnv, i: int):
    return venv.envs[i].unwrapped


# --------------------------------------------------------------------------- reset and shapes
def test_reset_shapes_and_spaces():
    env = VectorEnv("CartPole-v1", 3, seed=0)
    obs = env.reset()
    assert obs.shape == (3, 4)
    assert obs.dtype == np.float32
    assert env.single_observation_space.shape == (4,)
    assert isinstance(env.single_action_space, gym.spaces.Discrete)
    res = env.step(discrete_actions(3, 1))
    assert res.obs.shape == (3, 4)
    assert res.reward.shape == res.terminated.shape == res.truncated.shape == res.dropped.shape == (3,)
    assert res.reward.dtype == np.float32
    assert env.steps == 3
    env.close()


def test_reset_is_seeded():
    a, b, c = (VectorEnv("CartPole-v1", 4, seed=s) for s in (7, 7, 8))
    oa, ob, oc = a.reset(), b.reset(), c.reset()
    np.testing.assert_array_equal(oa, ob)
    assert not np.array_equal(oa, oc)
    # explicit per-env seeds: equal seeds give equal starts
    o = a.reset(seed=[1, 1, 2, 2])
    np.testing.assert_array_equal(o[0], o[1])
    np.testing.assert_array_equal(o[2], o[3])
    assert not np.array_equal(o[0], o[2])


def test_box_actions_are_clipped_and_chunk_shaped():
    env = VectorEnv("Pendulum-v1", 2, seed=0, chunk=3)
    env.reset()
    res = env.step(np.full((2, 3, 1), 50.0, dtype=np.float32))  # far beyond the +-2 torque limit
    assert env.steps == 6
    assert np.all(np.isfinite(res.reward))


# --------------------------------------------------------------------------- episode statistics
def test_cartpole_episode_stats_equal_sum_of_raw_rewards():
    n = 4
    env = VectorEnv("CartPole-v1", n, seed=3)
    env.reset()
    rng = np.random.default_rng(0)
    running = np.zeros(n)
    running_len = np.zeros(n, dtype=int)
    expected_returns, expected_lengths = [], []
    for _ in range(200):
        res = env.step(rng.integers(0, 2, size=(n, 1)))
        running += res.reward
        running_len += 1
        for i in np.flatnonzero(res.terminated | res.truncated):
            expected_returns.append(running[i])
            expected_lengths.append(int(running_len[i]))
            running[i] = 0
            running_len[i] = 0
    stats = env.episode_stats()
    assert len(expected_returns) >= 5
    assert stats["return"] == pytest.approx(expected_returns)
    assert stats["length"] == expected_lengths
    assert stats["return"] == pytest.approx([float(x) for x in stats["length"]])  # CartPole pays 1 per step
    assert stats["success"] == []
    assert env.steps == 200 * n == sum(stats["length"]) + int(running_len.sum())
    assert env.episode_stats() == {"return": [], "length": [], "success": []}  # popped


def test_fixed_length_episode_stats():
    env = VectorEnv(FIXED_ENV_ID, 2, seed=0, kwargs={"length": 3})
    env.reset()
    rewards = [env.step(discrete_actions(2, 1)).reward.tolist() for _ in range(7)]
    assert rewards == [[1, 1], [2, 2], [3, 3], [1, 1], [2, 2], [3, 3], [1, 1]]
    stats = env.episode_stats()
    assert stats["return"] == [6.0, 6.0, 6.0, 6.0]
    assert stats["length"] == [3, 3, 3, 3]


# --------------------------------------------------------------------------- action chunks
def test_chunk_stops_at_episode_end_and_counts_steps_exactly():
    """Episodes of 3 steps, chunks of 2: decision 2 ends the episode after its first action;
    the second action of that chunk must not be stepped (not into the old episode, not into the
    next one)."""
    env = VectorEnv(FIXED_ENV_ID, 2, seed=0, chunk=2, kwargs={"length": 3})
    env.reset()
    r1 = env.step(discrete_actions(2, 2, 1))
    assert r1.reward.tolist() == [3.0, 3.0]  # steps 1 + 2
    assert not r1.terminated.any()
    assert env.steps == 4
    assert [raw_env(env, i).calls for i in range(2)] == [2, 2]

    r2 = env.step(discrete_actions(2, 2, 1))
    assert r2.reward.tolist() == [3.0, 3.0]  # only step 3
    assert r2.terminated.tolist() == [True, True]
    assert r2.truncated.tolist() == [False, False]
    assert env.steps == 6
    assert [raw_env(env, i).calls for i in range(2)] == [3, 3]
    assert [raw_env(env, i).t for i in range(2)] == [0, 0]  # reset, not stepped with the leftover action
    np.testing.assert_array_equal(r2.obs, [[0.0, -1.0], [0.0, -1.0]])  # first obs of the next episode
    assert r2.final_obs == {}  # terminated, not truncated: nothing to bootstrap

    r3 = env.step(discrete_actions(2, 2, 0))
    assert r3.reward.tolist() == [3.0, 3.0]
    assert env.steps == 10
    stats = env.episode_stats()
    assert stats == {"return": [6.0, 6.0], "length": [3, 3], "success": []}


def test_chunk_with_ended_env_keeps_other_envs_going():
    env = VectorEnv(FIXED_ENV_ID, 2, seed=0, chunk=3, kwargs={"length": 4})
    env.reset()
    env.envs[1].unwrapped.t = 2  # env 1 is two steps further into its episode
    res = env.step(discrete_actions(2, 3))
    assert res.terminated.tolist() == [False, True]
    assert res.reward.tolist() == [1 + 2 + 3, 3 + 4]
    assert env.steps == 3 + 2
    assert [raw_env(env, i).calls for i in range(2)] == [3, 2]


def test_inactive_envs_are_not_stepped():
    env = VectorEnv(FIXED_ENV_ID, 3, seed=0, chunk=2, kwargs={"length": 5})
    env.reset()
    res = env.step(discrete_actions(3, 2), active=np.array([True, False, True]))
    assert [raw_env(env, i).calls for i in range(3)] == [2, 0, 2]
    assert res.reward.tolist() == [3.0, 0.0, 3.0]
    assert env.steps == 4


def test_no_auto_reset_keeps_last_observation():
    env = VectorEnv(FIXED_ENV_ID, 1, seed=0, chunk=2, kwargs={"length": 3})
    env.reset()
    env.step(discrete_actions(1, 2, 1))
    res = env.step(discrete_actions(1, 2, 1), auto_reset=False)
    assert res.terminated.tolist() == [True]
    np.testing.assert_array_equal(res.obs, [[3.0, 1.0]])  # the terminal observation, no reset
    assert raw_env(env, 0).t == 3


# --------------------------------------------------------------------------- truncation
def test_truncation_stores_final_obs_of_the_ending_chunk_step():
    env = VectorEnv(FIXED_ENV_ID, 2, seed=0, chunk=2, kwargs={"length": 3, "truncate": True})
    env.reset()
    env.step(discrete_actions(2, 2, 0))
    res = env.step(np.array([[1, 0], [0, 1]]))
    assert res.truncated.tolist() == [True, True]
    assert res.terminated.tolist() == [False, False]
    assert sorted(res.final_obs) == [0, 1]
    # step 3 used the first action of each chunk; the second was never applied
    np.testing.assert_array_equal(res.final_obs[0], [3.0, 1.0])
    np.testing.assert_array_equal(res.final_obs[1], [3.0, 0.0])
    np.testing.assert_array_equal(res.obs, [[0.0, -1.0], [0.0, -1.0]])
    assert env.episode_stats()["return"] == [6.0, 6.0]


def test_time_limit_truncation_through_max_episode_steps():
    env = VectorEnv(FIXED_ENV_ID, 2, seed=0, max_episode_steps=2, kwargs={"length": 10})
    env.reset()
    r1 = env.step(discrete_actions(2, 1, 1))
    assert r1.final_obs == {} and not r1.truncated.any()
    r2 = env.step(discrete_actions(2, 1, [0, 1]))
    assert r2.truncated.tolist() == [True, True]
    assert not r2.terminated.any()
    np.testing.assert_array_equal(r2.final_obs[0], [2.0, 0.0])
    np.testing.assert_array_equal(r2.final_obs[1], [2.0, 1.0])
    assert env.episode_stats()["length"] == [2, 2]


def test_cartpole_time_limit_final_obs_differs_from_next_obs():
    env = VectorEnv("CartPole-v1", 2, seed=1, max_episode_steps=4)
    env.reset()
    out = [env.step(discrete_actions(2, 1, [0, 1])) for _ in range(4)]
    last = out[-1]
    assert last.truncated.tolist() == [True, True]
    for i in (0, 1):
        assert last.final_obs[i].shape == (4,)
        assert not np.array_equal(last.final_obs[i], last.obs[i])


# --------------------------------------------------------------------------- reward scaling
def test_reward_scaling_changes_rewards_not_episode_stats():
    kw = dict(num_envs=2, seed=0, kwargs={"length": 3})
    plain = VectorEnv(FIXED_ENV_ID, **kw)
    scaled = VectorEnv(FIXED_ENV_ID, normalize_reward=True, gamma=0.9, **kw)
    plain.reset(), scaled.reset()
    r_plain, r_scaled = [], []
    for _ in range(9):
        a = discrete_actions(2, 1)
        r_plain.append(plain.step(a).reward)
        r_scaled.append(scaled.step(a).reward)
    r_plain, r_scaled = np.array(r_plain), np.array(r_scaled)
    assert not np.allclose(r_plain, r_scaled)
    assert np.all(r_scaled > 0)  # a positive scale, not a shift
    # within one step, rewards are divided by one common factor
    np.testing.assert_allclose(r_scaled[:, 0] / r_plain[:, 0], r_scaled[:, 1] / r_plain[:, 1], rtol=1e-6)
    assert scaled.episode_stats() == plain.episode_stats() == {
        "return": [6.0] * 6, "length": [3] * 6, "success": []}


def test_reward_scaler_clips_and_round_trips_state():
    s = RewardScaler(1, gamma=0.0, clip=0.5)
    out = s(np.array([100.0]), np.array([False]))
    assert out.tolist() == [0.5]
    state = s.state_dict()
    t = RewardScaler(1, gamma=0.0, clip=0.5)
    t.load_state_dict(state)
    x = np.array([3.0])
    assert s(x.copy(), np.array([True])).tolist() == t(x.copy(), np.array([True])).tolist()


# --------------------------------------------------------------------------- non-finite values
def test_nan_reward_raises_with_env_id_rank_and_step():
    env = VectorEnv(NAN_ENV_ID, 1, seed=0, rank=3, kwargs={"nan_at": 5})
    env.reset()
    for _ in range(4):
        env.step(discrete_actions(1, 1))
    with pytest.raises(EnvError) as info:
        env.step(discrete_actions(1, 1))
    assert str(info.value) == (
        f"env '{NAN_ENV_ID}' (env worker rank 3, env 0, step 5) returned a non-finite reward"
    )


def test_observation_of_the_wrong_shape_raises_naming_both_shapes():
    env = VectorEnv(NAN_ENV_ID, 2, seed=0, rank=1, kwargs={"nan_at": 0, "bad_shape_at": 3})
    env.reset()
    for _ in range(2):
        env.step(discrete_actions(2, 1))
    with pytest.raises(EnvError) as info:
        env.step(discrete_actions(2, 1))
    assert str(info.value) == (
        f"env '{NAN_ENV_ID}' (env worker rank 1, env 0, step 5) returned an observation of shape (2,); "
        "its observation space has shape (3,)"
    )


def test_nan_reward_dropped_when_configured():
    env = VectorEnv(NAN_ENV_ID, 2, seed=0, on_nonfinite="drop", kwargs={"nan_at": 2, "length": 10})
    env.reset()
    r1 = env.step(discrete_actions(2, 1))
    assert not r1.dropped.any()
    r2 = env.step(discrete_actions(2, 1))
    assert r2.dropped.tolist() == [True, True]
    assert r2.terminated.tolist() == [True, True]  # the learner sees the episode end there
    assert r2.reward.tolist() == [0.0, 0.0]
    assert np.all(np.isfinite(r2.obs))
    assert env.dropped_episodes == 2
    assert env.episode_stats()["return"] == []  # dropped episodes are not reported
    assert [raw_env(env, i).t for i in range(2)] == [0, 0]  # and were reset


# --------------------------------------------------------------------------- suites and ids
def test_unknown_gym_id_is_refused_with_the_key():
    with pytest.raises(ValueError, match=r"env.id: unknown gymnasium id 'NoSuchEnv-v0'"):
        VectorEnv("NoSuchEnv-v0", 1, seed=0)


def test_module_prefixed_gym_id_imports_the_registering_module():
    """gymnasium's own convention for envs registered by a user package: 'module:EnvId'
    (gym.make imports the module first). It is the way to name a custom env in Ray worker
    processes, which never import the driver's registering code."""
    env = VectorEnv(f"tests.nan_env:{FIXED_ENV_ID}", 1, seed=0, kwargs={"length": 2})
    env.reset()
    assert env.step(discrete_actions(1, 1)).reward.tolist() == [1.0]


# --------------------------------------------------------------------------- pixels
def test_pixel_env_frame_stack_on_channels():
    env = VectorEnv(
        "InvertedPendulum-v5", 2, seed=0,
        pixels={"enabled": True, "width": 64, "height": 64, "frame_stack": 2},
    )
    obs = env.reset()
    assert obs.shape == (2, 64, 64, 6)
    assert obs.dtype == np.uint8
    assert env.single_observation_space.shape == (64, 64, 6)
    assert env.single_observation_space.dtype == np.uint8
    assert obs.max() > 0  # something was rendered
    # after a reset both stacked frames are the first frame
    np.testing.assert_array_equal(obs[..., :3], obs[..., 3:])
    res = env.step(np.full((2, 1, 1), 3.0, dtype=np.float32))
    assert res.obs.shape == (2, 64, 64, 6) and res.obs.dtype == np.uint8
    # the newest frame is last: the previous newest frame moved to the first three channels
    np.testing.assert_array_equal(res.obs[..., :3], obs[..., 3:])
    env.close()

