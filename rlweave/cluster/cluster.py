"""Cluster: start an embedded Ray or attach to an existing one, and take an inventory.

The inventory is what placement is validated against: each node has a number of *device slots*.
Where a node has GPUs, its slots are its GPUs; otherwise its slots are its CPUs. Tests declare
fake GPUs by giving nodes a ``GPU`` resource (``ray.cluster_utils.Cluster().add_node(num_gpus=4)``):
Ray does not check the hardware behind a declared resource, so placement code sees GPUs.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass, field

import ray

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node as placement sees it."""

    index: int
    node_id: str
    address: str
    num_cpus: int
    num_gpus: int

    @property
    def slot_kind(self) -> str:
        return "gpu" if self.num_gpus > 0 else "cpu"

    @property
    def num_slots(self) -> int:
        return self.num_gpus if self.num_gpus > 0 else self.num_cpus


@dataclass
class Cluster:
    """Handle on the Ray cluster a run uses.

    ``Cluster.start(address=None)`` starts an embedded Ray sized to this machine (dashboard off);
    with an address it attaches to a running cluster and never shuts it down. ``local=True`` gives
    a cluster object without Ray at all: one node, one process, for the debug mode in which worker
    code runs in the driver (so ``breakpoint()`` works).
    """

    nodes: list[NodeInfo] = field(default_factory=list)
    started_here: bool = False
    local: bool = False
    # How a worker calls a worker of another group in another process of its node (Peer):
    # "direct" over a Unix socket (rlweave.utils.direct), or "ray" (an actor call).
    peer_calls: str = "direct"

    # ------------------------------------------------------------------ construction
    @classmethod
    def start(
        cls,
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        dashboard: bool = False,
        local: bool = False,
        namespace: str = "rlweave",
        peer_calls: str = "direct",
    ) -> "Cluster":
        if peer_calls not in ("direct", "ray"):
            raise ValueError(f"cluster.peer_calls must be 'direct' or 'ray', got {peer_calls!r}")
        if local:
            cpus = num_cpus or os.cpu_count() or 1
            node = NodeInfo(0, "local", "127.0.0.1", cpus, num_gpus or 0)
            return cls(nodes=[node], started_here=False, local=True)
        started_here = False
        if not ray.is_initialized():
            kwargs: dict = dict(
                include_dashboard=dashboard,
                namespace=namespace,
                log_to_driver=True,
                configure_logging=True,
                logging_level=logging.WARNING,
            )
            if address:
                ray.init(address=address, **kwargs)
            else:
                # Silence Ray's own metrics exporter and usage stats: nothing outside is reachable.
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                # address="local": always a new embedded Ray, never a cluster that another program
                # on this machine happened to start with `ray start`.
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, **kwargs)
                started_here = True
                atexit.register(_shutdown_if_initialized)
        return cls(nodes=_read_nodes(), started_here=started_here, peer_calls=peer_calls)

    # ------------------------------------------------------------------ inventory
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_cpus(self) -> int:
        return sum(n.num_cpus for n in self.nodes)

    @property
    def num_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    @property
    def slot_kind(self) -> str:
        """``gpu`` when any node has GPUs: then CPU-only nodes hold no device slots."""
        return "gpu" if self.num_gpus > 0 else "cpu"

    def slots_on(self, node_index: int) -> int:
        node = self.nodes[node_index]
        return node.num_gpus if self.slot_kind == "gpu" else node.num_cpus

    def slots(self) -> list:
        """Every device slot, node by node, in index order."""
        from rlweave.cluster.placement import Slot

        return [Slot(n, i) for n in range(self.num_nodes) for i in range(self.slots_on(n))]

    @property
    def num_slots(self) -> int:
        return sum(self.slots_on(i) for i in range(self.num_nodes))

    def describe(self) -> str:
        kind = self.slot_kind
        parts = [f"node{n.index}: {n.num_cpus} CPU, {n.num_gpus} GPU" for n in self.nodes]
        planned = bool(self.nodes) and self.nodes[0].node_id == "planned"
        mode = "local (no Ray)" if self.local else ("embedded Ray" if self.started_here else ("embedded Ray (planned)" if planned else "Ray cluster"))
        return f"{mode}, {self.num_nodes} node(s), {self.num_slots} {kind} slot(s) [{'; '.join(parts)}]"

    @classmethod
    def planned(cls, num_cpus: int | None = None, num_gpus: int | None = None) -> "Cluster":
        """The inventory an embedded Ray *will* have, so placement can be checked before starting."""
        gpus = num_gpus
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(nodes=[NodeInfo(0, "planned", "127.0.0.1", num_cpus or os.cpu_count() or 1, gpus)])

    def shutdown(self) -> None:
        """Stops Ray if this process started it; an attached cluster is left running."""
        if self.started_here and ray.is_initialized():
            ray.shutdown()
        self.started_here = False


def _read_nodes() -> list[NodeInfo]:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    # Head node first, then the others in a stable order, so node indices mean the same thing on
    # every call.
    alive.sort(key=lambda n: (not n.get("Resources", {}).get("node:__internal_head__", 0), n["NodeID"]))
    nodes = []
    for i, n in enumerate(alive):
        res = n.get("Resources", {})
        nodes.append(
            NodeInfo(
                index=i,
                node_id=n["NodeID"],
                address=n.get("NodeManagerAddress", ""),
                num_cpus=int(res.get("CPU", 0)),
                num_gpus=int(res.get("GPU", 0)),
            )
        )
    return nodes


def _shutdown_if_initialized() -> None:
    if ray.is_initialized():
        ray.shutdown()
