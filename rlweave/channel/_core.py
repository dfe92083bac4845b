"""Backend-independent pieces of a channel: errors, envelopes, the keyed FIFO store, helpers.

Nothing here imports Ray; both the in-process backend and the Ray actor build on :class:`Store`.
"""

from __future__ import annotations

import queue
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Hashable, NamedTuple

#: Payloads whose estimated size is at least this many bytes travel through the Ray object store
#: by reference (producer ``ray.put``s, the channel actor only sees the ObjectRef).
DEFAULT_REF_THRESHOLD = 64 * 1024

_SCAN_LIMIT = 256  # at most this many entries of a dict/list/tuple are looked at by the size estimate


class ChannelError(Exception):
    """Base class of all channel errors."""


class ChannelFull(ChannelError, queue.Full):
    """``put`` found the channel full (non-blocking) or timed out waiting for space."""


class ChannelEmpty(ChannelError, queue.Empty):
    """``get`` / ``get_batch`` found no (or not enough) items, non-blocking or after a timeout."""


class ChannelClosed(ChannelError):
    """The channel was closed (its actor killed, or ``close()`` called on a local channel)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One item as it came out of a channel.

    ``seq`` is the channel-wide put order (0, 1, 2, ...); ``version`` is the policy version that
    produced the item (``None`` if unknown).
    """

    item: Any
    key: Hashable
    weight: float
    version: int | None
    seq: int


class Entry(NamedTuple):
    """What a store holds: the envelope fields with ``payload`` still encoded.

    ``enc`` says how ``payload`` holds the item: :data:`ENC_OBJECT` (the item itself),
    :data:`ENC_PICKLED` (cloudpickled bytes, Ray backend, small items), :data:`ENC_REF`
    (``[ObjectRef]``, Ray backend, large items) or :data:`ENC_SHM` (a shared-memory descriptor,
    Ray backend, large items when the cluster is one node: :mod:`rlweave.channel._shm`);
    :data:`ENC_HELD` only in a reply over a direct socket (the payload waits in the actor).
    """

    seq: int
    key: Hashable
    weight: float
    version: int | None
    payload: Any
    enc: int


ENC_OBJECT, ENC_PICKLED, ENC_REF, ENC_SHM = 0, 1, 2, 3
# A payload that holds Ray handles, kept in the channel actor for one Ray call (``take_held``): a
# reply over a direct socket is a plain pickle, which would bypass Ray's reference counting.
ENC_HELD = 4
PLAIN_TYPES = (int, float, bool, str, bytes)


def holds_ray_handles(payload: Any, enc: int) -> bool:
    """True for payloads only Ray's serialisation may carry: ``[ObjectRef]`` and items that hold
    Ray handles (anything stored as an object that is not a plain value)."""
    return enc == ENC_REF or (enc == ENC_OBJECT and payload is not None and type(payload) not in PLAIN_TYPES)


# --------------------------------------------------------------------------- helpers


def fmt_timeout(timeout: float | None) -> str:
    return f"{timeout:g} s"


def check_target(name: str, target_weight: float) -> float:
    """``get_batch``'s target weight as a float, refused unless > 0."""
    target = float(target_weight)
    if not target > 0:
        raise ValueError(f"channel {name!r}: get_batch target_weight must be > 0, got {target_weight!r}")
    return target


def check_timeout(block: bool, timeout: float | None) -> float | None:
    """Normalise ``(block, timeout)`` to a timeout: ``0.0`` = non-blocking, ``None`` = forever."""
    if not block:
        return 0.0
    if timeout is None:
        return None
    timeout = float(timeout)
    if timeout < 0:
        raise ValueError(f"timeout must be a non-negative number, got {timeout!r}")
    return timeout


def _tensordict_base():
    mod = sys.modules.get("tensordict")  # an item can only be a TensorDict if tensordict is loaded
    return getattr(mod, "TensorDictBase", None) if mod is not None else None


def _is_tensordict(item: Any) -> bool:
    base = _tensordict_base()
    return base is not None and isinstance(item, base)


def resolve_version(item: Any, version: int | None) -> int | None:
    """The policy version to stamp on ``item``.

    An explicit ``version`` wins. Otherwise, if ``item`` is a TensorDict with a ``"policy_version"``
    entry, that entry is used: a scalar gives its value; a per-sample tensor gives its *minimum*
    (the oldest policy that contributed to the batch, so staleness is never under-estimated).
    """
    if version is not None:
        return int(version)
    if not _is_tensordict(item):
        return None
    try:
        if "policy_version" not in item.keys():
            return None
        v = item.get("policy_version")
    except Exception:  # exotic TensorDict subclasses: no version rather than a failed put
        return None
    if hasattr(v, "numel"):
        if v.numel() == 0:
            return None
        return int(v.min().item())
    if hasattr(v, "data") and not isinstance(v, (int, float)):  # NonTensorData
        v = v.data
    return None if v is None else int(v)


def estimate_nbytes(item: Any, _depth: int = 0) -> int:
    """Cheap size estimate of ``item`` in bytes (no pickling).

    Counts numpy arrays, torch tensors, bytes-like objects and strings found at top level, inside a
    TensorDict (all leaves), or inside dicts / lists / tuples up to two levels deep (first 256 entries
    of each). Everything else counts as 0, so the estimate is a lower bound.
    """
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int) and type(item).__module__.startswith("numpy"):
        return nbytes
    if isinstance(item, (bytes, bytearray)):
        return len(item)
    if isinstance(item, memoryview):
        return item.nbytes
    if isinstance(item, str):
        return len(item)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if _is_tensordict(item):
        total = 0
        try:
            for leaf in item.values(include_nested=True, leaves_only=True):
                if torch is not None and isinstance(leaf, torch.Tensor):
                    total += leaf.numel() * leaf.element_size()
        except Exception:
            pass
        return total
    if _depth >= 2:
        return 0
    if isinstance(item, dict):
        values = item.values()
    elif isinstance(item, (list, tuple)):
        values = item
    else:
        return 0
    total = 0
    for i, v in enumerate(values):
        if i >= _SCAN_LIMIT:
            break
        total += estimate_nbytes(v, _depth + 1)
    return total


# --------------------------------------------------------------------------- the store


_COUNTER = {ENC_REF: "puts_by_ref", ENC_SHM: "puts_shm"}


class Store:
    """Keyed FIFO with a global put order; not thread-safe (callers hold their own lock).

    Per key, entries are kept in a deque in ``seq`` order; the globally oldest entry is the one with
    the smallest head ``seq`` across keys (O(number of non-empty keys)).
    """

    def __init__(self, maxsize: int = 0):
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        self.maxsize = int(maxsize)
        self._by_key: dict[Hashable, deque[Entry]] = {}
        self._size = 0
        self._next_seq = 0
        self.counts = {"puts_inline": 0, "puts_by_ref": 0, "puts_shm": 0, "gets": 0, "restored": 0}

    # -- queries
    def full(self) -> bool:
        return self.maxsize > 0 and self._size >= self.maxsize

    def qsize(self, key: Hashable = None) -> int:
        if key is None:
            return self._size
        d = self._by_key.get(key)
        return len(d) if d else 0

    def keys(self) -> list:
        return list(self._by_key)

    def stats(self) -> dict:
        return {
            **self.counts,
            "size": self._size,
            "maxsize": self.maxsize,
            "keys": {repr(k): len(d) for k, d in self._by_key.items()},
            "next_seq": self._next_seq,
        }

    # -- mutations
    def push(self, key: Hashable, weight: float, version: int | None, payload: Any, enc: int) -> Entry:
        entry = Entry(self._next_seq, key, float(weight), version, payload, int(enc))
        self._next_seq += 1
        d = self._by_key.get(key)
        if d is None:
            d = self._by_key[key] = deque()
        d.append(entry)
        self._size += 1
        self.counts[_COUNTER.get(enc, "puts_inline")] += 1
        return entry

    def pop(self, key: Hashable = None) -> Entry | None:
        """Remove and return the oldest entry of ``key`` (``None``: of any key), or ``None``."""
        if key is None:
            best_key, best_seq = None, None
            for k, d in self._by_key.items():
                s = d[0].seq
                if best_seq is None or s < best_seq:
                    best_key, best_seq = k, s
            if best_seq is None:
                return None
            key = best_key
        d = self._by_key.get(key)
        if not d:
            return None
        entry = d.popleft()
        if not d:
            del self._by_key[key]
        self._size -= 1
        self.counts["gets"] += 1
        return entry

    def restore(self, entries: list[Entry]) -> None:
        """Put back entries taken by an unfinished ``get_batch`` (they were heads, so go in front)."""
        for entry in reversed(entries):
            d = self._by_key.get(entry.key)
            if d is None:
                d = self._by_key[entry.key] = deque()
            d.appendleft(entry)
            self._size += 1
            self.counts["gets"] -= 1
            self.counts["restored"] += 1

    def drain_batch(self, key: Hashable, target: float, taken: list[Entry], weight: float) -> float:
        """Move entries into ``taken`` (FIFO) until their summed weight reaches ``target``."""
        while weight < target:
            entry = self.pop(key)
            if entry is None:
                break
            taken.append(entry)
            weight += entry.weight
        return weight

    def clear(self) -> None:
        self._by_key.clear()
        self._size = 0
