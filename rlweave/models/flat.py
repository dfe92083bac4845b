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
from torch.optim import optimizer as _optim

# the private pieces adam_step relies on (torch 2.13); without any of them it is optimizer.step()
_DIRECT_ADAM = all(hasattr(o, a) for o, a in ((torch, "_fused_adam_"), (torch, "_foreach_add_"),
                                               (_optim, "_global_optimizer_pre_hooks"), (_optim, "_global_optimizer_post_hooks")))

__all__ = ["FlatParameters", "adam_step"]


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


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` for a fused Adam over one flat parameter, without the Python around it.

    ``Optimizer.step`` wraps the kernel in hook, profiler, grad-mode, dynamo and device-grouping
    layers: ~75 us of Python per step next to the ~15 us kernel on a 64x64 PPO network, where
    320 steps make one iteration. Here the same two calls ``Adam.step`` ends in (the step count
    incremented, then ``torch._fused_adam_`` with the group's settings) are made directly, on the
    optimizer's own state, so the result is bit-identical and state dicts are unchanged. Anything
    else (the first step, which creates the state; hooks; amsgrad, maximize, weight-decay variants;
    several parameters or groups; a tensor lr) goes through ``optimizer.step()``.
    """
    groups = optimizer.param_groups
    g = groups[0]
    params = g["params"]
    state = optimizer.state.get(params[0]) if len(groups) == 1 and len(params) == 1 else None
    if (not _DIRECT_ADAM or state is None or "step" not in state or type(optimizer) is not torch.optim.Adam or not g.get("fused")
            or g["amsgrad"] or g["maximize"] or g["differentiable"] or g.get("decoupled_weight_decay")
            or isinstance(g["lr"], Tensor) or params[0].grad is None or getattr(optimizer, "_optimizer_step_pre_hooks", True)
            or getattr(optimizer, "_optimizer_step_post_hooks", True) or _optim._global_optimizer_pre_hooks
            or _optim._global_optimizer_post_hooks):
        optimizer.step()
        return
    p = params[0]
    beta1, beta2 = g["betas"]
    with torch.no_grad():
        torch._foreach_add_([state["step"]], 1)
        torch._fused_adam_([p], [p.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                           amsgrad=False, lr=g["lr"], beta1=float(beta1), beta2=float(beta2),
                           weight_decay=g["weight_decay"], eps=g["eps"], maximize=False, grad_scale=None, found_inf=None)
