"""Cluster layer: Ray attachment, placement grammar, worker groups."""

from rlweave.cluster.cluster import Cluster, NodeInfo
from rlweave.cluster.placement import GroupPlacement, Plan, PlacementError, Slot, derive_mode, make_plan, parse_slots
from rlweave.cluster.worker import Handle, Peer, Worker, WorkerContext, WorkerError, WorkerGroup, local_worker, wait_all

__all__ = [
    "Cluster", "NodeInfo", "GroupPlacement", "Plan", "PlacementError", "Slot", "derive_mode", "make_plan",
    "parse_slots", "Handle", "Peer", "local_worker", "Worker", "WorkerContext", "WorkerError", "WorkerGroup", "wait_all",
]
