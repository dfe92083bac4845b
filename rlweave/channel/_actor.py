"""The threaded Ray actor that holds a Ray-backed channel's state.

The class is plain Python (no Ray import); :mod:`rlweave.channel.ray_channel` wraps it with
``ray.remote`` (``max_concurrency`` threads) when the first Ray channel is created. All waiting
(backpressure, blocking gets, ``get_batch``) happens here under one ``threading.Condition``, so a
blocked caller holds one actor thread and no process. A threaded actor, not an async one: on a
2-core machine Ray's async-actor dispatch costs ~0.7 ms more per call (put+get round trip measured
4.4 ms threaded vs 7.0 ms async), and a channel item costs two calls. Methods return status tuples;
the client turns them into the channel's exceptions.

Payloads are opaque here: small items arrive as cloudpickled bytes (so the actor never imports the
user's classes, e.g. torch for a TensorDict, and never re-pickles them), large ones as a
shared-memory descriptor or as ``[ObjectRef]`` (wrapped in a list so that Ray does not resolve
them); the actor stores and returns them untouched, so large payloads never pass through this
process.

Direct calls (``calls="direct"``, chosen when the channel's transport is node-local shared memory):
the actor also serves its methods over a Unix socket (:mod:`rlweave.utils.direct`), so that a put
or get costs ~0.1 ms of CPU on each side instead of a Ray call's ~1.5 ms on this 2-core machine
(measured in ``rlweave bench channel``). Ray still creates, names and supervises the actor. Replies
over the socket are plain pickles, so an entry whose payload holds Ray handles (an item that fell
back to the object store) is kept here and handed over by one Ray call (:meth:`take_held`), which
keeps Ray's reference counting intact.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Hashable

from ._core import ENC_HELD, ChannelClosed, Entry, Store, holds_ray_handles

OK, FULL, EMPTY = "ok", "full", "empty"
# what a direct caller may call; the replies of the getters pass through ``_hold``
DIRECT_METHODS = frozenset({"config", "put", "get", "get_up_to", "get_batch", "qsize", "stats", "ping"})
_GETTERS = frozenset({"get", "get_up_to", "get_batch"})


class ChannelActor:
    def __init__(
        self, name: str, maxsize: int = 0, ref_threshold: int = 0, put_window: int = 0, transport: str = "object_store",
        calls: str = "ray",
    ):
        self._name = name
        self._transport = transport
        self._ref_threshold = ref_threshold
        self._put_window = put_window
        self._next_pseq: dict[str, int] = {}  # pipelined producers: next sequence number to apply
        self._store = Store(maxsize)
        self._cond = threading.Condition()
        self._blocked_puts = 0
        self._held: dict[int, tuple[int, Any]] = {}  # token -> (enc, payload) of entries handed out by token
        self._next_token = 0
        self._direct_calls = 0
        self._closed = False  # set by close(): every later call is refused, though the process may live on a moment
        self._direct: tuple[str, bytes] | None = None
        if calls == "direct":
            from rlweave.utils import direct

            # a put sent is a put made, even when its handle is dropped before the reply (pipelined puts)
            self._direct = direct.serve(self._serve_direct, after_hangup=frozenset({"put"}))

    def _serve_direct(self, group: str, method: str, args: tuple, kwargs: dict) -> tuple[Any, float]:
        """One call that arrived over the direct socket: ``(value, seconds)`` as a worker host's
        ``run`` returns it."""
        if method not in DIRECT_METHODS:
            raise ValueError(f"channel {self._name!r}: {method!r} cannot be called directly")
        with self._cond:
            self._direct_calls += 1
        value = getattr(self, method)(*args, **kwargs)
        if method in _GETTERS and value[0] == OK:
            got = value[1]
            value = (OK, [self._hold(e) for e in got] if isinstance(got, list) else self._hold(got))
        return value, 0.0

    def _hold(self, entry: Entry) -> Entry:
        """The entry as a direct reply may carry it: payloads with Ray handles stay here under a token."""
        if not holds_ray_handles(entry.payload, entry.enc):
            return entry
        with self._cond:
            token = self._next_token
            self._next_token += 1
            self._held[token] = (entry.enc, entry.payload)
        return entry._replace(payload=token, enc=ENC_HELD)

    def take_held(self, token: int) -> tuple[int, Any]:
        """``(enc, payload)`` of an entry a direct get handed out by token (a Ray call: Ray tracks the handles)."""
        with self._cond:
            return self._held.pop(token)

    def _wait(self, deadline: float | None) -> bool:
        """Under ``self._cond``: wait for a change; False once ``deadline`` (monotonic) has passed;
        ChannelClosed when the change was :meth:`close`."""
        if deadline is None:
            self._cond.wait()
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(remaining)
        self._check_open()
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self._name!r} is closed")

    def close(self) -> None:
        """Refuses every call from now on and wakes the waiting ones with ChannelClosed. The client's
        ``close()`` calls it before it kills the actor: a killed actor's process can still serve a
        direct call for a moment, and no handle may take an item after ``close()`` returned."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @staticmethod
    def _deadline(timeout: float | None) -> float | None:
        return None if timeout is None else time.monotonic() + timeout

    # ------------------------------------------------------------------ API used by the client
    def config(self) -> dict:
        return {
            "name": self._name,
            "maxsize": self._store.maxsize,
            "ref_threshold": self._ref_threshold,
            "put_window": self._put_window,
            "transport": self._transport,
            "direct": self._direct,
        }

    def put(self, msg: tuple) -> str:
        """``msg`` = ``(payload, key, weight, version, enc, timeout, producer, pseq)``, one argument
        (Ray serialises each argument separately). ``timeout``: 0 = non-blocking, None = wait for
        space forever.

        ``producer``/``pseq``: pipelined puts (several in flight from one handle) may arrive out of
        order (a threaded actor runs calls concurrently); each waits for its turn here.
        """
        payload, key, weight, version, enc, timeout, producer, pseq = msg
        with self._cond:
            self._check_open()
            if producer is not None:
                while self._next_pseq.get(producer, 0) != pseq:
                    self._cond.wait()
                    self._check_open()
            try:
                if self._store.full():
                    if timeout == 0:
                        return FULL
                    deadline = self._deadline(timeout)
                    self._blocked_puts += 1
                    while self._store.full():
                        if not self._wait(deadline):
                            return FULL
                self._store.push(key, weight, version, payload, enc)
                return OK
            finally:
                if producer is not None:
                    self._next_pseq[producer] = pseq + 1
                self._cond.notify_all()

    def get(self, key: Hashable, timeout: float | None) -> tuple[str, Entry | None]:
        status, taken = self.get_up_to(key, 1, timeout)
        return status, taken[0] if taken else None

    def get_up_to(self, key: Hashable, limit: int, timeout: float | None) -> tuple[str, list[Entry] | None]:
        """Like :meth:`get` for the first entry, then up to ``limit`` in all of those already
        there (oldest first): a consumer's get window (``Channel.with_get_window``)."""
        with self._cond:
            self._check_open()
            deadline = None if not timeout else self._deadline(timeout)
            while True:
                entry = self._store.pop(key)
                if entry is not None:
                    taken = [entry]
                    while len(taken) < limit and (entry := self._store.pop(key)) is not None:
                        taken.append(entry)
                    self._cond.notify_all()
                    return OK, taken
                if timeout == 0 or not self._wait(deadline):
                    return EMPTY, None

    def get_batch(self, key: Hashable, target: float, timeout: float | None) -> tuple[str, Any]:
        """Entries (FIFO) whose weights sum to >= ``target``.

        Entries are taken as they arrive (so a bounded channel keeps flowing while a large batch
        accumulates); on timeout they are put back in front, in order, and the available weight is
        returned instead.
        """
        taken: list[Entry] = []
        weight = 0.0
        with self._cond:
            self._check_open()
            deadline = None if not timeout else self._deadline(timeout)
            try:
                while True:
                    n = len(taken)
                    weight = self._store.drain_batch(key, target, taken, weight)
                    if len(taken) != n:
                        self._cond.notify_all()
                    if weight >= target:
                        result, taken = taken, []
                        return OK, result
                    if timeout == 0 or not self._wait(deadline):
                        return EMPTY, weight
            finally:
                if taken:  # timed out: give the items back
                    self._store.restore(taken)
                    self._cond.notify_all()

    def qsize(self, key: Hashable = None) -> int:
        with self._cond:
            self._check_open()
            return self._store.qsize(key)

    def stats(self) -> dict:
        """Debug counters: ``puts_inline``, ``puts_by_ref``, ``gets``, ``size``, ``blocked_puts``, ..."""
        with self._cond:
            return {
                **self._store.stats(),
                "blocked_puts": self._blocked_puts,
                "calls": "direct" if self._direct else "ray",
                "direct_calls": self._direct_calls,  # this stats call included when it came directly
                "backend": "ray",
                "actor_imported_torch": "torch" in sys.modules,  # payloads are opaque: stays False
            }

    def ping(self) -> str:
        return self._name
