"""Human interventions: a person (or a script standing in for one) watches the robot and takes over,
and those corrections train the policy (HG-DAgger: ``imitation.gate=operator``).

The pieces reuse the imitation machinery of :mod:`rlweave.data.experts`:

* an :class:`InputDevice` turns a person's input into ``(takeover, action)``:
  :class:`KeyboardDevice` (``pynput``), :class:`GamepadDevice` (``pygame``), both optional
  (``pip install pynput`` / ``pygame``; asked for only when used), and :class:`ScriptedHuman` for
  tests and demos: it intervenes when the learner strays from a scripted controller by more than a
  threshold, after a reaction delay, and keeps control for a few steps once it has it (people do
  not flick in and out every step);
* :class:`HumanOperator` is the operator process's decision service, run as a named Ray actor:
  ``decide(obs, learner_action)`` is the gate (:class:`~rlweave.data.experts.OperatorGate` calls
  it), ``act(obs)`` the person's actions, which :func:`operator_action` serves as the expert
  (``imitation.expert=rlweave.robot.human:operator_action``), so the stored label of a takeover
  step is what the person commanded.

Start one beside a run on a Ray cluster: ``python -m rlweave.robot.human --device gamepad`` (the
actor is pinned to this machine, where the device is), then train with
``imitation.gate=operator imitation.operator=rlweave-operator
imitation.expert=rlweave.robot.human:operator_action``.
"""

from __future__ import annotations

import abc
import argparse
import os
import sys
import threading
import time
from typing import Any

import numpy as np

__all__ = ["InputDevice", "ScriptedHuman", "KeyboardDevice", "GamepadDevice", "HumanOperator", "operator_action",
           "DEFAULT_OPERATOR", "make_device"]

DEFAULT_OPERATOR = "rlweave-operator"


class InputDevice(abc.ABC):
    """A person's input for a batch of ``n`` envs (one person watches them all; a device that
    cannot tell envs apart applies to every env)."""

    def __init__(self, action_low: np.ndarray, action_high: np.ndarray):
        self.low, self.high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)

    @abc.abstractmethod
    def action(self, obs: np.ndarray) -> np.ndarray:
        """The person's commanded actions ``[n, act_dim]`` (the label of a takeover step)."""

    @abc.abstractmethod
    def takeover(self, obs: np.ndarray, learner_action: np.ndarray) -> np.ndarray:
        """Whether the person has control of each env ``[n]`` (bool)."""


class ScriptedHuman(InputDevice):
    """A scripted stand-in for a person: wants the actions of ``controller`` (``module:function``,
    see :mod:`rlweave.envs.controllers`); takes over after ``reaction_steps`` consecutive steps
    where the learner's action is farther than ``threshold`` (max-norm) from it, and keeps control
    for at least ``hold_steps``."""

    def __init__(self, controller: str, action_low, action_high, threshold: float = 0.5, reaction_steps: int = 2,
                 hold_steps: int = 5):
        super().__init__(action_low, action_high)
        from rlweave.data.experts import _import

        self.controller = _import(controller)
        self.threshold, self.reaction_steps, self.hold_steps = float(threshold), int(reaction_steps), int(hold_steps)
        self._strays: np.ndarray | None = None
        self._holding: np.ndarray | None = None

    def action(self, obs: np.ndarray) -> np.ndarray:
        a = np.asarray(self.controller(obs), dtype=np.float32).reshape(len(obs), -1)
        return np.clip(a, self.low.reshape(1, -1), self.high.reshape(1, -1))

    def takeover(self, obs: np.ndarray, learner_action: np.ndarray) -> np.ndarray:
        n = len(obs)
        if self._strays is None or len(self._strays) != n:
            self._strays, self._holding = np.zeros(n, np.int64), np.zeros(n, np.int64)
        gap = np.abs(np.asarray(learner_action, np.float32).reshape(n, -1) - self.action(obs)).max(-1)
        self._strays = np.where(gap > self.threshold, self._strays + 1, 0)
        start = (self._holding == 0) & (self._strays >= self.reaction_steps)
        self._holding = np.where(start, self.hold_steps, np.maximum(self._holding - 1, 0))
        return (self._holding > 0) | start


class _AxesDevice(InputDevice):
    """Shared by real devices: ``axes`` in [-1, 1] per action dim, scaled to the action box, and a
    deadman switch (held = the person has control)."""

    def __init__(self, action_low, action_high):
        super().__init__(action_low, action_high)
        self._lock = threading.Lock()
        self.axes = np.zeros(self.low.shape, np.float32)
        self.engaged = False

    def action(self, obs: np.ndarray) -> np.ndarray:
        with self._lock:
            a = self.low + (self.axes + 1.0) * 0.5 * (self.high - self.low)
        return np.repeat(a.reshape(1, -1), len(obs), 0)

    def takeover(self, obs: np.ndarray, learner_action: np.ndarray) -> np.ndarray:
        with self._lock:
            return np.full(len(obs), self.engaged)


class KeyboardDevice(_AxesDevice):
    """Keyboard through ``pynput``: hold SPACE to take control; LEFT/RIGHT push action dim 0 to its
    low/high end, DOWN/UP dim 1 (centred when released). Needs a display or a console pynput can read."""

    def __init__(self, action_low, action_high):
        super().__init__(action_low, action_high)
        try:
            from pynput import keyboard
        except ImportError:
            raise ImportError("KeyboardDevice needs pynput: pip install pynput") from None
        self._keys = {keyboard.Key.left: (0, -1.0), keyboard.Key.right: (0, 1.0), keyboard.Key.down: (1, -1.0), keyboard.Key.up: (1, 1.0)}
        self._space = keyboard.Key.space
        self._listener = keyboard.Listener(on_press=lambda k: self._key(k, True), on_release=lambda k: self._key(k, False))
        self._listener.start()

    def _key(self, key, down: bool) -> None:
        with self._lock:
            if key == self._space:
                self.engaged = down
            elif key in self._keys:
                dim, sign = self._keys[key]
                if dim < self.axes.size:
                    self.axes.flat[dim] = sign if down else 0.0


class GamepadDevice(_AxesDevice):
    """A gamepad through ``pygame``: stick axes 0.. map to action dims, button ``deadman`` (default
    5, the right bumper on common pads) held = control. Polled on every call."""

    def __init__(self, action_low, action_high, index: int = 0, deadman: int = 5):
        super().__init__(action_low, action_high)
        try:
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            import pygame
        except ImportError:
            raise ImportError("GamepadDevice needs pygame: pip install pygame") from None
        pygame.display.init()  # the event queue the pad's state comes through (no audio, no window: dummy driver)
        pygame.joystick.init()
        if pygame.joystick.get_count() <= index:
            raise RuntimeError(f"gamepad {index}: {pygame.joystick.get_count()} connected")
        self._pg, self._pad, self._deadman = pygame, pygame.joystick.Joystick(index), int(deadman)

    def _poll(self) -> None:
        self._pg.event.pump()
        with self._lock:
            for d in range(min(self.axes.size, self._pad.get_numaxes())):
                self.axes.flat[d] = float(self._pad.get_axis(d))
            self.engaged = bool(self._pad.get_button(self._deadman))

    def action(self, obs):
        self._poll()
        return super().action(obs)

    def takeover(self, obs, learner_action):
        self._poll()
        return super().takeover(obs, learner_action)


def make_device(kind: str, action_low, action_high, controller: str | None = None, **kwargs) -> InputDevice:
    """``scripted`` (needs ``controller``), ``keyboard`` or ``gamepad``."""
    if kind == "scripted":
        if not controller:
            raise ValueError("device scripted: name the controller it stands in for (module:function)")
        return ScriptedHuman(controller, action_low, action_high, **kwargs)
    if kind == "keyboard":
        return KeyboardDevice(action_low, action_high)
    if kind == "gamepad":
        return GamepadDevice(action_low, action_high, **kwargs)
    raise ValueError(f"device: 'scripted', 'keyboard' or 'gamepad', got {kind!r}")


class HumanOperator:
    """The operator's decision service (a Ray actor: ``ray.remote(HumanOperator).options(name=...)``).
    Counts the steps it took over, so a run's interventions can be checked against it."""

    def __init__(self, kind: str, action_low, action_high, controller: str | None = None, **kwargs):
        self.device = make_device(kind, action_low, action_high, controller, **kwargs)
        self.takeovers = 0
        self.decisions = 0

    def act(self, obs: Any) -> np.ndarray:
        return self.device.action(np.asarray(obs))

    def decide(self, obs: Any, learner_action: Any) -> list[bool]:
        out = np.asarray(self.device.takeover(np.asarray(obs), np.asarray(learner_action)), dtype=bool)
        self.takeovers += int(out.sum())
        self.decisions += len(out)
        return out.tolist()

    def counts(self) -> dict:
        return {"takeovers": self.takeovers, "decisions": self.decisions}


_OPERATOR: dict[str, Any] = {}


def operator_action(obs: np.ndarray) -> np.ndarray:
    """The expert of a human-supervised run: the operator's commanded actions (the Ray actor named
    ``$RLWEAVE_OPERATOR``, default ``rlweave-operator``)."""
    import ray

    name = os.environ.get("RLWEAVE_OPERATOR", DEFAULT_OPERATOR)
    if name not in _OPERATOR:
        _OPERATOR[name] = ray.get_actor(name)
    return np.asarray(ray.get(_OPERATOR[name].act.remote(np.asarray(obs)), timeout=30.0), dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    """Registers a :class:`HumanOperator` on a running Ray cluster, pinned to this machine (where the
    device is), and keeps it alive until interrupted."""
    p = argparse.ArgumentParser(prog="python -m rlweave.robot.human", description=main.__doc__.splitlines()[0])
    p.add_argument("--device", choices=("keyboard", "gamepad", "scripted"), required=True)
    p.add_argument("--action-low", type=float, nargs="+", required=True)
    p.add_argument("--action-high", type=float, nargs="+", required=True)
    p.add_argument("--controller", help="--device scripted: module:function it stands in for")
    p.add_argument("--name", default=DEFAULT_OPERATOR)
    p.add_argument("--address", default="auto", help="the Ray cluster (default: the running one)")
    args = p.parse_args(argv)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=args.address, namespace=None)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(HumanOperator).options(name=args.name, lifetime="detached", scheduling_strategy=here).remote(
        args.device, np.array(args.action_low), np.array(args.action_high), args.controller)
    ray.get(actor.counts.remote())
    print(f"[rlweave] operator '{args.name}' ready ({args.device}); Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(5)
    except KeyboardInterrupt:
        ray.kill(actor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
