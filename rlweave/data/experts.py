"""Experts and intervention gates for imitation learning (BC, DAgger, HG-DAgger).

An *expert* labels states with actions: ``expert(obs [n, obs_dim]) -> actions [n, act_dim]``. It
is either a trained rlweave run (its latest checkpoint's policy, acting deterministically) or a
scripted controller named ``module:function`` (see :mod:`rlweave.envs.controllers`).

A *gate* decides, step by step, whether the expert takes over from the learner (HG-DAgger, where
a human supervises): ``gate(obs, learner_action, expert_action) -> bool [n]``. The packaged rule,
:class:`ActionGapGate`, stands in for a human who intervenes when the robot visibly deviates from
what they would do. :class:`OperatorGate` asks a real operator process instead: any process that
registers a named Ray actor with a ``decide(obs, learner_action) -> list[bool]`` method (a teleop
console, a safety monitor) can supervise a run, on this machine or across a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rlweave.utils.tree import is_dict, tree_index, tree_len, tree_shapes
from rlweave.utils.plugins import import_object

__all__ = ["load_expert", "load_gate", "ActionGapGate", "OperatorGate", "ExpertError"]


class ExpertError(ValueError):
    """An expert or gate that cannot be loaded; the message is one line."""


def _import(target: str):
    if ":" not in target or target.endswith(":"):
        raise ExpertError(f"'{target}' is neither a run folder nor 'module:function'")
    try:
        return import_object(target)
    except (ImportError, AttributeError) as e:
        raise ExpertError(f"cannot import '{target}': {e}") from None


def load_expert(spec: str, observation_space, action_space, probe=None) -> Callable[[np.ndarray], np.ndarray]:
    """The expert named by ``spec``: a run folder (its latest checkpoint's policy, deterministic)
    or ``module:function``. Checks that it returns actions of the env's shape, on ``probe`` (a batch
    of real observations) or on two samples of the observation space; dict observations are
    probed only on real ones (a sampled instruction names no task a scripted expert knows)."""
    path = Path(spec)
    if (path / "config.yaml").is_file():
        from rlweave.models.run_policy import RunPolicyError, load_run_policy

        try:
            policy = load_run_policy(path, observation_space=observation_space, action_space=action_space, chunk=1).policy
        except RunPolicyError as e:
            raise ExpertError(f"expert run {e}") from None

        def expert(obs: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                a = policy.env_action(policy.act(torch.as_tensor(np.asarray(obs), dtype=torch.float32), deterministic=True)[0])
            return a[:, 0].reshape(len(obs), -1).numpy()
    else:
        expert = _import(spec)
    if probe is None:
        if is_dict(observation_space.sample()):
            return expert
        probe = np.stack([observation_space.sample() for _ in range(2)])
    rows = tree_len(probe)
    try:
        got = np.asarray(expert(probe))
    except Exception as e:  # noqa: BLE001 - a scripted expert written for another env
        raise ExpertError(f"expert '{spec}' fails on this env's observations {tree_shapes(tree_index(probe, 0))}: {e!r}") from None
    want = (rows, int(np.prod(action_space.shape)))
    if got.size != want[0] * want[1]:
        raise ExpertError(f"expert '{spec}' returns actions of shape {got.shape[1:]}, the env needs {tuple(action_space.shape)}")
    return expert


class ActionGapGate:
    """Intervenes where the learner's action is farther than ``threshold`` (max-norm) from the
    expert's: a stand-in for a supervisor who takes over when the robot visibly goes wrong."""

    def __init__(self, threshold: float):
        self.threshold = float(threshold)

    def __call__(self, obs: np.ndarray, learner_action: np.ndarray, expert_action: np.ndarray) -> np.ndarray:
        gap = np.abs(np.asarray(learner_action).reshape(len(obs), -1) - np.asarray(expert_action).reshape(len(obs), -1))
        return gap.max(-1) > self.threshold


class OperatorGate:
    """Asks a named Ray actor, run by an operator process, whether to take over:
    ``decide(obs, learner_action) -> list[bool]``."""

    def __init__(self, actor_name: str, timeout: float = 30.0):
        import ray

        self.actor = ray.get_actor(actor_name)
        self.timeout = timeout

    def __call__(self, obs: np.ndarray, learner_action: np.ndarray, expert_action: np.ndarray) -> np.ndarray:
        import ray

        return np.asarray(ray.get(self.actor.decide.remote(obs, learner_action), timeout=self.timeout), dtype=bool)


def load_gate(kind: str, threshold: float, operator: str | None) -> Callable | None:
    """The gate of ``imitation.gate``: ``none``, ``action_gap`` or ``operator``."""
    if kind == "none":
        return None
    if kind == "action_gap":
        return ActionGapGate(threshold)
    if not operator:
        raise ExpertError("imitation.operator: name the Ray actor of the operator process for imitation.gate=operator")
    return OperatorGate(operator)
