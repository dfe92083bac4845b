"""Cluster layer: Ray attachment, placement grammar, worker groups."""

from rlweave.cluster.cluster import Cluster, NodeInfo
from rlweave.cluster.placement import GroupPlacement, Plan, PlacementError, Slot, derive_mode, make_plan, parse_slots
from rlweave.cluster.errors import WorkerError
from rlweave.cluster.group import WorkerGroup
from rlweave.cluster.handle import Handle, wait_all
from rlweave.cluster.peer import Peer
from rlweave.cluster.worker import Worker, WorkerContext, local_worker

__all__ = [
    "Cluster", "NodeInfo", "GroupPlacement", "Plan", "PlacementError", "Slot", "derive_mode", "make_plan",
    "parse_slots", "Handle", "Peer", "local_worker", "Worker", "WorkerContext", "WorkerError", "WorkerGroup", "wait_all",
]
