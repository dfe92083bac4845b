"""RL on 2-digit addition after a short SFT warm-up: held-out accuracy gained within a time budget.

Per seed, the ``sft-arith`` warm-up runs once (``rlweave train sft-arith``); then each RL recipe
(``grpo-arith`` first, then e.g. ``dapo-arith``, ``reinforcepp-arith``) starts from that
warm-up's model (``init.checkpoint``), each in its own process with its own embedded Ray, one after
the other, so every algorithm starts from identical weights. Reported per run, from the runs'
metrics.jsonl (greedy answers to the same held-out problems every time: task.eval_prompts, 400 in grpo-arith):

  * accuracy before the first RL update (iteration 0, i.e. after SFT);
  * the best and the last accuracy within ``--budget-s`` seconds of RL wall time (the run's own
    clock, which starts when the RL run starts, SFT excluded), and the gain over the start;
  * wall seconds of the warm-up and of each RL run.

The verdict (the issue's target) is whether the first recipe's gain within the budget is at least
``--target`` for at least ``--need`` of the seeds. A plot of accuracy against RL wall time, one
line per (recipe, seed), is written with ``--plot``.

    rlweave bench llm_arith --seeds 0 1 2 --recipes grpo-arith dapo-arith reinforcepp-arith \
        --budget-s 600 --target 0.3 --need 2 --keep DIR --json F --plot P [key=value ...]
"""

from __future__ import annotations

import argparse
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


def _train(recipe: str, run_dir: Path, overrides: list[str]) -> float:
    cmd = [sys.executable, "-m", "rlweave.cli", "train", recipe, f"run.dir={run_dir}", "run.progress=false",
           "run.tensorboard=false", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": "local"})
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{recipe} ({run_dir}): rlweave train exited {proc.returncode}: {tail}")
    return time.perf_counter() - t0


def _evals(run_dir: Path) -> list[tuple[float, int, float]]:
    """(RL wall seconds, iteration, accuracy) of every evaluation, the RL clock starting at 0."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    ev = [(r["wall_time"], r["iteration"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    t0 = ev[0][0]
    return [(w - t0, i, a) for w, i, a in ev]


def summarise(run_dir: Path, budget_s: float) -> dict:
    ev = _evals(run_dir)
    within = [e for e in ev if e[0] <= budget_s]
    start = ev[0][2]
    return {"run_dir": str(run_dir), "start_accuracy": start, "best_within_budget": max(a for _, _, a in within),
            "last_within_budget": within[-1][2], "gain_best": max(a for _, _, a in within) - start,
            "gain_last": within[-1][2] - start, "final_accuracy": ev[-1][2], "rl_seconds": ev[-1][0],
            "iterations": ev[-1][1], "evals": ev}


def plot(results: list[dict], path: str, budget_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {}
    for r in results:
        c = colours.setdefault(r["recipe"], f"C{len(colours)}")
        t, _, a = zip(*r["evals"])
        ax.plot(t, a, color=c, alpha=0.85, label=r["recipe"] if r["seed"] == min(x["seed"] for x in results if x["recipe"] == r["recipe"]) else None)
    ax.axvline(budget_s, color="grey", ls=":", lw=1)
    ax.set_xlabel("RL wall time (s; SFT warm-up excluded)")
    ax.set_ylabel("held-out accuracy (greedy, task.eval_prompts problems)")
    ax.set_title("2-digit addition after SFT: one line per seed")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=["grpo-arith"])
    p.add_argument("--extra-seeds", type=int, nargs="*", default=None,
                   help="seeds the recipes after the first run with (default: all --seeds)")
    p.add_argument("--budget-s", type=float, default=600.0)
    p.add_argument("--target", type=float, default=0.3)
    p.add_argument("--need", type=int, default=2)
    p.add_argument("--keep", default=None, help="folder to keep the runs in (default: a temporary folder)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("overrides", nargs="*", help="overrides for the RL runs (key=value)")
    args = p.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-llm-arith-"))
    print(f"llm_arith: recipes {args.recipes}, seeds {args.seeds}, budget {args.budget_s:g} s of RL, target gain {args.target}")
    results, warmups = [], {}
    for seed in args.seeds:
        sft_dir = root / f"sft-seed{seed}"
        if not (sft_dir / "model" / "config.json").is_file():
            warmups[seed] = _train("sft-arith", sft_dir, [f"seed={seed}"])
        for i, recipe in enumerate(args.recipes):
            if i > 0 and args.extra_seeds is not None and seed not in args.extra_seeds:
                continue
            run_dir = root / f"{recipe}-seed{seed}"
            if not (run_dir / "model" / "config.json").is_file():
                _train(recipe, run_dir, [f"seed={seed}", f"init.checkpoint={sft_dir}", *args.overrides])
            r = {"recipe": recipe, "seed": seed, "sft_seconds": warmups.get(seed), **summarise(run_dir, args.budget_s)}
            results.append(r)
            print(f"  {recipe} seed {seed}: accuracy {r['start_accuracy']:.3f} after SFT -> best {r['best_within_budget']:.3f}, "
                  f"last {r['last_within_budget']:.3f} within {args.budget_s:g} s (gain {r['gain_last']:+.3f}); "
                  f"final {r['final_accuracy']:.3f} after {r['iterations']} iterations, {r['rl_seconds']:.0f} s", flush=True)
    first = [r for r in results if r["recipe"] == args.recipes[0]]
    met = sum(r["gain_last"] >= args.target for r in first)
    passed = met >= min(args.need, len(first))
    summary = {}
    for recipe in args.recipes:
        rs = [r for r in results if r["recipe"] == recipe]
        gains = [r["gain_last"] for r in rs]
        summary[recipe] = {"seeds": [r["seed"] for r in rs], "gain_last_mean": statistics.fmean(gains),
                           "gain_last_std": statistics.pstdev(gains) if len(gains) > 1 else 0.0,
                           "final_accuracy_mean": statistics.fmean(r["final_accuracy"] for r in rs)}
        print(f"{recipe}: gain within budget {summary[recipe]['gain_last_mean']:+.3f} +- {summary[recipe]['gain_last_std']:.3f} "
              f"over seeds {summary[recipe]['seeds']}")
    print(f"{args.recipes[0]}: {met} of {len(first)} seeds gained >= {args.target} within {args.budget_s:g} s -> "
          f"{'met' if passed else 'NOT met'} (need {args.need})")
    if args.plot:
        plot(results, args.plot, args.budget_s)
        print(f"wrote {args.plot}")
    out = {"benchmark": "llm_arith", "recipes": args.recipes, "budget_s": args.budget_s, "target_gain": args.target,
           "need": args.need, "passed": passed, "seeds_meeting_target": met, "summary": summary, "runs": results,
           "sft_seconds": warmups, "overrides": args.overrides}
    if args.json:
        C.write_json(args.json, out)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
