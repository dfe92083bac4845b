"""The replay shard worker: a :class:`~rlweave.data.replay.ReplayBuffer` fed from the transition
channel, serving sampled batches to its actor rank."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlweave.cluster import Worker
from rlweave.data.replay import ReplayBuffer
from rlweave.cluster.dispatch import group_method
from rlweave.workers.channels import ChannelSpec

__all__ = ["ReplayBufferWorker"]


class ReplayBufferWorker(Worker):
    """A replay shard as a worker: takes the env workers' transitions from the transition channel
    (exactly the items the driver says are due, in env-rank order, so a run is reproducible), and
    serves sampled batches to its actor rank. It is usually placed in the actor's own process
    (``colocate_with``), where a sample is a function call."""

    def __init__(self, capacity: int, seed: int, channel: ChannelSpec | None, mix: dict[str, float] | None = None,
                 transient: tuple[str, ...] = ()):
        self.buffer = ReplayBuffer(capacity, seed=seed * 7919 + self.rank, mix=mix, transient=transient)
        self.channel = channel.open() if channel is not None else None
        self.staged: list[dict] = []  # taken from the channel for a checkpoint, not yet ingested

    def _take(self, count: int, timeout: float) -> list[dict]:
        """``count`` transition items: the staged ones first, then from the channel."""
        items, self.staged = self.staged[:count], self.staged[count:]
        if count > len(items):
            envelopes = self.channel.get_batch_envelopes(float(count - len(items)), key=self.rank, timeout=timeout)
            items += [e.item for e in envelopes]
        return items

    @group_method("all")
    def stage(self, count: int, timeout: float = 600.0) -> int:
        """Makes sure ``count`` transition items are staged: taken out of the channel into this
        shard's checkpointed state *without* being ingested. A checkpoint then holds every
        collected transition, and the next ``ingest`` sees exactly what it would have seen without
        the checkpoint (the same items, counted and staleness-checked then)."""
        need = count - len(self.staged)
        if need > 0:
            self.staged += [e.item for e in self.channel.get_batch_envelopes(float(need), key=self.rank, timeout=timeout)]
        return len(self.staged)

    def ingest(self, count: int, timeout: float = 600.0) -> dict:
        """Moves ``count`` transition batches addressed to this rank (staged ones first, then from
        the channel) into the online ring. Returns how many transitions came in and the policy
        versions they carry."""
        if count <= 0:
            return {"transitions": 0, "versions": []}
        items = sorted(self._take(count, timeout), key=lambda it: int(it["env_rank"]))
        n = 0
        versions: list[int] = []
        for it in items:
            batch = it["transitions"]
            if batch is None:
                continue
            self.buffer.add(batch, "online")
            n += len(batch["reward"])
            versions += np.unique(batch["policy_version"]).tolist()
        return {"transitions": n, "versions": sorted(set(versions))}

    @group_method("all")
    def add(self, batch: dict[str, np.ndarray], source: str = "online", capacity: int | None = None) -> int:
        self.buffer.add(batch, source, capacity)
        return self.buffer.size(source)

    def sample(self, batch_size: int, num_batches: int = 1) -> dict[str, np.ndarray]:
        return self.buffer.sample(batch_size, num_batches)

    def size(self, source: str | None = None) -> int:
        return self.buffer.size(source)

    @group_method("all")
    def state_dict(self) -> dict[str, Any]:
        return {**self.buffer.state_dict(), "staged": list(self.staged)}

    @group_method("per_rank")
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)
        self.staged = list(state.get("staged", []))
