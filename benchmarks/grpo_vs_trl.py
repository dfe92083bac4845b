"""GRPO throughput: rlweave vs TRL's ``GRPOTrainer`` on the same Qwen3, same work, same layouts.

Both sides start from one Hugging Face folder (a Qwen3 built here with random weights and a
tokenizer trained here), draw their prompts from the same arithmetic problems, and run the same
number of GRPO steps: ``--prompts`` prompts x ``--group`` responses of exactly ``--tokens`` new
tokens each (``min_new_tokens = max_new_tokens`` on both sides, so response lengths match), one
optimizer step per batch (AdamW), no KL term, no evaluation, sampling at temperature 1, float32,
no gradient checkpointing (TRL: ``gradient_checkpointing=False``, written down because its
default has changed between releases).

Layouts (``--layouts``, default both), each measured on both sides, on the same cores:

  2x1  two processes of one thread each. rlweave: two worker processes, each an actor rank
       (``actor.strategy=ddp``: one gradient all-reduce per step) with a rollout engine beside it;
       TRL: ``accelerate launch --multi_gpu --num_processes 2`` (on a machine without GPUs this
       starts TRL's documented data-parallel run on CPU: two processes, gloo; ``--cpu`` would
       start only one here, as accelerate runs several CPU processes through mpirun).
  1x2  one process of two threads. rlweave: one worker process (actor and rollout collocated);
       TRL: ``python`` with ``torch.set_num_threads(2)``.

The two sides of one layout run with the same environment (``_common.side_env``: threads, the
glibc malloc settings rlweave gives its workers, flush-denormal); rlweave's driver and Ray's own
processes are part of its result.

The figure is the whole GRPO loop (generation + scoring + update + weight sync) in steady state:
measured from the end of step ``--warmup-steps`` (default 3) to the end of the last, so each side's
one-time costs (the first step's start-up, kernel and allocator warm-up, DDP's bucket rebuild on
its second step) are excluded on both sides alike: completions/s and generated tokens/s. The
JSON also holds each step's seconds (``step_s``) and the figure from the end of step 1
(``ratio_from_step_1``: the earlier protocol, which timed those warm-up steps). Headline ``ratio``: the faster rlweave layout
against the faster TRL layout (each side at its best); ``ratio_<layout>`` matches layouts.
Median of ``--repeats`` rounds (A B C D, D C B A, ...) after a discarded warm-up of each side.
``phases_s`` in the JSON says where a step goes on each side (median seconds per step):
generation, scoring (rewards, old log-probs), the update's forward and backward, and the rest
(optimizer, weight sync); rlweave's from its ``time/*`` stages, TRL's from its own method
boundaries.

``--model large`` is the larger point: ~32M parameters (hidden 512, 8 layers) and 64-token
responses, where per-operation overhead matters less.

    rlweave bench grpo-vs-trl [--json FILE] [--steps 20|8] [--warmup-steps 3] [--repeats 3] [--layouts 2x1,1x2] [--model small|large]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

MODELS = {  # name -> (architecture sizes, default prompts, default tokens, default steps)
    "small": (dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256, max_positions=64), 16, 16, 20),
    "large": (dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536, max_positions=128), 8, 64, 8),
}


def make_model(folder: Path, model: str, seed: int = 0) -> int:
    """The shared starting point: a Qwen3 of the chosen size, random weights. Returns its parameters."""
    from rlweave.envs.text_tasks import ArithmeticTask
    from rlweave.models.causal_lm import build_causal_lm, save_pretrained, train_tokenizer

    task = ArithmeticTask(ops=("+",), min_digits=2, max_digits=2)
    tok = train_tokenizer([p.text + p.answer for p in task.prompts("train", 2000, seed)], vocab_size=320)
    net = build_causal_lm(len(tok), arch="qwen3", seed=seed, **MODELS[model][0])
    save_pretrained(net, tok, folder)
    return sum(p.numel() for p in net.parameters())


def parse_layout(layout: str) -> tuple[int, int]:
    procs, threads = layout.split("x")
    return int(procs), int(threads)


# --------------------------------------------------------------------------- the two sides
def placement_overrides(ranks: int, threads: int) -> list[str]:
    """``ranks`` processes on slots 0..ranks-1, each an actor rank with a rollout engine beside it."""
    slots = ",".join(str(i) for i in range(ranks))
    return [f"actor.num_workers={ranks}", f"rollout.num_workers={ranks}", "actor.strategy=ddp", "placement.mode=collocated",
            f"placement.groups.actor={{slots: '{slots}', threads: {threads}}}",
            f"placement.groups.rollout={{slots: '{slots}', threads: {threads}}}"]


def run_rlweave(folder: str, layout: str, steps: int, prompts: int, group: int, tokens: int, lr: float, seed: int,
                device: str = "cpu", warmup_steps: int = 1) -> dict:
    """One rlweave run, its driver in this (side) process. On ``cuda`` the cluster's slots are its
    GPUs (Ray finds them), so the same placement puts each rank on a GPU."""
    from omegaconf import OmegaConf

    from rlweave.cli import main as cli

    ranks, threads = parse_layout(layout)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-grpo-rlweave-"))
    rc = cli(["train", "grpo-arith", f"run.dir={run_dir}", f"init.checkpoint={folder}", "run.progress=false",
              "run.tensorboard=false", f"seed={seed}", f"rollout.prompts_per_iteration={prompts}", f"algorithm.group_size={group}",
              f"rollout.max_new_tokens={tokens}", f"rollout.min_new_tokens={tokens}", f"algorithm.minibatch_size={prompts * group}",
              "algorithm.epochs=1", "algorithm.kl_coef=0", f"algorithm.lr={lr}", f"train.total_iterations={steps}",
              "train.eval_every=0", "train.checkpoint_every=0", *placement_overrides(ranks, threads),
              *(["cluster.num_gpus=0"] if device == "cpu" else [])])
    if rc:
        raise RuntimeError(f"rlweave train exited {rc}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["iteration"] >= 1]
    resolved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    stages = ("generate", "score", "advantages", "update", "sync", "iteration")
    later = rows[warmup_steps:]
    return {**timed_window([r["wall_time"] for r in rows], [r["train/response_length"] for r in rows], warmup_steps,
                           prompts * group),
            "phases_s": {k: C.median([r[f"time/{k}"] for r in later]) for k in stages if all(f"time/{k}" in r for r in later)},
            "effective": {k: resolved.get(k) for k in ("actor", "rollout", "algorithm", "placement", "model")}}


def timed_window(ends: list[float], lengths: list[float], warmup_steps: int, completions_per_step: int) -> dict:
    """A run's figures from its steps' end times (one per step, in order) and mean response
    lengths: the steps after the first ``warmup_steps`` are timed (from the end of the last
    warm-up step to the end of the last step); ``from_step_1`` is the same from the end of step 1
    (the earlier protocol, warm-up included), and ``step_s`` every step's seconds after the first."""
    if len(ends) <= warmup_steps:
        raise RuntimeError(f"grpo-vs-trl: {len(ends)} steps ran, more than --warmup-steps {warmup_steps} are needed")

    def window(skip: int) -> dict:
        timed = lengths[skip:]
        return {"timed_s": ends[-1] - ends[skip - 1], "completions": len(timed) * completions_per_step,
                "tokens": sum(x * completions_per_step for x in timed)}

    return {**window(warmup_steps), "from_step_1": window(1), "step_s": [b - a for a, b in zip(ends, ends[1:])]}


def run_trl(folder: str, layout: str, steps: int, prompts: int, group: int, tokens: int, lr: float, seed: int,
            device: str = "cpu", warmup_steps: int = 1) -> dict | None:
    """One TRL run in this (side) process, or in each process of an ``accelerate launch``
    (only rank 0 returns the figures)."""
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rlweave.envs.text_tasks import ArithmeticTask, answers_match, extract_answer

    procs, threads = parse_layout(layout)
    torch.set_num_threads(threads)
    task = ArithmeticTask(ops=("+",), min_digits=2, max_digits=2)
    data = Dataset.from_list([{"prompt": p.text, "answer": p.answer} for p in task.prompts("train", prompts * (steps + 1), seed)])

    def correct(prompts, completions, answer, **_):
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

    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-grpo-trl-"), use_cpu=device == "cpu", bf16=False, report_to=[],
        per_device_train_batch_size=prompts * group // procs, num_generations=group, max_completion_length=tokens,
        generation_kwargs={"min_new_tokens": tokens}, temperature=1.0, beta=0.0, num_iterations=1,
        gradient_checkpointing=False, learning_rate=lr, max_steps=steps, logging_steps=1, save_strategy="no", seed=seed,
        dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(folder), reward_funcs=correct, args=cfg,
                          train_dataset=data, processing_class=transformers.AutoTokenizer.from_pretrained(folder),
                          callbacks=[Clock()])
    spent = time_methods(trainer, ("_generate", "_generate_and_score_completions", "training_step"))
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return None
    lengths = lengths if len(lengths) == len(stamps) else [float(tokens)] * len(stamps)
    plain = (str, int, float, bool, type(None), list, dict)
    window = timed_window(stamps, lengths, warmup_steps, prompts * group)
    steps_s = window["step_s"][warmup_steps - 1:]  # the timed steps
    phase = {k: C.median(v[warmup_steps:]) for k, v in spent.items() if len(v) > warmup_steps}
    phases = {"generate": phase.get("_generate"), "score": phase.get("_generate_and_score_completions", 0) - phase.get("_generate", 0),
              "update": phase.get("training_step", 0) - phase.get("_generate_and_score_completions", 0),
              "optimizer_and_rest": C.median(steps_s) - phase.get("training_step", 0), "iteration": C.median(steps_s)}
    return {**window, "phases_s": phases,
            "effective": {"processes": trainer.accelerator.num_processes, "distributed": str(trainer.accelerator.distributed_type),
                          "torch_threads": torch.get_num_threads(),
                          "grpo_config": {k: v for k, v in cfg.to_dict().items() if isinstance(v, plain)}}}


def time_methods(obj, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Wrap ``obj``'s methods ``names`` (on the instance) so each call's wall time is appended to
    the returned lists: where a TRL step goes, read from TRL's own method boundaries
    (``_generate`` inside ``_generate_and_score_completions`` inside ``training_step``)."""
    spent: dict[str, list[float]] = {n: [] for n in names}

    def wrap(name: str, fn):
        def timed_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name].append(time.perf_counter() - t0)
        return timed_call

    for n in names:
        setattr(obj, n, wrap(n, getattr(obj, n)))
    return spent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def side_fn(here: Path, name: str, params: dict):
    """A zero-argument callable that runs side ``name`` (``rlweave-2x1``, ``trl-1x2``, ...) in
    its own process(es)."""
    procs, threads = parse_layout(params["layout"])

    def run() -> dict:
        launcher = None
        if name.startswith("trl") and procs > 1:
            launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(procs),
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        "--num_cpu_threads_per_process", str(threads), "--main_process_port", str(_free_port())]
        return C.run_side(here, name, params, threads, launcher=launcher)

    return run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="rlweave bench grpo-vs-trl", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="steps a run (default: 20 small, 8 large: ~10 s a step there)")
    p.add_argument("--warmup-steps", type=int, default=3,
                   help="steps at the start of each run left out of the timing on both sides (>= 1; default 3)")
    p.add_argument("--model", choices=sorted(MODELS), default="small")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default: 16 small, 8 large)")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=None, help="new tokens per response (default: 16 small, 64 large)")
    p.add_argument("--layouts", default="2x1,1x2", help="processes x threads, comma-separated; default 2x1,1x2")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: both sides on GPUs (one per process of a layout), float32 as on CPU")
    p.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up run of each side (quick checks only)")
    p.add_argument("--json", default=None)
    C.add_side_args(p)
    a = p.parse_args(argv)
    if a.side:
        return C.serve_side(run_rlweave if a.side.startswith("rlweave") else run_trl, a.side_params)
    a.steps = MODELS[a.model][3] if a.steps is None else a.steps  # an explicit --steps 0 is refused below, not defaulted
    if not 1 <= a.warmup_steps < a.steps:
        p.error(f"--warmup-steps must be at least 1 and below --steps ({a.steps}), got {a.warmup_steps}")
    a.prompts = a.prompts or MODELS[a.model][1]
    a.tokens = a.tokens or MODELS[a.model][2]
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        print("grpo-vs-trl needs TRL: bash scripts/setup.sh dev,bench  (the 'bench' extra)")
        return 1
    folder = Path(tempfile.mkdtemp(prefix="bench-grpo-model-")) / "qwen3"
    n_params = make_model(folder, a.model, a.seed)
    work = {"model": f"qwen3 {MODELS[a.model][0]}, {n_params / 1e6:.1f}M parameters, random init", "prompts/step": a.prompts,
            "group": a.group, "new tokens": f"exactly {a.tokens}", "steps": a.steps, "warm-up steps (untimed)": a.warmup_steps, "optimizer": f"AdamW lr {a.lr}",
            "epochs x minibatches": "1 x 1", "kl": "none", "precision": "float32", "gradient checkpointing": "off",
            "device": a.device}
    configs = {}
    for layout in layouts:
        procs, threads = parse_layout(layout)
        configs[f"rlweave-{layout}"] = {"layout": layout, "processes": f"driver + {procs} worker process(es) x {threads} thread(s)"
                                        + (" (actor rank, ddp, + rollout engine in each)" if procs > 1 else " (actor + rollout)")}
        configs[f"trl-{layout}"] = {"layout": layout, "processes": (f"accelerate launch --multi_gpu --num_processes {procs} (gloo)"
                                                                    if procs > 1 else "1") + f" x {threads} thread(s)"}
    out = C.report("grpo-vs-trl", argv, "GRPO completions/s of the whole loop; ratio = median over rounds of the faster rlweave "
                   "layout / the faster TRL layout; ratio_<layout> matches layouts", configs, a.repeats, not a.no_warmup,
                   parse_layout(layouts[0])[1])
    C.print_settings("grpo-vs-trl: the same GRPO work on both sides", configs,
                     common={**work, "order": " | ".join(out["protocol"]["order"])})
    here = Path(__file__).resolve()
    params = {n: dict(folder=str(folder), layout=c["layout"], steps=a.steps, prompts=a.prompts, group=a.group, tokens=a.tokens,
                      lr=a.lr, seed=a.seed, device=a.device, warmup_steps=a.warmup_steps) for n, c in configs.items()}
    fns = {n: side_fn(here, n, params[n]) for n in configs}
    describe = lambda side, r: f"{r['completions'] / r['timed_s']:.1f} completions/s, {r['tokens'] / r['timed_s']:.0f} tokens/s"  # noqa: E731
    _, res = C.interleave(fns, repeats=a.repeats, warmup=not a.no_warmup, describe=describe)
    rate = {what: {n: [r[what] / r["timed_s"] for r in res[n]] for n in res} for what in ("completions", "tokens")}
    out.update({"work": work, "parameters": n_params,
                "completions_per_s": {n: C.median(v) for n, v in rate["completions"].items()},
                "tokens_per_s": {n: C.median(v) for n, v in rate["tokens"].items()}})
    print()
    out["phases_s"] = {n: {k: C.median([r["phases_s"][k] for r in res[n] if r.get("phases_s", {}).get(k) is not None])
                           for k in res[n][0].get("phases_s", {})} for n in res}
    for n in res:
        phases = "  ".join(f"{k} {v:.3f}" for k, v in out["phases_s"][n].items())
        print(f"  {n:<12} {out['completions_per_s'][n]:7.1f} completions/s  {out['tokens_per_s'][n]:7.0f} tokens/s   s/step: {phases}")
    for layout in layouts:
        s = C.ratio_stats(rate["completions"][f"rlweave-{layout}"], rate["completions"][f"trl-{layout}"])
        out[f"ratio_{layout}"], out[f"ratio_{layout}_stats"] = s["median"], s
        print(f"  layout {layout}: rlweave / TRL {C.fmt_ratio(s)}")
    rl = {n: rate["completions"][n] for n in res if n.startswith("rlweave")}
    best_rl = C.fastest(rl)
    s = C.ratio_vs_fastest(rl[best_rl], {n: rate["completions"][n] for n in res if n.startswith("trl")})
    out.update({"ratio": s["median"], "ratio_min": s["min"], "ratio_max": s["max"], "ratio_stats": s,
                "best_rlweave": best_rl, "best_trl": s["baseline"], "runs": res})
    early = {n: [r["from_step_1"]["completions"] / r["from_step_1"]["timed_s"] for r in res[n]] for n in res}
    e = C.ratio_vs_fastest(early[C.fastest({n: early[n] for n in early if n.startswith("rlweave")})],
                           {n: early[n] for n in early if n.startswith("trl")})
    out["ratio_from_step_1"], out["ratio_from_step_1_stats"] = e["median"], e
    print(f"  from the end of step 1 (warm-up steps timed too): {C.fmt_ratio(e)}")
    print(f"ratio (best of each: {best_rl} / {s['baseline']}), completions/s: {C.fmt_ratio(s)}  [{out['command']}]")
    C.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
