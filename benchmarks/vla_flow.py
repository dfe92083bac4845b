"""A pixel VLA rollout, pipelined by the planner against the best collocated layout, in one run.

The workflow is the ``ppo-vla-mt3`` recipe run through the real on-policy runner: MetaWorld
(reach, drawer-close, button-press-topdown) env workers render a 64x64 camera image (on the CPU,
llvmpipe, where there is no GPU) and send it with the instruction to a rollout worker holding the
recipe's small VLA (SigLIP tower + Qwen3 LM, chunk head, ~2.9 M parameters); one decision is
``env.chunk`` = 4 env steps; PPO trains on the actor between collections (the recipe's 2 epochs of
64-row minibatches) and the weights go back to the rollout worker. The policy starts from its
random initialisation (no SFT warm-up: the weights do not change the work of a decision). Why this
workload: rendering makes the env stage expensive and a transformer makes inference expensive,
the case pipelining is for; which stage dominates is printed per run (env / inference seconds) and
kept in the JSON (``rounds[].env_s_per_decision``, ``inference_s_per_decision``). Every plan runs
the same logical workflow (envs, decisions, model, PPO settings, seed); only the layout changes.

Layouts a user can choose without the planner (the *baselines*; the fastest of them in each
round is the one the headline is against, BENCHMARKS.md rule 2):

  collocated     env and rollout fused in one process on slot 0, one torch thread, k = 1
  collocated-2t  the same process with two torch threads (what the recipe's ``rollout.threads: 2``
                 asks for; :func:`group_threads` says why this side needs a shim)
  fused-dp       two env workers, each with its rollout replica fused in its process, one per slot
                 (data parallel over both cores, no pipelining)

The planner's layouts (the *pipelined* side):

  disaggregated  env worker on slot 0, rollout on slot 1, k micro-batches streaming between them
  hybrid         two env workers on slots 0 and 1, rollout on slot 1, k micro-batches
  auto           ``placement.mode=auto``: the planner profiles, predicts every candidate, verifies
                 a shortlist and runs its choice; reported beside the headline, not in it

The actor sits on slot 0 with the recipe's threads in every plan. Figures per run, from the
runner's own ``metrics.jsonl`` (``samples/produced``, ``time/*``), medians over the iterations
after the first (the first warms up; for auto it is its first profile):

  iteration_steps_per_s  env steps of an iteration / its whole time (collection + training +
                         weight sync): the HEADLINE unit (BENCHMARKS.md rule 4)
  collect_steps_per_s    env steps / the collection's time (env stepping and inference only)

  ratio              best pipelined / best baseline, whole iteration, per round; median over rounds
  ratio_collect      the same with collection-only figures (each side's fastest collection)
  bound_ratio        best pipelined collection / the bound 1 / max(env, inference) per decision of
                     a one-env-worker pipeline, the stage times taken from the round's collocated
                     run, where the stages run alone (hybrid splits env stepping over both cores
                     and can pass it); 1 / sum is beside it as ``sequential_steps_per_s``
  auto_steady_ratio  auto over the iterations after its choice / best baseline (``auto_choice``
                     names the layout it chose; fused-dp means it chose not to pipeline)
  auto_run_ratio     auto over its whole run after its first iteration, profiling and
                     verification included / best baseline

Protocol, as in ``bench flow``: each run in a fresh process (``_common.side_env``); round 1 runs
every plan; later rounds run the baselines and the ``--finalists`` fastest pipelined plans of
round 1 (auto too with ``--auto-every-round``), in alternating order (A B ..., ... B A). Ratios
are taken within a round; the headline is their median over rounds, with the range. The defaults
(3 rounds, 3 iterations a fixed-plan run, 8 for auto) are sized to finish in about a quarter of
an hour on 2 quiet cores (an estimate; the run prints its elapsed time).

    rlweave bench vla-flow [--json FILE] [--repeats R] [--iterations N] [--quick] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

RECIPE = "ppo-vla-mt3"
CHUNK = 4  # env actions per decision: the recipe's env.chunk, fixed here so every plan steps the same
BASELINES = ("collocated", "collocated-2t", "fused-dp")
PIPELINED = ("disaggregated", "hybrid")
SETTINGS = ("envs", "steps", "iterations", "auto_iterations", "image", "actor_threads", "quick", "seed", "slots", "extra")

# Every plan's layout: env and rollout slots, torch threads of their processes, env workers.
PLANS: dict[str, dict] = {
    "collocated": {"env": "0", "rollout": "0", "threads": 1, "env_workers": 1},
    "collocated-2t": {"env": "0", "rollout": "0", "threads": 2, "env_workers": 1},
    "fused-dp": {"env": "0-1", "rollout": "0-1", "threads": 1, "env_workers": 2},
    "disaggregated": {"env": "0", "rollout": "1", "threads": 1, "env_workers": 1},
    "hybrid": {"env": "0-1", "rollout": "1", "threads": 1, "env_workers": 2},
    "auto": {"env_workers": 1},
}

# --quick: the model and images of tests/test_vla_pipeline.py (seconds per run, not minutes)
QUICK_MODEL = ["policy.kwargs.vision_hidden=32", "policy.kwargs.vision_layers=1", "policy.kwargs.vision_heads=2",
               "policy.kwargs.vision_intermediate=64", "policy.kwargs.lm_hidden=32", "policy.kwargs.lm_layers=1",
               "policy.kwargs.lm_heads=2", "policy.kwargs.lm_kv_heads=1", "policy.kwargs.lm_intermediate=64"]


def overrides(s: dict, name: str, k: int | None, run_dir: str) -> list[str]:
    """The workflow (the same for every plan) and the plan's layout, as ``rlweave train`` overrides."""
    p = PLANS[name]
    workers = p["env_workers"]
    work = [
        f"env.num_workers={workers}", f"env.num_envs={s['envs'] // workers}", f"env.chunk={CHUNK}",
        f"env.pixels.width={s['image']}", f"env.pixels.height={s['image']}", f"policy.kwargs.image_size={s['image']}",
        *(QUICK_MODEL if s["quick"] else []),
        f"train.rollout_steps={s['steps']}", f"train.total_env_steps={s['envs'] * s['steps'] * CHUNK * iterations_of(s, name)}",
        "train.eval_every=0", "train.checkpoint_every=0", "init.checkpoint=null", "init.sft_recipe=null",
        "algorithm.critic_warmup_iterations=0",  # every timed iteration the same PPO update
        "run.progress=false", "run.tensorboard=false", f"seed={s['seed']}", f"cluster.num_cpus={s['slots']}",
        "placement.groups.actor.slots=0", f"placement.groups.actor.threads={s['actor_threads']}", *s.get("extra", []),
    ]
    if name == "auto":  # the planner lays env and rollout out itself: the recipe's groups go
        layout = ["placement.mode=auto", "~placement.groups.env", "~placement.groups.rollout"]
    else:
        layout = [f"placement.groups.env.slots={p['env']}", f"placement.groups.rollout.slots={p['rollout']}",
                  f"placement.groups.env.threads={p['threads']}", f"placement.groups.rollout.threads={p['threads']}",
                  f"rollout.num_workers={2 if name == 'fused-dp' else 1}", f"rollout.micro_batches={k or 1}"]
    return [*work, *layout, f"run.dir={run_dir}"]


def iterations_of(s: dict, name: str) -> int:
    """Auto runs longer: it spends its first iterations profiling and verifying a shortlist."""
    return s["auto_iterations"] if name == "auto" else s["iterations"]


@contextlib.contextmanager
def group_threads(cfg) -> Iterator[None]:
    """Within the block, env and rollout processes get ``placement.groups.{env,rollout}.threads``.

    Why a shim: the on-policy runner lays env and rollout out from a ``FlowPlan``, whose
    ``placements()`` carry slots but no thread count, so the recipe's ``rollout.threads: 2`` is
    dropped and every env/rollout process runs one torch thread. A user who writes that setting
    expects one process with two threads, and the baseline is measured at its best (rule 2), so
    the ``collocated-2t`` side runs what its config says (``host_threads`` in its figures shows
    what the processes got). A placement that already carries threads keeps them: once the
    runner honours the setting itself, this changes nothing."""
    from rlweave.flow import plan as plan_module

    wanted = {g: cfg.placement.groups[g].threads for g in ("env", "rollout") if g in cfg.placement.groups}
    original = plan_module.FlowPlan.placements

    def placements(self):
        out = original(self)
        for group, placement in out.items():
            if placement.threads is None and wanted.get(group) is not None:
                placement.threads = int(wanted[group])
        return out

    plan_module.FlowPlan.placements = placements
    try:
        yield
    finally:
        plan_module.FlowPlan.placements = original


def host_threads(runner) -> dict:
    """Torch threads of the env and rollout processes, as their hosts were started with them
    (``OMP_NUM_THREADS``, which the host sets beside ``torch.set_num_threads``)."""
    import ray

    out = {}
    for name in ("env", "rollout"):
        hosts = getattr(getattr(runner, name, None), "hosts", None) or []
        try:
            out[name] = [ray.get(h.environ.remote("OMP_NUM_THREADS"), timeout=30) for h in hosts]
        except Exception as e:  # noqa: BLE001 - informational only
            out[name] = f"unknown ({type(e).__name__})"
    return out


def run_plan(settings: dict, name: str, k: int | None, keep_config: bool = False) -> dict:
    """One run of one plan through the on-policy runner, in this (side) process."""
    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.runners.onpolicy import OnPolicyRunner

    seen: dict = {}

    def on_iteration(runner, record) -> None:
        if not seen:  # after the first iteration: what its processes run with, and when it ended
            seen.update(threads=host_threads(runner), first_done=time.perf_counter())

    with tempfile.TemporaryDirectory(prefix=f"bench-vla-flow-{name}-") as run_dir:
        cfg = load_config(RECIPE, overrides(settings, name, k, run_dir))
        with group_threads(cfg) if name == "collocated-2t" else contextlib.nullcontext():
            t0 = time.perf_counter()
            OnPolicyRunner(cfg, run_dir).run(on_iteration=on_iteration)
            wall = time.perf_counter() - t0
        records = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines() if x.strip()]
        plans_path = Path(run_dir, "plans.json")
        plans = json.loads(plans_path.read_text()) if plans_path.exists() else []
        resolved = OmegaConf.to_container(OmegaConf.load(Path(run_dir, "config.yaml"))) if keep_config else None
    out = summarize(name, records, plans, wall, resolved)
    out["host_threads"] = seen.get("threads")
    # start-up: Ray, the worker processes, envs and model, up to the first iteration's start
    out["startup_s"] = seen["first_done"] - t0 - records[0]["time/iteration"] if seen else float("nan")
    return out


def summarize(name: str, records: list[dict], plans: list[dict], wall: float, resolved: dict | None = None) -> dict:
    """A run's figures from its metrics records: medians over the iterations after the first."""
    measured = records[1:]
    if not measured:
        raise RuntimeError(f"vla-flow: plan {name} left no measured iterations; raise --iterations")
    rate = lambda rs, key: C.median([r["samples/produced"] / r[key] for r in rs])  # noqa: E731
    med = lambda key: C.median([r[key] for r in measured])  # noqa: E731
    last = measured[-1]
    out = {
        "plan": name, "micro_batches": last["plan/micro_batches"], "env_workers": last["plan/env_workers"],
        "rollout_workers": last["plan/rollout_workers"], "fused": bool(last["plan/fused"]),
        "iteration_steps_per_s": rate(measured, "time/iteration"), "collect_steps_per_s": rate(measured, "time/collect"),
        "env_steps_per_iteration": C.median([r["samples/produced"] for r in measured]),
        "time_iteration_s": med("time/iteration"), "time_collect_s": med("time/collect"), "time_env_s": med("time/env"),
        "time_rollout_s": med("time/rollout"), "time_actor_s": med("time/actor"), "time_weight_sync_s": med("time/weight_sync"),
        "first_iteration_s": records[0]["time/iteration"], "iterations": len(records),
        "timed_s": sum(r["time/iteration"] for r in measured), "wall_s": wall,
    }
    chosen = [p for p in plans if p.get("reason") == "chosen"]
    if chosen:  # auto: the figures under its choice, after the iteration that made it
        steady = [r for r in records if r["iteration"] > chosen[-1]["iteration"]]
        out.update({
            "planner_choice": chosen[-1]["chosen"]["plan"], "planner_ranking": chosen[-1]["ranked"],
            "auto_choice": layout_name(steady[-1]) if steady else "?",
            "planner_log": [{k: v for k, v in p.items() if k in ("iteration", "reason", "plan")} for p in plans],
            "steady_iterations": len(steady),
            "steady_iteration_steps_per_s": rate(steady, "time/iteration") if steady else float("nan"),
            "steady_collect_steps_per_s": rate(steady, "time/collect") if steady else float("nan"),
        })
        errors = [r["plan/error"] for r in steady if "plan/error" in r]
        out["plan_error"] = C.median(errors) if errors else float("nan")
    if resolved is not None:
        out["config"] = {k: resolved.get(k) for k in ("env", "policy", "algorithm", "train", "rollout", "placement", "planner", "cluster", "init")}
    return out


def layout_name(record: dict) -> str:
    """This benchmark's name for the layout a metrics record ran under (what auto chose, in the
    names of the fixed plans: a choice of fused-dp means the planner did not pipeline)."""
    fused, n_env, k = record["plan/fused"], record["plan/env_workers"], record["plan/micro_batches"]
    if fused:
        name = "collocated" if n_env == 1 else "fused-dp"
        return name if k == 1 else f"{name} k={k}"
    if n_env == 1:
        return f"disaggregated k={k}"
    return f"hybrid k={k}" if record["plan/rollout_workers"] == 1 else f"env[{n_env}] rollout[{record['plan/rollout_workers']}] k={k}"


def label(r: dict) -> str:
    return r["plan"] if r["plan"] in BASELINES or r["plan"] == "auto" else f"{r['plan']} k={r['micro_batches']}"


def round_figures(s: dict, baselines: list[dict], pipelined: list[dict], auto: dict | None) -> dict:
    """One round's ratios. The bound comes from the round's collocated run, where env stepping and
    inference take turns in one process: 1 / max(stage) per decision, and 1 / sum beside it."""
    colloc = next(r for r in baselines if r["plan"] == "collocated")
    decision_steps = s["envs"] * CHUNK
    env, inference = colloc["time_env_s"] / s["steps"], colloc["time_rollout_s"] / s["steps"]
    bound = decision_steps / max(env, inference)
    best_base = max(baselines, key=lambda r: r["iteration_steps_per_s"])
    best_base_collect = max(baselines, key=lambda r: r["collect_steps_per_s"])
    best_pipe = max(pipelined, key=lambda r: r["iteration_steps_per_s"])
    best_pipe_collect = max(pipelined, key=lambda r: r["collect_steps_per_s"])
    out = {
        "env_s_per_decision": env, "inference_s_per_decision": inference, "bound_steps_per_s": bound,
        "sequential_steps_per_s": decision_steps / (env + inference),
        "best_baseline": label(best_base), "best_baseline_steps_per_s": best_base["iteration_steps_per_s"],
        "best_baseline_collect": label(best_base_collect), "best_pipelined": label(best_pipe),
        "best_pipelined_steps_per_s": best_pipe["iteration_steps_per_s"], "best_pipelined_collect": label(best_pipe_collect),
        "ratio": best_pipe["iteration_steps_per_s"] / best_base["iteration_steps_per_s"],
        "ratio_collect": best_pipe_collect["collect_steps_per_s"] / best_base_collect["collect_steps_per_s"],
        "bound_ratio": best_pipe_collect["collect_steps_per_s"] / bound,
        "vs_each_baseline": {label(b): best_pipe["iteration_steps_per_s"] / b["iteration_steps_per_s"] for b in baselines},
        "vs_each_baseline_collect": {label(b): best_pipe_collect["collect_steps_per_s"] / b["collect_steps_per_s"] for b in baselines},
    }
    if auto is not None:
        out.update({
            "auto_choice": auto.get("auto_choice", "?"), "plan_error": auto.get("plan_error", float("nan")),
            "auto_steady_ratio": auto.get("steady_iteration_steps_per_s", float("nan")) / best_base["iteration_steps_per_s"],
            "auto_run_ratio": auto["iteration_steps_per_s"] / best_base["iteration_steps_per_s"],
        })
    return out


HEADLINES = ("ratio", "ratio_collect", "bound_ratio", "auto_steady_ratio", "auto_run_ratio", "plan_error")


def gl_info() -> dict:
    """The OpenGL renderer the env workers render with (llvmpipe on a CPU-only machine: rendering
    is CPU work and belongs to the env stage), and the variables that steer it."""
    import os

    info = {k: os.environ.get(k) for k in ("MUJOCO_GL", "LP_NUM_THREADS", "GALLIUM_DRIVER")}
    try:
        os.environ.setdefault("MUJOCO_GL", "egl")
        import mujoco
        from OpenGL import GL

        ctx = mujoco.GLContext(16, 16)
        ctx.make_current()
        try:
            info["renderer"] = GL.glGetString(GL.GL_RENDERER).decode()
            info["gl_version"] = GL.glGetString(GL.GL_VERSION).decode()
        finally:
            ctx.free()
    except Exception as e:  # noqa: BLE001 - informational only
        info["renderer"] = f"unknown ({type(e).__name__}: {e})"
    return info


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rlweave bench vla-flow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the figures, settings and configs as one JSON object")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny VLA, 32x32 images, 4 envs, 4 decisions, 2 iterations, 1 round; plans "
                         "collocated, fused-dp and disaggregated k=2, auto off (the figures mean nothing)")
    ap.add_argument("--envs", type=int, default=None, help="envs of the workflow, all env workers together (default 6, the recipe's)")
    ap.add_argument("--steps", type=int, default=None, help="decisions per env per iteration (default 32, the recipe's)")
    ap.add_argument("--iterations", type=int, default=None, help="iterations per run of a fixed plan; the first is not measured (default 3)")
    ap.add_argument("--auto-iterations", type=int, default=None,
                    help="iterations of the auto run (default 8: 2 profiling, up to 3 verifying, then its choice)")
    ap.add_argument("--depths", default=None, help="micro-batch counts of the pipelined plans (default 2,3)")
    ap.add_argument("--baselines", default=None, help=f"layouts of the baseline side (default {','.join(BASELINES)})")
    ap.add_argument("--pipelined", default=None, help=f"layouts of the pipelined side (default {','.join(PIPELINED)})")
    ap.add_argument("--auto", choices=("on", "off"), default=None, help="the placement.mode=auto run (default on; off with --quick)")
    ap.add_argument("--auto-every-round", action="store_true", help="run auto in every round, not only in round 1")
    ap.add_argument("--finalists", type=int, default=1, help="pipelined plans of round 1 that every later round runs again")
    ap.add_argument("--repeats", type=int, default=None, help="rounds (the first screens every plan; default 3)")
    ap.add_argument("--actor-threads", type=int, default=None, help="torch threads of the trainer, the same in every plan (default 2, the recipe's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override for every plan (repeatable), e.g. --set policy.kwargs.lm_layers=8")
    ap.add_argument("--slots", type=int, default=2, help="CPU slots of the embedded cluster")
    ap.add_argument("--seed", type=int, default=0)
    C.add_side_args(ap)
    args = ap.parse_args(argv)
    q = args.quick
    defaults = {"envs": 4 if q else 6, "steps": 4 if q else 32, "iterations": 2 if q else 3, "auto_iterations": 5 if q else 8,
                "depths": "2" if q else "2,3", "baselines": "collocated,fused-dp" if q else ",".join(BASELINES),
                "pipelined": "disaggregated" if q else ",".join(PIPELINED), "repeats": 1 if q else 3, "actor_threads": 1 if q else 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.no_auto = (args.auto or ("off" if q else "on")) == "off"
    args.image = 32 if q else 64
    args.extra = list(args.set)
    names = args.baselines.split(",")
    if any(b not in BASELINES for b in names) or "collocated" not in names:
        ap.error(f"--baselines: choose from {', '.join(BASELINES)}, collocated included (the bound comes from it); got {args.baselines}")
    if any(x not in PIPELINED for x in args.pipelined.split(",")):
        ap.error(f"--pipelined: choose from {', '.join(PIPELINED)}; got {args.pipelined}")
    if args.envs % 2 or args.iterations < 2 or args.repeats < 1 or args.finalists < 1:
        ap.error("--envs must be even (two env workers split them), --iterations at least 2, --repeats and --finalists at least 1")
    return args


def describe(r: dict) -> str:
    """One printed line per run."""
    chose = f"; auto chose {r['auto_choice']} ({r['planner_choice']})" if "planner_choice" in r else ""
    return (f"  {label(r):<17} env[{r['env_workers']}] rollout[{r['rollout_workers']}]{' fused' if r['fused'] else '      '}: "
            f"iteration {r['iteration_steps_per_s']:6.1f} env steps/s, collect {r['collect_steps_per_s']:6.1f} (env "
            f"{r['time_env_s']:.2f} s, inference {r['time_rollout_s']:.2f} s, train {r['time_actor_s']:.2f} s; start-up "
            f"{r['startup_s']:.0f} s; threads {r['host_threads']}){chose}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.side:
        return C.serve_side(run_plan, args.side_params)
    s = {k: getattr(args, k) for k in SETTINGS}
    depths = [int(x) for x in args.depths.split(",")]
    baseline_names, pipe_names = args.baselines.split(","), args.pipelined.split(",")
    pipelined_plans = [("disaggregated", k) for k in depths if "disaggregated" in pipe_names and args.envs % k == 0]
    pipelined_plans += [("hybrid", k) for k in depths if "hybrid" in pipe_names and (args.envs // 2) % k == 0]
    if not pipelined_plans:
        print(f"vla-flow: no micro-batch count of {args.depths} splits the envs of {args.pipelined}")
        return 2
    sides = [*baseline_names, *[n for n in PIPELINED if n in pipe_names], *([] if args.no_auto else ["auto"])]
    configs = {n: {"overrides": " ".join(overrides(s, n, None, "RUN_DIR")), "role": role(n),
                   "micro_batches": "per run, in plans[]" if n in PIPELINED else ("planner's" if n == "auto" else 1)} for n in sides}
    out = C.report("vla-flow", argv, "ratio: best pipelined plan / best of the layouts a user picks without the planner "
                   "(collocated, collocated-2t, fused-dp), whole-iteration env steps/s (collection + PPO training + weight "
                   "sync), median over rounds; ratio_collect: the same, collection only", configs, args.repeats)
    out.update({"gl": gl_info(), "recipe": RECIPE})
    print(f"vla-flow benchmark: {RECIPE}, {args.envs} envs, {args.image}x{args.image} pixels, chunk {CHUNK}, {args.steps} decisions"
          f"/iteration, {args.iterations} iterations per fixed-plan run ({args.auto_iterations} for auto), {args.slots} slots"
          f"{', QUICK (tiny VLA; the figures mean nothing)' if args.quick else ''}; {out['environment']['cpu_model']}; "
          f"GL {out['gl'].get('renderer')}")
    common = [o for o in overrides(s, "collocated", None, "RUN_DIR") if o in overrides(s, "fused-dp", None, "RUN_DIR")]
    print("  every plan: " + " ".join(common))
    for n in sides:
        print(f"  {n:<14} {role(n)}: " + " ".join(o for o in overrides(s, n, None, "RUN_DIR") if o not in common))
    here, results, current = Path(__file__).resolve(), [], [1]

    def run(name: str, k: int | None = None) -> dict:
        r = C.run_side(here, "plan", {"settings": s, "name": name, "k": k, "keep_config": current[0] == 1}, threads=1)
        r["round"] = current[0]
        results.append(r)
        print(describe(r), flush=True)
        return r

    t_start = time.perf_counter()
    base = [run(n) for n in baseline_names]
    pipes = [run(n, k) for n, k in pipelined_plans]
    auto = None if args.no_auto else run("auto")
    rounds = [round_figures(s, base, pipes, auto)]
    finalists = sorted(pipes, key=lambda r: r["iteration_steps_per_s"], reverse=True)[: args.finalists]
    names = baseline_names + [label(r) for r in finalists] + (["auto"] if auto and args.auto_every_round else [])
    for i, order in enumerate(C.pair_order(names, args.repeats)[1:], start=2):
        current[0] = i
        print(f" round {i}/{args.repeats}: {', '.join(order)}", flush=True)
        got = {}
        for n in order:
            plan, _, k = n.partition(" k=")
            got[n] = run(plan, int(k) if k else None)
        rounds.append(round_figures(s, [got[n] for n in baseline_names], [got[label(r)] for r in finalists], got.get("auto")))
    elapsed = time.perf_counter() - t_start
    out.update({"baseline": "per round, the fastest of " + ", ".join(baseline_names) + " (whole iteration; collection-only "
                "figures against the fastest collection)", "settings": s,
                "pipelined_plans": [f"{n} k={k}" for n, k in pipelined_plans], "repeated_plans": names, "plans": results,
                "rounds": rounds, "elapsed_s": elapsed})
    for key in HEADLINES:
        vals = [r[key] for r in rounds if key in r]
        out[key], out[f"{key}_range"] = (C.median(vals), [min(vals), max(vals)]) if vals else (None, None)
    print()
    for i, r in enumerate(rounds, 1):
        print(f"round {i}: best pipelined {r['best_pipelined']} {r['ratio']:.2f} x best baseline {r['best_baseline']} "
              f"(collection {r['ratio_collect']:.2f}: {r['best_pipelined_collect']} vs {r['best_baseline_collect']}); "
              f"{r['bound_ratio']:.2f} x bound"
              + (f"; auto ({r['auto_choice']}) steady {r['auto_steady_ratio']:.2f} x best baseline" if "auto_choice" in r else ""))
    rng = lambda k: f"{out[k]:.2f} ({out[k + '_range'][0]:.2f}-{out[k + '_range'][1]:.2f})"  # noqa: E731
    print(f"median of {len(rounds)} round(s): HEADLINE pipelined vs best collocated layout, whole iteration {rng('ratio')}; "
          f"collection only {rng('ratio_collect')}; bound ratio {rng('bound_ratio')}"
          + (f"; auto steady state {rng('auto_steady_ratio')}, over its run {rng('auto_run_ratio')}" if out["auto_run_ratio"] is not None else ""))
    print(f"[{elapsed:.0f} s; {out['command']}]")
    C.write_json(args.json, out)
    return 0


def role(name: str) -> str:
    return "baseline" if name in BASELINES else ("planner" if name == "auto" else "pipelined")


if __name__ == "__main__":
    sys.exit(main())
