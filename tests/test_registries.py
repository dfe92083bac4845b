"""Live registries: a user's estimator, loss and policy, registered by name in a plugin module
(``examples/my_algorithm.py``), train through config names alone, in-process and in Ray worker
processes; pieces of the wrong kind and unknown names are refused on one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from rlweave.algorithms import (ALGORITHMS, POLICY_LOSSES, AlgorithmSpec, OnPolicyLossInput, get_algorithm, get_policy_loss,
                                register_algorithm, register_policy_loss)
from rlweave.config.load import ConfigError, load_config
from tests.helpers import QUIET, read_metrics, train

REPO_ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "algorithm.plugins=[examples.my_algorithm]"
SHORT = ["env.num_envs=4", "train.rollout_steps=32", "train.total_env_steps=256", "train.eval_every=100",
         "train.eval_episodes=2", "algorithm.epochs=2", "algorithm.minibatch_size=64", *QUIET]
USER_ALGO = ["algorithm.name=a2c_td", "policy.name=shared_mlp"]


def test_user_pieces_train_in_process_through_config_names(tmp_path):
    run_dir = tmp_path / "run"
    rc, out = train("ppo-cartpole", "cluster.local=true", PLUGIN, *USER_ALGO, *SHORT, f"run.dir={run_dir}")
    assert rc == 0, out
    from examples import my_algorithm  # the module the plugin import loaded: the workers ran in this process

    calls = my_algorithm.CALLS
    assert calls["estimator"] == 2, calls  # one per iteration (256 steps / (4 envs * 32 steps))
    assert calls["loss"] == 2 * 2 * 2, calls  # iterations * epochs * minibatches (128 samples / 64)
    assert calls["policy"] >= 3, calls  # the driver's check, the rollout and the actor built one
    rows = read_metrics(run_dir)
    assert [r["env_steps"] for r in rows] == [128, 256]
    assert all("train/td_error_abs" in r and "train/loss_policy" in r and "train/clip_fraction" not in r for r in rows)


def test_user_pieces_reach_ray_worker_processes(tmp_path):
    """Workers are fresh processes: only ``algorithm.plugins`` makes the names known there."""
    run_dir = tmp_path / "run"
    args = ["train", "ppo-cartpole", "cluster.num_cpus=2", PLUGIN, *USER_ALGO, *SHORT, "train.total_env_steps=128",
            f"run.dir={run_dir}"]  # one iteration: the run's start is the cost here
    code = f"import sys; from rlweave.cli import main; sys.exit(main({args!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = read_metrics(run_dir)
    # the estimator's own metric: it ran in the actor's process, under the name the config gave
    assert [r["env_steps"] for r in rows] == [128] and "train/td_error_abs" in rows[0]


def test_plugin_import_registers_in_a_fresh_process():
    code = ("import gymnasium as gym; from rlweave.algorithms import load_algorithm; from rlweave.models import build_policy;"
            "spec = load_algorithm({'name': 'a2c_td', 'plugins': ['examples.my_algorithm']});"
            "p = build_policy('shared_mlp', gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), plugins=['examples.my_algorithm']);"
            "print(spec.advantage, spec.loss, type(p).__name__, p.shared_backbone)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["td", "a2c", "MLPPolicy", "True"], proc.stderr[-2000:]


def test_policy_name_is_checked_against_the_registry():
    with pytest.raises(ConfigError, match=r"^policy\.name: 'nope' is not a registered policy; known: cnn, .*mlp, .*squashed_mlp"):
        load_config("ppo-cartpole", ["policy.name=nope"])
    cfg = load_config("ppo-cartpole", [PLUGIN, "policy.name=shared_mlp"])  # the plugin registers it
    assert cfg.policy.name == "shared_mlp"
    with pytest.raises(ConfigError, match=r"^algorithm\.plugins: cannot import 'no_such_plugin': ModuleNotFoundError"):
        load_config("ppo-cartpole", ["algorithm.plugins=[no_such_plugin]"])


def _learner_loss(batch, nets, opts, update_actor=True):
    return {"loss_bc": torch.zeros(())}


def test_a_loss_of_the_wrong_kind_is_refused():
    register_policy_loss("test_learner_only", _learner_loss, kind="learner")
    try:
        spec = AlgorithmSpec(name="test_wrong_kind", kind="on_policy", advantage="gae", loss="test_learner_only",
                             uses_critic=True, episodic_groups=False, description="")
        with pytest.raises(KeyError) as err:
            register_algorithm(spec)
        msg = str(err.value)
        assert msg.startswith("algorithm 'test_wrong_kind' (runner onpolicy): policy loss 'test_learner_only' is of kind learner")
        assert "kind on_policy is needed here: loss(inp: OnPolicyLossInput)" in msg and "\n" not in msg
        assert "test_wrong_kind" not in ALGORITHMS
        with pytest.raises(KeyError, match="is of kind learner"):
            get_policy_loss("test_learner_only", "on_policy")
    finally:
        POLICY_LOSSES.unregister("test_learner_only")
    # a function that cannot take its kind's call is refused when registered
    with pytest.raises(TypeError, match=r"policy loss 'test_bad_sig' \(on_policy\) is called as loss\(inp: OnPolicyLossInput\)"):
        register_policy_loss("test_bad_sig", _learner_loss, kind="on_policy")
    assert "test_bad_sig" not in POLICY_LOSSES
    with pytest.raises(ValueError, match="kind must be one of on_policy, token, learner, sft"):
        register_policy_loss("test_bad_kind", lambda inp: {}, kind="embodied")


def test_one_name_one_implementation_per_kind():
    """``ppo`` is a clipped surrogate on embodied steps and on tokens; the same inputs give the
    same terms through either contract."""
    from rlweave.algorithms.contracts import TokenLossInput

    g = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(6, generator=g) for _ in range(3))
    cfg = {"clip_eps": 0.2, "vf_coef": 0.5, "ent_coef": 0.0}
    steps = get_policy_loss("ppo", "on_policy")(OnPolicyLossInput(lp, old, adv, None, None, None, None, torch.zeros(6, 1),
                                                                   torch.zeros(6), 0.2, cfg))
    tokens = get_policy_loss("ppo", "token")(TokenLossInput(lp[None], old[None], adv[None], torch.ones(1, 6, dtype=torch.bool),
                                                            None, 6, cfg))
    torch.testing.assert_close(steps["loss_policy"], tokens["loss_policy"])


def test_sft_is_its_own_kind_and_offline_means_offline_rl():
    assert get_algorithm("sft").kind == "sft" and get_algorithm("sft").runners == ("llm", "policy_sft")
    assert {n for n, a in ALGORITHMS.items() if a.kind == "offline"} == {"iql", "offline_bc"}
    with pytest.raises(KeyError, match="is of kind policy_sft and sft"):
        get_policy_loss("sft", "token")


def test_wrong_runner_for_a_user_algorithm_is_one_line(capsys, tmp_path):
    rc, _ = train("grpo-arith", PLUGIN, "algorithm.name=a2c_td", f"run.dir={tmp_path / 'r'}", *QUIET)
    err = capsys.readouterr().err
    assert rc == 2 and "algorithm.name: 'a2c_td' is an on-policy algorithm; it runs with runner=onpolicy" in err, err


def test_example_space_mismatch_is_reported_by_name():
    from rlweave.models import build_policy

    with pytest.raises(ValueError, match="policy 'shared_mlp'"):
        build_policy("shared_mlp", gym.spaces.Box(0, 255, (8, 8, 3), "uint8"), gym.spaces.Discrete(2),
                     plugins=["examples.my_algorithm"])
