"""GRPO throughput: rlweave vs TRL's ``GRPOTrainer`` on the same tiny Qwen3, same work.

Both sides start from one Hugging Face folder (a Qwen3 built here with random weights and a
tokenizer trained here), draw their prompts from the same arithmetic problems, and run the same
number of GRPO steps: ``--prompts`` prompts x ``--group`` responses of exactly ``--tokens`` new
tokens each (``min_new_tokens = max_new_tokens`` on both sides, so response lengths match), one
optimizer step per batch, no KL term, no evaluation, sampling at temperature 1. Both sides get the
same cores and the same total torch thread count (``--threads``): TRL in one process with all of
them; rlweave in ``--ranks`` worker processes (default 2, one per core), each holding an actor
rank and a rollout engine with ``threads / ranks`` threads, the actor ranks replicated
(``actor.strategy=ddp``: one gradient all-reduce per step), plus the driver and Ray's own
processes, which are part of the result. ``--ranks 1`` runs rlweave in one process like TRL.

The figure is the whole GRPO loop (generation + scoring + update + weight sync), measured from
the end of the first step to the end of the last (the first step's start-up is excluded on both
sides): completions/s and generated tokens/s, median of ``--repeats`` interleaved pairs after a
discarded warm-up of each side, and the median per-pair ratio rlweave / TRL.

    rlweave bench grpo_vs_trl --steps 8 --repeats 3 --json F
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load_common():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rlweave_bench_common", HERE / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_model(folder: Path, seed: int = 0) -> None:
    """The shared starting point: a qwen3 of the grpo-arith recipe's size, random weights."""
    from rlweave.envs.text_tasks import ArithmeticTask
    from rlweave.models.causal_lm import build_causal_lm, save_pretrained, train_tokenizer

    task = ArithmeticTask(ops=("+",), min_digits=2, max_digits=2)
    tok = train_tokenizer([p.text + p.answer for p in task.prompts("train", 2000, seed)], vocab_size=320)
    model = build_causal_lm(len(tok), arch="qwen3", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                            intermediate_size=256, max_positions=64, seed=seed)
    save_pretrained(model, tok, folder)


# --------------------------------------------------------------------------- the two sides
def placement_overrides(ranks: int, threads: int) -> list[str]:
    """``ranks`` processes on slots 0..ranks-1, each an actor rank with a rollout engine beside it."""
    slots, per = ",".join(str(i) for i in range(ranks)), max(1, threads // ranks)
    return [f"actor.num_workers={ranks}", f"rollout.num_workers={ranks}", "actor.strategy=ddp", "placement.mode=collocated",
            f"placement.groups.actor={{slots: '{slots}', threads: {per}}}",
            f"placement.groups.rollout={{slots: '{slots}', threads: {per}}}"]


def run_rlweave(folder: str, a) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-grpo-rlweave-"))
    cmd = [sys.executable, "-m", "rlweave.cli", "train", "grpo-arith", f"run.dir={run_dir}", f"init.checkpoint={folder}",
           "run.progress=false", "run.tensorboard=false", f"seed={a.seed}",
           f"rollout.prompts_per_iteration={a.prompts}", f"algorithm.group_size={a.group}",
           f"rollout.max_new_tokens={a.tokens}", f"rollout.min_new_tokens={a.tokens}", f"algorithm.minibatch_size={a.prompts * a.group}",
           "algorithm.epochs=1", "algorithm.kl_coef=0", f"algorithm.lr={a.lr}", f"train.total_iterations={a.steps}",
           "train.eval_every=0", "train.checkpoint_every=0", *placement_overrides(a.ranks, a.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": "local"})
    if proc.returncode != 0:
        raise RuntimeError(f"rlweave side failed: {proc.stderr.strip().splitlines()[-3:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["iteration"] >= 1]
    seconds = rows[-1]["wall_time"] - rows[0]["wall_time"]
    later = rows[1:]
    tokens = sum(r["train/response_length"] * a.prompts * a.group for r in later)
    return {"seconds": seconds, "completions": len(later) * a.prompts * a.group, "tokens": tokens}


def run_trl(folder: str, a) -> dict:
    """In this process (called through ``--side trl`` in a fresh one)."""
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlweave.envs.text_tasks import ArithmeticTask

    torch.set_num_threads(a.threads)
    task = ArithmeticTask(ops=("+",), min_digits=2, max_digits=2)
    prompts = task.prompts("train", a.prompts * (a.steps + 1), a.seed)
    data = Dataset.from_list([{"prompt": p.text, "answer": p.answer} for p in prompts])

    def correct(prompts, completions, answer, **_):
        from rlweave.envs.text_tasks import answers_match, extract_answer

        return [1.0 if (x := extract_answer(c)) is not None and answers_match(x, gold) else 0.0
                for c, gold in zip(completions, answer)]

    stamps: list[float] = []
    lengths: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-grpo-trl-"), use_cpu=True, bf16=False, report_to=[],
        per_device_train_batch_size=a.prompts * a.group, num_generations=a.group, max_completion_length=a.tokens,
        generation_kwargs={"min_new_tokens": a.tokens}, temperature=1.0, beta=0.0, num_iterations=1,
        learning_rate=a.lr, max_steps=a.steps, logging_steps=1, save_strategy="no", seed=a.seed,
        dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=correct, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()])
    trainer.train()
    seconds = stamps[-1] - stamps[0]
    later = lengths[1:] if len(lengths) == len(stamps) else [float(a.tokens)] * (len(stamps) - 1)
    return {"seconds": seconds, "completions": (len(stamps) - 1) * a.prompts * a.group,
            "tokens": sum(x * a.prompts * a.group for x in later)}


def _side(side: str, folder: str, a) -> dict:
    if side == "rlweave":
        return run_rlweave(folder, a)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", "trl", "--folder", folder,
           *[f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k in ("steps", "prompts", "group", "tokens", "threads", "lr", "seed")]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL side failed: {proc.stderr.strip().splitlines()[-5:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2, help="rlweave worker processes (actor rank + rollout engine each)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--side", choices=("trl",), default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.side == "trl":
        print(json.dumps(run_trl(a.folder, a)))
        return 0
    common = _load_common()
    import trl
    import transformers

    folder = Path(tempfile.mkdtemp(prefix="bench-grpo-model-")) / "qwen3"
    make_model(folder, a.seed)
    settings = {"model": "qwen3 hidden 128, 4 layers, 4 heads (2 kv), random init", "prompts/step": a.prompts,
                "group": a.group, "new tokens": f"exactly {a.tokens}", "steps": a.steps, "optimizer": f"AdamW lr {a.lr}",
                "epochs x minibatches": "1 x 1", "kl": "none", "threads": a.threads,
                "rlweave processes": a.ranks}
    layout = (f"driver + {a.ranks} worker processes x {max(1, a.threads // a.ranks)} threads (actor rank, ddp, "
              "+ rollout engine in each)" if a.ranks > 1 else "driver + 1 worker (actor and rollout collocated)")
    common.print_settings("grpo_vs_trl: the same GRPO work on both sides",
                          {"rlweave": {"processes": layout},
                           "TRL GRPOTrainer": {"processes": "1"}}, common=settings)
    print(f"versions: trl {trl.__version__}, transformers {transformers.__version__}")
    fns = {"rlweave": lambda: _side("rlweave", str(folder), a), "trl": lambda: _side("trl", str(folder), a)}
    describe = lambda side, r: f"{r['completions'] / r['seconds']:.1f} completions/s, {r['tokens'] / r['seconds']:.0f} tokens/s"  # noqa: E731
    _, results = common.interleave(fns, repeats=a.repeats, describe=describe)
    rate = lambda r, what: r[what] / r["seconds"]  # noqa: E731
    out = {"benchmark": "grpo_vs_trl", "settings": settings, "trl": trl.__version__}
    for what in ("completions", "tokens"):
        rw = [rate(r, what) for r in results["rlweave"]]
        tr = [rate(r, what) for r in results["trl"]]
        stats = common.ratio_stats(rw, tr)
        out[f"rlweave_{what}_per_s"], out[f"trl_{what}_per_s"] = common.median(rw), common.median(tr)
        out[f"ratio_{what}"] = stats
        print(f"{what}/s: rlweave {common.median(rw):.1f}, TRL {common.median(tr):.1f}; "
              f"ratio median {stats['median']:.2f} (min {stats['min']:.2f}, max {stats['max']:.2f})")
    out["ratio"] = out["ratio_completions"]["median"]
    out["environment"] = common.environment_info()
    if a.json:
        common.write_json(a.json, out)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
