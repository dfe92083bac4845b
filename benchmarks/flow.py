"""Execution plans of one workflow, measured in one run: collocated, fused data-parallel,
disaggregated, hybrid, auto.

The workflow is PPO on a MuJoCo task (HalfCheetah-v5 by default) with many envs (768) and a
policy big enough that inference costs about as much as env stepping (actor and critic MLPs of
3 layers, ~640-1024 wide: a stand-in for the larger policies -- VLAs -- that make embodied RL
inference-bound), so the order in which the two stages run matters. Many envs, because a forward
of such an MLP has a fixed cost of a few ms: a micro-batch must hold enough rows (128+) that
splitting the batch does not multiply that cost, and 768 splits into 2, 3 and 4 micro-batches.
Every plan runs the same logical workflow (same envs, rollout length, policy, seed, number of
iterations); only the physical layout changes:

  collocated     env and rollout fused in one process on slot 0, one micro-batch (the one-core
                 sequential plan)
  fused-dp       two env workers of 384 envs, each with its rollout worker fused in its process,
                 one per slot (data parallel over the two cores, no pipelining): the two-core
                 baseline a pipelined plan has to beat
  disaggregated  env on slot 0, rollout on slot 1, k micro-batches streaming between them
  hybrid         env on slots 0 and 1 (two workers), rollout on slot 1 (shared with an env worker)
  auto           placement.mode=auto: the planner profiles, predicts every candidate, switches

The actor (trainer) sits on slot 0 in every plan; on-policy PPO trains between collections.
Headline figures are *whole-iteration* env-steps/s (collection + training + weight sync; the
median over a run's iterations after the first), with the collection-only figures beside them:

  pipelined_vs_fused_dp     best pipelined plan / fused-dp (both on two cores)
  pipelined_vs_collocated   best pipelined plan / collocated (two cores against one; labelled so)
  auto_vs_best              auto / the best fixed plan, each over its *whole* run: every iteration
                            auto ran (its profiling and verification iterations included) against
                            every iteration of the best fixed plan's run of the same length
  bound_ratio               best pipelined collection / the bound 1 / max(env, inference) per
                            decision, from the stage times of the round's collocated run

Each plan runs in a fresh process (``_common.side_env``: one thread in the driver, rlweave's
malloc settings, flush-denormal). Round 1 runs every plan; each later round runs collocated,
fused-dp, the two fastest pipelined plans of round 1 (and the best fixed plan if it is none of
them) and auto, in alternating order (A B ... , ... B A). Each ratio is taken within its round;
the headline is the median over rounds, with the range.

Stage balance: ``--hidden auto`` (default) first times, on one thread, one step of the envs and
the policy's ``act`` on as many rows for a ladder of widths, and runs every plan with the 3-layer
width whose inference time is closest to the env step's (printed and in the JSON).

    rlweave bench flow [--json FILE] [--repeats R] [--iterations N] [--envs N] [--hidden auto|1024,1024,1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

WIDTHS = (384, 512, 640, 768, 896, 1024, 1280)  # the ladder --hidden auto chooses from
SETTINGS = ("env_id", "envs", "hidden", "steps", "iterations", "slots", "gpus", "seed")


def calibrate_width(args) -> dict:
    """Times one step of ``args.envs`` envs (random actions) and ``act`` of the workflow's policy
    on as many rows for each width of ``WIDTHS`` (3 layers, tanh), one thread; returns the width
    whose inference time is closest to the env step's, with every timing."""
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
        envs.step(rng.uniform(space.low, space.high, size=(args.envs, 1, *space.shape)).astype(np.float32))

    env_s = median_time(env_step, 5)
    x = torch.from_numpy(obs.astype(np.float32))
    inference = {}
    for width in WIDTHS:
        policy = build_policy("mlp", envs.single_observation_space, space, hidden=[width] * 3, activation="tanh")
        inference[width] = median_time(lambda: policy.act(x), 5)
    width = min(WIDTHS, key=lambda w: abs(inference[w] - env_s))
    return {"env_step_s": env_s, "inference_s": inference, "width": width}


PLANS = {
    "collocated": ["placement.groups.env.slots=0", "placement.groups.rollout.slots=0", "placement.groups.actor.slots=0",
                   "rollout.micro_batches=1"],
    "fused-dp": ["placement.groups.env.slots=0-1", "placement.groups.rollout.slots=0-1", "placement.groups.actor.slots=0",
                 "rollout.micro_batches=1"],
    "disaggregated": ["placement.groups.env.slots=0", "placement.groups.rollout.slots=1", "placement.groups.actor.slots=0"],
    "hybrid": ["placement.groups.env.slots=0-1", "placement.groups.rollout.slots=1", "placement.groups.actor.slots=0"],
    "auto": ["placement.mode=auto"],
}
TWO_ENV_WORKERS = ("fused-dp", "hybrid")  # plans whose envs are split between two env workers


def overrides(s: dict, name: str, k: int | None, run_dir: str) -> list[str]:
    """The workflow (fixed for every plan) and the plan's layout."""
    workers = 2 if name in TWO_ENV_WORKERS else 1
    extra = list(PLANS[name]) + ([f"rollout.micro_batches={k}"] if k is not None else [])
    return [
        f"env.id={s['env_id']}", f"env.num_workers={workers}", f"env.num_envs={s['envs'] // workers}",
        f"rollout.num_workers={2 if name == 'fused-dp' else 1}",
        f"policy.hidden=[{s['hidden']}]", "policy.activation=tanh", f"train.rollout_steps={s['steps']}",
        "algorithm.epochs=1", f"algorithm.minibatch_size={s['envs'] * s['steps']}",
        f"train.total_env_steps={s['envs'] * s['steps'] * s['iterations']}", "train.eval_every=0", "train.checkpoint_every=0",
        "run.progress=false", "run.tensorboard=false", f"seed={s['seed']}",
        f"cluster.num_gpus={s['gpus']}" if s.get("gpus") else f"cluster.num_cpus={s['slots']}",
        f"run.dir={run_dir}", *extra,
    ]


def run_plan(settings: dict, name: str, k: int | None) -> dict:
    """One run of one plan, in this (side) process."""
    from rlweave.config import load_config
    from rlweave.runners.onpolicy import OnPolicyRunner

    with tempfile.TemporaryDirectory(prefix=f"bench-flow-{name}-") as run_dir:
        cfg = load_config("ppo-halfcheetah", overrides(settings, name, k, run_dir))
        t0 = time.perf_counter()
        OnPolicyRunner(cfg, run_dir).run()
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines() if x.strip()]
        plans = json.loads(Path(run_dir, "plans.json").read_text()) if Path(run_dir, "plans.json").exists() else []
    measured = records[1:]  # the first iteration warms up (for auto, it is also its first profile)
    if not measured:
        raise RuntimeError(f"flow bench: plan {name} left no measured iterations; raise --iterations")
    med = lambda key: C.median([r[key] for r in measured])  # noqa: E731
    steps = measured[0]["samples/produced"]
    last = measured[-1]
    out = {
        "plan": name, "micro_batches": last["plan/micro_batches"], "env_workers": last["plan/env_workers"],
        "rollout_workers": last["plan/rollout_workers"], "fused": bool(last["plan/fused"]),
        "collect_steps_per_s": steps / med("time/collect"), "iteration_steps_per_s": steps / med("time/iteration"),
        "whole_run_steps_per_s": steps * len(records) / sum(r["time/iteration"] for r in records),
        "time_collect_s": med("time/collect"), "time_iteration_s": med("time/iteration"), "time_env_s": med("time/env"),
        "time_rollout_s": med("time/rollout"), "time_actor_s": med("time/actor"),
        "iterations": len(records), "timed_s": sum(r["time/iteration"] for r in records), "wall_s": wall,
    }
    errors = [r["plan/error"] for r in measured if "plan/error" in r]
    if errors:
        out["plan_error"] = C.median(errors)
    chosen = [p for p in plans if p["reason"] == "chosen"]
    if chosen:
        out["planner_choice"] = chosen[-1]["chosen"]["plan"]
        out["planner_ranking"] = chosen[-1]["ranked"]
        out["planner_log"] = [{k: v for k, v in p.items() if k in ("iteration", "reason", "plan")} for p in plans]
    return out


def label(r: dict) -> str:
    return f"{r['plan']} k={r['micro_batches']}"


def round_figures(s: dict, colloc: dict, fused: dict, pipelined: list[dict], fixed: list[dict], auto: dict) -> dict:
    """One round's ratios. The bound comes from this round's collocated run, where each stage
    runs alone (env and inference take turns on one slot): 1 / max(stage) per decision."""
    env, inference = colloc["time_env_s"] / s["steps"], colloc["time_rollout_s"] / s["steps"]
    bound = s["envs"] / max(env, inference)
    best_pipe = max(pipelined, key=lambda r: r["iteration_steps_per_s"])
    best_pipe_collect = max(pipelined, key=lambda r: r["collect_steps_per_s"])
    best_fixed = max(fixed, key=lambda r: r["whole_run_steps_per_s"])
    return {
        "env_s_per_decision": env, "inference_s_per_decision": inference, "bound_steps_per_s": bound,
        "sequential_steps_per_s": s["envs"] / (env + inference),
        "best_pipelined": label(best_pipe), "best_pipelined_steps_per_s": best_pipe["iteration_steps_per_s"],
        "best_fixed": label(best_fixed),
        "pipelined_vs_fused_dp": best_pipe["iteration_steps_per_s"] / fused["iteration_steps_per_s"],
        "pipelined_vs_fused_dp_collect": best_pipe_collect["collect_steps_per_s"] / fused["collect_steps_per_s"],
        "pipelined_vs_collocated": best_pipe["iteration_steps_per_s"] / colloc["iteration_steps_per_s"],
        "pipelined_vs_collocated_collect": best_pipe_collect["collect_steps_per_s"] / colloc["collect_steps_per_s"],
        "bound_ratio": best_pipe_collect["collect_steps_per_s"] / bound,
        "auto_vs_best": auto["whole_run_steps_per_s"] / best_fixed["whole_run_steps_per_s"],
        "auto_steady_vs_best": auto["iteration_steps_per_s"] / max(r["iteration_steps_per_s"] for r in fixed),
        "plan_error": auto.get("plan_error", float("nan")), "auto_choice": auto.get("planner_choice", "?"),
    }


HEADLINES = ("pipelined_vs_fused_dp", "pipelined_vs_fused_dp_collect", "pipelined_vs_collocated",
             "pipelined_vs_collocated_collect", "bound_ratio", "auto_vs_best", "auto_steady_vs_best", "plan_error")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="rlweave bench flow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as one JSON object")
    ap.add_argument("--env-id", default="HalfCheetah-v5")
    ap.add_argument("--envs", type=int, default=768, help="envs in the workflow (all env workers together)")
    ap.add_argument("--hidden", default="auto", help="policy MLP widths, or auto: the width whose inference matches the env step")
    ap.add_argument("--steps", type=int, default=8, help="decisions per env per iteration")
    ap.add_argument("--iterations", type=int, default=12, help="iterations per run, the same for every plan and auto")
    ap.add_argument("--depths", default="2,3,4", help="micro-batch counts tried for the pipelined fixed plans")
    ap.add_argument("--slots", type=int, default=2, help="CPU slots of the embedded cluster")
    ap.add_argument("--gpus", type=int, default=0, help="run on N GPUs as the slots (CUDA; the plans need 2); default 0: CPU slots")
    ap.add_argument("--repeats", type=int, default=5, help="rounds (the first screens every plan)")
    ap.add_argument("--seed", type=int, default=0)
    C.add_side_args(ap)
    args = ap.parse_args(argv)
    if args.side:
        return C.serve_side(run_plan, args.side_params)
    depths = [int(x) for x in args.depths.split(",")]
    calibration = None
    if args.gpus:
        if args.gpus < 2:
            print("flow: the plans need 2 slots; with one GPU, scripts/gpu-check.sh runs single plans on it")
            return 2
        args.slots = args.gpus
        if args.hidden == "auto":  # the calibration times CPU inference
            args.hidden = "1024,1024,1024"
    if args.hidden == "auto":
        calibration = calibrate_width(args)
        args.hidden = ",".join([str(calibration["width"])] * 3)
        print(f"calibration (one thread): {args.envs} envs step in {calibration['env_step_s'] * 1e3:.1f} ms; policy act: "
              + ", ".join(f"{w}: {t * 1e3:.1f} ms" for w, t in calibration["inference_s"].items()) + f" -> width {calibration['width']}")
    s = {k: getattr(args, k) for k in SETTINGS}
    configs = {n: {"layout": " ".join(PLANS[n]), "env workers": 2 if n in TWO_ENV_WORKERS else 1} for n in PLANS}
    out = C.report("flow", argv, "whole-iteration env-steps/s per plan; pipelined_vs_fused_dp = best pipelined / the "
                   "two-worker fused plan; auto_vs_best over whole runs of equal length, profiling included", configs, args.repeats)
    print(f"flow benchmark: {args.env_id}, {args.envs} envs, policy MLP [{args.hidden}], {args.steps} decisions/iteration, "
          f"{args.iterations} iterations per run, {args.slots} slots; {out['environment']['cpu_model']}")
    here, results, current = Path(__file__).resolve(), [], [1]

    def run(name: str, k: int | None = None) -> dict:
        r = C.run_side(here, "plan", {"settings": s, "name": name, "k": k}, threads=1)
        r["round"] = current[0]
        results.append(r)
        print(f"  {name:<13} k={r['micro_batches']} env[{r['env_workers']}] rollout[{r['rollout_workers']}]{' fused' if r['fused'] else ''}: "
              f"iteration {r['iteration_steps_per_s']:7.0f} steps/s, collect {r['collect_steps_per_s']:7.0f}, whole run "
              f"{r['whole_run_steps_per_s']:7.0f} (env {r['time_env_s']:.3f} s, inference {r['time_rollout_s']:.3f} s)")
        return r

    t_start = time.perf_counter()
    colloc, fused = run("collocated"), run("fused-dp")
    pipelined = [run("disaggregated", k) for k in depths] + [run("hybrid", k) for k in depths if (args.envs // 2) % k == 0]
    auto = run("auto")
    leaders = sorted(pipelined, key=lambda r: r["iteration_steps_per_s"], reverse=True)[:2]
    best_fixed = max([colloc, fused] + pipelined, key=lambda r: r["whole_run_steps_per_s"])
    repeat = leaders + ([best_fixed] if best_fixed["plan"] not in ("collocated", "fused-dp") and best_fixed not in leaders else [])
    rounds = [round_figures(s, colloc, fused, pipelined, [colloc, fused] + pipelined, auto)]
    names = ["collocated", "fused-dp"] + [label(r) for r in repeat] + ["auto"]
    for i, order in enumerate(C.pair_order(names, args.repeats)[1:], start=2):
        current[0] = i
        print(f" round {i}/{args.repeats}: {', '.join(order)}")
        got = {}
        for n in order:
            plan, _, k = n.partition(" k=")
            got[n] = run(plan, int(k) if k else None)
        pipes = [got[label(r)] for r in repeat]
        rounds.append(round_figures(s, got["collocated"], got["fused-dp"], pipes, [got["collocated"], got["fused-dp"]] + pipes, got["auto"]))
    elapsed = time.perf_counter() - t_start
    out.update({"baseline": "fused-dp: two env workers, each with its rollout fused in its process (two cores, no pipelining)",
                "settings": s, "width_calibration": calibration, "plans": results, "rounds": rounds,
                "repeated_plans": names, "elapsed_s": elapsed})
    for key in HEADLINES:
        vals = [r[key] for r in rounds]
        out[key], out[f"{key}_range"] = C.median(vals), [min(vals), max(vals)]
    out["ratio"] = out["pipelined_vs_fused_dp"]
    print()
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: best pipelined {r['best_pipelined']}: {r['pipelined_vs_fused_dp']:.2f} x fused-dp "
              f"(collect {r['pipelined_vs_fused_dp_collect']:.2f}), {r['pipelined_vs_collocated']:.2f} x collocated, "
              f"{r['bound_ratio']:.2f} x bound; auto ({r['auto_choice']}) {r['auto_vs_best']:.2f} x best fixed ({r['best_fixed']}) "
              f"over the whole run")
    rng = lambda k: f"{out[k]:.2f} ({out[k + '_range'][0]:.2f}-{out[k + '_range'][1]:.2f})"  # noqa: E731
    print(f"median of {len(rounds)} rounds: pipelined vs fused-dp, whole iteration {rng('pipelined_vs_fused_dp')}, collection "
          f"{rng('pipelined_vs_fused_dp_collect')}; vs collocated (one core) {rng('pipelined_vs_collocated')}; bound ratio "
          f"{rng('bound_ratio')}; auto vs best fixed, whole run {rng('auto_vs_best')} (steady state {rng('auto_steady_vs_best')}); "
          f"planner error {out['plan_error']:.1%}")
    print(f"[{elapsed:.0f} s; {out['command']}]")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
