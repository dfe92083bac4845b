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

__all__ = ["LayoutTrials"]


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
