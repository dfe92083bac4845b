"""Handles of group calls: :class:`Handle` (one call on several ranks; ``wait()`` gives their
results in rank order) and :func:`wait_all` (several handles together, the first failure at once).
Ray's task and actor errors come back as :class:`~rlweave.cluster.errors.WorkerError`."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from typing import Any, Callable, Sequence

import ray

from rlweave.cluster.errors import PROCESS_DIED, WorkerError


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else text


class Handle:
    """Result of a group call: ``wait()`` returns one result per called rank, in rank order, or
    what the method's declared ``collect`` makes of them (:mod:`rlweave.cluster.dispatch`)."""

    def __init__(self, group: str, method: str, ranks: list[int], pending: list, host_groups: Sequence[str] = (),
                 collect: Callable[[list], Any] | None = None):
        self.group, self.method, self.ranks = group, method, ranks
        self.host_groups = host_groups  # every group living in these host processes (fused groups)
        self._pending = pending  # ObjectRefs (Ray) or Futures (local)
        self._results: list | None = None
        self._collect = collect
        self._collected: Any = None
        self.durations: list[float] = []

    def done(self) -> bool:
        if self._results is not None:
            return True
        if self._pending and isinstance(self._pending[0], cf.Future):
            return all(f.done() for f in self._pending)
        ready, _ = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        return len(ready) == len(self._pending)

    def wait(self, timeout: float | None = None) -> Any:
        if self._results is None:
            if self._pending and not isinstance(self._pending[0], cf.Future):
                _poll_ready(list(self._pending), len(self._pending), timeout)
            pairs = []
            for rank, p in zip(self.ranks, self._pending):
                pairs.append(self._get_one(rank, p, timeout))
            results = [r for r, _ in pairs]
            collected = self._collect(results) if self._collect is not None else results  # may raise: nothing cached then
            self._results, self._collected = results, collected
            self.durations = [d for _, d in pairs]
        return self._collected

    @property
    def results(self) -> list:
        """Every called rank's own result, in rank order (before ``collect``)."""
        self.wait()
        return self._results

    @property
    def duration(self) -> float:
        """Longest per-rank execution time of the call (seconds), measured in the workers."""
        self.wait()
        return max(self.durations) if self.durations else 0.0

    def _get_one(self, rank: int, pending, timeout):
        try:
            if isinstance(pending, cf.Future):
                return pending.result(timeout=timeout)
            return ray.get(pending, timeout=timeout)
        except ray.exceptions.RayTaskError as e:
            # Ray re-raises the worker's exception as a subclass of both RayTaskError and the cause;
            # rebuild a plain WorkerError so the driver prints one clean message.
            cause = e.cause if isinstance(getattr(e, "cause", None), WorkerError) else None
            if cause is not None:
                raise WorkerError(cause.group, cause.rank, cause.method, cause.short.split("(): ", 1)[-1], cause.remote_traceback) from None
            inner = getattr(e, "cause", None)
            detail = repr(inner) if inner is not None else _last_line(str(e))
            raise WorkerError(self.group, rank, self.method, detail) from None
        except ray.exceptions.RayActorError as e:
            # which call notices a dead process first is a race between the groups it hosted: name them all
            others = [f"{g}[rank {rank}]" for g in self.host_groups if g != self.group]
            also = f"; the process also hosted {', '.join(others)}" if others else ""
            raise WorkerError(self.group, rank, self.method, f"{PROCESS_DIED} ({type(e).__name__}{also})") from None

    def __await__(self):
        async def _collect():
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self.wait)

        return _collect().__await__()


_POLL_S = 0.25


def _poll_ready(refs: list, num: int, timeout: float | None) -> tuple[list, list]:
    """``ray.wait`` for ``num`` of ``refs`` in slices of ``_POLL_S``: between slices the driver's
    main thread runs Python again, so a signal handler (a second Ctrl-C) acts within a quarter
    second instead of when the call returns. ``TimeoutError`` after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _POLL_S if deadline is None else min(_POLL_S, max(0.0, deadline - time.monotonic()))
        done, rest = ray.wait(refs, num_returns=num, timeout=left)
        if len(done) >= num:
            return done, rest
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("timed out waiting for workers")


def wait_all(handles: Sequence[Handle], timeout: float | None = None) -> list[Any]:
    """Waits for several handles together and raises the *first* failure as soon as it happens;
    returns what each handle's ``wait()`` returns (its ranks' results, or what its method's
    declared ``collect`` makes of them).

    Waiting handle by handle would hang when a later handle's worker failed while an earlier one
    blocks on it (an env worker waiting on a channel its dead rollout worker would have filled).
    """
    entries = [(h, i) for h in handles if h._results is None for i in range(len(h._pending))]
    if entries:
        pending = [h._pending[i] for h, i in entries]
        deadline = None if timeout is None else time.monotonic() + timeout
        if isinstance(pending[0], cf.Future):
            remaining = set(pending)
            while remaining:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, remaining = cf.wait(remaining, timeout=left, return_when=cf.FIRST_COMPLETED)
                if not done:
                    raise TimeoutError("timed out waiting for workers")
                for f in done:
                    h, i = entries[pending.index(f)]
                    h._get_one(h.ranks[i], f, None)  # raises the worker's error, if any
        else:
            remaining = list(pending)
            while remaining:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, remaining = _poll_ready(remaining, 1, left)
                for ref in done:
                    h, i = entries[pending.index(ref)]
                    h._get_one(h.ranks[i], ref, None)
    return [h.wait() for h in handles]
