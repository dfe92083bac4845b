"""WorkerGroup on an embedded Ray (and in local mode): ranks, calls, handles, errors, torch.distributed."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time

import pytest
import ray
import torch
import torch.distributed as dist

from rlweave.cluster import (
    Cluster,
    GroupPlacement,
    Handle,
    Slot,
    Worker,
    WorkerError,
    WorkerGroup,
    wait_all,
)


class Probe(Worker):
    """Worker used by every test here; ``__init__`` records what it saw of its context."""

    LABEL = "not a method"

    def __init__(self, base: int, scale: int = 1):
        self.seen = (self.rank, self.world_size, self.group_name, self.name)
        self.base, self.scale = base, scale
        self._release = threading.Event()

    def init_info(self):
        return self.seen

    def add(self, x, y=0):
        return self.base + self.rank * self.scale + x + y

    def echo(self, *args, **kwargs):
        return (self.rank, args, kwargs)

    def pid(self):
        return os.getpid()

    def slot(self):
        return str(self._ctx.slot)

    def fail_on(self, rank: int, message: str):
        if self.rank == rank:
            raise ValueError(message)
        return self.rank

    def block(self, seconds: float):
        """Blocks on a local event nobody sets: returns after ``seconds``."""
        self._release.wait(seconds)
        return "timed out"

    def allreduce(self, value: float):
        t = torch.tensor([float(value)])
        dist.all_reduce(t)
        return (dist.get_rank(), dist.get_world_size(), dist.get_backend(), t.item())


class Other(Worker):
    def __init__(self, tag: str):
        self.tag = tag

    def pid(self):
        return os.getpid()

    def who(self):
        return (self.tag, self.group_name, self.rank, self.world_size)


class BadInit(Worker):
    def __init__(self):
        if self.rank == 1:
            raise KeyError("no such resource on rank one")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    c = Cluster.start()  # attaches to the Ray above
    yield c
    ray.shutdown()


def two_slots(name: str = "probe") -> GroupPlacement:
    return GroupPlacement(name, [Slot(0, 0), Slot(0, 1)])


@pytest.fixture(scope="module")
def group(cluster):
    """Two ranks, torch.distributed (gloo) initialised across them."""
    g = WorkerGroup(Probe, two_slots(), cluster, args=(100,), kwargs={"scale": 10}, init_dist=True)
    yield g
    g.shutdown()


def test_cluster_attaches_to_the_running_ray(cluster):
    assert not cluster.started_here
    assert not cluster.local
    assert (cluster.num_nodes, cluster.slot_kind, cluster.num_slots) == (1, "cpu", 2)


def test_rank_and_world_size_are_set_inside_init(group):
    assert group.world_size == 2
    assert group.run("init_info") == [
        (0, 2, "probe", "probe[rank 0]"),
        (1, 2, "probe", "probe[rank 1]"),
    ]
    assert group.run("slot") == ["node0:0", "node0:1"]


def test_ranks_run_in_separate_ray_processes(group):
    pids = group.run("pid")
    assert len(set(pids)) == 2
    assert os.getpid() not in pids
    assert group.host_info("pid") == pids


def test_call_on_all_ranks_returns_results_in_rank_order(group):
    h = group.call("add", 1, y=2)
    assert isinstance(h, Handle)
    assert h.ranks == [0, 1]
    assert h.method == "add"
    assert h.wait() == [103, 113]
    assert h.wait() == [103, 113]  # cached
    assert group.run("echo", "a", k=1) == [(0, ("a",), {"k": 1}), (1, ("a",), {"k": 1})]


def test_call_on_selected_ranks(group):
    assert group.call("add", 5, ranks=[1]).wait() == [115]
    assert group.call("add", 5, ranks=[0]).wait() == [105]
    h = group.call("add", 0, ranks=[1, 0])
    assert h.ranks == [1, 0]
    assert h.wait() == [110, 100]  # in the order the ranks were asked for


def test_call_each_gives_every_rank_its_own_arguments(group):
    assert group.call_each("add", [(1,), (2, 3)]).wait() == [101, 115]
    assert group.call_each("echo", [("only-one",)], ranks=[1]).wait() == [(1, ("only-one",), {})]
    with pytest.raises(ValueError, match=r"^probe.add: 1 argument sets for 2 ranks$"):
        group.call_each("add", [(1,)], ranks=[0, 1])


def test_handle_done_wait_and_duration(group):
    h = group.call("block", 0.6)
    assert h.done() is False  # each rank waits 0.6 s in the worker
    assert h.wait() == ["timed out", "timed out"]
    assert h.done() is True
    assert len(h.durations) == 2
    assert h.duration >= 0.6
    assert h.duration == max(h.durations)
    quick = group.call("add", 0)
    quick.wait()
    assert 0 < quick.duration < 0.6


def test_await_handles_inside_asyncio(group):
    async def main():
        h1 = group.call("add", 1)
        h2 = group.call("block", 0.2, ranks=[1])
        return await asyncio.gather(h1, h2)

    assert asyncio.run(main()) == [[101, 111], ["timed out"]]


def test_torch_distributed_gloo_all_reduce_across_ranks(group):
    out = group.call_each("allreduce", [(1.5,), (2.0,)]).wait()
    assert out == [(0, 2, "gloo", 3.5), (1, 2, "gloo", 3.5)]


def test_colocated_group_shares_host_processes(cluster, group):
    other = WorkerGroup(Other, two_slots("other"), cluster, args=("x",), colocate_with=group)
    try:
        assert other.host_info("pid") == group.host_info("pid")
        assert other.run("pid") == group.run("pid")
        assert other.run("who") == [("x", "other", 0, 2), ("x", "other", 1, 2)]
        # the first group's workers are untouched by the second one
        assert group.run("add", 0) == [100, 110]
    finally:
        other.hosts = []  # shared hosts belong to `group`



def test_death_of_a_shared_process_names_every_group_it_hosted(cluster):
    first = WorkerGroup(Probe, two_slots("first"), cluster, args=(0,))
    second = WorkerGroup(Other, two_slots("second"), cluster, args=("x",), colocate_with=first)
    try:
        os.kill(first.host_info("pid")[1], 9)
        with pytest.raises(WorkerError) as info:
            second.run("pid")
        assert (info.value.group, info.value.rank, info.value.process_died) == ("second", 1, True)
        assert re.fullmatch(r"worker second\[rank 1\] failed in pid\(\): worker process died "
                            r"\(Actor\w+Error; the process also hosted first\[rank 1\]\)", info.value.short)
        with pytest.raises(WorkerError, match=r"^worker first\[rank 1\] .* also hosted second\[rank 1\]\)$"):
            first.run("add", 0)
        # rank 0's process is alive and its calls still answer
        assert second.run("who", ranks=[0]) == [("x", "second", 0, 2)]
    finally:
        second.hosts = []
        first.shutdown()

def test_colocating_needs_identical_slots(cluster, group):
    with pytest.raises(ValueError, match=r"placement.groups.other: colocating with 'probe' needs identical slots"):
        WorkerGroup(Other, GroupPlacement("other", [Slot(0, 1), Slot(0, 0)]), cluster, args=("x",), colocate_with=group)


def test_worker_exception_becomes_worker_error_with_location(group):
    h = group.call("fail_on", 1, "the flux capacitor is empty")
    with pytest.raises(WorkerError) as info:
        h.wait()
    e = info.value
    text = str(e)
    assert (e.group, e.rank, e.method) == ("probe", 1, "fail_on")
    assert "probe" in text
    assert "rank 1" in text
    assert "fail_on" in text
    assert "the flux capacitor is empty" in text
    assert text.startswith("worker probe[rank 1] failed in fail_on(): ValueError('the flux capacitor is empty')")
    # the remote traceback points at the line that raised, in this file
    assert "--- remote traceback ---" in text
    assert "raise ValueError(message)" in text
    assert "test_worker.py" in e.remote_traceback
    assert "rank 0" not in e.short


def _live_hosts() -> set[str]:
    """Ids of the _RayHost actors that are alive (or still starting)."""
    from ray._private.state import actors

    out = set()
    for actor_id, a in actors().items():
        cls = a.get("ActorClassName") or a.get("ClassName") or ""
        if cls.endswith("_RayHost") and a.get("State") != "DEAD":
            out.add(actor_id)
    return out


def test_error_in_init_names_rank_and_leaves_no_host_processes(cluster, group):
    """A group whose __init__ fails on one rank raises a WorkerError naming __init__ and that
    rank, and must not leave its host actors running: on an attached (long-lived) cluster they
    would hold processes, and the caller never gets their handles. The check runs while the
    caller still holds the error (as pytest, a debugger or a notebook's last traceback do): its
    traceback references the half-built group, so the hosts must be killed explicitly, not left
    to the garbage collection of their handles."""
    before = _live_hosts()
    assert len(before) >= 2  # the module's group: the check does see live hosts
    with pytest.raises(WorkerError) as info:
        WorkerGroup(BadInit, two_slots("badinit"), cluster)
    e = info.value
    assert (e.group, e.rank, e.method) == ("badinit", 1, "__init__")
    assert "no such resource on rank one" in str(e)
    assert "KeyError" in str(e)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _live_hosts() - before:
        time.sleep(0.2)
    assert _live_hosts() - before == set()


class SlowInit(Worker):
    """A constructor that takes a while, then leaves state a call reads."""

    def __init__(self, seconds: float):
        time.sleep(seconds)
        self.built = ("built", self.rank)

    def state(self):
        return self.built


def test_groups_started_without_waiting_build_side_by_side_and_calls_wait_for_them(cluster):
    """``wait=False`` returns while the constructors run; the first call waits for them (a host
    runs calls on several threads, so without the wait it would find no worker), and both groups
    were built in their own processes at the same time."""
    t0 = time.monotonic()
    a = WorkerGroup(SlowInit, two_slots("slow_a"), cluster, args=(3.0,), wait=False)
    b = WorkerGroup(SlowInit, GroupPlacement("slow_b", [Slot(0, 0)]), cluster, args=(3.0,), wait=False)
    try:
        assert time.monotonic() - t0 < 2.5, "wait=False waited for the constructors"
        assert a.run("state") == [("built", 0), ("built", 1)]
        assert b.call("state").wait() == [("built", 0)]
        assert b.ready() is b and a.ready() is a  # already built: returns at once
    finally:
        a.shutdown()
        b.shutdown()


def test_a_failed_start_without_waiting_raises_on_every_call_and_leaves_no_host_processes(cluster, group):
    before = _live_hosts()
    g = WorkerGroup(BadInit, two_slots("badinit_nowait"), cluster, wait=False)
    for attempt in (lambda: g.call("__init__"), g.ready, lambda: g.host_info("pid")):
        with pytest.raises(WorkerError) as info:
            attempt()
        assert (info.value.group, info.value.rank, info.value.method) == ("badinit_nowait", 1, "__init__")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _live_hosts() - before:
        time.sleep(0.2)
    assert _live_hosts() - before == set()


def test_unimportable_worker_class_error_carries_the_cause(cluster):
    """When the host cannot even unpickle the call (class from a module the workers cannot
    import), the WorkerError must still say why, not only where."""
    import sys
    import types

    mod = types.ModuleType("rlweave_ghost_module")
    exec("from rlweave.cluster import Worker\nclass Ghost(Worker):\n    pass\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        with pytest.raises(WorkerError) as info:
            WorkerGroup(mod.Ghost, GroupPlacement("ghost", [Slot(0, 0)]), cluster)
    finally:
        del sys.modules[mod.__name__]
    assert info.value.method == "__init__"
    assert "No module named 'rlweave_ghost_module'" in str(info.value)


def test_wait_all_raises_the_first_failure_while_another_handle_blocks(group):
    blocked = group.call("block", 120, ranks=[0])
    failing = group.call("fail_on", 1, "rank one gave up", ranks=[1])
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        wait_all([blocked, failing])
    assert time.monotonic() - t0 < 60, "wait_all waited for the blocked handle instead of failing fast"
    assert info.value.rank == 1
    assert info.value.method == "fail_on"
    assert "rank one gave up" in str(info.value)
    assert blocked.done() is False


def test_wait_all_returns_every_result_and_times_out(group):
    h1, h2 = group.call("add", 1), group.call("add", 2, ranks=[1])
    assert wait_all([h1, h2]) == [[101, 111], [112]]
    slow = group.call("block", 30, ranks=[1])
    with pytest.raises(TimeoutError, match="timed out waiting for workers"):
        wait_all([slow], timeout=0.3)


def test_unknown_method_raises_attribute_error_naming_the_class(group):
    with pytest.raises(AttributeError, match=r"^worker class Probe \(group 'probe'\) has no method 'fly'$"):
        group.call("fly")
    with pytest.raises(AttributeError, match=r"has no method 'LABEL'"):
        group.call("LABEL")
    with pytest.raises(AttributeError, match=r"worker class Probe .* has no method 'fly'"):
        group.call_each("fly", [(), ()])


# --------------------------------------------------------------------------- local mode
@pytest.fixture
def local_cluster():
    c = Cluster.start(local=True, num_cpus=2)
    assert c.local and not c.started_here
    return c


def test_local_mode_runs_the_same_worker_in_process(local_cluster):
    g = WorkerGroup(Probe, two_slots("loc"), local_cluster, args=(7,))
    try:
        assert g.run("pid") == [os.getpid(), os.getpid()]
        assert g.host_info("pid") == [os.getpid(), os.getpid()]
        assert g.host_info("node_id") in (["local", "local"], [ray.get_runtime_context().get_node_id()] * 2)
        assert g.run("init_info") == [(0, 2, "loc", "loc[rank 0]"), (1, 2, "loc", "loc[rank 1]")]
        assert g.call("add", 1, ranks=[1]).wait() == [9]
        assert g.call_each("add", [(1,), (2,)]).wait() == [8, 10]
        h = g.call("block", 0.3)
        assert h.done() is False
        assert h.wait() == ["timed out", "timed out"] and h.done()
        assert h.duration >= 0.3
        assert asyncio.run(_await(g.call("add", 0))) == [7, 8]
    finally:
        g.shutdown()


async def _await(h):
    return await h


def test_local_mode_errors_and_wait_all(local_cluster):
    g = WorkerGroup(Probe, two_slots("loc"), local_cluster, args=(0,))
    with pytest.raises(WorkerError) as info:
        g.call("fail_on", 0, "local boom").wait()
    assert (info.value.group, info.value.rank, info.value.method) == ("loc", 0, "fail_on")
    assert "local boom" in str(info.value) and "raise ValueError(message)" in str(info.value)
    blocked = g.call("block", 120, ranks=[0])
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match="rank 1"):
            wait_all([blocked, g.call("fail_on", 1, "second", ranks=[1])])
        assert time.monotonic() - t0 < 60
        assert blocked.done() is False
    finally:
        g.hosts[0].workers["loc"]._release.set()  # let the pool thread finish
    assert blocked.wait() == ["timed out"]
    with pytest.raises(AttributeError, match="worker class Probe"):
        g.call("nope")


def test_local_mode_does_not_touch_the_driver_environment(local_cluster):
    before = dict(os.environ)
    threads = torch.get_num_threads()
    g = WorkerGroup(Probe, two_slots("loc"), local_cluster, args=(0,))
    assert dict(os.environ) == before
    assert torch.get_num_threads() == threads
    assert g.host_info("environ", "OMP_NUM_THREADS") == [before.get("OMP_NUM_THREADS")] * 2
