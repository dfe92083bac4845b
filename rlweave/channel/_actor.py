"""The async Ray actor that holds a Ray-backed channel's state.

The class is plain Python (no Ray import); :mod:`rlweave.channel.channel` wraps it with
``ray.remote`` when the first Ray channel is created. All waiting (backpressure, blocking gets,
``get_batch``) happens here on the actor's event loop, so a blocked caller costs one pending call,
not a thread. Methods return status tuples; the client turns them into the channel's exceptions.

Payloads are opaque here: small items arrive as cloudpickled bytes (so the actor never imports the
user's classes, e.g. torch for a TensorDict, and never re-pickles them), large ones as ``[ObjectRef]``
(wrapped in a list so that Ray does not resolve them); the actor stores and returns them untouched,
so large payloads never pass through this process.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Hashable

from ._core import Entry, Store

OK, FULL, EMPTY = "ok", "full", "empty"


class ChannelActor:
    def __init__(self, name: str, maxsize: int = 0, ref_threshold: int = 0, put_window: int = 0):
        self._name = name
        self._ref_threshold = ref_threshold
        self._put_window = put_window
        self._next_pseq: dict[str, int] = {}  # pipelined producers: next sequence number to apply
        self._store = Store(maxsize)
        self._cond: asyncio.Condition | None = None  # created lazily on the actor's event loop
        self._blocked_puts = 0

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def _wait(self, cond: asyncio.Condition, deadline: float | None) -> bool:
        """Wait for a change; False once ``deadline`` (loop time) has passed."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            await cond.wait()
            return True
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(cond.wait(), remaining)
        except asyncio.TimeoutError:
            pass
        return True

    @staticmethod
    def _deadline(timeout: float | None) -> float | None:
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

    # ------------------------------------------------------------------ API used by the client
    async def config(self) -> dict:
        return {
            "name": self._name,
            "maxsize": self._store.maxsize,
            "ref_threshold": self._ref_threshold,
            "put_window": self._put_window,
        }

    async def put(self, msg: tuple) -> str:
        """``msg`` = ``(payload, key, weight, version, enc, timeout, producer, pseq)``, one argument
        (Ray serialises each argument separately). ``timeout``: 0 = non-blocking, None = wait for
        space forever.

        ``producer``/``pseq``: pipelined puts (several in flight from one handle) may arrive out of
        order (Ray runs async-actor calls out of order); each waits for its turn here.
        """
        payload, key, weight, version, enc, timeout, producer, pseq = msg
        cond = self._condition()
        async with cond:
            if producer is not None:
                while self._next_pseq.get(producer, 0) != pseq:
                    await cond.wait()
            try:
                if self._store.full():
                    if timeout == 0:
                        return FULL
                    deadline = self._deadline(timeout)
                    self._blocked_puts += 1
                    while self._store.full():
                        if not await self._wait(cond, deadline):
                            return FULL
                self._store.push(key, weight, version, payload, enc)
                return OK
            finally:
                if producer is not None:
                    self._next_pseq[producer] = pseq + 1
                cond.notify_all()

    async def get(self, key: Hashable, timeout: float | None) -> tuple[str, Entry | None]:
        cond = self._condition()
        async with cond:
            deadline = None if not timeout else self._deadline(timeout)
            while True:
                entry = self._store.pop(key)
                if entry is not None:
                    cond.notify_all()
                    return OK, entry
                if timeout == 0 or not await self._wait(cond, deadline):
                    return EMPTY, None

    async def get_batch(self, key: Hashable, target: float, timeout: float | None) -> tuple[str, Any]:
        """Entries (FIFO) whose weights sum to >= ``target``.

        Entries are taken as they arrive (so a bounded channel keeps flowing while a large batch
        accumulates); on timeout they are put back in front, in order, and the available weight is
        returned instead.
        """
        cond = self._condition()
        taken: list[Entry] = []
        weight = 0.0
        async with cond:
            deadline = None if not timeout else self._deadline(timeout)
            try:
                while True:
                    n = len(taken)
                    weight = self._store.drain_batch(key, target, taken, weight)
                    if len(taken) != n:
                        cond.notify_all()
                    if weight >= target:
                        result, taken = taken, []
                        return OK, result
                    if timeout == 0 or not await self._wait(cond, deadline):
                        return EMPTY, weight
            finally:
                if taken:  # timed out or cancelled: give the items back
                    self._store.restore(taken)
                    cond.notify_all()

    async def qsize(self, key: Hashable = None) -> int:
        return self._store.qsize(key)

    async def stats(self) -> dict:
        """Debug counters: ``puts_inline``, ``puts_by_ref``, ``gets``, ``size``, ``blocked_puts``, ..."""
        return {
            **self._store.stats(),
            "blocked_puts": self._blocked_puts,
            "backend": "ray",
            "actor_imported_torch": "torch" in sys.modules,  # payloads are opaque: stays False
        }

    async def ping(self) -> str:
        return self._name
