"""Running observation statistics kept as module buffers.

The statistics live inside the policy (as float64 buffers), so they travel with the weights through
``state_dict`` / weight sync / checkpoints, and evaluation uses exactly the statistics training used.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

__all__ = ["RunningMeanStd"]


class RunningMeanStd(nn.Module):
    """Running mean and (population) variance over the leading axes of the inputs.

    Buffers: ``mean`` [*shape], ``var`` [*shape], ``count`` [] (all float64). Batches are merged with
    the parallel-variance formula of Chan et al., so ``update`` on batches of any size equals the
    statistics of their concatenation; ``update_from_moments`` merges moments computed elsewhere
    (e.g. all-reduced across distributed ranks).
    """

    def __init__(self, shape: int | Sequence[int] = (), epsilon: float = 1e-8):
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape = shape
        self.epsilon = float(epsilon)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self._scale_cache: tuple | None = None

    def _apply(self, fn, recurse=True):
        # Keep the statistics in float64 through module.half()/.to(dtype): only devices change.
        saved = {k: b for k, b in self._buffers.items() if b is not None}
        super()._apply(fn, recurse)
        for k, old in saved.items():
            new = self._buffers[k]
            if new is not None and new.dtype != old.dtype:
                self._buffers[k] = old.to(device=new.device)
        return self

    def extra_repr(self) -> str:
        return f"shape={self.shape}, count={int(self.count.item())}"

    @staticmethod
    def batch_moments(x: Tensor, shape: Sequence[int]) -> tuple[Tensor, Tensor, int]:
        """(mean, population var, count) of ``x`` over every axis before the trailing ``shape``."""
        x = x.detach().to(torch.float64).reshape(-1, *shape)
        n = x.shape[0]
        if n == 0:
            return x.new_zeros(tuple(shape)), x.new_ones(tuple(shape)), 0
        return x.mean(0), x.var(0, unbiased=False), n

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold a batch ``x`` of shape [..., *shape] into the statistics."""
        mean, var, n = self.batch_moments(x.to(self.mean.device), self.shape)
        if n > 0:
            self.update_from_moments(mean, var, n)

    @torch.no_grad()
    def update_from_moments(self, mean: Tensor, var: Tensor, count: float | Tensor) -> None:
        """Merge a batch summarised by its mean, population variance and count (Chan et al.)."""
        dev, f64 = self.mean.device, torch.float64
        b_mean = torch.as_tensor(mean, dtype=f64, device=dev).reshape(self.shape)
        b_var = torch.as_tensor(var, dtype=f64, device=dev).reshape(self.shape)
        b_count = torch.as_tensor(count, dtype=f64, device=dev).reshape(())
        if b_count.item() <= 0:
            return
        tot = self.count + b_count
        delta = b_mean - self.mean
        new_mean = self.mean + delta * (b_count / tot)
        m2 = self.var * self.count + b_var * b_count + delta.square() * (self.count * b_count / tot)
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def _scale(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Mean and std in ``dtype``, recomputed only when the statistics change.

        A policy normalises every small batch it sees (one env step's observations, one PPO
        minibatch) while the statistics stay fixed for a whole iteration; converting them each time
        was five of the eight operations of :meth:`normalize`. The cache is keyed on the buffer
        objects and their version counters, which every in-place write (``update``,
        ``load_state_dict``, weight sync) bumps, and a device move replaces."""
        def convert() -> tuple[Tensor, Tensor]:
            return self.mean.to(dtype, copy=True), (self.var + self.epsilon).sqrt().to(dtype)

        try:
            key = (dtype, self.mean._version, self.var._version)
        except RuntimeError:  # buffers made inside torch.inference_mode have no version counter
            return convert()
        cache = self._scale_cache
        if cache is None or cache[0] is not self.mean or cache[1] is not self.var or cache[2] != key:
            # normal tensors even when first asked inside torch.inference_mode (a rollout's act)
            with torch.inference_mode(False), torch.no_grad():
                cache = self._scale_cache = (self.mean, self.var, key, *convert())
        return cache[3], cache[4]

    def normalize(self, x: Tensor, clip: float | None = 10.0) -> Tensor:
        """``(x - mean) / sqrt(var + eps)``, clipped to [-clip, clip], in x's float dtype."""
        dtype = x.dtype if x.is_floating_point() else torch.float32
        mean, std = self._scale(dtype)
        y = (x.to(dtype) - mean) / std
        if clip is not None:
            y = y.clamp(-clip, clip)
        return y

    def denormalize(self, y: Tensor) -> Tensor:
        dtype = y.dtype if y.is_floating_point() else torch.float32
        return y * (self.var + self.epsilon).sqrt().to(dtype) + self.mean.to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.normalize(x)
