"""The world-model contract, and the registry that loads a saved model folder.

A world model is used in three places, and each needs only part of it:

* the world-model env (:mod:`rlweave.world_models.env`) encodes a real start observation once and
  then steps a *latent state* with the agent's actions, reading back observation, reward,
  termination and an uncertainty;
* evaluation of the model (:mod:`rlweave.world_models.train`) rolls it open loop along held-out
  real trajectories and compares its decoded observations with the real ones;
* videos decode the latent to something a person can look at (an observation the real simulator
  can be put into, or camera pixels).

Why a latent at all, when the small state models' latent *is* the observation: a video model
(diffusion or autoregressive, on a GPU) keeps context frames, a Dreamer-style model a recurrent
state; neither is an observation. The env holds the latent as an opaque numpy array (so env
snapshots and checkpoints carry it) and never looks inside. Everything is batched: the first axis
of every array is the batch.

A model folder holds ``world_model.json`` (``kind``: the registry key, plus the model's own
settings, the real env id and the spaces) and whatever files the kind writes beside it.
:func:`load_world_model` reads ``kind`` and lets the registered class load the rest, so a new kind
(a pixel model, a video model) plugs in by one registry line.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlweave.utils.plugins import import_object

__all__ = ["WorldModel", "TorchWorldModel", "WorldStep", "WorldModelError", "MODEL_KINDS", "CONFIG_FILE", "load_world_model",
           "read_model_config", "space_to_json", "space_from_json", "is_image_space"]

CONFIG_FILE = "world_model.json"

# kind -> "module:Class" (imported when a folder of that kind is loaded)
MODEL_KINDS: dict[str, str] = {
    "mlp_ensemble": "rlweave.world_models.ensemble:EnsembleWorldModel",
    "pixel_rnn": "rlweave.world_models.pixel:PixelWorldModel",
}
WEIGHTS_FILE = "weights.pt"


class WorldModelError(ValueError):
    """A model folder or training input that cannot be used; one line naming it."""


@dataclass
class WorldStep:
    """One imagined step over a batch of B latents."""

    latent: np.ndarray  # [B, ...] the next latent state (opaque to callers)
    obs: np.ndarray  # [B, *obs_shape] the predicted observation
    reward: np.ndarray  # [B] float32
    terminated: np.ndarray  # [B] bool: the termination head's probability above its threshold
    uncertainty: np.ndarray  # [B] float32: ensemble disagreement (0 for a single model)


class WorldModel(ABC):
    """Action-conditioned dynamics with reward and termination heads, over a batch.

    Attributes every kind sets: ``observation_space`` and ``action_space`` (gymnasium spaces of
    the real env the data came from) and ``env_id`` (that env's id, for evaluating in it)."""

    kind: str = ""
    observation_space: Any
    action_space: Any
    env_id: str

    @abstractmethod
    def encode(self, obs: np.ndarray) -> np.ndarray:
        """Latent states [B, ...] of real observations [B, *obs_shape]."""

    @abstractmethod
    def step(self, latent: np.ndarray, action: np.ndarray) -> WorldStep:
        """The imagined outcome of taking ``action`` [B, *action_shape] in ``latent`` [B, ...]."""

    @abstractmethod
    def decode(self, latent: np.ndarray) -> np.ndarray:
        """The observations [B, *obs_shape] the latents stand for (videos, open-loop errors)."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Writes the model into folder ``path``, ``world_model.json`` included."""

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path) -> "WorldModel":
        """The model saved in folder ``path``."""

    def rollout(self, obs0: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
        """Open-loop imagination: from real observations ``obs0`` [B, ...], the actions
        ``actions`` [B, H, ...] applied in turn without ever looking at the real env again.
        Returns ``obs`` [B, H, ...], ``reward`` [B, H], ``terminated`` [B, H], ``uncertainty`` [B, H]."""
        latent = self.encode(obs0)
        out: dict[str, list] = {"obs": [], "reward": [], "terminated": [], "uncertainty": []}
        for t in range(actions.shape[1]):
            s = self.step(latent, actions[:, t])
            latent = s.latent
            for k in out:
                out[k].append(getattr(s, k))
        return {k: np.stack(v, axis=1) for k, v in out.items()}


class TorchWorldModel(WorldModel):
    """A world model whose weights are one ``torch.nn.Module`` (``self.net``) and whose
    constructor is ``cls(observation_space, action_space, env_id, max_episode_steps=..., **settings)``:
    saving and loading are then the same for every such kind (config JSON + ``weights.pt``)."""

    net: torch.nn.Module
    settings: dict
    max_episode_steps: int | None = None

    def config(self) -> dict:
        return {"kind": self.kind, "env_id": self.env_id, "max_episode_steps": self.max_episode_steps,
                "observation_space": space_to_json(self.observation_space), "action_space": space_to_json(self.action_space),
                **self.settings}

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), path / WEIGHTS_FILE)
        existing = read_model_config(path) if (path / CONFIG_FILE).is_file() else {}
        (path / CONFIG_FILE).write_text(json.dumps({**existing, **self.config()}, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "TorchWorldModel":
        cfg = read_model_config(path)
        try:
            spaces = space_from_json(cfg["observation_space"]), space_from_json(cfg["action_space"])
            settings = {k: cfg[k] for k in cls.setting_names}
            model = cls(*spaces, cfg["env_id"], max_episode_steps=cfg.get("max_episode_steps"), **settings)
        except KeyError as e:
            raise WorldModelError(f"world model {path}: {CONFIG_FILE} lacks {e}") from None
        weights = Path(path) / WEIGHTS_FILE
        if not weights.is_file():
            raise WorldModelError(f"world model {path}: no {WEIGHTS_FILE}")
        model.net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        model.net.eval()
        model.net.requires_grad_(False)
        return model

    setting_names: tuple[str, ...] = ()  # the config keys the constructor takes back


def read_model_config(path: str | Path) -> dict:
    """The ``world_model.json`` of the model folder ``path`` (one-line error when it is not one)."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise WorldModelError(f"world model {path}: no {CONFIG_FILE} (train one with: rlweave train-world-model DATASET -o {path})")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise WorldModelError(f"world model {file}: not valid JSON ({e})") from None


_CACHE: dict[str, WorldModel] = {}
_CACHE_LOCK = threading.Lock()


def load_world_model(path: str | Path, cache: bool = True) -> WorldModel:
    """The model in folder ``path``, loaded by the class its ``kind`` names. With ``cache`` (the
    envs' default) one copy per process and folder: all envs of an env worker share it, and
    nothing writes to it after loading."""
    key = str(Path(path).expanduser().resolve())
    with _CACHE_LOCK:
        if cache and key in _CACHE:
            return _CACHE[key]
        cfg = read_model_config(key)
        kind = cfg.get("kind")
        if kind not in MODEL_KINDS:
            raise WorldModelError(f"world model {path}: unknown kind {kind!r} in {CONFIG_FILE}; known: {', '.join(sorted(MODEL_KINDS))}")
        model = import_object(MODEL_KINDS[kind]).load(key)
        if cache:
            _CACHE[key] = model
        return model


def as_batch(x: Any, dtype=np.float32) -> np.ndarray:
    """``x`` as a contiguous numpy array of ``dtype`` (inputs arrive as lists, tensors, float64)."""
    return np.ascontiguousarray(np.asarray(x, dtype=dtype))


def space_to_json(space: gym.spaces.Box) -> dict:
    return {"low": np.asarray(space.low).tolist(), "high": np.asarray(space.high).tolist(),
            "shape": list(space.shape), "dtype": str(space.dtype)}


def space_from_json(d: dict) -> gym.spaces.Box:
    dtype = np.dtype(d["dtype"])
    return gym.spaces.Box(np.asarray(d["low"], dtype=dtype), np.asarray(d["high"], dtype=dtype), tuple(d["shape"]), dtype=dtype)


def is_image_space(space: Any) -> bool:
    """A uint8 [H, W, C] box: camera images (C = 3 per stacked frame)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3 and space.shape[2] % 3 == 0
