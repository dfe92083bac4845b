"""Worker and WorkerGroup: N processes of one worker class, driven like a one-process program.

A worker class is a plain Python class deriving from :class:`Worker`. A :class:`WorkerGroup` starts
one *host* process per placement entry (a Ray actor, or an in-process object in local mode) and
builds the worker inside it with its context (group name, rank, world size, slot, device) already
set, so ``__init__`` can use ``self.rank``. ``group.call("step", x)`` runs ``step(x)`` on every rank
(or the chosen ``ranks``) and returns a :class:`Handle`; ``group.call_each("train", [b0, b1])``
gives each rank its own argument. Groups placed on the same slots can share host processes
(``colocate_with=``), as veRL's colocated worker classes do: calls between them cost a function
call instead of an inter-process hop.

Failures come back to the driver as :class:`WorkerError`, whose message names the group, rank and
method and carries the remote traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Sequence

import ray
import torch
import torch.distributed as dist  # imported at module top: see the pickling trap in docs/architecture.md
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlweave.cluster import direct
from rlweave.cluster.cluster import Cluster
from rlweave.cluster.placement import GroupPlacement, Slot


PROCESS_DIED = "worker process died"


class WorkerError(RuntimeError):
    """An exception raised inside a worker, re-raised in the driver with where it happened."""

    def __init__(self, group: str, rank: int, method: str, message: str, remote_traceback: str = ""):
        self.group, self.rank, self.method = group, rank, method
        self.remote_traceback = remote_traceback
        self.short = f"worker {group}[rank {rank}] failed in {method}(): {message}"
        text = self.short + (f"\n--- remote traceback ---\n{remote_traceback}" if remote_traceback else "")
        super().__init__(text)

    @property
    def process_died(self) -> bool:
        """A worker process died (this one, or one it was calling), as opposed to an exception in
        worker code: the failure a restart of the worker groups can cure."""
        return PROCESS_DIED in self.short

    def __reduce__(self):
        return (WorkerError, (self.group, self.rank, self.method, self.short.split("(): ", 1)[-1], self.remote_traceback))


@dataclass(frozen=True)
class WorkerContext:
    group: str
    rank: int
    world_size: int
    slot: Slot
    slot_kind: str  # "cpu" | "gpu"
    num_threads: int
    local: bool = False

    @property
    def device(self) -> torch.device:
        if self.slot_kind == "gpu" and torch.cuda.is_available():
            return torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES narrows the process to its slot
        return torch.device("cpu")


class Worker:
    """Base class of every role. Subclasses define ``__init__(self, config, ...)`` and methods.

    The context is bound before ``__init__`` runs, so ``self.rank``/``self.world_size`` are usable
    there.
    """

    _ctx: WorkerContext

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def world_size(self) -> int:
        return self._ctx.world_size

    @property
    def group_name(self) -> str:
        return self._ctx.group

    @property
    def device(self) -> torch.device:
        return self._ctx.device

    @property
    def name(self) -> str:
        return f"{self._ctx.group}[rank {self._ctx.rank}]"

    def use_deterministic_algorithms(self) -> None:
        """``run.deterministic``: torch picks deterministic kernels in this process (a warning,
        not an error, where an op has none)."""
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs
        torch.use_deterministic_algorithms(True, warn_only=True)

    # -- torch.distributed across the group's ranks ----------------------------------------
    def dist_address(self) -> tuple[str, int]:
        """Rank 0 picks the rendezvous address every rank joins."""
        host = "127.0.0.1" if self._ctx.local else ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return host, port

    def init_dist(self, host: str, port: int, backend: str | None = None) -> str:
        if backend is None:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size
            )
        return backend


# Workers living in this process, by (group, rank): a worker calls a peer fused into its own host
# process directly (a function call) instead of through Ray.
_IN_PROCESS: dict[tuple[str, int], Any] = {}


def local_worker(group: str, rank: int) -> Any:
    """The worker ``group[rank]`` if it lives in this process (fused hosts, local mode)."""
    try:
        return _IN_PROCESS[(group, rank)]
    except KeyError:
        raise LookupError(f"worker {group}[rank {rank}] does not live in this process") from None


def _bind(cls: type, ctx: WorkerContext, args: tuple, kwargs: dict) -> Any:
    obj = cls.__new__(cls)
    obj._ctx = ctx
    obj.__init__(*args, **kwargs)
    _IN_PROCESS[(ctx.group, ctx.rank)] = obj
    return obj


MALLOC_SETTINGS = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
"""glibc malloc settings of every worker process (a value in the driver's environment is passed
on instead).

``MALLOC_ARENA_MAX=2``: a host runs calls on whichever of Ray's eight call threads is free, and by
default glibc gives each thread its own arena (up to 8 per core): tensors a call frees go back to
that thread's arena, the next call on another thread finds none and faults in fresh pages.
Measured on the GRPO loop of ``bench grpo_vs_trl`` (2 processes, 1 thread each): the actor's
forward pass took 0.40-0.55 s per step from the third step on with default arenas, 0.07 s with one
or two; the whole step 0.65-0.80 s against 0.31-0.33 s. Why two and not one: threads that compute
at the same time (the SAC learner's second update thread, a fused env + rollout pair) then wait on
one arena's lock. SAC on Pendulum ran 135-140 env steps/s with one arena, 152-162 with two and
160-165 with the default.

``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``: blocks under 64 MB come from the heap and
up to 128 MB of freed heap is kept, instead of glibc's default of mapping each block over 128 KB
(a threshold that only adapts after the first free) and returning freed pages. PyTorch's CPU
allocator has no cache of its own, so a training step that allocates the same activations every
time otherwise maps, faults in and zeroes them again: 414 page faults per SAC update on Pendulum
(256 x 256 critics) and 3,900 per GRPO training pass of the benchmark's Qwen3, against 0 and ~350
with these settings, which made those updates 5-10% and 3-4% faster (one process, one thread)."""


def _flush_denormals() -> None:
    """Denormal floats (|x| < 1.2e-38) are flushed to zero on the calling thread, as XLA does on
    CPU. Optimiser state of weights whose gradients are zero (dead ReLU units) decays through the
    denormal range for thousands of steps, and x86 arithmetic on denormals is ~10x slower: with
    them, fused Adam took 0.74 ms per step instead of 0.17 ms in SAC. The flag is per thread, and
    OpenMP threads copy it from the thread that starts them, so it is set at the start of every call,
    before any parallel region of that thread."""
    torch.set_flush_denormal(True)


def _close(worker: Any) -> None:
    """Calls a worker's ``close()``, if it has one: its own resources (helper processes, reward
    servers), released when it leaves its host."""
    close = getattr(worker, "close", None)
    if callable(close):
        close()


class _HostBase:
    """Holds the worker objects of one process and runs method calls on them."""

    def __init__(self, env_vars: dict[str, str], num_threads: int):
        os.environ.update(env_vars)
        _flush_denormals()
        torch.set_num_threads(max(1, num_threads))
        self.workers: dict[str, Any] = {}
        self.contexts: dict[str, WorkerContext] = {}

    def add_worker(self, group: str, cls: type, ctx: WorkerContext, args: tuple, kwargs: dict) -> tuple[None, float]:
        start = time.perf_counter()
        _flush_denormals()
        try:
            self.contexts[group] = ctx
            self.workers[group] = _bind(cls, ctx, args, kwargs)
            return None, time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - re-raised with location
            raise WorkerError(group, ctx.rank, "__init__", repr(e), traceback.format_exc()) from None

    def remove_worker(self, group: str) -> tuple[None, float]:
        worker = self.workers.pop(group, None)
        ctx = self.contexts.pop(group, None)
        if ctx is not None and _IN_PROCESS.get((group, ctx.rank)) is worker:
            del _IN_PROCESS[(group, ctx.rank)]
        _close(worker)
        return None, 0.0

    def close_workers(self) -> None:
        """Every worker here releases its own resources; the objects stay (local mode: a finished
        run's workers can still be inspected in the driver)."""
        for worker in self.workers.values():
            _close(worker)

    def set_context(self, group: str, ctx: WorkerContext) -> tuple[None, float]:
        self.contexts[group] = ctx
        self.workers[group]._ctx = ctx
        _IN_PROCESS[(group, ctx.rank)] = self.workers[group]
        return None, 0.0

    def run(self, group: str, method: str, args: tuple, kwargs: dict) -> tuple[Any, float]:
        ctx = self.contexts[group]
        start = time.perf_counter()
        _flush_denormals()
        try:
            fn = getattr(self.workers[group], method)
            result = fn(*args, **kwargs)
        except WorkerError:
            raise
        except Exception as e:  # noqa: BLE001
            raise WorkerError(group, ctx.rank, method, repr(e), traceback.format_exc()) from None
        return result, time.perf_counter() - start

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"

    def environ(self, name: str) -> str | None:
        return os.environ.get(name)

    def direct_address(self) -> tuple[str, bytes, str]:
        """Starts this process's direct-call listener (once): ``(address, authkey, node id)``."""
        address, authkey = direct.serve(self.run, on_thread_start=_flush_denormals)
        return address, authkey, self.node_id()


@ray.remote(num_cpus=0, max_restarts=0)
class _RayHost(_HostBase):
    pass


class _LocalHost(_HostBase):
    """Same interface in the driver process; calls run on threads so fused loops can interleave."""

    def __init__(self, env_vars: dict[str, str], num_threads: int):
        # Don't touch the driver's environment or thread count in local mode.
        self.workers, self.contexts = {}, {}
        self.pool = cf.ThreadPoolExecutor(max_workers=8)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else text


class Handle:
    """Result of a group call: ``wait()`` returns one result per called rank, in rank order."""

    def __init__(self, group: str, method: str, ranks: list[int], pending: list, host_groups: Sequence[str] = ()):
        self.group, self.method, self.ranks = group, method, ranks
        self.host_groups = host_groups  # every group living in these host processes (fused groups)
        self._pending = pending  # ObjectRefs (Ray) or Futures (local)
        self._results: list | None = None
        self.durations: list[float] = []

    def done(self) -> bool:
        if self._results is not None:
            return True
        if self._pending and isinstance(self._pending[0], cf.Future):
            return all(f.done() for f in self._pending)
        ready, _ = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        return len(ready) == len(self._pending)

    def wait(self, timeout: float | None = None) -> list:
        if self._results is None:
            if self._pending and not isinstance(self._pending[0], cf.Future):
                _poll_ready(list(self._pending), len(self._pending), timeout)
            pairs = []
            for rank, p in zip(self.ranks, self._pending):
                pairs.append(self._get_one(rank, p, timeout))
            self._results = [r for r, _ in pairs]
            self.durations = [d for _, d in pairs]
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


class _Done:
    __slots__ = ("value", "duration")

    def __init__(self, value: Any, duration: float):
        self.value, self.duration = value, duration


_NODE_ID: str | None = None


def _this_node() -> str:
    global _NODE_ID
    if _NODE_ID is None:
        _NODE_ID = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    return _NODE_ID


@dataclass(frozen=True)
class Peer:
    """A handle one worker holds to a worker of another group, for request/reply calls inside a
    stage (an env worker asking a rollout worker for actions). When the peer lives in the caller's
    process (fused hosts, local mode) a call is a plain function call; when it lives in another
    process of the caller's node and ``direct`` is set, a call goes over a Unix socket to that
    process (:mod:`rlweave.cluster.direct`: ~10x less CPU per call than Ray's); otherwise it is
    one Ray call to the peer's host. A request costs one round trip and several can be in flight.
    ``result`` returns ``(value, seconds the peer spent)``; a failure in the peer re-raises the
    peer's own :class:`WorkerError`."""

    group: str
    rank: int
    host: Any = None  # the peer's Ray host; None = same process
    direct: tuple[str, bytes, str] | None = None  # (address, authkey, node id) of the host's socket

    def submit(self, method: str, *args) -> Any:
        if self.host is None:
            t0 = time.perf_counter()
            try:
                value = getattr(local_worker(self.group, self.rank), method)(*args)
            except WorkerError:
                raise
            except Exception as e:  # noqa: BLE001 - same shape as a remote failure
                raise WorkerError(self.group, self.rank, method, repr(e), traceback.format_exc()) from None
            return _Done(value, time.perf_counter() - t0)
        if self.direct is not None and self.direct[2] == _this_node():
            try:
                return direct.connection(self.direct[0], self.direct[1]).submit(self.group, method, args)
            except direct.PeerGone:
                raise self._died() from None
        return self.host.run.remote(self.group, method, args, {})

    def result(self, pending: Any) -> tuple[Any, float]:
        if isinstance(pending, _Done):
            return pending.value, pending.duration
        if isinstance(pending, direct.DirectPending):
            try:
                ok, payload = pending.connection.result(pending.rid)
            except direct.PeerGone:
                raise self._died() from None
            if ok:
                return payload
            raise payload from None  # a WorkerError arrives unpickled as a plain one already
        try:
            return ray.get(pending)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, WorkerError):
                raise WorkerError(cause.group, cause.rank, cause.method, cause.short.split("(): ", 1)[-1], cause.remote_traceback) from None
            raise
        except ray.exceptions.RayActorError:
            raise self._died() from None

    def _died(self) -> WorkerError:
        return WorkerError(self.group, self.rank, "(peer call)", PROCESS_DIED)


class WorkerGroup:
    """N workers of one class, placed on slots, called together."""

    def __init__(
        self,
        cls: type,
        placement: GroupPlacement,
        cluster: Cluster,
        args: Sequence = (),
        kwargs: dict | None = None,
        colocate_with: "WorkerGroup | None" = None,
        init_dist: bool = False,
        name: str | None = None,
    ):
        self.cls = cls
        self.name = name or placement.name
        self.placement = placement
        self.cluster = cluster
        self.local = cluster.local
        self.args, self.kwargs = tuple(args), dict(kwargs or {})
        self.owns_hosts = colocate_with is None
        self.has_dist = init_dist
        n = placement.num_workers
        if colocate_with is not None:
            if colocate_with.placement.slots != placement.slots:
                raise ValueError(
                    f"placement.groups.{self.name}: colocating with '{colocate_with.name}' needs identical slots"
                )
            self.hosts = colocate_with.hosts
            self.host_groups = colocate_with.host_groups  # shared, so both groups' errors name both
            self.host_groups.append(self.name)
        else:
            self.hosts = [self._start_host(placement.slots[r], placement) for r in range(n)]
            self.host_groups = [self.name]
        contexts = [self._context(r, placement) for r in range(n)]
        kwargs = dict(kwargs or {})
        try:
            refs = [self._host_call(h, "add_worker", self.name, cls, ctx, tuple(args), kwargs) for h, ctx in zip(self.hosts, contexts)]
            Handle(self.name, "__init__", list(range(n)), refs).wait()
            if init_dist and n > 1:
                host, port = self.call("dist_address", ranks=[0]).wait()[0]
                self.call("init_dist", host, port).wait()
        except BaseException:
            if colocate_with is None:  # hosts we started die with the failed group, not at GC time
                self.shutdown()
            raise

    @property
    def world_size(self) -> int:
        return self.placement.num_workers

    # -- calls --------------------------------------------------------------------------------
    def call(self, method: str, *args, ranks: Sequence[int] | None = None, **kwargs) -> Handle:
        """Runs ``method(*args, **kwargs)`` on every rank (or ``ranks``); returns a handle."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        self._check_method(method)
        pending = [self._host_call(self.hosts[r], "run", self.name, method, args, kwargs) for r in ranks]
        return Handle(self.name, method, ranks, pending, self.host_groups)

    def call_each(self, method: str, per_rank_args: Sequence[tuple], ranks: Sequence[int] | None = None) -> Handle:
        """Runs ``method(*per_rank_args[i])`` on rank ``ranks[i]`` (default: rank i)."""
        ranks = list(range(len(per_rank_args))) if ranks is None else list(ranks)
        if len(ranks) != len(per_rank_args):
            raise ValueError(f"{self.name}.{method}: {len(per_rank_args)} argument sets for {len(ranks)} ranks")
        self._check_method(method)
        pending = [self._host_call(self.hosts[r], "run", self.name, method, tuple(a), {}) for r, a in zip(ranks, per_rank_args)]
        return Handle(self.name, method, ranks, pending, self.host_groups)

    def run(self, method: str, *args, **kwargs) -> list:
        """``call(...).wait()``: the results of every rank."""
        return self.call(method, *args, **kwargs).wait()

    def host_info(self, what: str, *args) -> list:
        """Per-rank facts about the host processes (``pid``, ``node_id``, ``environ``)."""
        pending = [self._host_call(h, what, *args) for h in self.hosts]
        if self.local:
            return [p.result() for p in pending]
        return ray.get(pending)

    def peer(self, rank: int, caller_host: Any = None) -> Peer:
        """A :class:`Peer` for ``rank``, to hand to a worker living in ``caller_host`` (another
        group's ``hosts[i]``): a direct in-process reference when that is ``rank``'s own host
        process (fused groups) or in local mode, else a Ray reference, which also carries the
        host's direct-call socket unless the cluster's ``peer_calls`` is ``ray`` (a caller on
        another node falls back to Ray calls by itself)."""
        if self.local or caller_host is self.hosts[rank]:
            return Peer(self.name, rank)
        host = self.hosts[rank]
        if self.cluster.peer_calls != "direct":
            return Peer(self.name, rank, host)
        return Peer(self.name, rank, host, tuple(ray.get(host.direct_address.remote())))

    def resize(self, placement: GroupPlacement) -> None:
        """Grows or shrinks the group to ``placement`` between calls: ranks beyond the new size stop
        (their host processes exit), new ranks start on their slots with the group's constructor
        arguments, and every rank sees the new world size. Ranks that stay keep their process and
        state, so their slots must not change. Groups that share hosts or a torch.distributed
        group are rebuilt instead (``ValueError``)."""
        old, new = self.placement.num_workers, placement.num_workers
        if not self.owns_hosts or self.has_dist:
            raise ValueError(f"worker group '{self.name}' shares host processes or a distributed group: rebuild it")
        keep = min(old, new)
        if placement.slots[:keep] != self.placement.slots[:keep]:
            raise ValueError(f"worker group '{self.name}': resizing cannot move ranks 0..{keep - 1} to other slots")
        if new < old and not self.local:
            for h in self.hosts[new:]:
                ray.kill(h)
        self.hosts = self.hosts[:new]
        self.placement = placement
        added = list(range(old, new))
        self.hosts += [self._start_host(placement.slots[r], placement) for r in added]
        refs = [self._host_call(self.hosts[r], "add_worker", self.name, self.cls, self._context(r, placement), self.args, self.kwargs) for r in added]
        refs += [self._host_call(self.hosts[r], "set_context", self.name, self._context(r, placement)) for r in range(keep)]
        try:
            Handle(self.name, "__init__", added + list(range(keep)), refs).wait()
        except BaseException:
            self.shutdown()
            raise

    def detach(self) -> None:
        """Removes this group's workers from host processes it shares with another group (the
        processes keep running the other group); a group that owns its hosts shuts them down."""
        if self.owns_hosts:
            self.shutdown()
            return
        refs = [self._host_call(h, "remove_worker", self.name) for h in self.hosts]
        if refs:
            Handle(self.name, "detach", list(range(len(refs))), refs).wait()
        if self.name in self.host_groups:
            self.host_groups.remove(self.name)
        self.hosts = []

    def shutdown(self) -> None:
        if self.owns_hosts:
            for h in self.hosts:
                try:
                    if self.local:  # the driver process lives on: its workers release what they hold
                        h.close_workers()
                    else:
                        ray.kill(h)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.hosts = []

    # -- internals ----------------------------------------------------------------------------
    def _check_method(self, method: str) -> None:
        if not callable(getattr(self.cls, method, None)):
            raise AttributeError(f"worker class {self.cls.__name__} (group '{self.name}') has no method '{method}'")

    def _context(self, rank: int, placement: GroupPlacement) -> WorkerContext:
        slot = placement.slots[rank]
        return WorkerContext(
            group=self.name,
            rank=rank,
            world_size=placement.num_workers,
            slot=slot,
            slot_kind=self.cluster.slot_kind,
            num_threads=self._threads_for(slot, placement),
            local=self.local,
        )

    def _threads_for(self, slot: Slot, placement: GroupPlacement | None = None) -> int:
        if placement is not None and placement.threads is not None:
            return placement.threads  # asked for in the config (e.g. a learner whose env peer is mostly idle)
        if self.cluster.slot_kind == "cpu":
            return 1  # a CPU slot is one core
        node = self.cluster.nodes[slot.node]
        return max(1, node.num_cpus // max(1, node.num_gpus))

    def _start_host(self, slot: Slot, placement: GroupPlacement):
        env_vars: dict[str, str] = {}
        if self.cluster.slot_kind == "gpu":
            env_vars["CUDA_VISIBLE_DEVICES"] = str(slot.index)
        threads = self._threads_for(slot, placement)
        env_vars["OMP_NUM_THREADS"] = str(threads)
        env_vars.update({key: os.environ.get(key, value) for key, value in MALLOC_SETTINGS.items()})
        if self.local:
            return _LocalHost(env_vars, threads)
        node = self.cluster.nodes[slot.node]
        return _RayHost.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
            max_concurrency=8,
            runtime_env={"env_vars": env_vars},
            name=None,
        ).remote(env_vars, threads)

    def _host_call(self, host, method: str, *args):
        if self.local:
            return host.pool.submit(getattr(host, method), *args)
        return getattr(host, method).remote(*args)


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


def wait_all(handles: Sequence[Handle], timeout: float | None = None) -> list[list]:
    """Waits for several handles together and raises the *first* failure as soon as it happens.

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
