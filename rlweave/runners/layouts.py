"""``placement.mode=auto`` by measurement, for the runners without a stage cost model.

The embodied on-policy runner predicts plans from a fitted pipeline model (:mod:`rlweave.flow`).
The language-model and off-policy runners have few sensible layouts and stages whose cost a short
profile does not extrapolate well (generation length, replay warm-up), so they try each candidate:
a layout runs ``settle`` iterations that are not timed (its start-up), then one that is; after the
last candidate the run moves to the fastest measured and stays there. A switch happens at an
iteration boundary and carries the run's whole state (the runner's checkpoint parts), so no sample
or update is lost or repeated.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rlweave.cluster import Cluster, make_plan

__all__ = ["LayoutTrials", "llm_layout_candidates"]


class LayoutTrials:
    """The candidate layouts of one run and what each measured.

    ``candidates``: ``(label, plan)`` pairs, tried in order; the first is the starting layout.
    ``settle``: untimed iterations per layout before its timed one."""

    def __init__(self, candidates: Sequence[tuple[str, Any]], settle: int = 1):
        if not candidates:
            raise ValueError("placement.mode=auto needs at least one candidate layout")
        self.candidates = list(candidates)
        self.settle = int(settle)
        self.times: list[list[float]] = [[] for _ in self.candidates]
        self.index = 0
        self.chosen = len(self.candidates) == 1

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.candidates]

    @property
    def label(self) -> str:
        return self.candidates[self.index][0]

    @property
    def plan(self):
        return self.candidates[self.index][1]

    def observe(self, seconds: float) -> int | None:
        """Records an iteration of the current layout; returns the layout to switch to now, if any."""
        if self.chosen:
            return None
        times = self.times[self.index]
        times.append(float(seconds))
        if len(times) <= self.settle:
            return None
        nxt = self.index + 1
        if nxt >= len(self.candidates):
            nxt = int(np.argmin([t[-1] for t in self.times]))
            self.chosen = True
            table = ", ".join(f"{label} {t[-1]:.3f} s" for label, t in zip(self.labels, self.times))
            print(f"[rlweave] placement auto: measured {table}; chose {self.candidates[nxt][0]}")
        return nxt if nxt != self.index else None


def llm_layout_candidates(cluster: Cluster, oversubscribe: bool = False) -> list[tuple[str, object]]:
    """The layouts ``placement.mode=auto`` measures for a language-model run: actor and rollout in
    one process with every slot's threads; one process per slot, each an actor rank (replicated)
    with a rollout engine; and rollout and actor on separate halves of the slots."""
    slots = cluster.num_slots
    threads = slots if cluster.slot_kind == "cpu" else None
    span = lambda a, b: ",".join(str(i) for i in range(a, b))  # noqa: E731
    layouts = [("one process", {"actor": {"slots": "0", "threads": threads}, "rollout": {"slots": "0", "threads": threads}})]
    if slots > 1:
        layouts.append((f"{slots} replicated ranks", {"actor": {"slots": span(0, slots)}, "rollout": {"slots": span(0, slots)}}))
        layouts.append(("disaggregated", {"rollout": {"slots": span(0, slots // 2)}, "actor": {"slots": span(slots // 2, slots)}}))
    return [(label, make_plan(cluster, {"rollout": 1, "actor": 1}, "collocated", explicit, oversubscribe))
            for label, explicit in layouts]
