"""One contiguous buffer behind a model's parameters, and one behind their gradients.

Small-network RL training (PPO's 64x64 MLPs, minibatches of 64) is bound by per-operation
overhead, not arithmetic: with 13 parameter tensors, a fused Adam step still spends ~130 us
grouping and checking tensors and gradient-norm clipping ~110 us, next to ~1.5 ms for the
forward and backward passes. Viewing every parameter into one flat tensor makes Adam one kernel on
one tensor (~60 us) and clipping one norm and one multiply.

The parameters stay ordinary ``nn.Parameter`` objects of the module (state dicts, weight export,
DDP and checksums see no difference); only their storage moves. Gradients are views too, so
backward accumulates into the flat gradient in place: it must therefore be zeroed with
:meth:`FlatParameters.zero_grad` (never set to None), and the optimizer is built over
:attr:`FlatParameters.flat` alone.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn

__all__ = ["FlatParameters"]


class FlatParameters:
    """Re-homes ``params`` (same dtype and device) into one flat parameter and one flat gradient.

    Adam, SGD and the other elementwise optimizers give the same result on the flat tensor as on
    the separate ones; the gradient norm is the same quantity as ``clip_grad_norm_``'s.
    """

    def __init__(self, params: Iterable[nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("FlatParameters: no trainable parameters")
        dtypes = {p.dtype for p in self.params}
        devices = {p.device for p in self.params}
        if len(dtypes) > 1 or len(devices) > 1:
            raise ValueError(f"FlatParameters: parameters must share one dtype and device, got {dtypes} on {devices}")
        self.numels = [p.numel() for p in self.params]
        data = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.flat = nn.Parameter(data)
        self.flat.grad = torch.zeros_like(data)
        self.bind()

    def bind(self) -> None:
        """Points every parameter (and its gradient) at its slice of the flat buffers."""
        data, grad = self.flat.data, self.flat.grad
        offset = 0
        for p, n in zip(self.params, self.numels):
            p.data = data[offset : offset + n].view_as(p)
            p.grad = grad[offset : offset + n].view_as(p)
            offset += n

    def adopt(self, data: Tensor, grad: Tensor, copy: bool = True) -> None:
        """Moves the buffers to ``data`` and ``grad`` (1-D, this dtype and size; shared memory
        that a helper process also maps, :mod:`rlweave.workers.update_helper`), copying the
        current values over unless ``copy=False``, and re-binds the views. The optimizer keeps
        the same parameter object."""
        if data.shape != self.flat.shape or grad.shape != self.flat.shape or data.dtype != self.flat.dtype:
            raise ValueError(f"FlatParameters.adopt: buffers of {tuple(data.shape)} {data.dtype} for {tuple(self.flat.shape)} {self.flat.dtype}")
        if copy:
            data.copy_(self.flat.data)
            grad.copy_(self.flat.grad)
        self.flat.data = data
        self.flat.grad = grad
        self.bind()

    def zero_grad(self) -> None:
        self.flat.grad.zero_()

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """Scales the gradient so its 2-norm is at most ``max_norm``; returns the norm before.
        Same coefficient as ``torch.nn.utils.clip_grad_norm_``: min(1, max_norm / (norm + 1e-6))."""
        grad = self.flat.grad
        norm = torch.linalg.vector_norm(grad)
        grad.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm

    def to(self, device: torch.device) -> None:
        """Moves both buffers (the optimizer keeps the same parameter object) and re-binds the views.
        Call before ``module.to(device)``, which then only moves the module's buffers."""
        if self.flat.device == torch.device(device):
            return
        grad = self.flat.grad.to(device)
        self.flat.data = self.flat.data.to(device)
        self.flat.grad = grad
        self.bind()
