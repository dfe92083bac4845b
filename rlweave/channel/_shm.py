"""Node-local shared-memory transport for large channel payloads (the ``shm`` transport).

Why: on one node, a payload through Ray's object store costs a fresh ``ray.put`` (allocation and
page faults in the store, ~5 ms for 10 MB here) plus the ownership protocol of an ObjectRef that
travels through the channel actor to a third process (borrower registration with the owner, ~1.6
ms per item more than a plain call). With this transport a producer copies the array bytes into
shared memory it owns and has already faulted in, the channel actor carries only a small
descriptor, and the consumer copies the bytes out. Measured in ``rlweave bench channel``.

How:

* Each producing process has one :class:`Arena`: anonymous shared-memory files (segments,
  ``memfd_create``, mapped with ``MAP_POPULATE`` so their pages are faulted in once), used as
  rings of blocks in allocation order. A block is a 64-byte header (byte 0: 1 = live, 0 =
  released) followed by the item's out-of-band pickle buffers (pickle protocol 5: numpy arrays
  hand over their memory without being copied into the pickle stream).
* The consumer (:func:`read`) opens the segment through ``/proc/<producer pid>/fd/<fd>`` and maps
  it (cached; a random token at the segment's start guards against a reused pid), copies the
  buffers into fresh numpy memory, writes 0 into the block's state byte, and unpickles. So items
  arrive as ordinary, writable arrays, and the producer reclaims the block on its next
  allocation, without any call.
* When an arena cannot place an item (all segments busy and ``RLWEAVE_SHM_MAX_MB`` reached), the
  channel falls back to the object store for that item: the transport never blocks a put.
* Nothing to clean up: a memfd has no name, so the kernel frees a segment once its producer has
  exited (however it exited) and no consumer maps it any more. As with the object store, an item
  whose producer died before it was consumed is lost (:class:`ChannelPayloadLost`).

Only valid when producer and consumers run on one machine: channels choose this transport only
when the Ray cluster has one node (see ``RayChannel``). Not ``multiprocessing.shared_memory``:
named ``/dev/shm`` files outlive a killed producer (Ray kills workers with SIGKILL), and before
Python 3.13 that class unlinks a segment when *any* process that attached to it exits.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from ._core import ChannelError

HEADER = 64  # block header bytes; keeps every block's data 64-byte aligned
SEGMENT_HEADER = 64  # a segment starts with its 16-byte token, then the ring
_ALIGN = 64
LIVE, RELEASED = 1, 0
_READER_CACHE = 16  # mapped segments a consumer keeps open (LRU)


def _mb_env(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default))) << 20
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer number of MiB, got {os.environ[name]!r}") from None


def available() -> bool:
    """True where segments can be made and opened by other processes (Linux: memfd + /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class Segment:
    """One shared-memory file used as a ring of blocks (producer side); ``key`` = (pid, fd, token)
    is what a consumer needs to map it."""

    def __init__(self, size: int):
        self.size = size
        self.fd = os.memfd_create("rlweave-channel", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size, flags=_MAP_FLAGS)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.mm)
        token = uuid.uuid4().bytes
        self.view[:16] = token
        self.key = (os.getpid(), self.fd, token)
        self.live: deque[tuple[int, int]] = deque()  # (offset, end) of unreleased blocks, oldest first

    def _reclaim(self) -> None:
        view, live = self.view, self.live
        while live and view[live[0][0]] == RELEASED:
            live.popleft()

    def alloc(self, total: int) -> int | None:
        """Offset of a new block of ``total`` bytes (header included), or None if it does not fit."""
        self._reclaim()
        live = self.live
        if not live:
            off = SEGMENT_HEADER if SEGMENT_HEADER + total <= self.size else None
        else:
            tail, head = live[0][0], live[-1][1]
            if head > tail:  # used: [tail, head)
                off = head if self.size - head >= total else (SEGMENT_HEADER if tail - SEGMENT_HEADER >= total else None)
            else:  # wrapped, used: [tail, end of the last block before the wrap) + [front, head)
                off = head if tail - head >= total else None
        if off is None:
            return None
        live.append((off, off + total))
        self.view[off] = LIVE
        return off


class Arena:
    """The shared memory one process writes channel payloads into (one per process, lazily made)."""

    def __init__(self, segment_bytes: int, max_bytes: int):
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.segments: list[Segment] = []
        self.lock = threading.Lock()
        self.fallbacks = 0  # items that did not fit (they went through the object store)

    @property
    def nbytes(self) -> int:
        return sum(s.size for s in self.segments)

    def place(self, nbytes: int) -> tuple[Segment, int] | None:
        """Reserve a block for ``nbytes`` of data: (segment, offset of its header), or None."""
        total = HEADER + _round_up(nbytes)
        with self.lock:
            for seg in self.segments:
                off = seg.alloc(total)
                if off is not None:
                    return seg, off
            size = max(self.segment_bytes, SEGMENT_HEADER + total)
            if self.nbytes + size > self.max_bytes:
                self.fallbacks += 1
                return None
            seg = Segment(size)
            self.segments.append(seg)
            off = seg.alloc(total)
            assert off is not None
            return seg, off


_arena: Arena | None = None
_arena_pid = -1
_arena_lock = threading.Lock()


def arena() -> Arena:
    """This process's arena (made on first use; a forked child makes its own)."""
    global _arena, _arena_pid
    with _arena_lock:
        if _arena is None or _arena_pid != os.getpid():
            _arena = Arena(_mb_env("RLWEAVE_SHM_SEGMENT_MB", 64), _mb_env("RLWEAVE_SHM_MAX_MB", 1024))
            _arena_pid = os.getpid()
        return _arena


# --------------------------------------------------------------------------- encode / decode

#: what travels through the channel actor: (segment key, block offset, buffer sizes, pickle bytes)
Descriptor = tuple


def write(meta: bytes, raws: list[memoryview]) -> Descriptor | None:
    """Copy ``raws`` (the item's out-of-band buffers as flat bytes, ``PickleBuffer.raw()``) into
    this process's arena; None if they do not fit (the caller falls back)."""
    sizes = [r.nbytes for r in raws]
    placed = arena().place(sum(_round_up(n) for n in sizes))
    if placed is None:
        return None
    seg, off = placed
    pos = off + HEADER
    for r, n in zip(raws, sizes):
        seg.view[pos : pos + n] = r
        pos += _round_up(n)
    return seg.key, off, sizes, meta


class _Reader:
    """Consumer-side cache of mapped segments (LRU): mapping a 64 MiB segment costs ~1 ms. A
    mapping keeps its memory alive, so mappings of exited producers are dropped on every miss."""

    def __init__(self):
        self.maps: OrderedDict[tuple, memoryview] = OrderedDict()
        self.lock = threading.Lock()

    def view(self, key: tuple) -> memoryview | None:
        """The segment's memory, or None if its producer is gone."""
        with self.lock:
            hit = self.maps.get(key)
            if hit is not None:
                self.maps.move_to_end(key)
                return hit
            pid, fd, token = key
            if pid == os.getpid():  # producer and consumer in one process: the arena's own mapping
                seg = _own_segment(key)
                view = seg.view if seg is not None else None
            else:
                view = _map(pid, fd)
            if view is None or bytes(view[:16]) != token:
                return None
            for old in [k for k in self.maps if not _pid_alive(k[0])]:
                del self.maps[old]  # unmapped once no copy in flight still holds it
            self.maps[key] = view
            while len(self.maps) > _READER_CACHE:
                self.maps.popitem(last=False)
            return view


def _map(pid: int, fd: int) -> memoryview | None:
    try:
        f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        return memoryview(mmap.mmap(f, 0, flags=_MAP_FLAGS))
    finally:
        os.close(f)


def _own_segment(key: tuple) -> Segment | None:
    """The segment of this process's arena that ``key`` names."""
    for seg in arena().segments:
        if seg.key == key:
            return seg
    return None


_reader = _Reader()


def read(desc: Descriptor, channel: str, copy: bool = True) -> Any:
    """The item a descriptor points to. ``copy`` (default): its arrays in new, writable memory, and
    the block released at once. ``copy=False``: its arrays are read-only views of the producer's
    shared memory (no copy, as Ray hands out object-store arrays), and the block is released when
    the last of them is garbage-collected; until then the producer's ring cannot reuse it (an arena
    that fills up sends later items through the object store)."""
    key, off, sizes, meta = desc
    view = _reader.view(key)
    if view is None:
        # the wording contains the runtime's "worker process died", so a run restarts from its
        # checkpoint as it does when it sees the producer's death itself
        raise ChannelPayloadLost(
            f"channel {channel!r}: item lost, its producing worker process died (pid {key[0]}) before it was consumed"
        )
    if not copy:
        return pickle.loads(meta, buffers=_leased_views(view, off, sizes))
    buffers = []
    pos = off + HEADER
    for n in sizes:
        dst = np.empty(n, dtype=np.uint8)
        memoryview(dst)[:] = view[pos : pos + n]
        buffers.append(dst)
        pos += _round_up(n)
    view[off] = RELEASED  # after the copies: the producer may now reuse the block
    return pickle.loads(meta, buffers=buffers)


def _leased_views(view: memoryview, off: int, sizes: list[int]) -> list[memoryview]:
    """Read-only views of a block's buffers that release the block when the last one is gone.

    The views are slices of one ctypes array laid over the block's data: ctypes objects accept a
    finalizer (memoryviews and numpy arrays made from buffers do not), and every array unpickled
    from a slice keeps the slice, so the array, the slice and the ctypes object die together."""
    total = sum(_round_up(n) for n in sizes)
    lease = (ctypes.c_ubyte * max(total, 1)).from_buffer(view, off + HEADER)
    weakref.finalize(lease, view.__setitem__, off, RELEASED)
    data = memoryview(lease).cast("B").toreadonly()
    out, pos = [], 0
    for n in sizes:
        out.append(data[pos : pos + n])
        pos += _round_up(n)
    return out


def release(desc: Descriptor) -> None:
    """Give back a block whose item was never stored (a put that failed)."""
    seg = _own_segment(desc[0])
    if seg is not None:
        seg.view[desc[1]] = RELEASED


class ChannelPayloadLost(ChannelError):
    """A shared-memory payload's producer exited before the item was consumed."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
