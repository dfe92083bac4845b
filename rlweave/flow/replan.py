"""Re-planning over a whole run (``placement.mode=auto`` of the embodied on-policy workflow): which
execution plan the next iteration runs under, decided at each iteration boundary from the
iteration just measured.

Why it lives in the flow layer: it is the planner's policy over time (profile, verify, run, watch
for drift), independent of how a runner lays out its groups; the runner only applies the plan it
is handed. Phases: *profile* (the planner's profiling plans, one iteration each), *verify* (one
iteration of each shortlisted prediction not measured yet that the planner predicts to beat the best
measured plan by ``planner.min_gain``), *run* (the shortlisted plan with the
fastest measured iteration). Two iterations in a row whose time drifts from the prediction by more
than ``planner.margin`` send the run back to *verify* with the refitted costs.
"""

from __future__ import annotations

from rlweave.flow.plan import FlowPlan
from rlweave.flow.planner import Measurement, Planner, Prediction

__all__ = ["Replanner"]


class Replanner:
    """The planner's decisions over a run, with what a checkpoint needs to continue them: the
    current prediction, the plans verified since the last drift, the drift count and the log
    written to ``plans.json``."""

    def __init__(self, planner: Planner, verify: int):
        self.planner, self.verify = planner, verify
        self.prediction: Prediction | None = None
        self.verified: set[FlowPlan] = set()
        self.drift_count = 0
        self.log: list[dict] = []

    def first_plan(self) -> FlowPlan:
        return self.planner.profile_plans()[0]

    def observe(self, flow: FlowPlan, record: dict, steps: int) -> None:
        """Feeds the planner one iteration's stage times (``time/*`` of its metrics record)."""
        busy = record["time/collect"] + record["time/actor"] + record["time/weight_sync"]
        self.planner.observe(Measurement(
            flow, collect=record["time/collect"], env_compute=record["time/env"], infer_compute=record["time/rollout_per_env_worker"],
            steps=steps, train=record["time/actor"], sync=record["time/weight_sync"],
            other=max(0.0, record["time/iteration"] - busy), iteration=record["time/iteration"],
        ))

    def next_plan(self, flow: FlowPlan, record: dict, iteration: int, steps: int) -> FlowPlan | None:
        """The plan the next iteration should run under (None: stay on ``flow``); logged."""
        pl = self.planner
        self.observe(flow, record, steps)
        seen = {m.plan for m in pl.history}
        todo = [p for p in pl.profile_plans() if p not in seen]
        if todo:
            return self._logged(iteration, todo[0], "profiling")
        if self.prediction is not None and self.prediction.plan == flow:
            self.drift_count = self.drift_count + 1 if pl.drifted(self.prediction.iteration, record["time/iteration"]) else 0
            if self.drift_count < 2:
                return None
            self.drift_count, self.verified, reason = 0, set(), "drift"
        else:
            reason = "verify"
        short = pl.shortlist(self.verify)
        if reason == "drift":  # measurements from before the drift no longer settle the choice
            unverified = [p.plan for p in short if p.plan != flow]
        else:
            unverified = [p.plan for p in short if p.plan not in self.verified and pl.measured(p.plan) is None
                          and pl.worth_verifying(p)]
        if unverified:
            self.verified.add(unverified[0])
            self.prediction = None
            return self._logged(iteration, unverified[0], "verifying" if reason != "drift" else "drift: verifying")
        chosen = pl.choose(self.verify)
        self.prediction = pl.predict(chosen.plan)
        self.log.append({
            "iteration": iteration, "reason": "chosen", "chosen": self.prediction.as_dict(),
            "measured_s": {p.plan.label(): pl.measured(p.plan) for p in short},
            "measured_collect_s": {p.plan.label(): pl.measured_collect(p.plan) for p in short},
            "ranked": [p.as_dict() for p in pl.rank()[:8]],
        })
        measured = pl.measured(chosen.plan)
        print(f"[rlweave] planner: chose {chosen.plan.label()}: predicted {self.prediction.iteration:.3f} s/iteration"
              + (f", measured {measured:.3f}" if measured else ""))
        return chosen.plan

    def _logged(self, iteration: int, plan: FlowPlan, reason: str) -> FlowPlan:
        self.log.append({"iteration": iteration, "reason": reason, "plan": plan.label()})
        return plan

    def state_dict(self) -> dict:
        return {"planner": self.planner.state_dict(), "planner_run": {
            "prediction": self.prediction.plan.as_tuple() if self.prediction else None,
            "verified": [p.as_tuple() for p in self.verified], "drift_count": self.drift_count, "plan_log": self.log}}

    def load_state_dict(self, state: dict, iteration: int) -> None:
        """A checkpoint's decisions, its log cut at ``iteration`` (a resume repeats none)."""
        if not state.get("planner"):
            return
        self.planner.load_state_dict(state["planner"])
        run = state.get("planner_run") or {}
        self.prediction = self.planner.predict(FlowPlan.from_tuple(run["prediction"])) if run.get("prediction") else None
        self.verified = {FlowPlan.from_tuple(t) for t in run.get("verified", [])}
        self.drift_count = run.get("drift_count", 0)
        self.log = [e for e in run.get("plan_log", []) if e["iteration"] <= iteration]
