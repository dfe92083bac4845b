"""A policy trained only inside a world model against the same algorithm trained in the real env,
for the same number of policy updates, both evaluated in the real env (issue #28, item 1).

Steps (each skipped when its output already exists, so an interrupted benchmark continues):

1. ``rlweave collect REAL_RECIPE --policy random --episodes E -o DATA``: the real env steps the
   world model may learn from (E x time limit; <= 50k for the issue's bound);
2. ``rlweave train-world-model DATA -o MODEL``: the model, its open-loop error per horizon (JSON
   and PNG in MODEL);
3. ``REAL_RECIPE`` and ``WM_RECIPE env.id=world_model/MODEL`` per seed with
   ``train.total_env_steps=STEPS`` (the same SAC, so the same number of updates; the world-model
   run's env steps are imagined), through :mod:`learning`'s seed runner;
4. ``rlweave world-model-video`` on each world-model run: ``RUN/videos/real_vs_imagined.gif``.

Reported: the final real-env evaluation return of each run, the means, the ratio of means, and the
score normalised between the random policy (the dataset's mean episode return) and the real-env
run: ``(wm - random) / (real - random)``; the verdict is whether the normalised score is >= 0.7.

    rlweave bench world-model [--episodes 200] [--steps 5100] [--seeds 0 1 2] [--out runs/bench-world-model] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402
from learning import run_seeds  # noqa: E402


def _rlweave(*argv: str) -> str:
    """Runs ``rlweave ARGV`` and returns its last stdout line (the commands print one JSON line)."""
    cmd = [sys.executable, "-m", "rlweave.cli", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": "local"})
    if proc.returncode != 0:
        raise RuntimeError(f"rlweave {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip().splitlines()[-1]


def _updates(run_dir: str) -> int:
    """The policy updates a run made (summed from its metrics)."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return int(sum(r.get("samples/updates", 0) for r in rows))


def _summary(runs: list[dict]) -> dict:
    for r in runs:
        r["updates"] = _updates(r["run_dir"])
    finals = [r["final_eval_return"] for r in runs]
    return {"final_eval_return_mean": statistics.fmean(finals),
            "final_eval_return_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0, "runs": runs}


def compare(real: dict, wm: dict, random_return: float) -> dict:
    """Ratio of means and random-to-real normalised score of the world-model runs."""
    r, w = real["final_eval_return_mean"], wm["final_eval_return_mean"]
    return {"random_policy_return": random_return, "ratio_of_means": w / r if r else None,
            "normalised_score": (w - random_return) / (r - random_return) if r != random_return else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real-recipe", default="sac-pendulum")
    p.add_argument("--wm-recipe", default="sac-pendulum-wm")
    p.add_argument("--episodes", type=int, default=200, help="random-policy episodes the model learns from")
    p.add_argument("--steps", type=int, default=5100, help="train.total_env_steps of both runs (updates = steps - learning_starts)")
    p.add_argument("--epochs", type=int, default=30, help="world-model training epochs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/bench-world-model")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*", help="config overrides for the world-model runs (e.g. env.kwargs.horizon=100)")
    args = p.parse_args(argv)
    out = Path(args.out)
    data, model = out / "data", out / "model"
    commands = []
    if not data.exists():
        commands.append(["collect", args.real_recipe, "--policy", "random", "--episodes", str(args.episodes), "-o", str(data)])
        print(_rlweave(*commands[-1]), flush=True)
    if not (model / "world_model.json").exists():
        commands.append(["train-world-model", str(data), "-o", str(model), "--epochs", str(args.epochs), "--quiet"])
        print(_rlweave(*commands[-1]), flush=True)
    cfg = json.loads((model / "world_model.json").read_text())
    err = json.loads((model / "prediction_error.json").read_text())
    from rlweave.data.datasets import load_transitions, dataset_spaces

    _, stats = load_transitions(data, *dataset_spaces(data), gamma=0.99)
    steps = [f"train.total_env_steps={args.steps}"]

    def report(job, r):
        print(f"  {job[0]} seed {job[1]}: real-env eval return {r['final_eval_return']:.1f}; {r['wall_s']:.0f} s", flush=True)

    real = run_seeds([(args.real_recipe, s, steps, str(out / "real")) for s in args.seeds], on_done=report)
    wm_over = [*steps, f"env.id=world_model/{model}", *args.overrides]
    wm = run_seeds([(args.wm_recipe, s, wm_over, str(out / "wm")) for s in args.seeds], on_done=report)
    for r in wm:
        r["video"] = json.loads(_rlweave("world-model-video", r["run_dir"]))
    result = {"benchmark": "world_model", "real_recipe": args.real_recipe, "wm_recipe": args.wm_recipe,
              "real_env_steps_for_model": cfg["training"]["steps"], "seeds": args.seeds,
              "world_model": cfg, "prediction_error": err, "real": _summary(real), "world_model_runs": _summary(wm),
              "wm_overrides": wm_over, "commands": [" ".join(["rlweave", *c]) for c in commands]}
    result.update(compare(result["real"], result["world_model_runs"], stats["return_mean"]))
    result["passed"] = result["normalised_score"] is not None and result["normalised_score"] >= 0.7
    print(f"real: {result['real']['final_eval_return_mean']:.1f}, world model: {result['world_model_runs']['final_eval_return_mean']:.1f}, "
          f"normalised score {result['normalised_score']:.2f} (random {stats['return_mean']:.1f})")
    C.write_json(args.json, result)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
