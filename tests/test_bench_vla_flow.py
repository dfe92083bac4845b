"""``rlweave bench vla-flow``: the pixel-VLA rollout under a collocated and a pipelined layout,
end to end at tiny sizes (``--quick``: the figures mean nothing, the report's shape does), and
the pieces of its protocol that need no run (the threads shim, auto's steady-state figures)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vla_flow_under_test", ROOT / "benchmarks" / "vla_flow.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_writes_the_ratio_and_what_it_rests_on(tmp_path):
    out_json = tmp_path / "vla-flow.json"
    rc, text = run_cli("bench", "vla-flow", "--quick", "--baselines", "collocated", "--json", str(out_json))
    assert rc == 0, text
    report = json.loads(out_json.read_text())
    for key in ("ratio", "ratio_collect", "bound_ratio", "rounds", "plans", "settings", "baseline", "headline", "command",
                "protocol", "environment", "process_env", "sides", "gl", "recipe", "pipelined_plans"):
        assert key in report, key
    assert report["benchmark"] == "vla-flow" and report["command"] == "rlweave bench vla-flow --quick --baselines collocated"
    assert report["settings"]["quick"] and report["settings"]["image"] == 32
    env = report["environment"]
    assert env["cpu_model"] and env["versions"]["torch"] and env["versions"]["transformers"]
    plans = {r["plan"]: r for r in report["plans"]}
    assert set(plans) == {"collocated", "disaggregated"}
    assert plans["collocated"]["fused"] and not plans["disaggregated"]["fused"]
    assert plans["disaggregated"]["micro_batches"] == 2 and plans["disaggregated"]["env_workers"] == 1
    # one decision = chunk (4) env steps of each of the 4 envs, 4 decisions an iteration (fewer: an episode ended mid-chunk)
    assert all(0 < r["env_steps_per_iteration"] <= 4 * 4 * 4 and r["iteration_steps_per_s"] > 0 for r in plans.values())
    assert plans["collocated"]["config"]["env"]["pixels"]["width"] == 32  # the resolved config of round 1
    assert plans["collocated"]["host_threads"] == {"env": ["1"], "rollout": ["1"]}
    (r,) = report["rounds"]
    assert r["best_baseline"] == "collocated" and r["best_pipelined"] == "disaggregated k=2"
    expected = plans["disaggregated"]["iteration_steps_per_s"] / plans["collocated"]["iteration_steps_per_s"]
    assert report["ratio"] == pytest.approx(expected)
    assert "HEADLINE pipelined vs best collocated layout, whole iteration" in text


def test_threads_shim_applies_the_config_and_restores_the_plan_class(bench):
    from omegaconf import OmegaConf

    from rlweave.cluster.placement import Slot
    from rlweave.flow.plan import FlowPlan

    cfg = OmegaConf.create({"placement": {"groups": {"env": {"threads": 2}, "rollout": {"threads": 2}}}})
    plan = FlowPlan((Slot(0, 0),), (Slot(0, 0),), 1)
    original = FlowPlan.placements
    with bench.group_threads(cfg):
        assert {g: p.threads for g, p in plan.placements().items()} == {"env": 2, "rollout": 2}
    assert FlowPlan.placements is original
    assert plan.placements()["rollout"].threads is None


def test_auto_figures_come_from_the_iterations_after_its_choice(bench):
    def rec(i: int, t: float, k: int) -> dict:
        return {"iteration": i, "samples/produced": 100, "time/iteration": t, "time/collect": t / 2, "time/env": 0.1,
                "time/rollout": 0.1, "time/actor": 0.1, "time/weight_sync": 0.0, "plan/micro_batches": k,
                "plan/env_workers": 1, "plan/rollout_workers": 1, "plan/fused": 0, "plan/error": 0.1}

    records = [rec(1, 10.0, 1), rec(2, 4.0, 2), rec(3, 1.0, 3), rec(4, 1.0, 3)]
    log = [{"iteration": 1, "reason": "profiling", "plan": "p2"},
           {"iteration": 2, "reason": "chosen", "chosen": {"plan": "disaggregated k=3"}, "ranked": []}]
    out = bench.summarize("auto", records, log, wall=20.0)
    assert out["planner_choice"] == "disaggregated k=3" and out["steady_iterations"] == 2
    assert out["auto_choice"] == "disaggregated k=3"  # from the plan/* of the iterations it ran
    assert out["steady_iteration_steps_per_s"] == pytest.approx(100.0)
    assert out["iteration_steps_per_s"] == pytest.approx(100.0)  # median of 25, 100, 100 over iterations 2..4
    assert out["first_iteration_s"] == 10.0
