"""Human interventions (rlweave.robot.human): the scripted human's takeover rule, the optional
devices' missing-package message, and HG-DAgger trained through a remote robot with a scripted
human as the operator (its commanded actions are the labels; only its takeover steps are stored)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import ray

from rlweave.robot.human import DEFAULT_OPERATOR, HumanOperator, ScriptedHuman, make_device
from rlweave.utils.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers import QUIET, read_metrics, train

SWING_UP = "rlweave.envs.controllers:pendulum_swing_up"


def test_scripted_human_reacts_after_a_delay_and_holds_control():
    human = ScriptedHuman(SWING_UP, [-2.0], [2.0], threshold=0.5, reaction_steps=2, hold_steps=3)
    obs = np.array([[1.0, 0.0, 0.0]], np.float32)  # upright and still: the controller wants 0 torque
    good, bad = np.zeros((1, 1), np.float32), np.full((1, 1), 2.0, np.float32)
    decisions = [bool(human.takeover(obs, a)[0]) for a in (bad, bad, bad, good, good, good, good)]
    # strays once (no reaction yet), twice (takes over), then holds 3 steps after taking over, then lets go
    assert decisions == [False, True, True, True, False, False, False]
    assert human.action(obs).shape == (1, 1) and abs(float(human.action(obs)[0, 0])) < 1e-6


@pytest.mark.parametrize("kind,package", [("keyboard", "pynput"), ("gamepad", "pygame")])
def test_real_devices_are_optional_and_name_their_package(kind, package):
    if importlib.util.find_spec(package) is None:
        with pytest.raises(ImportError, match=f"pip install {package}"):
            make_device(kind, [-1.0], [1.0])
    elif kind == "gamepad":  # installed, and no pad on a test machine: a clear refusal
        with pytest.raises(RuntimeError, match="gamepad 0: 0 connected"):
            make_device(kind, [-1.0], [1.0])
    else:
        pytest.skip(f"{package} is installed here and would listen to this machine's keyboard")


def test_hg_dagger_through_a_remote_robot_with_a_scripted_human(ray_session, tmp_path):
    from rlweave.robot.driver import SimDriver
    from rlweave.robot.server import Limits, ServerThread
    from rlweave.serving import ServerSecurity

    sec = ServerSecurity.create("robot server")
    operator = ray.remote(HumanOperator).options(name=DEFAULT_OPERATOR).remote("scripted", [-2.0], [2.0], SWING_UP)
    with ServerThread(lambda: SimDriver("Pendulum-v1"), sec, Limits(heartbeat_timeout_s=2.0)) as srv:
        run_dir = tmp_path / "hg"
        rc, out = train("hg-dagger-pendulum", f"env.id=remote/127.0.0.1:{sec.port}", "imitation.gate=operator",
                        f"imitation.operator={DEFAULT_OPERATOR}", "imitation.expert=rlweave.robot.human:operator_action",
                        "policy.hidden=[32,32]", "algorithm.batch_size=32", "train.rollout_steps=100", "train.total_env_steps=200",
                        "train.eval_every=0", f"run.dir={run_dir}", *QUIET)
        assert rc == 0, out
        robot_steps = srv.call(lambda: srv.server.counters["steps"])
    rows = read_metrics(run_dir)
    interventions = sum(r["samples/interventions"] for r in rows)
    assert robot_steps == 200 == rows[-1]["env_steps"]
    assert 0 < interventions < 200 and [r["samples/labels"] for r in rows] == [r["samples/interventions"] for r in rows]
    assert ray.get(operator.counts.remote())["takeovers"] == interventions
    replay = load_checkpoint(latest_checkpoint(run_dir))["replay"][0]
    stored = replay["rings"]["online"]["size"] + sum(len(it["transitions"]["reward"]) for it in replay["staged"])
    assert stored == interventions  # only the human's corrections were stored
    ray.kill(operator)
