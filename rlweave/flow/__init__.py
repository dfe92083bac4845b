"""Flow layer: execution plans of a workflow's streaming stages, their simulation and the planner."""

from rlweave.flow.plan import FlowPlan, candidate_plans, plan_from_groups
from rlweave.flow.planner import Measurement, Planner, Prediction, physical_cores
from rlweave.flow.replan import Replanner
from rlweave.flow.simulate import LinearCost, StageCosts, simulate_collection

__all__ = [
    "FlowPlan", "candidate_plans", "plan_from_groups", "Measurement", "Planner", "Prediction", "physical_cores", "Replanner",
    "LinearCost", "StageCosts", "simulate_collection",
]
