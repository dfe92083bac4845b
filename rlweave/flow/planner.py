"""The planner: fits per-stage costs from measured iterations, predicts every candidate plan's
iteration time by simulation, picks the fastest, and says when measurements drift from the
prediction.

Profiling, in ``placement.mode=auto``: the run starts on the first of :meth:`Planner.profile_plans`
(fused on every slot the envs split over, one micro-batch: the data-parallel plan that keeps every
core busy without a cross-process request, so the profiling iteration is itself one of the fastest
plans), then runs the second (separate processes, two micro-batches: the price of a cross-process
request). From then on every iteration adds its measurements to the fit, so the costs keep up with
the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rlweave.flow.plan import FlowPlan, candidate_plans
from rlweave.flow.simulate import StageCosts, simulate_collection
from rlweave.cluster.placement import Slot


@dataclass
class Measurement:
    """What one iteration under ``plan`` measured (seconds)."""

    plan: FlowPlan
    collect: float  # wall time of the collection (env + rollout stages)
    env_compute: float  # per env worker: stepping envs (max over workers)
    infer_compute: float  # per env worker: inference time its requests took in the rollout (max)
    steps: int  # decisions per env worker
    train: float = 0.0
    sync: float = 0.0
    other: float = 0.0  # iteration time not in collect/train/sync (driver, logging)
    iteration: float = 0.0  # the whole iteration, as measured


@dataclass
class Prediction:
    """What the simulation predicts for one plan: collection seconds and the whole iteration's
    (collection plus the training, sync and driver time every plan shares)."""
    plan: FlowPlan
    collect: float
    iteration: float

    def as_dict(self) -> dict:
        return {"plan": self.plan.label(), "collect_s": self.collect, "iteration_s": self.iteration}


@dataclass
class Planner:
    """Chooses the execution plan from measurements: fits the stage costs from what the run (or an
    offline profile) measured, predicts every candidate plan by simulation, ranks them, and says when
    measurements drift from the prediction, so the layout follows the workload instead of flags."""
    slots: list[Slot]
    total_envs: int
    steps: int  # decisions per env per iteration
    cores: int
    max_micro_batches: int = 4
    env_multiple: int = 1  # env worker counts must be multiples of this (the actor's rank count)
    margin: float = 0.15
    min_gain: float = 0.0  # predicted gain over the best measured plan that earns an unmeasured plan a verifying iteration
    gpu_slots: bool = False
    costs: StageCosts = field(default_factory=StageCosts)
    train: float = 0.0
    sync_per_rollout: float = 0.0
    other: float = 0.0
    history: list[Measurement] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.costs.cores = self.cores
        self.costs.gpu_slots = self.gpu_slots

    # ---------------------------------------------------------------- profiling
    def profile_plans(self) -> list[FlowPlan]:
        """The plans the first iterations run to measure the costs: fused with k=1 on as many slots
        as the envs split over (a multiple of the actor's ranks), then env and rollout on separate
        slots with k=2 (when there are two slots and the envs split).

        Why fused data-parallel first, not fused on one slot: a profiling iteration is paid for at
        the speed of the plan it runs, and the one-slot plan leaves every other core idle (20 % slower
        iterations on two cores in ``rlweave bench flow``), while the data-parallel one is among the
        fastest plans wherever the stages replicate at equal cost."""
        e = self.env_multiple
        fused = max((n for n in range(e, len(self.slots) + 1, e) if self.total_envs % n == 0), default=e)
        dp = tuple(self.slots[:fused])
        env = tuple(self.slots[:e])
        plans = [FlowPlan(dp, dp, 1)]
        if len(self.slots) > e:
            k = 2 if (self.total_envs // e) % 2 == 0 else 1
            plans.append(FlowPlan(env, tuple(self.slots[e : e + 1]), k))
        return plans

    def observe(self, m: Measurement) -> None:
        """Adds one iteration's measurements to the cost fit."""
        self.history.append(m)
        p = m.plan
        rows = self.total_envs // p.num_env // p.micro_batches
        per_call = m.steps * p.micro_batches
        self.costs.env.add(rows, m.env_compute / per_call)
        self.costs.infer.add(rows, m.infer_compute / per_call)
        if p.num_env == 1 and p.micro_batches == 1:
            # one worker, strictly alternating: what the stages' own work leaves is the request price
            overhead = max(0.0, (m.collect - m.env_compute - m.infer_compute) / m.steps)
            if p.fused:
                self.costs.local_overhead = _blend(self.costs.local_overhead, overhead, len(self.history))
            else:
                self.costs.remote_overhead = _blend(self.costs.remote_overhead, overhead, len(self.history))
        elif not p.fused:
            self.costs.remote_overhead = _blend(self.costs.remote_overhead, self._calibrate_remote(m), len(self.history))
        self.train = m.train if not self.train else 0.5 * (self.train + m.train)
        self.sync_per_rollout = m.sync / p.num_rollout
        self.other = m.other if not self.other else 0.5 * (self.other + m.other)

    def _calibrate_remote(self, m: Measurement) -> float:
        """The cross-process request price that makes the simulation reproduce ``m`` (bisection)."""
        lo, hi = 0.0, max(1e-3, m.collect / m.steps)
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            self.costs.remote_overhead = mid
            if simulate_collection(m.plan, self.costs, self.total_envs, m.steps) < m.collect:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    @property
    def ready(self) -> bool:
        return self.costs.env.known and self.costs.infer.known

    # ---------------------------------------------------------------- prediction
    def predict(self, plan: FlowPlan) -> Prediction:
        collect = simulate_collection(plan, self.costs, self.total_envs, self.steps)
        iteration = collect + self.train + self.sync_per_rollout * plan.num_rollout + self.other
        return Prediction(plan, collect, iteration)

    def candidates(self) -> list[FlowPlan]:
        plans = [p for p in candidate_plans(self.slots, self.total_envs, self.max_micro_batches) if p.num_env % self.env_multiple == 0]
        if self.costs.remote_overhead is None:  # cross-process price unknown: only fused plans
            plans = [p for p in plans if p.fused]
        return plans

    def rank(self) -> list[Prediction]:
        """Every candidate's prediction, fastest first (ties: fewer processes, then fewer slices)."""
        preds = [self.predict(p) for p in self.candidates()]
        return sorted(preds, key=lambda x: (round(x.iteration, 4), x.plan.num_env + x.plan.num_rollout, x.plan.micro_batches))

    def best(self) -> Prediction:
        return self.rank()[0]

    def shortlist(self, size: int) -> list[Prediction]:
        """The fastest ``size`` predictions within ``margin`` of the fastest: the plans worth one
        measured iteration each before choosing (the model is small; a measurement settles what
        it cannot tell apart)."""
        ranked = self.rank()
        top = ranked[0].iteration
        return [p for p in ranked[: max(1, size)] if p.iteration <= top * (1 + self.margin)]

    def worth_verifying(self, candidate: Prediction) -> bool:
        """Whether an unmeasured plan deserves an iteration of its own: its prediction beats the
        prediction of the best plan measured so far (by :meth:`choose`'s cost) by more than
        ``min_gain``. Predictions are compared with predictions, so the model's bias on this
        workload cancels; a gain smaller than that is within the model's error and is not worth an
        iteration that, if the plan is in fact slower, is paid at its speed."""
        measured = [self.predict(p) for p in {m.plan for m in self.history} if self.measured_collect(p) is not None]
        if not measured:
            return True
        best = min(measured, key=lambda p: self.measured_collect(p.plan) + p.iteration - p.collect)
        return candidate.iteration < best.iteration * (1.0 - self.min_gain)

    def measured(self, plan: FlowPlan) -> float | None:
        """Median measured iteration time of ``plan`` in this run (None if never run)."""
        return _median([m.iteration for m in self.history if m.plan == plan and m.iteration > 0])

    def measured_collect(self, plan: FlowPlan) -> float | None:
        """Median measured collection time of ``plan`` in this run (None if never run)."""
        return _median([m.collect for m in self.history if m.plan == plan and m.collect > 0])

    def choose(self, size: int) -> Prediction:
        """Among the shortlist, the plan whose measured collection plus the shared rest of an
        iteration (training, sync per rollout worker, driver) is fastest; predicted where not
        measured. Plans differ only in how they collect, so their measured collections are what
        is compared: a whole iteration's time also carries the training pass's own swings (on this
        machine +-15% between single iterations, larger than the gap between the best plans),
        which would otherwise decide the choice by chance."""
        short = self.shortlist(size)

        def cost(p: Prediction) -> float:
            collect = self.measured_collect(p.plan)
            return p.iteration if collect is None else collect + p.iteration - p.collect

        return min(short, key=cost)

    def drifted(self, predicted: float, measured: float) -> bool:
        return abs(predicted - measured) > self.margin * measured

    def state_dict(self) -> dict:
        c = self.costs
        return {
            "env": c.env.samples, "infer": c.infer.samples, "remote_overhead": c.remote_overhead,
            "local_overhead": c.local_overhead, "train": self.train, "sync_per_rollout": self.sync_per_rollout,
            "other": self.other,
            "history": [{**{k: v for k, v in vars(m).items() if k != "plan"}, "plan": m.plan.as_tuple()} for m in self.history],
        }

    def load_state_dict(self, s: dict) -> None:
        self.history = [Measurement(**{**m, "plan": FlowPlan.from_tuple(m["plan"])}) for m in s.get("history", [])]
        for rows, sec in s["env"]:
            self.costs.env.add(rows, sec)
        for rows, sec in s["infer"]:
            self.costs.infer.add(rows, sec)
        self.costs.remote_overhead, self.costs.local_overhead = s["remote_overhead"], s["local_overhead"]
        self.train, self.sync_per_rollout, self.other = s["train"], s["sync_per_rollout"], s["other"]


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _blend(old: float | None, new: float, n: int) -> float:
    return new if old is None or n <= 1 else 0.5 * (old + new)


def physical_cores(cluster) -> int:
    """Cores the slots of ``cluster`` (a :class:`~rlweave.cluster.Cluster`) really share: the CPU
    slots, capped by the cores of this machine when Ray is embedded (a user may declare more
    logical CPUs than there are cores). The planner's ``cores``."""
    cores = sum(n.num_cpus for n in cluster.nodes) or 1
    if cluster.started_here or cluster.local:
        cores = min(cores, os.cpu_count() or cores)
    return int(cores)
