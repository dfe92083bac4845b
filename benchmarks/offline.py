"""IQL against behaviour cloning on the same offline dataset, over several seeds.

Trains the ``iql-hopper-medium`` recipe (or ``--recipe``) twice per seed on ``--dataset``: once as
IQL and once as offline BC (``algorithm.name=offline_bc``: the same actor, regressing the dataset's
actions), with the same evaluation protocol (deterministic
policy, ``train.eval_episodes`` episodes on separately seeded envs). Reports per seed and as mean
+- std: the final evaluation return, the mean of the last three evaluations, and the dataset's own
mean episode return; and the ratios IQL / dataset and IQL / BC. The verdict (the issue's target)
is IQL's mean final return above both the dataset's mean return and BC's.

BC converges in a few thousand updates, so ``--bc-updates`` may be smaller than IQL's ``--updates``.

    rlweave bench offline --dataset data/hopper-medium --seeds 0 1 2 --updates 100000 --bc-updates 30000 [--lanes N] [--json F] [key=value ...]

An offline run keeps one core busy (its learner), so ``--lanes 2`` on two cores trains two runs at
once, about twice as fast; the runs and their order in the report are the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402
from learning import run_seeds  # noqa: E402


def _read_run(run_dir: Path) -> dict:
    """A finished run's evaluations, as :func:`learning.run_seed` reports them."""
    from omegaconf import OmegaConf

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["env_steps"], r["eval/episode_return"]) for r in rows if r.get("eval/episode_return") is not None]
    budget = int(OmegaConf.load(run_dir / "config.yaml").train.total_updates)
    return {"seed": run_dir.name, "run_dir": str(run_dir), "wall_s": rows[-1]["wall_time"], "env_steps": 0,
            "updates": rows[-1].get("train/updates"), "budget": budget, "final_eval_return": evals[-1][1], "evals": evals}


def _summary(runs: list[dict]) -> dict:
    finals = [r["final_eval_return"] for r in runs]
    last3 = [statistics.fmean(v for _, v in r["evals"][-3:]) for r in runs]
    return {"final_mean": statistics.fmean(finals), "final_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
            "last3_mean": statistics.fmean(last3), "finals": finals, "wall_s": [r["wall_s"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="a Minari dataset folder (rlweave collect)")
    p.add_argument("--recipe", default="iql-hopper-medium")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--updates", type=int, default=100_000, help="gradient updates per IQL run")
    p.add_argument("--bc-updates", type=int, default=None, help="gradient updates per BC run (default: --updates)")
    p.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temporary folder)")
    p.add_argument("--lanes", type=int, default=1, help="runs at a time (each its own process and Ray)")
    p.add_argument("--json", default=None)
    p.add_argument("--summarize", nargs=2, metavar=("IQL_DIR", "BC_DIR"), default=None,
                   help="train nothing: summarise kept runs (folders of seed*/ run folders) instead")
    p.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    args = p.parse_args(argv)
    if args.lanes < 1:
        p.error(f"--lanes must be at least 1, got {args.lanes}")

    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.envs import space_info
    from rlweave.data.datasets import load_transitions

    cfg = load_config(args.recipe, [f"replay.offline_dataset={args.dataset}", *args.overrides])
    obs_space, act_space = space_info(cfg.env.id, cfg.env.pixels, OmegaConf.to_container(cfg.env.kwargs))
    _, stats = load_transitions(args.dataset, obs_space, act_space, cfg.algorithm.gamma)
    plan = "kept runs" if args.summarize else f"IQL {args.updates} updates, BC {args.bc_updates or args.updates}; seeds {args.seeds}"
    print(f"offline: {args.recipe} on {args.dataset} ({stats['episodes']} episodes, {stats['steps']} steps, "
          f"return {stats['return_mean']:.1f} +- {stats['return_std']:.1f}); {plan}")
    updates = {"iql": args.updates, "offline_bc": args.bc_updates or args.updates}
    results: dict[str, list[dict]] = {}
    if args.summarize:
        for algo, folder in zip(("iql", "offline_bc"), args.summarize):
            runs = [_read_run(d) for d in sorted(Path(folder).glob("seed*")) if (d / "metrics.jsonl").is_file()]
            results[algo] = [r for r in runs if r["updates"] == r["budget"]]
            for r in runs:
                done = "" if r["updates"] == r["budget"] else f" of {r['budget']}: unfinished, left out"
                print(f"  {algo} {Path(r['run_dir']).name}: final eval return {r['final_eval_return']:.1f} after "
                      f"{r['updates']} updates{done}")
    if not args.summarize:
        jobs = [(args.recipe, seed, [f"algorithm.name={algo}", f"replay.offline_dataset={args.dataset}",
                                     f"train.total_updates={updates[algo]}", *args.overrides],
                 str(Path(args.keep) / algo) if args.keep else None)
                for algo in ("iql", "offline_bc") for seed in args.seeds]

        def report(job, r):
            algo = next(o.split("=", 1)[1] for o in job[2] if o.startswith("algorithm.name="))
            print(f"  {algo} seed {job[1]}: final eval return {r['final_eval_return']:.1f}; {r['wall_s']:.0f} s", flush=True)

        runs = run_seeds(jobs, args.lanes, report)
        results = {"iql": runs[: len(args.seeds)], "offline_bc": runs[len(args.seeds):]}
    iql, bc = _summary(results["iql"]), _summary(results["offline_bc"])
    data_mean = stats["return_mean"]
    passed = iql["final_mean"] > data_mean and iql["final_mean"] > bc["final_mean"]
    print(f"IQL {iql['final_mean']:.1f} +- {iql['final_std']:.1f} | BC {bc['final_mean']:.1f} +- {bc['final_std']:.1f} | "
          f"dataset {data_mean:.1f}; IQL/dataset {iql['final_mean'] / data_mean:.2f}, IQL/BC {iql['final_mean'] / bc['final_mean']:.2f}; "
          f"{'IQL above both' if passed else 'IQL NOT above both'}")
    out = {"benchmark": "offline", "recipe": args.recipe, "dataset": str(args.dataset), "dataset_stats": stats,
           "updates": {a: sorted({r["updates"] for r in results[a]}) for a in results} if args.summarize else args.updates,
           "bc_updates": None if args.summarize else args.bc_updates or args.updates,
           "seeds": [r["seed"] for r in results["iql"]] if args.summarize else args.seeds, "iql": iql, "bc": bc,
           "ratio_iql_to_dataset": iql["final_mean"] / data_mean, "ratio_iql_to_bc": iql["final_mean"] / bc["final_mean"],
           "passed": passed, "runs": results, "overrides": args.overrides, "environment": C.environment_info()}
    if args.json:
        C.write_json(args.json, out)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
