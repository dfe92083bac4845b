"""Learning quality of a recipe over several seeds: evaluation return at the step budget.

Trains ``--recipe`` once per seed (each in its own process, with its own embedded Ray; ``--lanes``
runs at a time, one after the other by default) and reads the runs' metrics.jsonl. Reported per
seed and as mean +- standard deviation:

  * the *evaluation* return at the end of the run (deterministic policy, ``train.eval_episodes``
    episodes on separately seeded envs; not the training return);
  * the first env step at which an evaluation reached ``--threshold``;
  * wall-clock seconds.

The verdict is whether every seed's final evaluation return is at least ``--threshold`` (the
issue's target; published references are quoted in docs/results.md with their protocol).

    rlweave bench learning --recipe sac-pendulum --seeds 0 1 2 --threshold -200 [--lanes N] [--json F] [-- key=value ...]
    python benchmarks/learning.py [same flags]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402


def run_seed(recipe: str, seed: int, overrides: list[str], keep: str | None) -> dict:
    run_dir = Path(keep or tempfile.mkdtemp(prefix=f"bench-learning-{recipe}-")) / f"seed{seed}"
    cmd = [sys.executable, "-m", "rlweave.cli", "train", recipe, f"seed={seed}", f"run.dir={run_dir}",
           "run.progress=false", "run.tensorboard=false", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": "local"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: rlweave train exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["env_steps"], r["eval/episode_return"]) for r in rows if r.get("eval/episode_return") is not None]
    return {"seed": seed, "run_dir": str(run_dir), "wall_s": wall, "env_steps": rows[-1]["env_steps"],
            "final_eval_return": evals[-1][1] if evals else None, "evals": evals}


def run_seeds(jobs: list[tuple[str, int, list[str], str | None]], lanes: int = 1, on_done=None) -> list[dict]:
    """:func:`run_seed` for each ``(recipe, seed, overrides, keep)`` job, ``lanes`` at a time
    (each a process with its own embedded Ray: two lanes on two cores suit runs that keep one core
    busy, such as offline learners). Results come back in the order of ``jobs``; ``on_done(job,
    result)`` is called as each finishes."""

    def one(job):
        result = run_seed(*job)
        if on_done is not None:
            on_done(job, result)
        return result

    with cf.ThreadPoolExecutor(max_workers=lanes) as pool:
        return list(pool.map(one, jobs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threshold", type=float, required=True, help="evaluation return every seed must reach")
    p.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temporary folder)")
    p.add_argument("--lanes", type=int, default=1, help="runs at a time (each its own process and Ray)")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*", help="config overrides for every seed (key=value)")
    args = p.parse_args(argv)
    if args.lanes < 1:
        p.error(f"--lanes must be at least 1, got {args.lanes}")
    print(f"learning: {args.recipe}, seeds {args.seeds}, threshold {args.threshold} (evaluation return)")

    def report(job, r):
        first = next((s for s, v in r["evals"] if v >= args.threshold), None)
        r["first_step_at_threshold"] = first
        print(f"  seed {job[1]}: eval return {r['final_eval_return']:.1f} at {r['env_steps']} env steps; "
              f"first >= {args.threshold} at {first}; {r['wall_s']:.0f} s", flush=True)

    runs = run_seeds([(args.recipe, seed, args.overrides, args.keep) for seed in args.seeds], args.lanes, report)
    finals = [r["final_eval_return"] for r in runs]
    mean = statistics.fmean(finals)
    std = statistics.pstdev(finals) if len(finals) > 1 else 0.0
    passed = all(f >= args.threshold for f in finals)
    print(f"final eval return: {mean:.1f} +- {std:.1f} over {len(finals)} seeds; "
          f"{'all' if passed else 'NOT all'} seeds >= {args.threshold}")
    out = {"benchmark": "learning", "recipe": args.recipe, "threshold": args.threshold, "passed": passed,
           "final_eval_return_mean": mean, "final_eval_return_std": std, "runs": runs, "overrides": args.overrides}
    C.write_json(args.json, out)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
