"""Env snapshots: an env restored mid-episode continues exactly as the original."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from rlweave.envs.snapshot import restore_env, snapshot_env


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "HalfCheetah-v5", "Hopper-v5"])
def test_restored_env_continues_the_episode_exactly(env_id):
    original = gym.make(env_id)
    original.reset(seed=3)
    original.action_space.seed(0)
    for _ in range(7):
        original.step(original.action_space.sample())
    snap = pickle.loads(pickle.dumps(snapshot_env(original)))  # it goes through a checkpoint file
    copy = gym.make(env_id)
    copy.reset(seed=99)  # a different episode, to be overwritten
    restore_env(copy, snap)
    actions = [original.action_space.sample() for _ in range(40)]
    for a in actions:
        o1, r1, te1, tr1, _ = original.step(a)
        o2, r2, te2, tr2, _ = copy.step(a)
        assert np.array_equal(o1, o2) and r1 == r2 and (te1, tr1) == (te2, tr2)
        if te1 or tr1:  # the next reset draws the same noise from the restored generator
            assert np.array_equal(original.reset()[0], copy.reset()[0])


def test_time_limit_counter_is_part_of_the_snapshot():
    original = gym.make("Pendulum-v1", max_episode_steps=10)
    original.reset(seed=0)
    for _ in range(8):
        original.step(np.zeros(1, dtype=np.float32))
    copy = gym.make("Pendulum-v1", max_episode_steps=10)
    copy.reset(seed=0)
    restore_env(copy, snapshot_env(original))
    assert not copy.step(np.zeros(1, dtype=np.float32))[3]
    assert copy.step(np.zeros(1, dtype=np.float32))[3]  # truncated at 10, counting the 8 taken before


def test_snapshot_of_another_env_layout_is_refused():
    snap = snapshot_env(gym.make("Pendulum-v1"))
    with pytest.raises(ValueError, match="not the same env"):
        restore_env(gym.make("Pendulum-v1").unwrapped, snap)
