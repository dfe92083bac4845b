"""Flow plans: how the env -> rollout stage pair of an embodied workflow runs physically.

A :class:`FlowPlan` fixes the env workers' slots, the rollout workers' slots and the pipeline depth
``micro_batches`` (k: each env worker's envs are split into k slices that take turns, so stepping
one slice overlaps inference on another). The total number of envs is a property of the *logical*
workflow and never changes with the plan: E env workers hold ``total_envs / E`` envs each. When the
env and rollout slot lists are identical the two groups are fused into the same host processes
(requests are function calls, and the two stages take turns on the device); otherwise each request
is one Ray call to the rollout worker's process.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.cluster.placement import GroupPlacement, Slot, derive_mode


@dataclass(frozen=True)
class FlowPlan:
    """One physical layout of the env -> rollout stream: the env workers' slots, the rollout
    workers' slots and the pipeline depth (micro-batches per env worker). The logical workflow is
    fixed; a plan only says where its stages run and how they overlap, which is what the planner
    compares and switches between."""
    env_slots: tuple[Slot, ...]
    rollout_slots: tuple[Slot, ...]
    micro_batches: int = 1

    @property
    def num_env(self) -> int:
        return len(self.env_slots)

    @property
    def num_rollout(self) -> int:
        return len(self.rollout_slots)

    @property
    def fused(self) -> bool:
        return self.env_slots == self.rollout_slots

    @property
    def mode(self) -> str:
        """The mode of the env/rollout pair (the trainer runs between collections and does not
        change how the stream flows)."""
        return derive_mode([frozenset(self.env_slots), frozenset(self.rollout_slots)])

    def placements(self) -> dict[str, GroupPlacement]:
        return {
            "env": GroupPlacement("env", list(self.env_slots)),
            "rollout": GroupPlacement("rollout", list(self.rollout_slots)),
        }

    def label(self) -> str:
        fmt = lambda slots: ",".join(f"{s.index}" if s.node == 0 else str(s) for s in slots)  # noqa: E731
        return f"{self.mode:<13} env[{self.num_env}]@{fmt(self.env_slots)} rollout[{self.num_rollout}]@{fmt(self.rollout_slots)} k={self.micro_batches}"

    def as_tuple(self) -> tuple:
        """Plain data (for checkpoints): ((node, index), ...) per group and k."""
        return (tuple((s.node, s.index) for s in self.env_slots), tuple((s.node, s.index) for s in self.rollout_slots), self.micro_batches)

    @classmethod
    def from_tuple(cls, t: tuple) -> "FlowPlan":
        env, rollout, k = t
        return cls(tuple(Slot(*x) for x in env), tuple(Slot(*x) for x in rollout), int(k))

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "env": [str(s) for s in self.env_slots],
            "rollout": [str(s) for s in self.rollout_slots],
            "micro_batches": self.micro_batches,
        }


def plan_from_groups(env: GroupPlacement, rollout: GroupPlacement, micro_batches: int) -> FlowPlan:
    return FlowPlan(tuple(env.slots), tuple(rollout.slots), micro_batches)


def candidate_plans(slots: list[Slot], total_envs: int, max_micro_batches: int = 4) -> list[FlowPlan]:
    """Every plan worth predicting on ``slots``: E env workers (E divides the env count, at most one
    per slot), R rollout workers (R divides E), fused on the same slots or on separate ones (disjoint
    when they fit, else overlapping at the end), and every k from 1 to ``max_micro_batches`` that
    divides each worker's env count (3 matters: from k = 3 on, the hops between env and rollout
    are hidden behind the other micro-batches' work; with k = 2 they lie on the critical path)."""
    n = len(slots)
    out: list[FlowPlan] = []
    depths = range(1, max_micro_batches + 1)
    for e in range(1, n + 1):
        if total_envs % e:
            continue
        per_worker = total_envs // e
        env_slots = tuple(slots[:e])
        layouts = [env_slots]  # fused
        for r in range(1, n + 1):
            if e % r:
                continue
            rollout = tuple(slots[e : e + r]) if e + r <= n else tuple(slots[n - r :])
            if rollout != env_slots:
                layouts.append(rollout)
        for rollout in layouts:
            for k in depths:
                if per_worker % k == 0:
                    out.append(FlowPlan(env_slots, rollout, k))
    return out
