"""Weight sync actor -> rollout: bucketed, versioned, verified.

The actor flattens its state dict into a few contiguous numpy buckets (each up to ``bucket_bytes``),
so a model of any size moves as a handful of zero-copy object-store items instead of one pickle per
tensor. The receiver loads the buckets and recomputes the checksum; the sync is accepted only when it
equals the sender's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from rlweave.models import state_dict_checksum


@dataclass
class WeightBucket:
    names: list[str]
    shapes: list[tuple[int, ...]]
    dtype: str
    data: np.ndarray  # 1-D, all tensors of the bucket back to back


@dataclass
class WeightPacket:
    version: int
    checksum: str
    buckets: list  # WeightBucket, or ObjectRefs to them when sent through Ray


def pack_state(module: torch.nn.Module | dict, version: int, bucket_bytes: int = 32 << 20) -> WeightPacket:
    """A module's state dict (or a state dict: a sharded model's gathered one, LoRA adapters
    merged) as a versioned packet of contiguous buckets, with its checksum."""
    state = module if isinstance(module, dict) else module.state_dict()
    buckets: list[WeightBucket] = []
    current: dict[str, list] = {}
    sizes: dict[str, int] = {}
    for name, tensor in state.items():
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits travel as int16
            arr, key = tensor.detach().cpu().view(torch.int16).numpy(), _BF16
        else:
            arr = tensor.detach().cpu().numpy()
            key = arr.dtype.str
        if key in current and sizes[key] + arr.nbytes > bucket_bytes:
            buckets.append(_close(current.pop(key), key))
            sizes[key] = 0
        current.setdefault(key, []).append((name, arr))
        sizes[key] = sizes.get(key, 0) + arr.nbytes
    for key, items in current.items():
        buckets.append(_close(items, key))
    return WeightPacket(version=version, checksum=state_dict_checksum(state), buckets=buckets)


_BF16 = "bfloat16"


def _close(items: list, dtype: str) -> WeightBucket:
    data = np.concatenate([a.reshape(-1) for _, a in items]) if items else np.zeros(0, dtype=np.int16 if dtype == _BF16 else dtype)
    return WeightBucket([n for n, _ in items], [tuple(a.shape) for _, a in items], dtype, data)


def bucket_tensors(buckets: list[WeightBucket]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a packet's buckets, in packing order: views of the buckets'
    memory, no copies (bfloat16 restored from its int16 bits)."""
    out = []
    for b in buckets:
        offset = 0
        for name, shape in zip(b.names, b.shapes):
            size = int(np.prod(shape)) if shape else 1
            with warnings.catch_warnings():  # object-store arrays are read-only; these views are only read
                warnings.simplefilter("ignore", UserWarning)
                t = torch.from_numpy(b.data[offset : offset + size]).reshape(shape)
            out.append((name, t.view(torch.bfloat16) if b.dtype == _BF16 else t))
            offset += size
    return out


def unpack_into(module: torch.nn.Module, buckets: list[WeightBucket]) -> None:
    module.load_state_dict({name: t.clone() for name, t in bucket_tensors(buckets)}, strict=True)


def resolve_buckets(buckets: list) -> list[WeightBucket]:
    """Buckets travel as ObjectRefs between Ray processes; fetch them (zero-copy) if so."""
    if buckets and not isinstance(buckets[0], WeightBucket):
        import ray

        return ray.get(list(buckets))
    return buckets


def share_packet(packet: WeightPacket) -> WeightPacket:
    """Puts each bucket in the Ray object store once, so every rollout worker reads the same copy."""
    import ray

    if not ray.is_initialized():
        return packet
    return WeightPacket(packet.version, packet.checksum, [ray.put(b) for b in packet.buckets])


class WeightSyncError(RuntimeError):
    """A rollout worker ended up with weights whose checksum is not the actor's."""


def verify_sync(packet: WeightPacket, checksums: list[str]) -> None:
    """The one check every runner makes after a weight sync: each receiver's checksum of what it
    loaded equals the packet's (the actor's)."""
    if any(c != packet.checksum for c in checksums):
        raise WeightSyncError(f"weight sync v{packet.version}: rollout checksums {checksums} != actor {packet.checksum}")
