"""The flow layer: cost fits, the pipeline simulation, candidate plans, the planner; and, on a real
Ray, the same workflow under different plans, the auto planner, and scaling env workers mid-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlweave.cluster import Slot
from rlweave.config import load_config
from rlweave.flow import FlowPlan, LinearCost, Measurement, Planner, Prediction, StageCosts, candidate_plans, simulate_collection
from rlweave.runners.onpolicy import OnPolicyRunner

S0, S1 = Slot(0, 0), Slot(0, 1)
QUIET = ["run.progress=false", "run.tensorboard=false"]


# --------------------------------------------------------------------------- cost model and simulation
def test_linear_cost_fits_fixed_and_per_row_parts():
    c = LinearCost()
    c.add(10, 0.020)
    assert (c.fixed, c.per_row) == (0.0, pytest.approx(0.002))  # one batch size: all per row
    c.add(20, 0.030)
    assert c.fixed == pytest.approx(0.010) and c.per_row == pytest.approx(0.001)
    assert c(40) == pytest.approx(0.050)


def costs(env_per_row: float, infer_per_row: float, cores: int = 2, remote: float = 0.0) -> StageCosts:
    c = StageCosts(cores=cores, remote_overhead=remote)
    c.env.add(1, env_per_row)
    c.infer.add(1, infer_per_row)
    return c


def test_fused_plan_takes_the_sum_of_the_stages():
    c = costs(0.001, 0.0015)
    # 64 envs, one slice: each decision is env(64) + infer(64) = 0.064 + 0.096
    assert simulate_collection(FlowPlan((S0,), (S0,), 1), c, 64, 10) == pytest.approx(10 * 0.160)
    # fused slices still take turns in one process: no gain from k
    assert simulate_collection(FlowPlan((S0,), (S0,), 2), c, 64, 10) == pytest.approx(10 * 0.160)


def test_separate_slots_with_micro_batches_overlap_the_stages():
    c = costs(0.001, 0.0015)
    plan = FlowPlan((S0,), (S1,), 2)
    t = simulate_collection(plan, c, 64, 10)
    # steady state: the slower stage (inference, 2 x 0.048 per decision) is busy all the time;
    # the first env slice (0.032) is the only time it waits
    assert t == pytest.approx(10 * 0.096 + 0.032)
    # one slice on separate slots: no overlap, just the two stages in turn
    assert simulate_collection(FlowPlan((S0,), (S1,), 1), c, 64, 10) == pytest.approx(1.6)
    # one physical core: never faster than all the work on it
    assert simulate_collection(plan, costs(0.001, 0.0015, cores=1), 64, 10) == pytest.approx(1.6)


def test_remote_requests_cost_their_overhead():
    plan = FlowPlan((S0,), (S1,), 1)
    assert simulate_collection(plan, costs(0.001, 0.001, remote=0.01), 10, 5) == pytest.approx(5 * (0.02 + 0.01))


def test_candidate_plans_on_two_slots():
    labels = [p.label() for p in candidate_plans([S0, S1], 64, max_micro_batches=4)]
    layouts = sorted({label.rsplit(" k=", 1)[0] for label in labels})
    assert layouts == [
        "collocated    env[1]@0 rollout[1]@0",
        "collocated    env[2]@0,1 rollout[2]@0,1",
        "disaggregated env[1]@0 rollout[1]@1",
        "hybrid        env[2]@0,1 rollout[1]@1",
    ]
    assert len(labels) == 4 * 3  # k = 1, 2, 4 for each (3 does not divide 64 or 32)
    # k must divide every worker's envs: 6 envs on 2 workers leave 3 each, so k = 1 or 3 there
    assert {p.micro_batches for p in candidate_plans([S0, S1], 6) if p.num_env == 2} == {1, 3}
    assert {p.micro_batches for p in candidate_plans([S0, S1], 6) if p.num_env == 1} == {1, 2, 3}


def test_planner_profiles_then_picks_the_fastest_prediction():
    pl = Planner(slots=[S0, S1], total_envs=64, steps=10, cores=2)
    first, second = pl.profile_plans()
    assert (first.fused, first.micro_batches, second.fused, second.micro_batches) == (True, 1, False, 2)
    # fused on both slots first: every core busy from the first iteration on
    assert (first.num_env, first.num_rollout, second.num_env, second.num_rollout) == (2, 2, 1, 1)
    # measured: env 1 ms/row, inference 1.5 ms/row, requests free in-process, 5 ms across processes
    pl.observe(Measurement(first, collect=0.8, env_compute=0.32, infer_compute=0.48, steps=10, train=0.5, sync=0.01))
    assert {p.plan.fused for p in pl.rank()} == {True}  # cross-process price unknown yet
    assert pl.predict(first).collect == pytest.approx(0.8)
    pl.observe(Measurement(second, collect=10 * (0.096 + 0.005) + 0.032, env_compute=0.64, infer_compute=0.96, steps=10,
                           train=0.5, sync=0.01))
    assert pl.costs.remote_overhead == pytest.approx(0.005, rel=0.05)
    ranked = pl.rank()
    assert [p.iteration for p in ranked] == sorted(p.iteration for p in ranked)
    best = pl.best()
    # two fused workers split the envs: each does half the work on its own core
    assert best.plan.label() == "collocated    env[2]@0,1 rollout[2]@0,1 k=1"
    assert best.collect == pytest.approx(0.8)
    assert pl.drifted(1.0, 1.2) and not pl.drifted(1.0, 1.1)
    # the first profiling plan is the best: no other plan earns a verifying iteration, unless its
    # prediction beats the best measured plan's prediction by more than min_gain
    assert not any(pl.worth_verifying(p) for p in pl.rank())
    pl.min_gain = 0.05
    assert pl.worth_verifying(Prediction(second, best.collect, best.iteration * 0.94))
    assert not pl.worth_verifying(Prediction(second, best.collect, best.iteration * 0.96))


def test_planner_chooses_by_measured_collection_not_by_the_training_swing():
    pl = Planner(slots=[S0, S1], total_envs=64, steps=10, cores=2)
    first, second = pl.profile_plans()
    pl.observe(Measurement(first, collect=0.8, env_compute=0.32, infer_compute=0.48, steps=10, train=0.5, sync=0.01))
    pl.observe(Measurement(second, collect=10 * (0.096 + 0.005) + 0.032, env_compute=0.64, infer_compute=0.96, steps=10,
                           train=0.5, sync=0.01))
    a, b = (p.plan for p in pl.shortlist(2))
    # a collects faster, but its one verifying iteration met a slow training pass
    pl.observe(Measurement(a, collect=0.80, env_compute=0.32, infer_compute=0.48, steps=10, train=0.9, iteration=1.72))
    pl.observe(Measurement(b, collect=0.90, env_compute=0.32, infer_compute=0.48, steps=10, train=0.5, iteration=1.42))
    assert pl.measured(a) > pl.measured(b)  # by whole iterations b would win
    assert (pl.measured_collect(a), pl.measured_collect(b)) == (0.80, 0.90)
    assert pl.choose(2).plan == a


# --------------------------------------------------------------------------- real runs
def run(tmp_path: Path, name: str, *overrides: str, on_iteration=None) -> tuple[OnPolicyRunner, list[dict]]:
    run_dir = tmp_path / name
    cfg = load_config("ppo-cartpole", ["env.num_envs=4", "train.rollout_steps=32", "train.eval_every=0",
                                       f"run.dir={run_dir}", *QUIET, *overrides])
    runner = OnPolicyRunner(cfg, run_dir)
    runner.run(on_iteration=on_iteration)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return runner, rows


def _cartpole_policy():
    import gymnasium as gym

    from rlweave.models import build_policy

    env = gym.make("CartPole-v1")
    return build_policy(name="mlp", observation_space=env.observation_space, action_space=env.action_space, chunk=1, critic=True)


def test_same_seed_same_learning_under_every_plan(ray_session, tmp_path):
    """The actions' noise is seeded by (seed, env rank, decision), so the plan (fused or not,
    one slice or two) does not change what is collected or learned."""
    budget = "train.total_env_steps=640"
    _, fused = run(tmp_path, "fused", budget)
    _, split = run(tmp_path, "split", budget, "placement.groups.env.slots=0", "placement.groups.rollout.slots=1",
                   "placement.groups.actor.slots=0", "rollout.micro_batches=2")
    assert [r["plan/fused"] for r in fused] == [1] * 5 and [r["plan/fused"] for r in split] == [0] * 5
    assert [r["plan/micro_batches"] for r in split] == [2] * 5
    # the actor shares slot 0 with the fused rollout: the replica is released while it trains
    assert [r["plan/rollout_offloaded"] for r in fused] == [1] * 5
    assert fused[0]["mem/rollout_released_params"] == sum(p.numel() for p in _cartpole_policy().parameters())
    assert [r["plan/rollout_offloaded"] for r in split] == [0] * 5
    for key in ("env_steps", "train/episodes", "train/episode_return"):
        assert [r.get(key) for r in fused] == [r.get(key) for r in split], key
    for a, b in zip(fused, split):
        assert a["train/loss_value"] == pytest.approx(b["train/loss_value"], rel=1e-4)
    for rows in (fused, split):  # every sample trained once, by the policy version that produced it
        assert all(r["samples/produced"] == r["samples/trained"] == 128 for r in rows)


AUTO = ["placement.mode=auto", "train.total_env_steps=1280", "train.checkpoint_every=5", "train.keep_checkpoints=5"]


@pytest.fixture(scope="module")
def auto_run(ray_session, tmp_path_factory) -> tuple[Path, list[dict]]:
    """One placement.mode=auto run with checkpoints, shared: its choice is checked in one test and
    resumed from in another (the auto run is the slowest part of this module)."""
    root = tmp_path_factory.mktemp("auto")
    _, rows = run(root, "auto", *AUTO)
    return root / "auto", rows


def test_auto_profiles_verifies_then_runs_the_chosen_layout(auto_run):
    run_dir, rows = auto_run
    layouts = [(r["plan/env_workers"], r["plan/rollout_workers"], r["plan/micro_batches"], r["plan/fused"]) for r in rows]
    assert layouts[:2] == [(2, 2, 1, 1), (1, 1, 2, 0)]  # the two profiling plans
    log = json.loads((run_dir / "plans.json").read_text())
    assert log[0] == {"iteration": 1, "reason": "profiling", "plan": "disaggregated env[1]@0 rollout[1]@1 k=2"}
    chosen = [e for e in log if e["reason"] == "chosen"]
    assert chosen, log
    first = chosen[0]
    # verified plans were run once each between profiling and the choice
    verified = [e["plan"] for e in log if e["reason"] == "verifying" and e["iteration"] < first["iteration"]]
    assert first["iteration"] == 2 + len(verified)
    ranked = [round(p["iteration_s"], 4) for p in first["ranked"]]  # ranked to 0.1 ms; ties: fewer processes first
    assert ranked == sorted(ranked)
    # the choice compares measured collection plus the shared rest of an iteration (training,
    # sync, driver), not whole measured iterations, whose training pass swings between iterations
    predicted = {p["plan"]: p for p in first["ranked"]}
    cost = {plan: (predicted[plan]["iteration_s"] if collect is None
                   else collect + predicted[plan]["iteration_s"] - predicted[plan]["collect_s"])
            for plan, collect in first["measured_collect_s"].items()}
    assert any(v is not None for v in first["measured_collect_s"].values())
    assert first["chosen"]["plan"] == min(cost, key=cost.get)
    after = [r for r in rows if r["iteration"] > first["iteration"]]
    assert all("plan/predicted_iteration" in r and r["plan/error"] >= 0 for r in after[: 1])
    assert all(r["samples/produced"] == r["samples/trained"] for r in rows)
    assert sum(r["samples/produced"] for r in rows) == rows[-1]["env_steps"] == 1280


def test_env_workers_scale_out_and_in_mid_run_without_losing_samples(ray_session, tmp_path):
    def scale(runner, record):
        if record["iteration"] == 2:
            runner.scale_env(2)
        elif record["iteration"] == 4:
            runner.scale_env(1)

    runner, rows = run(tmp_path, "scale", "train.total_env_steps=896", on_iteration=scale)
    assert [r["plan/env_workers"] for r in rows] == [1, 1, 2, 2, 1]
    assert [r["samples/trajectories"] for r in rows] == [1, 1, 2, 2, 1]
    produced = [r["samples/produced"] for r in rows]
    assert produced == [128, 128, 256, 256, 128]
    assert produced == [r["samples/trained"] for r in rows]
    assert [r["env_steps"] for r in rows] == [128, 256, 512, 768, 896]


def test_scale_env_refuses_a_count_the_actor_cannot_split(ray_session, tmp_path):
    errors = []

    def scale(runner, record):
        try:
            runner.scale_env(3)
        except ValueError as e:
            errors.append(str(e))

    _, rows = run(tmp_path, "bad-scale", "train.total_env_steps=256", "actor.num_workers=2", "env.num_workers=2",
                  "rollout.num_workers=2", on_iteration=scale)
    assert errors and errors[0] == "env.num_workers: 3 must be a positive multiple of the 2 actor rank(s)"
    assert [r["plan/env_workers"] for r in rows] == [2]


def test_a_plan_that_cannot_run_leaves_the_previous_plan(ray_session, tmp_path):
    errors = []

    def switch(runner, record):
        if record["iteration"] == 1:
            try:  # 4 envs do not split into 3 env workers
                runner._apply_flow(FlowPlan((S0, S1, S0), (S1,), 1))
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))

        if record["iteration"] == 2:
            try:  # a rollout worker on a node that does not exist cannot start
                runner._apply_flow(FlowPlan((S0,), (Slot(3, 0),), 2))
            except Exception as e:  # noqa: BLE001
                errors.append(type(e).__name__)

    _, rows = run(tmp_path, "bad-plan", "train.total_env_steps=512", on_iteration=switch)
    assert errors == ["plan hybrid        env[3]@0,1,0 rollout[1]@1 k=1: 4 envs do not split into 3 workers x 1 micro-batches",
                      "IndexError"]
    # both times the run went on under its previous plan (rebuilt after the failed start)
    assert [(r["plan/env_workers"], r["plan/micro_batches"], r["plan/fused"]) for r in rows] == [(1, 1, 1)] * 4
    assert all(r["samples/produced"] == r["samples/trained"] == 128 for r in rows)


def test_plan_command_ranks_candidates_without_training(tmp_path, capsys, monkeypatch):
    import rlweave.models
    from rlweave.cli import main

    built = []

    def counted(*args, **kwargs):
        built.append(kwargs["name"])
        return rlweave.models.build_policy(*args, **kwargs)

    monkeypatch.setattr("rlweave.runners.checks.build_policy", counted)
    out_json = tmp_path / "plan.json"
    rc = main(["plan", "ppo-cartpole", "env.num_envs=8", "cluster.num_cpus=2", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert built == ["mlp"]  # the config check's policy is the one measured: built once
    assert "8 envs, 32 decisions per iteration" in out
    ranked = json.loads(out_json.read_text())["ranked"]
    assert len(ranked) == len(candidate_plans([S0, S1], 8))
    # ranked by predicted iteration time; plans within 0.1 ms are a tie broken by fewer workers
    keys = [round(r["iteration_s"], 4) for r in ranked]
    assert keys == sorted(keys) and keys[0] < keys[-1]
    assert ranked[0]["plan"] in out


def test_grpo_episodes_are_the_same_split_into_micro_batches(ray_session, tmp_path):
    """Episodic collection (GRPO): slices end their episodes at different decisions; the
    trajectories and what is learned match the unsplit, fused run."""
    def grpo(name, *overrides):
        run_dir = tmp_path / name
        cfg = load_config("grpo-cartpole", ["env.num_envs=8", "algorithm.group_size=4", "train.rollout_steps=60",
                                            "train.total_env_steps=900", "train.eval_every=0", f"run.dir={run_dir}",
                                            *QUIET, *overrides])
        OnPolicyRunner(cfg, run_dir).run()
        return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]

    fused = grpo("fused")
    split = grpo("split", "placement.groups.env.slots=0", "placement.groups.rollout.slots=1",
                 "placement.groups.actor.slots=0", "rollout.micro_batches=2")
    assert [r["plan/micro_batches"] for r in split] == [2] * len(split)
    for key in ("env_steps", "train/episodes", "train/episode_return", "train/samples"):
        assert [r.get(key) for r in fused] == [r.get(key) for r in split], key
    assert all(r["samples/produced"] == r["samples/trained"] for r in fused + split)


def test_auto_run_resumes_with_its_plan_and_planner_state(auto_run, tmp_path):
    import shutil

    run_dir = tmp_path / "auto-resume"  # a copy: the shared run stays as it ended
    shutil.copytree(auto_run[0], run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "iter_00000010")
    saved_flow = FlowPlan.from_tuple(torch_load(run_dir / "checkpoints" / "iter_00000005" / "runner.pt")["flow"])
    cfg = load_config("ppo-cartpole", ["env.num_envs=4", "train.rollout_steps=32", "train.eval_every=0", f"run.dir={run_dir}",
                                       *QUIET, *AUTO])
    resumed = OnPolicyRunner(cfg, run_dir, resume=True)
    resumed.run()
    after = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["iteration"] for r in after] == list(range(1, 11))
    # iteration 6 ran under the plan saved at iteration 5; the planner did not profile again
    r6 = after[5]
    assert (r6["plan/env_workers"], r6["plan/micro_batches"], r6["plan/fused"]) == (
        saved_flow.num_env, saved_flow.micro_batches, int(saved_flow.fused))
    log = json.loads((run_dir / "plans.json").read_text())
    assert [e["iteration"] for e in log if e["reason"] == "profiling"] == [1]
    assert len(resumed.replanner.planner.history) == 10
    assert sum(r["samples/produced"] for r in after) == 1280


def torch_load(path):
    import torch

    return torch.load(path, weights_only=False)


def test_layout_trials_time_each_candidate_after_settling_then_keep_the_fastest(capsys):
    from rlweave.runners.layouts import LayoutTrials

    trials = LayoutTrials([("a", "plan-a"), ("b", "plan-b"), ("c", "plan-c")], settle=1)
    assert (trials.plan, trials.chosen) == ("plan-a", False)
    assert trials.observe(9.0) is None  # a's start-up: not timed
    assert trials.observe(3.0) == 1  # a timed -> try b
    trials.index = 1
    assert trials.observe(9.0) is None and trials.observe(2.0) == 2
    trials.index = 2
    assert trials.observe(1.0) is None and trials.observe(4.0) == 1  # b was the fastest timed
    trials.index = 1
    assert trials.chosen and trials.observe(0.1) is None and trials.label == "b"
    assert "measured a 3.000 s, b 2.000 s, c 4.000 s; chose b" in capsys.readouterr().out
    # the last candidate the fastest: no switch is asked for; a single candidate is chosen at once
    last = LayoutTrials([("a", 1), ("b", 2)], settle=0)
    assert last.observe(5.0) == 1
    last.index = 1
    assert last.observe(1.0) is None and last.chosen and last.plan == 2
    assert LayoutTrials([("only", 0)]).chosen
    with pytest.raises(ValueError, match="at least one candidate"):
        LayoutTrials([])
