"""Building an iteration's metrics record: a stage clock and per-rank reducers, shared by every
runner so that an iteration function reads as its workflow and not as bookkeeping.

Conventions (one for every runner): stage times are ``time/<stage>`` (seconds, measured in the
driver around the group call, or inside the slowest rank where a worker reports it),
``time/iteration`` the whole iteration; a worker reports its own figures under the keys the record
uses (``train/*``, ``time/*``, ``peak_rss_mb``), and the runner reduces them over ranks with
:func:`worst` (times, memory), :func:`mean_of` (losses, statistics) or :func:`total` (counts).
"""

from __future__ import annotations

import numbers
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

__all__ = ["StageClock", "mean_of", "prefixed_means", "total", "update_only_record", "worst"]


class StageClock:
    """Times the stages of one iteration: ``with clock.stage("update"):`` records
    ``time/update``; :meth:`record` adds ``time/iteration`` since the clock started."""

    def __init__(self, trace=None, lane: str = "driver"):
        self.start = time.perf_counter()
        self.times: dict[str, float] = {}
        self._trace, self._lane = trace, lane

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time/{name}"] = time.perf_counter() - t0
            if self._trace is not None:
                self._trace.span(self._lane, name, t0, self.times[f"time/{name}"])

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self) -> dict:
        return {**self.times, "time/iteration": self.elapsed()}


def worst(outs: Sequence[dict], key: str) -> float:
    """The largest value of ``key`` over ranks: a stage ends when its slowest rank does."""
    return max(o[key] for o in outs)


def mean_of(outs: Sequence[dict], key: str) -> float:
    return float(np.mean([o[key] for o in outs]))


def total(outs: Sequence[dict], key: str) -> float:
    return sum(o[key] for o in outs)


def prefixed_means(outs: Sequence[dict], prefix: str) -> dict:
    """The mean over ranks of every numeric entry whose key starts with ``prefix``."""
    return {k: mean_of(outs, k) for k, v in outs[0].items() if k.startswith(prefix) and isinstance(v, (numbers.Real, np.generic))}


def update_only_record(iteration: int, act_out: dict, updates: int, seconds: float) -> dict:
    """The metrics record of an iteration made of gradient updates alone (offline RL, supervised
    fine-tuning of a policy): the learner's ``train/*`` terms, the update rate and its memory."""
    record: dict = {"iteration": iteration, "env_steps": 0, "wall_time": None}
    record.update({k: v for k, v in act_out.items() if k.startswith("train/")})
    record["samples/updates"] = updates
    record["time/actor"] = act_out["time/actor_train"]
    record["time/iteration"] = seconds
    record["perf/updates_per_s"] = updates / seconds
    record["mem/actor_peak_rss_mb"] = act_out["peak_rss_mb"]
    return record

