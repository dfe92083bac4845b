"""The local backend of :class:`~rlweave.channel.channel.Channel`: in-process and thread-safe, for
the runtime's single-process debug mode and for workers fused into one process. Same semantics as
the Ray backend; a local channel is registered by name in its process."""

from __future__ import annotations

import threading
import time
from typing import Any, Hashable

from ._core import Entry, Envelope, Store, check_target, check_timeout, resolve_version
from .channel import Channel


class _LocalRegistry:
    lock = threading.Lock()
    channels: dict[str, "LocalChannel"] = {}


def _rebuild_local_channel(name):
    ch = LocalChannel._registry_get(name)
    if ch is None:
        raise ValueError(
            f"local channel {name!r} does not exist in this process (local channels cannot cross processes)"
        )
    return ch


class LocalChannel(Channel):
    """In-process, thread-safe channel (``threading.Condition``): the runtime's local mode and workers
    fused into one process. Registered by name in its process, so ``Channel.connect`` finds it."""

    local = True
    ref_threshold = 0

    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.maxsize = maxsize
        self._store = Store(maxsize)
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._blocked_puts = 0

    def __reduce__(self):  # same-process copies (deepcopy, pickling to a thread) resolve to this channel
        return _rebuild_local_channel, (self.name,)

    @classmethod
    def _create(cls, name: str, maxsize: int) -> "LocalChannel":
        with _LocalRegistry.lock:
            if name in _LocalRegistry.channels:
                raise ValueError(f"channel {name!r} already exists (use Channel.connect)")
            ch = _LocalRegistry.channels[name] = cls(name, maxsize)
        return ch

    @staticmethod
    def _registry_get(name: str) -> "LocalChannel | None":
        with _LocalRegistry.lock:
            return _LocalRegistry.channels.get(name)

    # ---------------------------------------------------------------- waiting machinery
    def _notify(self) -> None:  # caller holds self._cond
        self._cond.notify_all()

    def _run_sync(self, attempt, timeout: float | None) -> bool:
        """Retry ``attempt()`` (under the lock) until it returns True or ``timeout`` runs out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise self._closed_error()
                if attempt():
                    return True
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)

    # ---------------------------------------------------------------- attempts (run under the lock)
    def _put_attempt(self, item, key, weight, version, timeout: float | None):
        counted = timeout == 0  # a non-blocking put that fails is not a blocked put

        def attempt() -> bool:
            nonlocal counted
            if self._store.full():
                if not counted:
                    counted = True
                    self._blocked_puts += 1
                return False
            self._store.push(key, weight, version, item, False)
            self._notify()
            return True

        return attempt

    def _get_attempt(self, key, out: list):
        def attempt() -> bool:
            entry = self._store.pop(key)
            if entry is None:
                return False
            out.append(entry)
            self._notify()
            return True

        return attempt

    def _batch_attempt(self, key, target, taken: list, state: list):
        def attempt() -> bool:
            n = len(taken)
            state[0] = self._store.drain_batch(key, target, taken, state[0])
            if len(taken) != n:
                self._notify()
            return state[0] >= target

        return attempt

    def _restore(self, taken: list) -> None:
        if taken:
            with self._cond:
                self._store.restore(taken)
                self._notify()

    @staticmethod
    def _envelope(e: Entry) -> Envelope:
        return Envelope(e.payload, e.key, e.weight, e.version, e.seq)

    # ---------------------------------------------------------------- sync API
    def put(
        self,
        item: Any,
        key: Hashable = None,
        *,
        weight: float = 1.0,
        version: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        timeout = check_timeout(block, timeout)
        version = resolve_version(item, version)
        if not self._run_sync(self._put_attempt(item, key, float(weight), version, timeout), timeout):
            raise self._full_error(timeout)

    def get_envelope(self, key: Hashable = None, *, block: bool = True, timeout: float | None = None) -> Envelope:
        timeout = check_timeout(block, timeout)
        out: list[Entry] = []
        if not self._run_sync(self._get_attempt(key, out), timeout):
            raise self._empty_error(key, timeout)
        return self._envelope(out[0])

    def get_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        target = check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        taken: list[Entry] = []
        state = [0.0]
        ok = False
        try:
            ok = self._run_sync(self._batch_attempt(key, target, taken, state), timeout)
        finally:
            if not ok:
                self._restore(taken)
        if not ok:
            raise self._batch_error(key, target, state[0], timeout)
        return [self._envelope(e) for e in taken]

    def qsize(self, key: Hashable = None) -> int:
        with self._cond:
            if self._closed:
                raise self._closed_error()
            return self._store.qsize(key)

    def stats(self) -> dict:
        with self._cond:
            if self._closed:
                raise self._closed_error()
            return {**self._store.stats(), "blocked_puts": self._blocked_puts, "backend": "local"}

    def close(self) -> None:
        """Close the channel (idempotent): waiting and later calls raise ChannelClosed; the name is freed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._store.clear()
            self._notify()
        with _LocalRegistry.lock:
            if _LocalRegistry.channels.get(self.name) is self:
                del _LocalRegistry.channels[self.name]
