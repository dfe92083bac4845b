"""Memory of one language-model RL update: the whole minibatch at once against micro-batches.

One GRPO update (``LMActorWorker.update``, the recipe's algorithm settings) of the recipe's model
on a batch shaped like its rows (``--prompt-tokens`` + ``--response-tokens``, the recipe's
prompts x group size), in a fresh process per side so that each side's peak resident memory is its
own: ``whole`` (``algorithm.micro_batch_size=null``) and ``micro`` (``--micro``). The two sides
take the same update (tests/test_agent_loop.py checks it); the headline is the peak memory of
``micro`` over ``whole``, beside each side's update time.

    rlweave bench lm-update-memory [--recipe grpo-search] [--prompt-tokens 200] [--response-tokens 300]
                                   [--micro 16] [--repeats 1] [--json F] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402


def side(recipe: str, micro: int | None, prompt_tokens: int, response_tokens: int, overrides: list[str]) -> dict:
    """In the side's process: one scored update; its peak RSS and time."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from rlweave.cluster.worker import WorkerContext, _bind
    from rlweave.config import load_config
    from rlweave.models.causal_lm import response_batch, train_tokenizer
    from rlweave.workers.lm_actor import LMActorWorker

    cfg = load_config(recipe, [*overrides, f"algorithm.micro_batch_size={'null' if micro is None else micro}"])
    tok = train_tokenizer([" ".join(str(i) for i in range(400))] * 4, vocab_size=cfg.model.vocab_size)
    tok_dir = tempfile.mkdtemp(prefix="lm-update-memory-")
    tok.save_pretrained(tok_dir)
    ctx = WorkerContext(group="bench", rank=0, world_size=1, slot=None, slot_kind="cpu", num_threads=torch.get_num_threads(), local=True)
    actor = _bind(LMActorWorker, ctx, (OmegaConf.to_container(cfg.model), tok_dir, OmegaConf.to_container(cfg.algorithm), 0, 1.0, {}), {})
    rng = np.random.default_rng(0)
    groups, size = cfg.rollout.prompts_per_iteration, cfg.algorithm.group_size
    prompts = [rng.integers(20, 200, prompt_tokens).tolist() for _ in range(groups) for _ in range(size)]
    batch = response_batch(prompts, [rng.integers(20, 200, response_tokens).tolist() for _ in prompts], tok.pad_token_id)
    batch["advantages"] = rng.standard_normal(batch["response_ids"].shape).astype(np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    batch["old_logprobs"] = actor.score(batch)["logprobs"]
    t0 = time.perf_counter()
    out = actor.update(batch)
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mb": before,
            "update_s": time.perf_counter() - t0, "loss_policy": out["loss_policy"], "rows": len(prompts)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="rlweave bench lm-update-memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="grpo-search")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--response-tokens", type=int, default=300)
    p.add_argument("--micro", type=int, default=16, help="algorithm.micro_batch_size of the micro side")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for both sides")
    p.add_argument("--json", default=None)
    C.add_side_args(p)
    args = p.parse_args(argv)
    if args.side:
        return C.serve_side(side, args.side_params)
    common = {"recipe": args.recipe, "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
              "overrides": args.set}
    sides = {"whole": {**common, "micro": None}, "micro": {**common, "micro": args.micro}}
    C.print_settings("lm-update-memory", sides)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for order in C.pair_order(list(sides), args.repeats):
        for name in order:
            r = C.run_side(__file__, name, sides[name], args.threads)
            runs[name].append(r)
            print(f"  {name:<6} peak {r['peak_rss_mb']:7.0f} MB  update {r['update_s']:6.2f} s  loss {r['loss_policy']:.6f}")
    peak = {n: C.median([r["peak_rss_mb"] for r in rs]) for n, rs in runs.items()}
    upd = {n: C.median([r["update_s"] for r in rs]) for n, rs in runs.items()}
    out = C.report("lm-update-memory", argv, "peak memory of one update, micro-batches / whole minibatch", sides,
                   args.repeats, warmup=False, threads=args.threads)
    out.update(runs=runs, peak_rss_mb=peak, update_s=upd, ratio=peak["micro"] / peak["whole"],
               update_time_ratio=upd["micro"] / upd["whole"])
    print(f"HEADLINE peak memory {peak['whole']:.0f} -> {peak['micro']:.0f} MB ({out['ratio']:.2f}x); "
          f"update {upd['whole']:.2f} -> {upd['micro']:.2f} s")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
