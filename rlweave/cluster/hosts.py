"""Host processes: the Ray actor (or, in local mode, the in-driver object) that holds the worker
objects of one process and runs method calls on them, with the process settings every worker
process gets (malloc, denormals, thread count)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
import traceback
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlweave.utils import direct
from rlweave.cluster.cluster import Cluster
from rlweave.cluster.errors import WorkerError
from rlweave.cluster.placement import Slot
from rlweave.cluster.worker import _IN_PROCESS, WorkerContext, _bind


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


def start_host(cluster: Cluster, slot: Slot, threads: int):
    """Starts the process that holds workers on ``slot`` (a Ray actor pinned to the slot's node,
    or an in-driver host in local mode) with ``threads`` torch threads."""
    env_vars: dict[str, str] = {}
    if cluster.slot_kind == "gpu":
        env_vars["CUDA_VISIBLE_DEVICES"] = str(slot.index)
    env_vars["OMP_NUM_THREADS"] = str(threads)
    env_vars.update({key: os.environ.get(key, value) for key, value in MALLOC_SETTINGS.items()})
    if cluster.local:
        return _LocalHost(env_vars, threads)
    node = cluster.nodes[slot.node]
    return _RayHost.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
        max_concurrency=8,
        runtime_env={"env_vars": env_vars},
        name=None,
    ).remote(env_vars, threads)
