"""Which dtype the off-policy learner's hidden-layer matmuls run in (``actor.precision``).

bfloat16 pays only where the hardware multiplies bf16 matrices natively: on CPUs with
avx512_bf16 or AMX, and on GPUs that support it. Elsewhere PyTorch emulates it, and the emulation
is far slower than float32: a 256x256 matmul took 23.4 ms in bf16 against 0.49 ms in float32 on a
2-core AMD EPYC with AVX2 only (2026-12-05), so an SAC update would be ~50x slower. ``auto``
therefore picks bf16 only where it is native, and an explicit ``bfloat16`` where it is not is
reported at start-up. The choice is made in the learner's own process, because on a cluster the
learner's CPU need not be the driver's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LearnerPrecision", "cpu_capability", "native_bf16", "resolve_precision"]


def _cpu_flag(name: str) -> bool:
    # torch.cpu's feature probes are private (torch 2.x); a torch without one reports "not native"
    probe = getattr(torch.cpu, name, None)
    return bool(probe()) if callable(probe) else False


def native_bf16(device: torch.device) -> bool:
    """True where ``device`` multiplies bfloat16 matrices in hardware (not emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return _cpu_flag("_is_avx512_bf16_supported") or _cpu_flag("_is_amx_tile_supported")
    return False


def cpu_capability() -> str:
    """The vector instruction set PyTorch dispatches to here ("AVX2", "AVX512", ...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - very old or unusual builds
        return "unknown"


@dataclass(frozen=True)
class LearnerPrecision:
    """What ``actor.precision`` resolved to in the learner's process, and why."""

    requested: str
    dtype: torch.dtype | None  # the autocast dtype; None: float32 throughout
    native: bool  # whether this device runs bf16 matmuls in hardware

    @property
    def name(self) -> str:
        return "bfloat16" if self.dtype is torch.bfloat16 else "float32"

    def describe(self, device: torch.device) -> str:
        """One line for the run's start-up log; says so when bf16 is emulated."""
        where = f"{device.type}" + (f" ({cpu_capability()})" if device.type == "cpu" else "")
        if self.requested == "auto":
            return (f"actor.precision=auto: {self.name} on {where}"
                    + ("" if self.native else ", which has no native bfloat16"))
        if self.dtype is torch.bfloat16 and not self.native:
            return (f"actor.precision=bfloat16: {where} has no native bfloat16 and emulates it, "
                    "far slower than float32 (a 256x256 matmul ~50x on AVX2); use float32 or auto")
        return f"actor.precision={self.requested} on {where}"


def resolve_precision(requested: str, device: torch.device) -> LearnerPrecision:
    """``float32`` | ``bfloat16`` | ``auto`` (bfloat16 where native on ``device``, else float32)."""
    if requested not in ("float32", "bfloat16", "auto"):
        raise ValueError(f"actor.precision: {requested!r} is not one of float32, bfloat16, auto")
    native = native_bf16(device)
    wants_bf16 = requested == "bfloat16" or (requested == "auto" and native)
    return LearnerPrecision(requested, torch.bfloat16 if wants_bf16 else None, native)
