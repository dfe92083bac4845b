"""The small state world model: an ensemble of MLPs predicting the change of the observation,
the reward and the termination, trained on CPU in a minute.

Design (what and why):

* **Deltas, normalised.** Each member predicts ``(next_obs - obs)`` in units of the data's delta
  standard deviation: consecutive states differ little, so predicting the change keeps the target
  well scaled and makes "nothing happens" the easy default. Inputs (observation and action) and
  the reward target are standardised with statistics of the training data, kept as buffers of the
  network (:class:`rlweave.models.normalizer.RunningMeanStd`) so they travel with the weights.
* **Heads.** One trunk per member, one linear output holding the delta, the reward and a
  termination logit (trained with binary cross-entropy; ``terminated`` when its probability is
  above 0.5).
* **Ensemble as batched matrices.** The E members are one set of ``[E, in, out]`` weight tensors
  multiplied with ``torch.baddbmm``: one kernel call per layer for all members, so stepping a
  batch of 1 (an env of the vector env) costs about as much as one MLP.
* **Disagreement.** Members start from different random weights and see different batches; where
  the data were dense they agree. ``uncertainty`` is the mean over observation dimensions of the
  members' standard deviation of the predicted (normalised) delta: the quantity MOPO/MBPO-style
  methods penalise. The step itself uses the members' mean (``member="mean"``: smooth and
  reproducible) or one member drawn per row (``member="random"``: the trajectory sampling of PETS).
* **Selection.** The weights kept are those of the epoch with the lowest one-step error on held-out
  transitions, so long training cannot overfit the saved model.
"""

from __future__ import annotations

import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlweave.models.normalizer import RunningMeanStd
from rlweave.world_models.base import TorchWorldModel, WorldModelError, WorldStep, as_batch, is_image_space
from rlweave.world_models.data import Trajectories

__all__ = ["EnsembleWorldModel", "EnsembleDynamics"]


class EnsembleLinear(nn.Module):
    """E independent linear layers applied to inputs ``[E, B, in]`` in one batched matmul."""

    def __init__(self, members: int, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(members, 1, n_out))
        bound = 1.0 / n_in ** 0.5  # each member initialised like an nn.Linear of its own
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleDynamics(nn.Module):
    """E MLPs from (observation, action) to (normalised delta, normalised reward, termination logit)."""

    def __init__(self, obs_dim: int, act_dim: int, members: int = 5, hidden: tuple[int, ...] = (200, 200, 200)):
        super().__init__()
        self.obs_dim, self.act_dim, self.members = obs_dim, act_dim, members
        dims = [obs_dim + act_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [EnsembleLinear(members, a, b), nn.SiLU()]
        layers.append(EnsembleLinear(members, dims[-1], obs_dim + 2))
        self.net = nn.Sequential(*layers)
        self.in_norm = RunningMeanStd(obs_dim + act_dim)
        self.delta_norm = RunningMeanStd(obs_dim)
        self.reward_norm = RunningMeanStd(())

    def fit_normalizers(self, obs: torch.Tensor, action: torch.Tensor, next_obs: torch.Tensor, reward: torch.Tensor) -> None:
        self.in_norm.update(torch.cat([obs, action], -1))
        self.delta_norm.update(next_obs - obs)
        self.reward_norm.update(reward)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``obs``/``action`` [B, ...] (shared by all members) or [E, B, ...] (one batch per
        member); returns normalised delta [E, B, obs], normalised reward [E, B], logit [E, B]."""
        x = self.in_norm.normalize(torch.cat([obs, action], -1), clip=None).float()
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        out = self.net(x)
        return out[..., : self.obs_dim], out[..., self.obs_dim], out[..., self.obs_dim + 1]


class EnsembleWorldModel(TorchWorldModel):
    """:class:`EnsembleDynamics` behind the :class:`WorldModel` contract: the latent is the
    observation itself (``[B, obs_dim]`` float32)."""

    kind = "mlp_ensemble"
    setting_names = ("members", "hidden", "member")

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, env_id: str,
                 members: int = 5, hidden: tuple[int, ...] = (200, 200, 200), member: str = "mean",
                 max_episode_steps: int | None = None, seed: int = 0):
        if is_image_space(observation_space) or len(observation_space.shape) != 1:
            raise WorldModelError(f"world model: kind mlp_ensemble needs state vectors, got {observation_space.dtype} "
                                  f"{tuple(observation_space.shape)} (images: kind pixel_rnn)")
        if member not in ("mean", "random"):
            raise WorldModelError(f"world model: member must be 'mean' or 'random', got {member!r}")
        self.observation_space, self.action_space, self.env_id = observation_space, action_space, env_id
        self.max_episode_steps = max_episode_steps
        self.obs_shape = tuple(observation_space.shape)
        obs_dim = int(np.prod(self.obs_shape))
        act_dim = int(np.prod(action_space.shape))
        torch.manual_seed(seed)
        self.net = EnsembleDynamics(obs_dim, act_dim, members, tuple(hidden))
        self.settings = {"members": members, "hidden": list(hidden), "member": member}
        self.member = member
        self._rng = np.random.default_rng(seed)
        low, high = np.asarray(observation_space.low, np.float32), np.asarray(observation_space.high, np.float32)
        self._low = np.where(np.isfinite(low), low, -np.inf).reshape(-1)
        self._high = np.where(np.isfinite(high), high, np.inf).reshape(-1)

    # -- the contract ------------------------------------------------------------------------
    def encode(self, obs: np.ndarray) -> np.ndarray:
        return as_batch(obs).reshape(len(obs), -1).copy()

    def decode(self, latent: np.ndarray) -> np.ndarray:
        return as_batch(latent).reshape(len(latent), *self.obs_shape)

    @torch.inference_mode()
    def step(self, latent: np.ndarray, action: np.ndarray) -> WorldStep:
        obs = torch.from_numpy(as_batch(latent).reshape(len(latent), -1))
        act = torch.from_numpy(np.clip(as_batch(action).reshape(len(latent), -1),
                                       self.action_space.low.reshape(-1), self.action_space.high.reshape(-1)))
        delta_n, reward_n, logit = self.net(obs, act)
        if self.member == "mean":
            pick = lambda x: x.mean(0)  # noqa: E731
        else:
            rows = torch.arange(len(latent))
            who = torch.from_numpy(self._rng.integers(0, self.net.members, size=len(latent)))
            pick = lambda x: x[who, rows]  # noqa: E731
        nets = self.net
        delta = nets.delta_norm.denormalize(pick(delta_n).double()).float()
        reward = nets.reward_norm.denormalize(pick(reward_n).double()).float()
        p_term = torch.sigmoid(pick(logit))
        uncertainty = delta_n.std(0, unbiased=False).mean(-1) if nets.members > 1 else torch.zeros(len(latent))
        nxt = np.clip((obs + delta).numpy(), self._low, self._high).astype(np.float32)
        return WorldStep(latent=nxt, obs=nxt.reshape(len(nxt), *self.obs_shape), reward=reward.numpy().astype(np.float32),
                         terminated=(p_term > 0.5).numpy(), uncertainty=uncertainty.numpy().astype(np.float32))

    # -- training ----------------------------------------------------------------------------
    def fit(self, train: Trajectories, valid: Trajectories, epochs: int = 50, batch_size: int = 256,
            lr: float = 1e-3, weight_decay: float = 1e-5, seed: int = 0,
            log: Callable[[dict], None] | None = None) -> list[dict]:
        """Trains on the transitions of ``train`` for ``epochs`` passes, each member on its own
        random batches; after each epoch measures the one-step loss on ``valid``'s transitions and
        keeps the best epoch's weights. Returns one record per epoch (also handed to ``log``)."""
        train, valid = train.transitions(), valid.transitions()
        t = {k: torch.from_numpy(as_batch(v).reshape(len(v), -1) if v.ndim > 1 else as_batch(v)) for k, v in train.items()}
        v = {k: torch.from_numpy(as_batch(x).reshape(len(x), -1) if x.ndim > 1 else as_batch(x)) for k, x in valid.items()}
        n = len(t["reward"])
        if n < batch_size:
            raise WorldModelError(f"world model: {n} training transitions, fewer than one batch of {batch_size}; "
                                  "collect more episodes or lower --batch-size")
        self.net.fit_normalizers(t["obs"], t["action"], t["next_obs"], t["reward"])
        opt = torch.optim.AdamW(self.net.parameters(), lr=lr, weight_decay=weight_decay)
        gen = torch.Generator().manual_seed(seed)
        members = self.net.members
        best, best_state, records = float("inf"), None, []
        for epoch in range(1, epochs + 1):
            t0 = time.perf_counter()
            self.net.train()
            perm = torch.stack([torch.randperm(n, generator=gen) for _ in range(members)])  # [E, n]
            total, batches = 0.0, 0
            for i in range(0, n - batch_size + 1, batch_size):
                idx = perm[:, i:i + batch_size]  # each member its own rows
                loss = self._loss({k: x[idx] for k, x in t.items()})
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total, batches = total + loss.item(), batches + 1
            val = self.evaluate_one_step(v)
            rec = {"epoch": epoch, "train/loss": total / batches, **val, "time/epoch": time.perf_counter() - t0}
            records.append(rec)
            if log is not None:
                log(rec)
            if val["valid/loss"] < best:
                best = val["valid/loss"]
                best_state = {k: x.detach().clone() for k, x in self.net.state_dict().items()}
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        return records

    def _loss(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared error of normalised delta and reward, plus termination cross-entropy;
        ``b``'s tensors are [E, B, ...] or [B, ...]."""
        nets = self.net
        delta_n, reward_n, logit = nets(b["obs"], b["action"])
        target_delta = nets.delta_norm.normalize(b["next_obs"] - b["obs"], clip=None).float()
        target_reward = nets.reward_norm.normalize(b["reward"], clip=None).float()
        if delta_n.dim() != target_delta.dim():  # shared rows for all members (validation)
            target_delta, target_reward = target_delta.unsqueeze(0), target_reward.unsqueeze(0)
            term = b["terminated"].unsqueeze(0).expand_as(logit)
        else:
            term = b["terminated"]
        return (((delta_n - target_delta) ** 2).mean() + ((reward_n - target_reward) ** 2).mean()
                + nn.functional.binary_cross_entropy_with_logits(logit, term.float()))

    @torch.no_grad()
    def evaluate_one_step(self, v: dict[str, torch.Tensor]) -> dict[str, float]:
        self.net.eval()
        loss = float(self._loss(v))
        s = self.step(v["obs"].numpy(), v["action"].numpy())
        return {"valid/loss": loss,
                "valid/obs_mse": float(np.mean((s.latent - v["next_obs"].numpy()) ** 2)),
                "valid/reward_mse": float(np.mean((s.reward - v["reward"].numpy()) ** 2)),
                "valid/termination_accuracy": float(np.mean(s.terminated == (v["terminated"].numpy() > 0.5)))}
