"""A trained run's policy behind a request interface: what a serving request may hold, how it
becomes a policy input, and the actions that go back.

Why separate from the transport: the request contract (keys, shapes, dtypes, the prompt as text)
is the part robot-side code depends on; checking it here, once per request and before batching,
means one malformed request is answered with an error naming the key and never poisons the batch
it would have joined.

Request keys follow openpi's robot clients: ``observation/<leaf>`` for each leaf of a dict
observation (``observation/image``, ``observation/state``), ``prompt`` (a string) for the
instruction leaf, and ``observation/state`` (``observation/image`` for uint8 pixels) for an env
whose observation is one array. The server metadata lists them with shapes and dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlweave.models.inputs import float_observations, policy_input
from rlweave.models.policies import Policy
from rlweave.utils.tree import tree_stack

__all__ = ["RequestError", "ObservationField", "ServedPolicy", "observation_fields", "parse_request"]

PROMPT_KEY = "prompt"
INSTRUCTION_LEAF = "instruction"
# the manipulation contract's simulator state: for scripted experts only, models ignore it and a
# real robot has none, so a request may leave it out (it is then zeros)
PRIVILEGED_LEAF = "privileged"


class RequestError(ValueError):
    """A request that does not fit the policy's observation contract; the text names the key."""


@dataclass(frozen=True)
class ObservationField:
    """One request key: the observation leaf it fills (None: the observation is one array), its
    shape and dtype, and whether it is text (the instruction, sent as a string)."""

    key: str
    leaf: str | None
    shape: tuple[int, ...]
    dtype: np.dtype
    text: bool = False
    optional: bool = False

    def describe(self) -> dict:
        if self.text:
            return {"type": "str", "max_bytes": int(self.shape[0])}
        out = {"shape": list(self.shape), "dtype": str(self.dtype)}
        return {**out, "optional": True} if self.optional else out

    def parse(self, value: Any) -> np.ndarray:
        """``value`` as this leaf's array (one row), or RequestError naming the key."""
        if self.text:
            if isinstance(value, str):
                from rlweave.envs.manipulation import encode_instruction

                try:
                    return encode_instruction(value, self.shape[0])
                except ValueError as e:
                    raise RequestError(f"'{self.key}': {e}") from None
            if not isinstance(value, np.ndarray):
                raise RequestError(f"'{self.key}': expected a string, got {type(value).__name__}")
        if not isinstance(value, np.ndarray):
            if isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
                value = np.asarray(value)
            else:
                raise RequestError(f"'{self.key}': expected an array of shape {self.shape}, got {type(value).__name__}")
        if tuple(value.shape) != self.shape:
            raise RequestError(f"'{self.key}': expected shape {self.shape}, got {tuple(value.shape)}")
        if self.dtype == np.uint8:
            if value.dtype != np.uint8:
                raise RequestError(f"'{self.key}': expected dtype uint8, got {value.dtype}")
            return value
        if value.dtype.kind not in "fiu":
            raise RequestError(f"'{self.key}': expected a numeric dtype (cast to {self.dtype}), got {value.dtype}")
        out = value.astype(self.dtype, copy=False)
        if not np.all(np.isfinite(out)):
            raise RequestError(f"'{self.key}': holds non-finite values")
        return out


def observation_fields(space: gym.Space) -> list[ObservationField]:
    """The request keys of an observation space (see the module docstring)."""
    if isinstance(space, gym.spaces.Dict):
        fields = []
        for leaf, sub in space.spaces.items():
            if leaf == INSTRUCTION_LEAF:
                fields.append(ObservationField(PROMPT_KEY, leaf, tuple(sub.shape), np.dtype(sub.dtype), text=True))
            else:
                fields.append(ObservationField(f"observation/{leaf}", leaf, tuple(sub.shape), np.dtype(sub.dtype),
                                               optional=leaf == PRIVILEGED_LEAF))
        return fields
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"serving needs a Box or Dict observation space, got {type(space).__name__}")
    image = space.dtype == np.uint8 and len(space.shape) == 3
    return [ObservationField("observation/image" if image else "observation/state", None, tuple(space.shape),
                             np.dtype(space.dtype))]


def parse_request(fields: list[ObservationField], request: Any) -> Any:
    """One request as one observation row (array or dict of arrays); RequestError naming the first
    missing, unknown or malformed key. An optional leaf left out is zeros."""
    if not isinstance(request, dict):
        raise RequestError(f"a request is a map of observation keys, got {type(request).__name__}")
    known = {f.key for f in fields}
    unknown = sorted(str(k) for k in request if k not in known)
    if unknown:
        raise RequestError(f"unknown key(s) {unknown}; expected {sorted(known)}")
    missing = sorted(f.key for f in fields if f.key not in request and not f.optional)
    if missing:
        raise RequestError(f"missing key(s) {missing}; expected {sorted(known)}")
    if fields[0].leaf is None:
        return fields[0].parse(request[fields[0].key])
    return {f.leaf: f.parse(request[f.key]) if f.key in request else np.zeros(f.shape, f.dtype) for f in fields}


class ServedPolicy:
    """A policy in eval mode with its observation contract: :meth:`parse` checks one request,
    :meth:`infer` runs one forward pass over any number of parsed rows (deterministic actions,
    the executed part: exactly what ``rlweave eval`` steps the env with)."""

    def __init__(self, policy: Policy, observation_space: gym.Space, action_space: gym.Space, info: dict | None = None):
        self.policy = policy.eval()
        self.observation_space, self.action_space = observation_space, action_space
        self.fields = observation_fields(observation_space)
        self.float_obs = float_observations(observation_space)
        self.info = dict(info or {})

    @classmethod
    def from_run(cls, run_dir: str | Path, checkpoint: str | None = None) -> "ServedPolicy":
        """The newest (or named) checkpoint of a run folder, in its env's spaces (RunPolicyError /
        ConfigError, one line, when the folder cannot be served)."""
        from omegaconf import OmegaConf

        from rlweave.envs import space_info
        from rlweave.models.run_policy import load_run_policy, read_run_config

        cfg = read_run_config(run_dir)
        env_cfg = OmegaConf.to_container(cfg.env)
        obs_space, act_space = space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
        run = load_run_policy(run_dir, checkpoint, observation_space=obs_space, action_space=act_space)
        return cls(run.policy, obs_space, act_space, {"run": str(Path(run_dir).resolve().name), "env": cfg.env.id,
                                                      "checkpoint": run.checkpoint.name, "policy": cfg.policy.name})

    def metadata(self) -> dict:
        """What the server sends each client on connect: the request keys and the action shape."""
        shape = [int(self.policy.chunk), *getattr(self.action_space, "shape", ())]
        action: dict = {"shape": shape, "dtype": "float32"}
        if isinstance(self.action_space, gym.spaces.Box):
            action.update(low=self.action_space.low.tolist(), high=self.action_space.high.tolist())
        elif isinstance(self.action_space, gym.spaces.Discrete):
            action.update(n=int(self.action_space.n), dtype="int64")
        return {"server": "rlweave", **self.info, "observation": {f.key: f.describe() for f in self.fields},
                "action": action, "action_horizon": int(self.policy.chunk)}

    def parse(self, request: Any) -> Any:
        """One request as one observation row (see :func:`parse_request`)."""
        return parse_request(self.fields, request)

    def infer(self, rows: list[Any]) -> np.ndarray:
        """Actions ``[len(rows), chunk, *action_shape]`` for parsed rows, in one forward pass."""
        obs = tree_stack(rows)
        with torch.inference_mode():
            action, _, _ = self.policy.act(policy_input(obs, self.float_obs, copy=True), deterministic=True)
            executed = self.policy.env_action(action)
        out = executed.detach().cpu().numpy()
        return out.reshape(len(rows), int(self.policy.chunk), *getattr(self.action_space, "shape", ()))
