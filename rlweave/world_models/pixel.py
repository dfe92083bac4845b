"""A small pixel world model: convolutional encoder and decoder around a recurrent latent, trained
open loop on CPU (kind ``pixel_rnn``).

Design (what and why):

* **Latent**: a deterministic GRU state ``h`` (the deterministic half of Dreamer's RSSM; the
  stochastic half is left out, as the issue allows: with one start frame and given actions, a
  deterministic model already has something to learn, and it halves the code). ``encode`` maps
  the start frame to ``h_0`` (conv stack, linear, tanh); ``step`` advances ``h`` with the action
  only, never with a frame: imagination sees no observations, so neither does training.
* **Heads**: the decoder (transposed convs, sigmoid pixels) reconstructs the frame from ``h``; the
  reward head reads ``(h_t, a_t)`` (a reward belongs to a state and an action); the termination
  head reads ``h_{t+1}``.
* **Training open loop**: each sample is a real window of ``seq_len`` steps; ``h_0`` is encoded
  from its first frame and rolled forward with its actions; the loss is the squared pixel error
  of every decoded frame, summed over the frame (the first one included: it trains the
  encoder/decoder pair), plus the standardised reward MSE and the termination cross-entropy,
  averaged over the window. This is the objective of
  action-conditional video prediction (Oh et al., 2015) and matches exactly what the env asks of
  the model; teacher forcing would train a one-step model that drifts in use.
* **Uncertainty**: one model, so 0 (an ensemble of these is a member count away, at E times the
  cost; the state model is where disagreement is used).

Images are uint8 ``[H, W, C]`` with H and W divisible by 8 (C = 3 per stacked frame).
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

__all__ = ["PixelWorldModel", "PixelDynamics"]


class PixelDynamics(nn.Module):
    """Encoder, GRU latent dynamics, decoder, reward and termination heads."""

    def __init__(self, image_shape: tuple[int, int, int], act_dim: int, latent: int = 128, width: int = 32):
        super().__init__()
        h, w, c = image_shape
        if h % 8 or w % 8:
            raise WorldModelError(f"world model: images of {h}x{w}; the pixel model needs sides divisible by 8")
        self.image_shape, self.latent = (h, w, c), latent
        self.grid = (2 * width, h // 8, w // 8)
        flat = int(np.prod(self.grid))
        act = nn.SiLU
        self.encoder = nn.Sequential(
            nn.Conv2d(c, width, 4, 2, 1), act(), nn.Conv2d(width, 2 * width, 4, 2, 1), act(),
            nn.Conv2d(2 * width, 2 * width, 4, 2, 1), act(), nn.Flatten(), nn.Linear(flat, latent), nn.Tanh())
        self.decoder = nn.Sequential(
            nn.Linear(latent, flat), act(), nn.Unflatten(1, self.grid),
            nn.ConvTranspose2d(2 * width, 2 * width, 4, 2, 1), act(), nn.ConvTranspose2d(2 * width, width, 4, 2, 1), act(),
            nn.ConvTranspose2d(width, c, 4, 2, 1), nn.Sigmoid())
        self.action_in = nn.Sequential(nn.Linear(act_dim, 64), act())
        self.cell = nn.GRUCell(64, latent)
        self.reward = nn.Sequential(nn.Linear(latent + act_dim, 128), act(), nn.Linear(128, 1))
        self.termination = nn.Linear(latent, 1)
        self.reward_norm = RunningMeanStd(())

    @staticmethod
    def pixels(images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, C] -> float [B, C, H, W] in [0, 1]."""
        return images.permute(0, 3, 1, 2).float() / 255.0

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.pixels(images))

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] in [0, 1]."""
        return self.decoder(h)

    def step(self, h: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Next latent, normalised reward of (h, action), termination logit of the next latent."""
        reward = self.reward(torch.cat([h, action], -1)).squeeze(-1)
        nxt = self.cell(self.action_in(action), h)
        return nxt, reward, self.termination(nxt).squeeze(-1)


class PixelWorldModel(TorchWorldModel):
    """:class:`PixelDynamics` behind the :class:`WorldModel` contract: latents are ``[B, latent]``
    float32 GRU states; observations uint8 images."""

    kind = "pixel_rnn"
    setting_names = ("latent", "width", "seq_len")

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, env_id: str, latent: int = 128,
                 width: int = 32, seq_len: int = 10, max_episode_steps: int | None = None, seed: int = 0):
        shape = tuple(observation_space.shape)
        if not is_image_space(observation_space):
            raise WorldModelError(f"world model: kind pixel_rnn needs uint8 [H, W, C] images, got {observation_space.dtype} {shape}")
        self.observation_space, self.action_space, self.env_id = observation_space, action_space, env_id
        self.max_episode_steps = max_episode_steps
        torch.manual_seed(seed)
        self.net = PixelDynamics(shape, int(np.prod(action_space.shape)), latent, width)
        self.settings = {"latent": latent, "width": width, "seq_len": seq_len}
        self.seq_len = seq_len
        self._low = np.asarray(action_space.low, np.float32).reshape(-1)
        self._high = np.asarray(action_space.high, np.float32).reshape(-1)

    # -- the contract ------------------------------------------------------------------------
    @torch.inference_mode()
    def encode(self, obs: np.ndarray) -> np.ndarray:
        return self.net.encode(torch.from_numpy(np.ascontiguousarray(obs, dtype=np.uint8))).numpy()

    @torch.inference_mode()
    def decode(self, latent: np.ndarray) -> np.ndarray:
        x = self.net.decode(torch.from_numpy(as_batch(latent)))
        return (x.permute(0, 2, 3, 1) * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()

    @torch.inference_mode()
    def step(self, latent: np.ndarray, action: np.ndarray) -> WorldStep:
        a = torch.from_numpy(np.clip(as_batch(action).reshape(len(latent), -1), self._low, self._high))
        nxt, reward_n, logit = self.net.step(torch.from_numpy(as_batch(latent)), a)
        reward = self.net.reward_norm.denormalize(reward_n.double()).float()
        latent_next = nxt.numpy()
        return WorldStep(latent=latent_next, obs=self.decode(latent_next), reward=reward.numpy().astype(np.float32),
                         terminated=(torch.sigmoid(logit) > 0.5).numpy(), uncertainty=np.zeros(len(latent), np.float32))

    # -- training ----------------------------------------------------------------------------
    def _loss(self, w: dict[str, torch.Tensor]) -> torch.Tensor:
        net = self.net
        h = net.encode(w["obs0"])
        # pixel error summed over the image (a Gaussian log-likelihood, as Dreamer's), averaged over
        # the batch: a per-pixel mean would weigh a whole frame like one reward and leave it blurred
        image = lambda x, target: ((x - net.pixels(target)) ** 2).flatten(1).sum(1).mean()  # noqa: E731
        loss = image(net.decode(h), w["obs0"])
        target_r = net.reward_norm.normalize(w["rewards"], clip=None).float()
        for t in range(w["actions"].shape[1]):
            a = w["actions"][:, t].reshape(len(h), -1)
            prev = h
            h, r, logit = net.step(prev, a)
            loss = loss + image(net.decode(h), w["obs"][:, t])
            loss = loss + ((r - target_r[:, t]) ** 2).mean()
            loss = loss + nn.functional.binary_cross_entropy_with_logits(logit, w["terminated"][:, t].float())
        return loss / (w["actions"].shape[1] + 1)

    def fit(self, train: Trajectories, valid: Trajectories, epochs: int = 20, batch_size: int = 32, lr: float = 3e-4,
            seed: int = 0, steps_per_epoch: int | None = None, log: Callable[[dict], None] | None = None) -> list[dict]:
        """Trains on random ``seq_len``-step windows of ``train`` (``steps_per_epoch`` batches an
        epoch; default: one pass's worth of windows); keeps the epoch with the lowest loss on
        held-out windows of ``valid``."""
        starts = train.window_starts(self.seq_len)
        if len(starts) < batch_size:
            raise WorldModelError(f"world model: {len(starts)} training windows of {self.seq_len} steps, fewer than one batch "
                                  f"of {batch_size}; collect more or longer episodes, or lower --batch-size")
        self.net.reward_norm.update(torch.from_numpy(np.concatenate(train.rewards)))
        rng = np.random.default_rng(seed)
        tensors = lambda d: {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()}  # noqa: E731
        held = tensors(valid.windows(self.seq_len, max_windows=4 * batch_size, seed=seed))
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        steps = steps_per_epoch or max(1, len(starts) // batch_size)
        best, best_state, records = float("inf"), None, []
        for epoch in range(1, epochs + 1):
            t0 = time.perf_counter()
            self.net.train()
            total = 0.0
            for _ in range(steps):
                batch = tensors(train.gather(starts[rng.integers(0, len(starts), batch_size)], self.seq_len))
                loss = self._loss(batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), 100.0)
                opt.step()
                total += loss.item()
            self.net.eval()
            with torch.no_grad():
                val = float(self._loss(held))
            rec = {"epoch": epoch, "train/loss": total / steps, "valid/loss": val, "time/epoch": time.perf_counter() - t0}
            records.append(rec)
            if log is not None:
                log(rec)
            if val < best:
                best, best_state = val, {k: x.detach().clone() for k, x in self.net.state_dict().items()}
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        return records
