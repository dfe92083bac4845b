"""Placement: the slot grammar, the mode presets, the derived mode, and real placement on a fake
2-node x 4-GPU Ray cluster (GPUs declared as resources through ``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import ray

from rlweave.cluster import (
    Cluster,
    GroupPlacement,
    NodeInfo,
    PlacementError,
    Slot,
    Worker,
    WorkerGroup,
    derive_mode,
    make_plan,
    parse_slots,
)


# --------------------------------------------------------------------------- fake inventories
def gpu_cluster() -> Cluster:
    """2 nodes x 4 GPUs (8 CPUs each)."""
    return Cluster(
        nodes=[
            NodeInfo(index=0, node_id="head", address="10.0.0.1", num_cpus=8, num_gpus=4),
            NodeInfo(index=1, node_id="other", address="10.0.0.2", num_cpus=8, num_gpus=4),
        ]
    )


def cpu_cluster() -> Cluster:
    """1 node, 2 CPUs, no GPUs: the CPUs are the slots."""
    return Cluster(nodes=[NodeInfo(index=0, node_id="laptop", address="127.0.0.1", num_cpus=2, num_gpus=0)])


def S(node: int, *idx: int) -> list[Slot]:
    return [Slot(node, i) for i in idx]


WORKERS = {"env": 2, "rollout": 2, "actor": 4}


# --------------------------------------------------------------------------- inventory
def test_inventory_counts_gpus_as_slots_and_cpus_when_no_gpus():
    g, c = gpu_cluster(), cpu_cluster()
    assert (g.num_nodes, g.num_gpus, g.num_cpus, g.slot_kind, g.num_slots) == (2, 8, 16, "gpu", 8)
    assert (c.num_nodes, c.num_gpus, c.num_cpus, c.slot_kind, c.num_slots) == (1, 0, 2, "cpu", 2)
    assert "2 node(s), 8 gpu slot(s)" in g.describe()
    assert "1 node(s), 2 cpu slot(s)" in c.describe()


def test_cpu_only_node_holds_no_slots_in_a_gpu_cluster():
    mixed = Cluster(nodes=[NodeInfo(0, "a", "x", 4, 2), NodeInfo(1, "b", "y", 16, 0)])
    assert mixed.slot_kind == "gpu"
    assert [mixed.slots_on(0), mixed.slots_on(1)] == [2, 0]
    assert mixed.num_slots == 2
    with pytest.raises(PlacementError, match=r"^k: slot 0 on node1 does not exist \(node1 has 0 gpu slot\(s\)\)"):
        parse_slots("node1:0", mixed, "k")


# --------------------------------------------------------------------------- parse_slots grammar
@pytest.mark.parametrize(
    "expr, expected",
    [
        ("0", S(0, 0)),
        ("0-3", S(0, 0, 1, 2, 3)),
        ("node1:0-3", S(1, 0, 1, 2, 3)),
        ("node0:2,node1:1", [Slot(0, 2), Slot(1, 1)]),
        ("3, 1 ,node1:3", [Slot(0, 3), Slot(0, 1), Slot(1, 3)]),  # order kept: rank order
        ("1-2,node1:0-1", S(0, 1, 2) + S(1, 0, 1)),
        ("all", S(0, 0, 1, 2, 3) + S(1, 0, 1, 2, 3)),
        ("  all  ", S(0, 0, 1, 2, 3) + S(1, 0, 1, 2, 3)),
    ],
)
def test_parse_slots_on_gpu_cluster(expr, expected):
    assert parse_slots(expr, gpu_cluster(), "placement.groups.actor.slots") == expected


def test_parse_slots_all_on_cpu_cluster_means_every_cpu():
    assert parse_slots("all", cpu_cluster(), "k") == S(0, 0, 1)
    assert parse_slots("0-1", cpu_cluster(), "k") == S(0, 0, 1)


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("3-1", "bad range '3-1' (end before start)"),
        ("4", "slot 4 on node0 does not exist (node0 has 4 gpu slot(s))"),
        ("node1:2-4", "slot 4 on node1 does not exist (node1 has 4 gpu slot(s))"),
        ("node2:0", "node2 does not exist (cluster has 2 node(s))"),
        ("gpus please", "cannot parse 'gpus please'"),
        ("0,,1", "cannot parse ''"),
        ("node1:", "cannot parse 'node1:'"),
        ("-1", "cannot parse '-1'"),
        ("0-", "cannot parse '0-'"),
        ("all,0", "cannot parse 'all'"),
        ("0,1,0", "slot node0:0 listed twice"),
        ("0-2,node0:1", "slot node0:1 listed twice"),
        ("", "empty slot expression"),
        ("   ", "empty slot expression"),
    ],
)
def test_parse_slots_errors_name_the_key(expr, fragment):
    key = "placement.groups.rollout.slots"
    with pytest.raises(PlacementError) as info:
        parse_slots(expr, gpu_cluster(), key)
    msg = str(info.value)
    assert msg.startswith(key + ": "), msg
    assert fragment in msg
    assert "\n" not in msg


def test_parse_slots_beyond_cpu_node():
    with pytest.raises(PlacementError, match=r"^k: slot 2 on node0 does not exist \(node0 has 2 cpu slot\(s\)\)$"):
        parse_slots("0-2", cpu_cluster(), "k")


def test_placement_error_is_a_value_error():
    assert issubclass(PlacementError, ValueError)


# --------------------------------------------------------------------------- derive_mode
def test_derive_mode_from_slot_sets():
    a, b, c = frozenset(S(0, 0, 1)), frozenset(S(0, 2, 3)), frozenset(S(0, 1, 2))
    assert derive_mode([]) == "collocated"
    assert derive_mode([a]) == "collocated"
    assert derive_mode([a, frozenset(S(0, 1, 0)), a]) == "collocated"
    assert derive_mode([a, b]) == "disaggregated"
    assert derive_mode([a, b, frozenset(S(1, 0))]) == "disaggregated"
    assert derive_mode([a, c]) == "hybrid"
    # pairwise: a and b are disjoint but c overlaps both
    assert derive_mode([a, b, c]) == "hybrid"
    # the same index on another node is another slot
    assert derive_mode([frozenset(S(0, 0)), frozenset(S(1, 0))]) == "disaggregated"


def explicit(**groups: str) -> dict:
    return {name: {"slots": slots} for name, slots in groups.items()}


@pytest.mark.parametrize(
    "layout, mode",
    [
        (explicit(env="0-1", rollout="0-1", actor="1,0"), "collocated"),
        (explicit(env="node0:0-1", rollout="node0:2-3", actor="node1:0-3"), "disaggregated"),
        (explicit(env="0", rollout="node1:0", actor="node0:1,node1:1"), "disaggregated"),
        (explicit(env="0-1", rollout="0-1", actor="1-2"), "hybrid"),
        (explicit(env="0-1", rollout="2-3", actor="all"), "hybrid"),
    ],
)
def test_explicit_layout_derives_mode(layout, mode):
    plan = make_plan(gpu_cluster(), {"env": 1, "rollout": 1, "actor": 1}, explicit=layout)
    assert plan.mode == mode
    assert plan.as_dict()["mode"] == mode
    assert plan.describe().startswith(f"placement {mode} (gpu slots): ")
    # the explicit slots win over the configured worker counts
    for name, spec in layout.items():
        assert plan.groups[name].slots == parse_slots(spec["slots"], gpu_cluster(), "k")


def test_explicit_mode_wins_over_preset_name():
    """The mode is derived from the slots, never declared twice: a disjoint explicit layout is
    disaggregated even when the preset says collocated."""
    plan = make_plan(
        gpu_cluster(), WORKERS, mode="collocated", explicit=explicit(env="0-1", rollout="2-3", actor="node1:0-3")
    )
    assert plan.mode == "disaggregated"


# --------------------------------------------------------------------------- presets
def test_collocated_preset_equal_counts_shares_the_same_slots():
    plan = make_plan(gpu_cluster(), {"env": 2, "rollout": 2, "actor": 2}, mode="collocated")
    assert plan.mode == "collocated"
    for g in ("env", "rollout", "actor"):
        assert plan.groups[g].slots == S(0, 0, 1)
    assert plan.processes_per_slot() == {Slot(0, 0): 3, Slot(0, 1): 3}
    assert plan.as_dict() == {
        "mode": "collocated",
        "slot_kind": "gpu",
        "groups": {g: ["node0:0", "node0:1"] for g in ("env", "rollout", "actor")},
    }
    assert list(plan.groups) == ["env", "rollout", "actor"]


def test_collocated_preset_on_cpu_laptop():
    plan = make_plan(cpu_cluster(), {"env": 1, "rollout": 1, "actor": 1})
    assert plan.mode == "collocated"
    assert plan.slot_kind == "cpu"
    assert {g: p.slots for g, p in plan.groups.items()} == {g: S(0, 0) for g in ("env", "rollout", "actor")}


def test_collocated_preset_wraps_more_workers_than_slots_round_robin():
    plan = make_plan(cpu_cluster(), {"env": 1, "rollout": 1, "actor": 4}, mode="collocated")
    assert plan.groups["actor"].slots == [Slot(0, 0), Slot(0, 1), Slot(0, 0), Slot(0, 1)]
    assert plan.groups["actor"].processes_on(Slot(0, 0)) == 2


def test_collocated_preset_with_unequal_counts_reports_the_honest_mode():
    """The collocated preset lays every group on a prefix of one common slot range (so smaller
    groups share the larger groups' slots instead of being spread thin); the *derived* mode says
    what that amounts to: hybrid when the slot sets differ, never a claimed 'collocated'."""
    plan = make_plan(gpu_cluster(), WORKERS, mode="collocated")
    assert plan.groups["env"].slots == S(0, 0, 1)
    assert plan.groups["rollout"].slots == S(0, 0, 1)
    assert plan.groups["actor"].slots == S(0, 0, 1, 2, 3)
    assert plan.mode == "hybrid"
    equal = make_plan(gpu_cluster(), {"env": 2, "rollout": 2, "actor": 2}, mode="collocated")
    assert equal.mode == "collocated"


def test_disaggregated_preset_gives_disjoint_consecutive_slots():
    plan = make_plan(gpu_cluster(), WORKERS, mode="disaggregated")
    assert plan.mode == "disaggregated"
    assert plan.groups["env"].slots == S(0, 0, 1)
    assert plan.groups["rollout"].slots == S(0, 2, 3)
    assert plan.groups["actor"].slots == S(1, 0, 1, 2, 3)
    assert set(plan.processes_per_slot().values()) == {1}


def test_disaggregated_preset_needs_a_slot_per_worker():
    with pytest.raises(PlacementError) as info:
        make_plan(gpu_cluster(), {"env": 4, "rollout": 4, "actor": 4}, mode="disaggregated")
    assert str(info.value) == (
        "placement.mode: disaggregated needs 12 slots for env(4) + rollout(4) + actor(4), "
        "the cluster has 8 gpu slot(s)"
    )
    with pytest.raises(PlacementError, match=r"needs 3 slots for env\(1\) \+ rollout\(1\) \+ actor\(1\), the cluster has 2 cpu slot"):
        make_plan(cpu_cluster(), {"env": 1, "rollout": 1, "actor": 1}, mode="disaggregated")


def test_hybrid_preset_trainer_spans_slots_others_split_them():
    plan = make_plan(gpu_cluster(), {"env": 2, "rollout": 2, "actor": 8}, mode="hybrid")
    assert plan.mode == "hybrid"
    assert plan.groups["actor"].slots == S(0, 0, 1, 2, 3) + S(1, 0, 1, 2, 3)
    assert plan.groups["env"].slots == S(0, 0, 1)
    assert plan.groups["rollout"].slots == S(1, 0, 1)
    assert not (plan.groups["env"].slot_set & plan.groups["rollout"].slot_set)


def test_hybrid_preset_on_two_cpus():
    plan = make_plan(cpu_cluster(), {"env": 1, "rollout": 1, "actor": 1}, mode="hybrid")
    assert plan.mode == "hybrid"
    assert (plan.groups["env"].slots, plan.groups["rollout"].slots, plan.groups["actor"].slots) == (
        S(0, 0), S(0, 1), S(0, 0))


def test_hybrid_preset_needs_a_slot_per_non_trainer_group():
    one = Cluster(nodes=[NodeInfo(0, "n", "x", 1, 0)])
    with pytest.raises(PlacementError, match=r"^placement.mode: hybrid needs at least 2 slots, cluster has 1$"):
        make_plan(one, {"env": 1, "rollout": 1, "actor": 1}, mode="hybrid")


def test_mixed_explicit_and_preset_groups():
    plan = make_plan(gpu_cluster(), WORKERS, mode="collocated", explicit=explicit(actor="node1:0-3"))
    assert plan.groups["actor"].slots == S(1, 0, 1, 2, 3)
    assert plan.groups["env"].slots == plan.groups["rollout"].slots == S(0, 0, 1)
    # env and rollout share slots, the actor is apart: neither identical nor pairwise disjoint
    assert plan.mode == "hybrid"


# --------------------------------------------------------------------------- procs_per_slot, oversubscription
def test_procs_per_slot_repeats_each_slot_in_rank_order():
    layout = {"actor": {"slots": "node0:0,node1:0", "procs_per_slot": 2}}
    plan = make_plan(gpu_cluster(), WORKERS, explicit=layout)
    actor = plan.groups["actor"]
    assert actor.slots == [Slot(0, 0), Slot(0, 0), Slot(1, 0), Slot(1, 0)]
    assert actor.num_workers == 4
    assert actor.processes_on(Slot(1, 0)) == 2
    assert plan.as_dict()["groups"]["actor"] == ["node0:0", "node0:0", "node1:0", "node1:0"]


def test_procs_per_slot_must_be_positive():
    with pytest.raises(PlacementError, match=r"^placement.groups.actor.procs_per_slot: must be >= 1, got 0$"):
        make_plan(gpu_cluster(), WORKERS, explicit={"actor": {"slots": "0", "procs_per_slot": 0}})


def test_explicit_slot_errors_name_the_group_key():
    with pytest.raises(PlacementError, match=r"^placement.groups.env.slots: slot 9 on node0 does not exist"):
        make_plan(gpu_cluster(), WORKERS, explicit=explicit(env="9"))
    with pytest.raises(PlacementError, match=r"^placement.groups.rollout.slots: empty slot expression$"):
        make_plan(gpu_cluster(), WORKERS, explicit={"rollout": {"procs_per_slot": 1}})


def test_oversubscription_is_refused_unless_allowed():
    layout = {"actor": {"slots": "0", "procs_per_slot": 4}, "env": {"slots": "0"}, "rollout": {"slots": "1"}}
    with pytest.raises(PlacementError) as info:
        make_plan(cpu_cluster(), WORKERS, explicit=layout)
    assert str(info.value) == (
        "placement: 5 processes on slot node0:0 (more than 4); set placement.oversubscribe=true to allow"
    )
    plan = make_plan(cpu_cluster(), WORKERS, explicit=layout, oversubscribe=True)
    assert plan.processes_per_slot() == {Slot(0, 0): 5, Slot(0, 1): 1}
    # the limit itself is allowed
    plan = make_plan(cpu_cluster(), WORKERS, explicit={**layout, "actor": {"slots": "0", "procs_per_slot": 3}})
    assert plan.processes_per_slot()[Slot(0, 0)] == 4


def test_preset_oversubscription_is_refused_too():
    with pytest.raises(PlacementError, match=r"^placement: 6 processes on slot node0:0 \(more than 4\)"):
        make_plan(cpu_cluster(), {"env": 1, "rollout": 1, "actor": 8})


# --------------------------------------------------------------------------- bad groups and modes
def test_unknown_group_names_key_and_lists_known_groups():
    with pytest.raises(PlacementError) as info:
        make_plan(gpu_cluster(), WORKERS, explicit=explicit(bogus="0"))
    assert str(info.value) == "placement.groups.bogus: unknown worker group (known: actor, env, rollout)"


def test_auto_mode_is_not_a_layout_of_make_plan():
    # 'auto' is resolved by the runner's planner into concrete layouts; make_plan lays out those
    with pytest.raises(PlacementError) as info:
        make_plan(gpu_cluster(), WORKERS, mode="auto")
    msg = str(info.value)
    assert msg.startswith("placement.mode: 'auto' is chosen by the runner's planner")
    assert msg.endswith("pass one of collocated, disaggregated, hybrid")


def test_unknown_mode_and_empty_group_are_refused():
    with pytest.raises(PlacementError, match=r"^placement.mode: unknown mode 'pipelined' \(expected one of collocated, disaggregated, hybrid\)$"):
        make_plan(gpu_cluster(), WORKERS, mode="pipelined")
    with pytest.raises(PlacementError, match=r"^env.num_workers: must be >= 1, got 0$"):
        make_plan(gpu_cluster(), {"env": 0, "rollout": 1, "actor": 1})


def test_cluster_without_slots_is_refused():
    empty = Cluster(nodes=[NodeInfo(0, "n", "x", 0, 0)])
    with pytest.raises(PlacementError, match=r"^placement: the cluster has no cpu slots$"):
        make_plan(empty, {"env": 1, "rollout": 1, "actor": 1})


# --------------------------------------------------------------------------- a real 2-node x 4-GPU Ray cluster
class Where(Worker):
    """Reports where a worker runs, as its context and the host process see it."""

    def __init__(self, tag: str):
        self.tag = tag

    def where(self) -> tuple:
        ctx = self._ctx
        return (
            self.tag,
            self.rank,
            self.world_size,
            str(ctx.slot),
            ctx.slot_kind,
            ray.get_runtime_context().get_node_id(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            os.getpid(),
        )


def _free_ports() -> dict:
    """Fixed agent ports per node: with port 0 the raylet waits (about 15 s) for each agent to
    publish the port it picked, which a loaded 2-core machine does not always make."""
    socks = [socket.socket() for _ in range(4)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    p = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return dict(metrics_agent_port=p[0], metrics_export_port=p[1], dashboard_agent_listen_port=p[2],
                runtime_env_agent_port=p[3])


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    from ray.cluster_utils import Cluster as RayTestCluster

    if ray.is_initialized():
        ray.shutdown()
    rc = RayTestCluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 4, "include_dashboard": False, **_free_ports()},
    )
    try:
        rc.add_node(num_cpus=2, num_gpus=4, **_free_ports())
        rc.wait_for_nodes()
        cluster = Cluster.start(address=rc.address)
        yield cluster
        cluster.shutdown()
    finally:
        ray.shutdown()
        rc.shutdown()


def test_real_cluster_inventory(fake_gpu_cluster):
    c = fake_gpu_cluster
    assert not c.started_here  # attached: never shuts that cluster down
    assert c.num_nodes == 2
    assert c.slot_kind == "gpu"
    assert [n.num_gpus for n in c.nodes] == [4, 4]
    assert c.num_slots == 8
    assert len({n.node_id for n in c.nodes}) == 2
    # node0 is the head node, and indices are stable between inventories
    head = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("node:__internal_head__")]
    assert c.nodes[0].node_id == head[0]
    assert [n.node_id for n in Cluster.start(address="auto").nodes] == [n.node_id for n in c.nodes]


def test_channels_use_the_object_store_across_nodes(fake_gpu_cluster):
    from rlweave.channel import Channel

    ch = Channel.create("two-node-auto")  # transport="auto": shared memory needs one node
    try:
        assert ch.transport == "object_store"
        ch.put(np.ones(1 << 20, np.uint8))
        assert ch.stats()["puts_by_ref"] == 1 and ch.get(timeout=30).sum() == 1 << 20
    finally:
        ch.close()
    with pytest.raises(ValueError, match=r"channel 'two-node-shm': transport='shm' needs one node and Linux shared memory; the Ray cluster has 2 nodes"):
        Channel.create("two-node-shm", transport="shm")


# Four groups started once: "a" and "b" on identical slots, "c" disjoint from "a" (same nodes,
# other devices), "d" overlapping "a" on one slot. Pairs of them are the three modes.
LAYOUT = {"a": "node0:1,node1:2", "b": "node0:1,node1:2", "c": "node0:0,node1:0", "d": "node0:0-1"}


@pytest.fixture(scope="module")
def placed(fake_gpu_cluster):
    c = fake_gpu_cluster
    plan = make_plan(c, {name: 1 for name in LAYOUT}, explicit=explicit(**LAYOUT))
    groups = {name: WorkerGroup(Where, plan.groups[name], c, args=(name,)) for name in LAYOUT}
    yield groups
    for g in groups.values():
        g.shutdown()


def _devices(group: WorkerGroup) -> set[tuple[str, str]]:
    return set(zip(group.host_info("node_id"), group.host_info("environ", "CUDA_VISIBLE_DEVICES")))


def test_explicit_slots_land_on_the_named_nodes_and_devices(fake_gpu_cluster, placed):
    c = fake_gpu_cluster
    g = placed["a"]
    assert g.world_size == 2
    assert g.host_info("node_id") == [c.nodes[0].node_id, c.nodes[1].node_id]
    assert g.host_info("environ", "CUDA_VISIBLE_DEVICES") == ["1", "2"]
    inside = g.run("where")
    assert [w[:7] for w in inside] == [
        ("a", 0, 2, "node0:1", "gpu", c.nodes[0].node_id, "1"),
        ("a", 1, 2, "node1:2", "gpu", c.nodes[1].node_id, "2"),
    ]
    # node has 2 CPUs for 4 GPUs: one thread per process
    assert g.host_info("environ", "OMP_NUM_THREADS") == ["1", "1"]
    # two malloc arenas per worker process, blocks under 64 MB from the heap and 128 MB of it kept
    # (unless the driver's environment says otherwise)
    for key, value in {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "134217728"}.items():
        assert g.host_info("environ", key) == [os.environ.get(key, value)] * 2, key
    d = placed["d"]
    assert d.host_info("node_id") == [c.nodes[0].node_id] * 2
    assert d.host_info("environ", "CUDA_VISIBLE_DEVICES") == ["0", "1"]


@pytest.mark.parametrize("other, mode", [("b", "collocated"), ("c", "disaggregated"), ("d", "hybrid")])
def test_modes_on_real_cluster(fake_gpu_cluster, placed, other, mode):
    c = fake_gpu_cluster
    plan = make_plan(c, {"a": 1, other: 1}, explicit=explicit(a=LAYOUT["a"], **{other: LAYOUT[other]}))
    assert plan.mode == mode
    a, b = _devices(placed["a"]), _devices(placed[other])
    n0, n1 = c.nodes[0].node_id, c.nodes[1].node_id
    assert a == {(n0, "1"), (n1, "2")}
    if mode == "collocated":
        assert b == a
    elif mode == "disaggregated":
        assert b == {(n0, "0"), (n1, "0")}
        assert not (a & b)
        # same nodes, different devices: disjointness is about (node, device) slots
        assert {n for n, _ in a} == {n for n, _ in b} == {n0, n1}
    else:
        assert b == {(n0, "0"), (n0, "1")}
        assert a & b == {(n0, "1")}
    # groups that are not told to colocate get their own processes, even on identical slots
    assert not set(placed["a"].host_info("pid")) & set(placed[other].host_info("pid"))


# --------------------------------------------------------------------------- a language-model workflow on it
LLM_TINY = ["model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64", "model.vocab_size=300",
            "run.progress=false", "run.tensorboard=false", "task.eval_prompts=8", "init.sft_recipe=null",
            "rollout.prompts_per_iteration=4", "algorithm.group_size=4", "rollout.max_new_tokens=4",
            "train.total_iterations=2", "train.eval_every=1", "cluster.address=auto"]


def test_llm_rollout_and_actor_collocated_or_disaggregated_on_gpu_slots(fake_gpu_cluster, tmp_path):
    """grpo-arith (tiny) with the rollout on the actor's GPU slot, then on another node's: where
    the processes land, and that the same seed logs the same values under both layouts."""
    pytest.importorskip("transformers")
    from rlweave.config import load_config
    from rlweave.runners.llm import LLMRunner
    from rlweave.utils.metrics import read_metrics

    c = fake_gpu_cluster
    logs = {}
    for rollout_slot, mode in (("node0:1", "collocated"), ("node1:2", "disaggregated")):
        cfg = load_config("grpo-arith", LLM_TINY + ["placement.groups.actor.slots=node0:1", f"placement.groups.rollout.slots={rollout_slot}"])
        runner = LLMRunner(cfg, tmp_path / mode)
        seen = {}

        def look(r, record):
            for name, g in (("actor", r.actor), ("rollout", r.rollout)):
                seen[name] = (g.host_info("pid"), g.host_info("node_id"), g.host_info("environ", "CUDA_VISIBLE_DEVICES"))

        runner.run(on_iteration=look)
        assert runner.plan.mode == mode
        assert seen["actor"][1:] == ([c.nodes[0].node_id], ["1"])
        if mode == "collocated":  # the rollout engine lives in the actor's process: weight sync is in-process
            assert seen["rollout"] == seen["actor"]
        else:
            assert seen["rollout"][1:] == ([c.nodes[1].node_id], ["2"])
            assert seen["rollout"][0] != seen["actor"][0]
        logs[mode] = read_metrics(tmp_path / mode)
        assert [r["iteration"] for r in logs[mode]] == [0, 1, 2]
    drop = ("time/", "throughput/", "wall_time", "peak_rss")
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rs]  # noqa: E731
    assert strip(logs["collocated"]) == strip(logs["disaggregated"])  # the same seed learns the same thing
