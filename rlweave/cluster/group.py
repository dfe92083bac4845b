"""WorkerGroup: N processes of one worker class, driven like a one-process program.

A :class:`WorkerGroup` starts one *host* process per placement entry (:mod:`rlweave.cluster.hosts`:
a Ray actor, or an in-process object in local mode) and builds the worker inside it with its
context (group name, rank, world size, slot, device) already set, so ``__init__`` can use
``self.rank``. A worker method declared with :func:`~rlweave.cluster.dispatch.group_method` is an
attribute of its group: ``group.update(batch)`` splits, runs and gathers as the method declares
(:mod:`rlweave.cluster.dispatch`). ``group.call("step", x)`` (every rank, or the chosen ``ranks``;
a :class:`~rlweave.cluster.handle.Handle`) and ``group.call_each`` stay for tests and the group's
own start-up calls. Groups placed on the same slots can share host processes
(``colocate_with=``), as veRL's colocated worker classes do: calls between them cost a function
call instead of an inter-process hop.

``WorkerGroup(..., wait=False)`` returns as soon as the group's processes and constructors are
under way, and the group's first call (or :meth:`WorkerGroup.ready`) waits for them: a runner that
makes its groups this way starts them side by side instead of one after another (each host process
takes 1.5-2.5 s to start and import torch, and the learner's constructor as long again). In local
mode, where every worker is built in the driver process, constructors still run one at a time.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import ray

from rlweave.cluster.cluster import Cluster
from rlweave.cluster.dispatch import Dispatch, collect_results, declared_methods, dispatch_of, plan_calls
from rlweave.cluster.handle import Handle
from rlweave.cluster.hosts import start_host
from rlweave.cluster.peer import Peer
from rlweave.cluster.placement import GroupPlacement, Slot
from rlweave.cluster.worker import WorkerContext


# what every group sets on itself: a worker method of one of these names would be hidden
_INSTANCE_ATTRIBUTES = frozenset({"cls", "name", "placement", "cluster", "local", "args", "kwargs", "owns_hosts",
                                  "has_dist", "hosts", "host_groups"})


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
        wait: bool = True,
    ):
        clashes = [m for m in declared_methods(cls) if hasattr(WorkerGroup, m) or m in _INSTANCE_ATTRIBUTES]
        if clashes:
            raise TypeError(f"{cls.__name__}: group methods {clashes} would be hidden by WorkerGroup's own attributes; rename them")
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
            colocate_with.ready()  # its constructors first: a host runs calls on several threads
        else:
            self.hosts = [self._start_host(placement.slots[r], placement) for r in range(n)]
            self.host_groups = [self.name]
        contexts = [self._context(r, placement) for r in range(n)]
        kwargs = dict(kwargs or {})
        refs = [self._host_call(h, "add_worker", self.name, cls, ctx, tuple(args), kwargs) for h, ctx in zip(self.hosts, contexts)]
        self._pending_init: Handle | None = Handle(self.name, "__init__", list(range(n)), refs)
        if wait or self.local:
            # local mode builds every worker in the driver process, whose global state (torch's
            # default device, transformers' meta-device init) constructors on two threads would share
            self.ready()

    def ready(self) -> "WorkerGroup":
        """Waits until every rank's constructor has run (and, with ``init_dist``, the ranks have
        joined their torch.distributed group). A failure raises its :class:`WorkerError` (naming
        ``__init__`` and the rank) after the hosts this group started are killed, so a half-built
        group leaves no processes behind; every later call raises the same way. Every call of the
        group waits here first: a host runs calls on several threads, so a call sent during the
        constructor would run beside it and find no worker."""
        failed = self.__dict__.get("_start_error")
        if failed is not None:
            raise failed  # the start's error again: never a call into killed processes
        init, self._pending_init = self.__dict__.get("_pending_init"), None
        if init is None:
            return self
        try:
            init.wait()
            if self.has_dist and self.world_size > 1:
                host, port = self.call("dist_address", ranks=[0]).wait()[0]
                self.call("init_dist", host, port).wait()
        except BaseException as e:
            self.shutdown()  # hosts we started die with the failed group, not at GC time
            self._start_error = e
            raise
        return self

    @property
    def world_size(self) -> int:
        return self.placement.num_workers

    # -- calls --------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """``group.method(...)`` for every worker method declared with
        :func:`~rlweave.cluster.dispatch.group_method`: split, run and gather as it declares."""
        cls = self.__dict__.get("cls")
        if name.startswith("_") or cls is None:
            raise AttributeError(name)
        spec = dispatch_of(cls, name)
        if spec is None:
            raise AttributeError(f"{cls.__name__}.{name} is not a group method (declare it with @group_method) "
                                 f"or does not exist (group '{self.__dict__.get('name')}')")
        return GroupMethod(self, name, spec)

    def _submit(self, method: str, spec: Dispatch, args: tuple, kwargs: dict) -> Handle:
        self.ready()
        calls = plan_calls(spec, self, method, args, kwargs)
        pending = [self._host_call(self.hosts[r], "run", self.name, method, a, kw) for r, a, kw in calls]
        return Handle(self.name, method, [r for r, _, _ in calls], pending, self.host_groups,
                      collect=functools.partial(collect_results, spec))

    def call(self, method: str, *args, ranks: Sequence[int] | None = None, **kwargs) -> Handle:
        """Runs ``method(*args, **kwargs)`` on every rank (or ``ranks``); returns a handle."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        self._check_method(method)
        self.ready()
        pending = [self._host_call(self.hosts[r], "run", self.name, method, args, kwargs) for r in ranks]
        return Handle(self.name, method, ranks, pending, self.host_groups)

    def call_each(self, method: str, per_rank_args: Sequence[tuple], ranks: Sequence[int] | None = None) -> Handle:
        """Runs ``method(*per_rank_args[i])`` on rank ``ranks[i]`` (default: rank i)."""
        ranks = list(range(len(per_rank_args))) if ranks is None else list(ranks)
        if len(ranks) != len(per_rank_args):
            raise ValueError(f"{self.name}.{method}: {len(per_rank_args)} argument sets for {len(ranks)} ranks")
        self._check_method(method)
        self.ready()
        pending = [self._host_call(self.hosts[r], "run", self.name, method, tuple(a), {}) for r, a in zip(ranks, per_rank_args)]
        return Handle(self.name, method, ranks, pending, self.host_groups)

    def run(self, method: str, *args, **kwargs) -> list:
        """``call(...).wait()``: the results of every rank."""
        return self.call(method, *args, **kwargs).wait()

    def host_info(self, what: str, *args) -> list:
        """Per-rank facts about the host processes (``pid``, ``node_id``, ``environ``)."""
        self.ready()
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
        self.ready()
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
        self.ready()
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
        self.ready()
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
        return start_host(self.cluster, slot, self._threads_for(slot, placement))

    def _host_call(self, host, method: str, *args):
        if self.local:
            return host.pool.submit(getattr(host, method), *args)
        return getattr(host, method).remote(*args)


class GroupMethod:
    """A declared worker method bound to its group: calling it runs it as declared (the gathered
    result, or a :class:`Handle` for ``blocking=False``); ``.submit(...)`` always returns the
    handle, for a call a driver overlaps with others."""

    def __init__(self, group: WorkerGroup, name: str, spec: Dispatch):
        self.group, self.name, self.spec = group, name, spec

    def __call__(self, *args, **kwargs) -> Any:
        handle = self.submit(*args, **kwargs)
        return handle.wait() if self.spec.blocking else handle

    def submit(self, *args, **kwargs) -> Handle:
        return self.group._submit(self.name, self.spec, args, kwargs)
