"""Worker: the base class of every role, and the context a worker runs in.

A worker class is a plain Python class deriving from :class:`Worker`; a
:class:`~rlweave.cluster.group.WorkerGroup` builds it inside its host processes with its context
(group name, rank, world size, slot, device) bound before ``__init__`` runs, so ``__init__`` can
use ``self.rank``. Workers living in this process are registered by (group, rank)
(:func:`local_worker`), so a peer fused into the same process is reached by a function call.

Failures come back to the driver as :class:`~rlweave.cluster.errors.WorkerError`, whose message
names the group, rank and method and carries the remote traceback.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import ray
import torch
import torch.distributed as dist  # imported at module top: see the pickling trap in docs/architecture.md

from rlweave.cluster.placement import Slot
from rlweave.cluster.dispatch import group_method


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

    @group_method("all")
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
