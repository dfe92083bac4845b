"""Human interventions (rlweave.robot.human): the scripted human's takeover rule and the optional
devices' refusals. HG-DAgger through a remote robot with a scripted human is in
test_robot_training.py (it shares that module's Ray)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from rlweave.robot.human import ScriptedHuman, make_device

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
