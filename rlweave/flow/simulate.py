"""Predicts how long one collection takes under a plan, by simulating the request pipeline.

The model is deliberately small (it is fitted from a couple of iterations): each *process* is one
server that runs one task at a time (fused env and rollout workers share their process; on GPU
slots the rollout workers of one GPU share it); an env worker is a sequential program that, for each decision
t and slice j in order, waits for slice j's reply, steps the slice (``env_cost(rows)``) and sends
the next request; a rollout worker answers requests in arrival order (``infer_cost(rows)``). A
request between processes costs ``remote_overhead`` seconds of work, split between the two
servers; a fused (same-process) request costs ``local_overhead``. The result is the makespan, and
never less than the total work divided by the physical cores (more processes than cores share them).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from rlweave.flow.plan import FlowPlan


@dataclass
class LinearCost:
    """Seconds as a function of rows: ``fixed + per_row * rows``, fitted by least squares."""

    fixed: float = 0.0
    per_row: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def __call__(self, rows: float) -> float:
        return max(0.0, self.fixed + self.per_row * rows)

    def add(self, rows: float, seconds: float) -> None:
        self.samples.append((float(rows), float(seconds)))
        self.samples = self.samples[-64:]
        self._fit()

    def _fit(self) -> None:
        xs = [x for x, _ in self.samples]
        ys = [y for _, y in self.samples]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx < 1e-9:  # one batch size seen: all of the cost is per row
            self.fixed, self.per_row = 0.0, my / mx if mx else 0.0
            return
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        slope = max(slope, 0.0)
        self.per_row, self.fixed = slope, max(0.0, my - slope * mx)

    @property
    def known(self) -> bool:
        return bool(self.samples)

    def as_dict(self) -> dict:
        return {"fixed_s": self.fixed, "per_row_s": self.per_row, "samples": len(self.samples)}


@dataclass
class StageCosts:
    """The fitted costs the simulation runs on: env stepping and inference as functions of rows,
    the price of a request across processes, and the cores the processes share."""
    env: LinearCost = field(default_factory=LinearCost)  # one env worker stepping `rows` envs once
    infer: LinearCost = field(default_factory=LinearCost)  # one request of `rows` observations
    remote_overhead: float | None = None  # seconds per cross-process request (None: not measured)
    local_overhead: float = 0.0
    cores: int = 1  # physical cores the processes share (CPU clusters)
    gpu_slots: bool = False  # rollout workers on the same slot share one device


def simulate_collection(plan: FlowPlan, costs: StageCosts, total_envs: int, steps: int) -> float:
    """Seconds for every env worker to take ``steps`` decisions under ``plan``."""
    E, R, k = plan.num_env, plan.num_rollout, plan.micro_batches
    rows = total_envs // E // k
    t_env, t_inf = costs.env(rows), costs.infer(rows)
    over = costs.local_overhead if plan.fused else (costs.remote_overhead or 0.0)
    if plan.fused:
        env_server = roll_server = [("process", e) for e in range(E)]
    else:
        env_server = [("env", e) for e in range(E)]
        roll_server = [("gpu", s) if costs.gpu_slots else ("rollout", r) for r, s in enumerate(plan.rollout_slots)]
    free: dict = {}
    worker_free = [0.0] * E
    pos = [(0, 0)] * E  # next (t, j) each env worker steps
    arrived: list[dict] = [{} for _ in range(E)]  # (t, j) -> reply time
    events: list[tuple[float, int, str, int, int, int]] = []
    seq = 0

    def push(time: float, kind: str, e: int, t: int, j: int) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, e, t, j))
        seq += 1

    for e in range(E):
        for j in range(k):
            push(0.0, "req", e, 0, j)
    end = 0.0
    while events:
        time, _, kind, e, t, j = heapq.heappop(events)
        if kind == "req":
            srv = roll_server[e % R]
            start = max(time, free.get(srv, 0.0))
            free[srv] = start + t_inf + over / 2
            push(free[srv], "reply", e, t, j)
            continue
        arrived[e][(t, j)] = time
        # the env worker steps its slices in program order, as soon as each reply is there
        while pos[e] in arrived[e]:
            pt, pj = pos[e]
            srv = env_server[e]
            start = max(arrived[e].pop(pos[e]), worker_free[e], free.get(srv, 0.0))
            finish = start + t_env + over / 2
            free[srv] = worker_free[e] = finish
            end = max(end, finish)
            if pt + 1 < steps:
                push(finish, "req", e, pt + 1, pj)
            pos[e] = (pt + (pj + 1) // k, (pj + 1) % k)
    work = steps * k * E * (t_env + t_inf + over)
    return max(end, work / max(1, costs.cores))
