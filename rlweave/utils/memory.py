"""Peak memory of the calling process, for the per-iteration profile."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def device_memory_mb(device) -> dict[str, float]:
    """Allocated and peak-allocated accelerator memory of ``device`` in MiB; empty on CPU."""
    import torch

    if getattr(device, "type", "cpu") != "cuda" or not torch.cuda.is_available():
        return {}
    return {
        "allocated_mb": torch.cuda.memory_allocated(device) / 2**20,
        "peak_mb": torch.cuda.max_memory_allocated(device) / 2**20,
    }
