"""Execution plans of one workflow, measured in one run: collocated, disaggregated, hybrid, auto.

The workflow is PPO on a MuJoCo task (HalfCheetah-v5 by default) with many envs (768) and a
policy big enough that inference costs about as much as env stepping (actor and critic MLPs of
3 layers, ~640-1024 wide: a stand-in for the larger policies -- VLAs -- that make embodied RL
inference-bound), so the order in which the two stages run matters. Many envs, because a forward
of such an MLP has a fixed cost of a few ms (its weights are read once per forward): a micro-batch
must hold enough rows (128+) that splitting the batch does not multiply that cost, and 768 splits
into 2, 3 and 4 micro-batches (from k = 3 on the hops between the stages are hidden). Every plan runs the same logical workflow (same
envs, rollout length, policy, seed); only the physical layout changes:

  collocated     env and rollout fused in one process on slot 0, one micro-batch (the sequential
                 baseline: the two stages take turns on the slot)
  disaggregated  env on slot 0, rollout on slot 1, k micro-batches streaming between them
  hybrid         env on slots 0 and 1 (two workers), rollout on slot 1 (shared with an env worker)
  auto           placement.mode=auto: the planner profiles, predicts every candidate, switches

The actor (trainer) sits on slot 0 in every plan; on-policy PPO trains between collections, so it
never overlaps the stream. Headline figures are *collection* env-steps/s (the stream the plans
change), median over the measured iterations; full-iteration figures are printed beside them.
The bound is computed from the stage times measured in the collocated run (where nothing else
runs beside either stage): bound = 1 / max(env, inference) per decision, sequential = 1 / sum.

Rounds (``--repeats``, BENCHMARKS.md rule 3): this machine's speed drifts by up to 2x within
minutes, so a ratio means something only between runs a minute apart. Round 1 runs every plan;
each later round runs collocated, the two fastest pipelined plans of round 1 (and the best fixed
plan if it is neither), and auto. Each ratio is taken within its round (the round's best pipelined
plan against the bound from the round's own collocated run); the headline is the median over
rounds, with the range.

Stage balance: pipelining two stages gains most when they cost the same, and on a shared CPU
the ratio of MuJoCo stepping to MLP inference moves from machine to machine and hour to hour (runs
of this bench measured inference at 0.6x to 2.1x the env stage with the same 3 x 1024 policy). So
by default (``--hidden auto``) the bench first times (median of 5), in its own process on one thread, one step of
the ``--envs`` envs and the policy's ``act`` on ``--envs`` rows for a ladder of widths, and runs
every plan with the 3-layer width whose inference time is closest to the env step's. The widths,
times and choice are printed and written to the JSON. ``--hidden 1024,1024,1024`` pins a width.

    rlweave bench flow [--json FILE] [--repeats R] [--iterations N] [--envs N] [--hidden auto|1024,1024,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


WIDTHS = (384, 512, 640, 768, 896, 1024, 1280)  # the ladder --hidden auto chooses from


def calibrate_width(args) -> dict:
    """Times one step of ``args.envs`` envs (random actions) and ``act`` of the workflow's policy
    on as many rows for each width of ``WIDTHS`` (3 layers, tanh, as in the runs), one thread;
    returns the width whose inference time is closest to the env step's, with every timing."""
    import numpy as np
    import torch

    from rlweave.envs.vector import VectorEnv
    from rlweave.flow.profile import median_time
    from rlweave.models import build_policy

    torch.set_num_threads(1)
    envs = VectorEnv(args.env_id, args.envs, seed=args.seed)
    obs = envs.reset()
    rng = np.random.default_rng(args.seed)
    space = envs.single_action_space

    def env_step() -> None:
        act = rng.uniform(space.low, space.high, size=(args.envs, 1, *space.shape)).astype(np.float32)
        envs.step(act)

    env_s = median_time(env_step, 5)
    x = torch.from_numpy(obs.astype(np.float32))
    inference = {}
    for width in WIDTHS:
        policy = build_policy("mlp", envs.single_observation_space, space, hidden=[width] * 3, activation="tanh")
        inference[width] = median_time(lambda: policy.act(x), 5)
    width = min(WIDTHS, key=lambda w: abs(inference[w] - env_s))
    return {"env_step_s": env_s, "inference_s": inference, "width": width}


def _overrides(args, run_dir: str, extra: list[str]) -> list[str]:
    hidden = "[" + args.hidden + "]"
    steps = args.envs * args.steps * args.iterations
    return [
        f"env.id={args.env_id}", "env.num_workers=1", f"env.num_envs={args.envs}", "rollout.num_workers=1",
        f"policy.hidden={hidden}", "policy.activation=tanh", f"train.rollout_steps={args.steps}",
        "algorithm.epochs=1", f"algorithm.minibatch_size={args.envs * args.steps}", f"train.total_env_steps={steps}",
        "train.eval_every=0", "train.checkpoint_every=0", "run.progress=false", "run.tensorboard=false",
        f"cluster.num_cpus={args.slots}", f"seed={args.seed}", f"run.dir={run_dir}", *extra,
    ]


PLANS = {
    "collocated": ["placement.groups.env.slots=0", "placement.groups.rollout.slots=0", "placement.groups.actor.slots=0", "rollout.micro_batches=1"],
    "disaggregated": ["placement.groups.env.slots=0", "placement.groups.rollout.slots=1", "placement.groups.actor.slots=0"],
    "hybrid": ["placement.groups.env.slots=0-1", "placement.groups.rollout.slots=1", "placement.groups.actor.slots=0"],
    "auto": ["placement.mode=auto"],
}


def _auto_iterations(records: list[dict], plans: list[dict]) -> tuple[list[dict], list[dict]]:
    """The auto run's iterations on the plan it chose, and all its iterations after the first choice.

    A record belongs to the last planner event logged at an earlier iteration boundary; the first
    record after each event settles the switch and is left out. Iterations spent re-verifying
    after a drift (planner events other than "chosen") are not the chosen plan's: they count only
    in the second list, whose throughput is reported beside the headline."""
    events = sorted(plans, key=lambda p: p["iteration"])
    first = next((p["iteration"] for p in events if p["reason"] == "chosen"), None)
    if first is None:
        return [], []
    on_choice, after = [], []
    for r in records:
        if r["iteration"] <= first + 1:
            continue
        after.append(r)
        last = [p for p in events if p["iteration"] < r["iteration"]][-1]
        if last["reason"] == "chosen" and r["iteration"] > last["iteration"] + 1:
            on_choice.append(r)
    return on_choice, after


def run_plan(args, name: str, k: int | None) -> dict:
    from rlweave.config import load_config
    from rlweave.runners.onpolicy import OnPolicyRunner

    extra = list(PLANS[name])
    if k is not None:
        extra.append(f"rollout.micro_batches={k}")
    if name == "hybrid":  # two env workers hold the same envs between them
        extra += ["env.num_workers=2", f"env.num_envs={args.envs // 2}"]
    with tempfile.TemporaryDirectory(prefix=f"bench-flow-{name}-") as run_dir:
        cfg = load_config("ppo-halfcheetah", _overrides(args, run_dir, extra))
        t0 = time.perf_counter()
        OnPolicyRunner(cfg, run_dir).run()
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines() if x.strip()]
        plans = json.loads(Path(run_dir, "plans.json").read_text()) if Path(run_dir, "plans.json").exists() else []
    after_choice: list[dict] = []
    if name == "auto":
        measured, after_choice = _auto_iterations(records, plans)
    else:
        measured = records[1:]  # the first iteration warms up
    if not measured:
        raise RuntimeError(f"flow bench: plan {name} left no measured iterations; raise --iterations")
    med = lambda key: statistics.median(r[key] for r in measured)  # noqa: E731
    steps = measured[0]["samples/produced"]
    out = {
        "plan": name,
        "micro_batches": measured[-1]["plan/micro_batches"],
        "env_workers": measured[-1]["plan/env_workers"],
        "rollout_workers": measured[-1]["plan/rollout_workers"],
        "fused": bool(measured[-1]["plan/fused"]),
        "collect_steps_per_s": steps / med("time/collect"),
        "iteration_steps_per_s": steps / med("time/iteration"),
        "time_collect_s": med("time/collect"),
        "time_iteration_s": med("time/iteration"),
        "time_env_s": med("time/env"),
        "time_rollout_s": med("time/rollout"),
        "time_actor_s": med("time/actor"),
        "iterations_measured": len(measured),
        "wall_s": wall,
    }
    if after_choice:  # everything auto ran once it had chosen, re-verification after drift included
        out["iteration_steps_per_s_after_choice"] = steps * len(after_choice) / sum(r["time/iteration"] for r in after_choice)
        out["iterations_after_choice"] = len(after_choice)
    errors = [r["plan/error"] for r in measured if "plan/error" in r]
    if errors:
        out["plan_error"] = statistics.median(errors)
        out["predicted_iteration_s"] = measured[-1]["plan/predicted_iteration"]
    chosen = [p for p in plans if p["reason"] == "chosen"]
    if chosen:
        out["planner_choice"] = chosen[-1]["chosen"]["plan"]
        out["planner_ranking"] = chosen[-1]["ranked"]
        out["planner_measured_shortlist_s"] = chosen[-1]["measured_s"]
        out["planner_log"] = [{k: v for k, v in p.items() if k in ("iteration", "reason", "plan")} for p in plans]
    return out


def _label(r: dict) -> str:
    return f"{r['plan']} k={r['micro_batches']}"


def _round_figures(args, colloc: dict, pipelined: list[dict], fixed: list[dict], auto: dict) -> dict:
    """One round's ratios: the best pipelined plan of the round against the bound, which comes
    from this round's collocated run, where each stage runs alone (env and inference take turns on
    one slot): 1 / max(stage) per decision; auto against the round's best fixed plan."""
    env = colloc["time_env_s"] / args.steps
    inference = colloc["time_rollout_s"] / args.steps
    bound = args.envs / max(env, inference)
    best_pipe = max(pipelined, key=lambda r: r["collect_steps_per_s"])
    best_fixed = max(fixed, key=lambda r: r["iteration_steps_per_s"])
    return {
        "env_s_per_decision": env,
        "inference_s_per_decision": inference,
        "bound_steps_per_s": bound,
        "sequential_steps_per_s": args.envs / (env + inference),
        "best_pipelined": _label(best_pipe),
        "best_pipelined_steps_per_s": best_pipe["collect_steps_per_s"],
        "best_fixed": _label(best_fixed),
        "bound_ratio": best_pipe["collect_steps_per_s"] / bound,
        "pipelined_vs_collocated": best_pipe["collect_steps_per_s"] / colloc["collect_steps_per_s"],
        "auto_vs_best": auto["iteration_steps_per_s"] / best_fixed["iteration_steps_per_s"],
        "auto_collect_vs_best_pipelined": auto["collect_steps_per_s"] / best_pipe["collect_steps_per_s"],
        "auto_after_choice_vs_best": auto.get("iteration_steps_per_s_after_choice", float("nan")) / best_fixed["iteration_steps_per_s"],
        "plan_error": auto.get("plan_error", float("nan")),
        "auto_choice": auto.get("planner_choice", "?"),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="rlweave bench flow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as one JSON object")
    ap.add_argument("--env-id", default="HalfCheetah-v5")
    ap.add_argument("--envs", type=int, default=768, help="envs in the workflow (all env workers together)")
    ap.add_argument("--hidden", default="auto",
                    help="policy MLP widths, or auto: the 3-layer width whose inference time matches the env step's")
    ap.add_argument("--steps", type=int, default=8, help="decisions per env per iteration")
    ap.add_argument("--iterations", type=int, default=5, help="iterations per fixed plan (auto runs twice as many)")
    ap.add_argument("--depths", default="2,3,4", help="micro-batch counts tried for the pipelined fixed plans")
    ap.add_argument("--slots", type=int, default=2, help="CPU slots of the embedded cluster")
    ap.add_argument("--repeats", type=int, default=5,
                    help="rounds: the first runs every plan, the others repeat collocated, the two fastest pipelined plans "
                         "(and the best fixed plan), and auto")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",")]
    calibration = None
    if args.hidden == "auto":
        calibration = calibrate_width(args)
        args.hidden = ",".join([str(calibration["width"])] * 3)
        print(f"calibration (one thread): {args.envs} envs step in {calibration['env_step_s'] * 1e3:.1f} ms; policy act on "
              f"{args.envs} rows: " + ", ".join(f"{w}: {t * 1e3:.1f} ms" for w, t in calibration["inference_s"].items())
              + f" -> width {calibration['width']}")

    print("flow benchmark: one PPO workflow, four execution plans")
    print(f"  {args.env_id}, {args.envs} envs, policy MLP [{args.hidden}], {args.steps} decisions/iteration, seed {args.seed}")
    print(f"  python {sys.version.split()[0]}, cpus {os.cpu_count()}, slots {args.slots}")
    results: list[dict] = []
    current_round = [1]
    t_start = time.perf_counter()

    def run(name, k=None, iterations=None):
        saved = args.iterations
        if iterations:
            args.iterations = iterations
        try:
            r = run_plan(args, name, k)
        finally:
            args.iterations = saved
        r["round"] = current_round[0]
        results.append(r)
        print(f"  {name:<13} k={r['micro_batches']} env[{r['env_workers']}] rollout[{r['rollout_workers']}]"
              f"{' fused' if r['fused'] else ''}: collect {r['collect_steps_per_s']:8.0f} steps/s "
              f"(env {r['time_env_s']:.3f} s, inference {r['time_rollout_s']:.3f} s, collect {r['time_collect_s']:.3f} s; "
              f"iteration {r['iteration_steps_per_s']:6.0f} steps/s)")
        return r

    # Round 1 screens every plan; the later rounds repeat, interleaved, the plans the headline
    # compares (BENCHMARKS.md rule 3): the machine's speed drifts by up to 2x over minutes here, so
    # each ratio is taken within one round, from runs a minute apart, and the headline is the median.
    colloc = run("collocated")
    pipelined = [run("disaggregated", k) for k in depths] + [run("hybrid", k) for k in depths if (args.envs // 2) % k == 0]
    auto = run("auto", iterations=2 * args.iterations + 4)
    leaders = sorted(pipelined, key=lambda r: r["collect_steps_per_s"], reverse=True)[:2]
    best_pipe = leaders[0]
    best_fixed = max([colloc] + pipelined, key=lambda r: r["iteration_steps_per_s"])
    rounds = [_round_figures(args, colloc, pipelined, [colloc] + pipelined, auto)]
    repeat = leaders + ([best_fixed] if best_fixed is not colloc and best_fixed not in leaders else [])
    for i in range(2, args.repeats + 1):
        current_round[0] = i
        print(f" round {i}/{args.repeats}: collocated, {', '.join(_label(r) for r in repeat)}, auto")
        c = run("collocated")
        pipes = [run(r["plan"], r["micro_batches"]) for r in repeat]
        a = run("auto", iterations=2 * args.iterations + 4)
        rounds.append(_round_figures(args, c, pipes, [c] + pipes, a))
    elapsed = time.perf_counter() - t_start

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def spread(key: str) -> list[float]:
        return [min(r[key] for r in rounds), max(r[key] for r in rounds)]

    per_decision_env = med("env_s_per_decision")
    per_decision_inf = med("inference_s_per_decision")
    bound, sequential = med("bound_steps_per_s"), med("sequential_steps_per_s")
    out = {
        "benchmark": "flow",
        "baseline": "collocated-sequential (env and inference fused on one slot, one micro-batch)",
        "settings": {k: getattr(args, k) for k in ("env_id", "envs", "hidden", "steps", "iterations", "slots", "seed", "repeats")},
        "width_calibration": calibration,
        "stage_times_per_decision_s": {"env": per_decision_env, "inference": per_decision_inf},
        "bound_steps_per_s": bound,
        "sequential_steps_per_s": sequential,
        "plans": results,
        "rounds": rounds,
        "best_pipelined": _label(best_pipe),
        "best_fixed": _label(best_fixed),
        "repeated_plans": [_label(r) for r in repeat],
        "bound_ratio": med("bound_ratio"),
        "bound_ratio_range": spread("bound_ratio"),
        "pipelined_vs_collocated": med("pipelined_vs_collocated"),
        "pipelined_vs_collocated_range": spread("pipelined_vs_collocated"),
        "auto_vs_best": med("auto_vs_best"),
        "auto_vs_best_range": spread("auto_vs_best"),
        "auto_collect_vs_best_pipelined": med("auto_collect_vs_best_pipelined"),
        "auto_after_choice_vs_best": med("auto_after_choice_vs_best"),
        "plan_error": med("plan_error"),
        "plan_error_range": spread("plan_error"),
        "elapsed_s": elapsed,
    }
    print()
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: bound {r['bound_steps_per_s']:.0f} steps/s, best pipelined {r['best_pipelined']} {r['best_pipelined_steps_per_s']:.0f} "
              f"({r['bound_ratio']:.2f} x bound, {r['pipelined_vs_collocated']:.2f} x collocated), "
              f"auto {r['auto_vs_best']:.2f} x best fixed ({r['best_fixed']}), planner error {r['plan_error']:.1%}")
    print(f"stage times per decision (collocated runs, median): env {per_decision_env * 1e3:.2f} ms, inference {per_decision_inf * 1e3:.2f} ms")
    print(f"bound 1/max(stage): {bound:8.0f} steps/s    sequential 1/sum: {sequential:8.0f} steps/s")
    print(f"best pipelined plan of each round, median of {len(rounds)} rounds: {out['bound_ratio']:.2f} x bound "
          f"({out['bound_ratio_range'][0]:.2f}-{out['bound_ratio_range'][1]:.2f}), {out['pipelined_vs_collocated']:.2f} x collocated-sequential "
          f"({out['pipelined_vs_collocated_range'][0]:.2f}-{out['pipelined_vs_collocated_range'][1]:.2f})")
    print(f"auto ({auto.get('planner_choice', '?')}): {out['auto_vs_best']:.2f} x best fixed plan "
          f"({out['auto_vs_best_range'][0]:.2f}-{out['auto_vs_best_range'][1]:.2f}); planner error {out['plan_error']:.1%}")
    print(f"auto, every iteration after its first choice (re-verification after drift included): "
          f"{out['auto_after_choice_vs_best']:.2f} x best fixed plan")
    print(f"[{elapsed:.0f} s; rlweave bench flow]")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
