"""Placement: which device slots each worker group uses, in one grammar for all three modes.

A group's placement is a list of slots, one entry per worker process (a slot listed twice holds two
processes). It is written in the config as a slot expression and a processes-per-slot count::

    placement:
      groups:
        env:     {slots: "0-1"}                    # slots 0 and 1 of node 0
        rollout: {slots: "0-1"}
        actor:   {slots: "node0:0,node1:0-3", procs_per_slot: 1}
        learner: {slots: "0", threads: 2}             # torch threads per process (default: 1 per CPU slot)

Slot expression: comma-separated items ``[nodeN:]A[-B]`` or ``all``; slots are a node's GPUs when
the cluster has GPUs, else its CPUs. The *mode* is derived, never declared twice: identical slot
sets for every group = collocated, pairwise disjoint = disaggregated, anything else = hybrid. When a
group has no explicit slots, the ``mode`` preset lays it out from the groups' worker counts.
Every error is one line that names the config key, raised before any actor starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlweave.cluster.cluster import Cluster

MODES = ("collocated", "disaggregated", "hybrid")


class PlacementError(ValueError):
    """A placement that cannot run; the message names the config key."""


@dataclass(frozen=True, order=True)
class Slot:
    node: int
    index: int

    def __str__(self) -> str:
        return f"node{self.node}:{self.index}"


@dataclass
class GroupPlacement:
    name: str
    slots: list[Slot]  # one per worker process, rank order
    threads: int | None = None  # torch threads per process; None = the slot's share of cores

    @property
    def num_workers(self) -> int:
        return len(self.slots)

    @property
    def slot_set(self) -> frozenset[Slot]:
        return frozenset(self.slots)

    def processes_on(self, slot: Slot) -> int:
        return sum(1 for s in self.slots if s == slot)


@dataclass
class Plan:
    """The physical layout of every group, and the mode it amounts to."""

    groups: dict[str, GroupPlacement]
    slot_kind: str
    mode: str = field(init=False)

    def __post_init__(self) -> None:
        self.mode = derive_mode([g.slot_set for g in self.groups.values()])

    def processes_per_slot(self) -> dict[Slot, int]:
        count: dict[Slot, int] = {}
        for g in self.groups.values():
            for s in g.slots:
                count[s] = count.get(s, 0) + 1
        return count

    def describe(self) -> str:
        parts = []
        for g in self.groups.values():
            parts.append(f"{g.name}[{g.num_workers}]@{_compact(g.slots)}")
        return f"placement {self.mode} ({self.slot_kind} slots): " + "  ".join(parts)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "slot_kind": self.slot_kind,
            "groups": {g.name: [str(s) for s in g.slots] for g in self.groups.values()},
        }


def derive_mode(sets: list[frozenset]) -> str:
    if len(sets) <= 1 or all(s == sets[0] for s in sets):
        return "collocated"
    if all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :]):
        return "disaggregated"
    return "hybrid"


_ITEM = re.compile(r"^(?:node(\d+):)?(\d+)(?:-(\d+))?$")


def parse_slots(expr: str, cluster: Cluster, key: str) -> list[Slot]:
    """Parses a slot expression into distinct slots, checking each exists in ``cluster``."""
    expr = str(expr).strip()
    if not expr:
        raise PlacementError(f"{key}: empty slot expression")
    if expr == "all":
        return cluster.slots()
    slots: list[Slot] = []
    for item in expr.split(","):
        item = item.strip()
        m = _ITEM.match(item)
        if not m:
            raise PlacementError(
                f"{key}: cannot parse '{item}' (expected [nodeN:]A[-B], e.g. '0-3' or 'node1:0-1', or 'all')"
            )
        node = int(m.group(1) or 0)
        lo = int(m.group(2))
        hi = int(m.group(3)) if m.group(3) is not None else lo
        if hi < lo:
            raise PlacementError(f"{key}: bad range '{item}' (end before start)")
        if node >= cluster.num_nodes:
            raise PlacementError(f"{key}: node{node} does not exist (cluster has {cluster.num_nodes} node(s))")
        have = cluster.slots_on(node)
        if hi >= have:
            raise PlacementError(
                f"{key}: slot {hi} on node{node} does not exist (node{node} has {have} {cluster.slot_kind} slot(s))"
            )
        for i in range(lo, hi + 1):
            s = Slot(node, i)
            if s in slots:
                raise PlacementError(f"{key}: slot {s} listed twice (use procs_per_slot for several processes)")
            slots.append(s)
    return slots


def make_plan(
    cluster: Cluster,
    workers: dict[str, int],
    mode: str = "collocated",
    explicit: dict[str, dict] | None = None,
    oversubscribe: bool = False,
    max_procs_per_slot: int = 4,
) -> Plan:
    """Lays out every group in ``workers`` (name -> worker count) on the cluster.

    ``explicit`` maps a group name to ``{"slots": expr, "procs_per_slot": k}``; groups it names use
    those slots (their worker count becomes ``len(slots) * k``), the others follow the preset.
    """
    explicit = dict(explicit or {})
    for name in explicit:
        if name not in workers:
            known = ", ".join(sorted(workers))
            raise PlacementError(f"placement.groups.{name}: unknown worker group (known: {known})")
    if mode not in MODES:
        if mode == "auto":
            raise PlacementError(
                "placement.mode: 'auto' is chosen by the runner's planner, not laid out here; "
                f"pass one of {', '.join(MODES)}"
            )
        raise PlacementError(f"placement.mode: unknown mode '{mode}' (expected one of {', '.join(MODES)})")
    for name, n in workers.items():
        if n < 1:
            raise PlacementError(f"{name}.num_workers: must be >= 1, got {n}")

    total = cluster.num_slots
    all_slots = cluster.slots()
    if total == 0:
        raise PlacementError(f"placement: the cluster has no {cluster.slot_kind} slots")
    groups: dict[str, GroupPlacement] = {}
    implicit = [g for g in workers if g not in explicit]

    if mode == "collocated":
        width = min(total, max(workers[g] for g in implicit)) if implicit else 0
        shared = all_slots[:width]
        for g in implicit:
            groups[g] = GroupPlacement(g, [shared[r % width] for r in range(workers[g])])
    elif mode == "disaggregated":
        need = sum(workers[g] for g in implicit)
        if need > total:
            detail = " + ".join(f"{g}({workers[g]})" for g in implicit)
            raise PlacementError(
                f"placement.mode: disaggregated needs {need} slots for {detail}, "
                f"the cluster has {total} {cluster.slot_kind} slot(s)"
            )
        start = 0
        for g in implicit:
            groups[g] = GroupPlacement(g, all_slots[start : start + workers[g]])
            start += workers[g]
    else:  # hybrid: the trainer spans every slot, the other groups split them between themselves
        trainer = "actor" if "actor" in implicit else (implicit[-1] if implicit else None)
        others = [g for g in implicit if g != trainer]
        if trainer is not None:
            groups[trainer] = GroupPlacement(trainer, [all_slots[r % total] for r in range(workers[trainer])])
        if others:
            if len(others) > total:
                raise PlacementError(
                    f"placement.mode: hybrid needs at least {len(others)} slots, cluster has {total}"
                )
            share = total // len(others)
            for k, g in enumerate(others):
                part = all_slots[k * share : (k + 1) * share]
                groups[g] = GroupPlacement(g, [part[r % len(part)] for r in range(workers[g])])

    for name, spec in explicit.items():
        key = f"placement.groups.{name}"
        slots = parse_slots(spec.get("slots", ""), cluster, f"{key}.slots")
        k = int(spec.get("procs_per_slot", 1))
        if k < 1:
            raise PlacementError(f"{key}.procs_per_slot: must be >= 1, got {k}")
        threads = spec.get("threads")
        if threads is not None and int(threads) < 1:
            raise PlacementError(f"{key}.threads: must be >= 1, got {threads}")
        groups[name] = GroupPlacement(name, [s for s in slots for _ in range(k)], None if threads is None else int(threads))

    plan = Plan(groups={g: groups[g] for g in workers}, slot_kind=cluster.slot_kind)
    if not oversubscribe:
        for slot, n in plan.processes_per_slot().items():
            if n > max_procs_per_slot:
                raise PlacementError(
                    f"placement: {n} processes on slot {slot} (more than {max_procs_per_slot}); "
                    "set placement.oversubscribe=true to allow"
                )
    return plan


def _compact(slots: list[Slot]) -> str:
    """Slots as text for the start-up line, elided in the middle when long."""
    text = [str(s) for s in slots]
    return f"{text[0]}..{text[-1]}" if len(text) > 6 else ",".join(text)
