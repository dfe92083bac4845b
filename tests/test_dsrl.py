"""DSRL (rlweave.envs.dsrl, algorithm ``dsrl``): the noise-space wrapper decodes deterministically
through the frozen flow policy, exposes the noise box, stops a chunk at the episode's end and
resumes exactly; the suite and the recipes chain collect -> bc-flow-push -> dsrl-push, and the
frozen policy's weights are the same after a DSRL run as before it."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from helpers import QUIET, read_metrics, run_cli, train
from rlweave.algorithms import get_algorithm
from rlweave.envs.dsrl import NoiseSpaceEnv, load_base_policy
from rlweave.envs.snapshot import restore_env, snapshot_env
from rlweave.models import build_policy
from rlweave.models.policies import flat_params_checksum

CHUNK = 4


def _pendulum(steps: int = 200) -> gym.Env:
    return gym.make("Pendulum-v1", max_episode_steps=steps)


def _flow(env: gym.Env, seed: int = 0):
    torch.manual_seed(seed)
    return build_policy("flow_mlp", env.observation_space, env.action_space, chunk=CHUNK, steps=3, hidden=(16, 16),
                        critic=False).eval()


# --------------------------------------------------------------------------- the wrapper
def test_the_action_space_is_the_noise_box_and_decoding_is_deterministic():
    inner = _pendulum()
    env = NoiseSpaceEnv(inner, _flow(inner), noise_bound=1.5)
    assert env.action_space == gym.spaces.Box(-1.5, 1.5, (CHUNK * 1,), np.float32)
    assert env.observation_space == inner.observation_space
    obs, _ = env.reset(seed=3)
    w = np.array([0.3, -1.2, 0.9, 1.5], np.float32)
    a = env.decode(obs, w)
    assert a.shape == (CHUNK, 1)
    np.testing.assert_array_equal(a, env.decode(obs, w.copy()))  # same noise, same chunk
    assert not np.allclose(a, env.decode(obs, -w))  # the noise steers it
    # w = 0 is the base policy's own deterministic action (its ODE from x_0 = 0)
    with torch.no_grad():
        own = env.policy.distribution_params(torch.as_tensor(obs)[None])[0].numpy()
    np.testing.assert_allclose(env.decode(obs, np.zeros(CHUNK, np.float32)), own, rtol=1e-6, atol=1e-6)


def test_equal_noise_from_equal_starts_gives_equal_transitions():
    outs = []
    for _ in range(2):
        inner = _pendulum()
        env = NoiseSpaceEnv(inner, _flow(inner))
        env.reset(seed=7)
        outs.append([env.step(np.full(CHUNK, 0.5, np.float32))[:2] for _ in range(3)])
    for (o1, r1), (o2, r2) in zip(*outs):
        np.testing.assert_array_equal(o1, o2)
        assert r1 == r2


def test_a_chunk_stops_at_the_episode_end_and_sums_the_executed_rewards():
    inner = _pendulum(steps=6)
    env = NoiseSpaceEnv(inner, _flow(inner))
    twin = _pendulum(steps=6)  # the same episode stepped by hand with the decoded actions
    obs, _ = env.reset(seed=1)
    twin.reset(seed=1)
    w = np.linspace(-1, 1, CHUNK, dtype=np.float32)
    for want_steps, want_trunc in ((4, False), (2, True)):  # 6 steps: a full chunk, then 2 of 4
        actions = np.clip(env.decode(obs, w), -2.0, 2.0)
        obs, r, term, trunc, info = env.step(w)
        assert info["chunk_steps"] == want_steps and trunc == want_trunc and not term
        expect = sum(twin.step(a)[1] for a in actions[:want_steps])
        assert r == pytest.approx(expect, rel=1e-12)
    assert inner._elapsed_steps == 6  # TimeLimit's count: no action of the finished episode was executed


class _Rendering(gym.Env):
    """Records whether each step was asked for fresh images (manipulation.FrameSkipping's flag)."""

    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    observe_images = True

    def __init__(self):
        self.asked: list[bool] = []

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.asked.append(self.observe_images)
        return np.full(3, len(self.asked) / 10, np.float32), 0.0, False, False, {}


def test_only_the_last_frame_of_a_chunk_is_rendered():
    inner = _Rendering()
    env = NoiseSpaceEnv(inner, _flow(inner))
    env.reset(seed=0)
    env.step(np.zeros(CHUNK * 2, np.float32))
    assert inner.asked == [False, False, False, True] and inner.observe_images


def test_a_snapshot_restores_the_observation_the_next_chunk_decodes_at():
    inner = _pendulum()
    env = NoiseSpaceEnv(inner, _flow(inner))
    env.reset(seed=2)
    env.step(np.full(CHUNK, 0.2, np.float32))
    snap = snapshot_env(env)
    w = np.full(CHUNK, -0.7, np.float32)
    first = env.step(w)[:2]
    fresh_inner = _pendulum()
    fresh = NoiseSpaceEnv(fresh_inner, env.policy)
    fresh.reset(seed=99)
    restore_env(fresh, snap)
    again = fresh.step(w)[:2]
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1] == again[1]


def test_a_policy_whose_action_ignores_the_noise_is_refused():
    inner = _pendulum()
    gaussian = build_policy("mlp", inner.observation_space, inner.action_space, chunk=CHUNK, critic=False)
    env = NoiseSpaceEnv(inner, gaussian)
    with pytest.raises(ValueError, match="does not depend on its noise"):
        env.reset(seed=0)


def test_dsrl_is_sac_under_its_own_name():
    spec, sac = get_algorithm("dsrl"), get_algorithm("sac")
    assert (spec.kind, spec.loss, spec.target_network, spec.runners) == (sac.kind, sac.loss, sac.target_network, sac.runners)
    assert "noise" in spec.description


# --------------------------------------------------------------------------- recipes end to end
needs_metaworld = pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="metaworld is not installed")

TINY_ENV = ["env.max_episode_steps=24"]
TINY_BC = ["train.total_updates=4", "train.updates_per_iteration=2", "algorithm.minibatch_size=16", "train.eval_every=1",
           "train.eval_episodes=1", "policy.hidden=[32,32]", "policy.kwargs.steps=2", "cluster.local=true"]
TINY_RL = ["train.total_env_steps=8", "train.rollout_steps=4", "algorithm.learning_starts=4", "algorithm.batch_size=4",
           "train.max_staleness=0", "train.eval_every=2", "train.eval_episodes=1", "policy.hidden=[16,16]", "critic.hidden=[16,16]",
           "cluster.num_cpus=2"]


def _files_digest(folder: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, ray_session) -> Path:
    """Demonstrations of the scripted push expert, then the flow policy behaviour-cloned on them (in
    one process: the Ray path of the policy SFT runner has its own tests; DSRL's below runs on Ray)."""
    root = tmp_path_factory.mktemp("dsrl")
    rc, out = run_cli("collect", "bc-flow-push", *TINY_ENV, "--expert", "rlweave.envs.dsrl:metaworld_push_expert",
                      "--episodes", "2", "-o", str(root / "demos"))
    assert rc == 0, out
    rc, out = train("bc-flow-push", f"data.path={root / 'demos'}", f"run.dir={root / 'bc'}", *TINY_ENV, *TINY_BC, *QUIET)
    assert rc == 0, out
    return root / "bc"


@needs_metaworld
def test_collect_bc_then_dsrl_leaves_the_base_run_untouched(base_run, tmp_path):
    before = _files_digest(base_run)
    rc, out = train("dsrl-push", f"env.kwargs.base_policy={base_run}", f"run.dir={tmp_path / 'rl'}", *TINY_ENV, *TINY_RL, *QUIET)
    assert rc == 0, out
    rows = read_metrics(tmp_path / "rl")
    assert rows[-1]["env_steps"] >= 8 and any(r.get("samples/updates", 0) > 0 for r in rows)
    assert any("eval/success_rate" in r for r in rows)  # MetaWorld's success flag comes through the wrapper
    assert _files_digest(base_run) == before


@needs_metaworld
def test_the_frozen_policy_is_bit_identical_after_a_dsrl_run(base_run, tmp_path):
    """In one process (cluster.local), the env's frozen policy is the cached object checked here."""
    from rlweave.envs.metaworld_suite import make_env

    probe = make_env("push-v3", obs="flat")
    policy, _ = load_base_policy(base_run, None, probe.observation_space, probe.action_space)
    probe.close()
    before = flat_params_checksum(policy)
    assert not any(p.requires_grad for p in policy.parameters())
    rc, out = train("dsrl-push", f"env.kwargs.base_policy={base_run}", f"run.dir={tmp_path / 'rl'}", "cluster.local=true",
                    *TINY_ENV, *TINY_RL, *QUIET)
    assert rc == 0, out
    again, _ = load_base_policy(base_run, None, probe.observation_space, probe.action_space)
    assert again is policy and flat_params_checksum(policy) == before


@needs_metaworld
def test_a_missing_base_policy_is_one_line(tmp_path, capsys):
    rc, _ = train("dsrl-push", f"env.kwargs.base_policy={tmp_path / 'nothing'}", f"run.dir={tmp_path / 'rl'}", *QUIET)
    err = capsys.readouterr().err
    assert rc == 2 and "env.kwargs.base_policy" in err and "not a run folder" in err and err.count("\n") == 1, err



def test_the_bc_run_normalises_by_its_demonstrations(base_run):
    """policy.normalize_obs under runner policy_sft: the statistics come from the demonstrations
    (unfitted, every input passes unnormalised and the state-based flow policy does not learn push)."""
    from rlweave.data.demos import load_demonstrations
    from rlweave.models.run_policy import load_run_policy

    policy = load_run_policy(base_run).policy
    demos = load_demonstrations(base_run.parent / "demos")
    assert policy.obs_rms is not None
    assert torch.allclose(policy.obs_rms.mean.float(), torch.as_tensor(demos.obs.mean(0)), atol=1e-3)
