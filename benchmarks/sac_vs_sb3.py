"""SAC env-steps/s and gradient updates/s: rlweave against Stable-Baselines3, the same work, one run.

Both sides train SAC from scratch on Pendulum-v1 with the SB3-zoo settings: 1 env, 256x256 ReLU
actor and twin critics, batch 256, Adam lr 1e-3, gamma 0.99, tau 0.005, automatic entropy tuning
(initial alpha 1, target entropy -1), 100 random steps before learning, then one gradient update per
env step (SB3 ``train_freq=1, gradient_steps=1``; rlweave ``algorithm.utd_ratio=1``), no evaluation.

Headline, per side, over the steady part of the run (env steps ``--skip`` .. ``--steps``, learning
is on throughout): env steps/s and gradient updates/s of the *full loop* (collection + training +
weight sync), and the ratios rlweave / SB3. The two sides do the same number of updates per env
step, so both ratios are close; both are reported.

  rlweave  sums ``time/iteration`` of the iterations whose steps lie in the window (metrics.jsonl).
           Env and its rollout replica share one process on CPU slot 1; the learner owns slot 0 and
           trains while the env collects (the asynchronous runner, ``train.max_staleness=1``).
  SB3      a callback stamps the wall clock when ``num_timesteps`` crosses ``--skip`` and at the
           end of ``learn()``; one process, torch's default threads (2 here).

Precision (``--precision``, default ``auto``): SB3 computes in float32 (it has no other setting).
rlweave runs its learner in float32 and, where this CPU multiplies bf16 natively (avx512_bf16 or
AMX), also with ``actor.precision=bfloat16`` as a second side of the same run: the hidden layers'
matmuls under autocast (bf16 operands, float32 accumulation; weights, gradients, Adam state, output
layers and losses float32). Then ``ratio`` is the bfloat16 side's and ``ratio_float32`` the float32
side's; on a CPU that would emulate bf16 (AVX2 only: ~50x slower than float32, utils/precision.py)
there is one rlweave side, float32, and ``ratio`` is its. ``precision`` in the JSON names the side
``ratio`` measures. ``both`` forces the two sides. That bf16 does not change what SAC learns is
checked separately (``rlweave bench learning --recipe sac-pendulum ... actor.precision=bfloat16``,
docs/results.md).

Learner threads (``--update-threads``, default 2): the critic's and the actor's parts of each SAC
update read the same weights and write disjoint gradients, so rlweave runs the actor's in a helper
process over the learner's parameters in shared memory while the critic's runs
(``actor.update_threads=2``, ``actor.update_helper=process``; the same numbers as one after the
other, checked in tests/test_offpolicy.py). It lands on the core the env process leaves mostly
idle. SB3 uses its default 2 intra-op threads on the same 2 cores.

Order: a warm-up run of each side (discarded), then ``--repeats`` interleaved rounds; per side the
median, and the median / min / max of the per-round ratios.

    rlweave bench sac-vs-sb3 [--json FILE] [--steps N] [--skip N] [--repeats R] [--precision P] [--update-threads T]
    python benchmarks/sac_vs_sb3.py [same flags]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ADDRESS", "local")  # always an embedded Ray of its own

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

ENV_ID = "Pendulum-v1"
HIDDEN = [256, 256]
BATCH = 256
LR = 1e-3
GAMMA = 0.99
TAU = 0.005
LEARNING_STARTS = 100
ROLLOUT_STEPS = 32  # rlweave: decisions per iteration (weights reach the rollout every 32 steps)


def rlweave_overrides(steps: int, seed: int, run_dir: str, precision: str = "float32", update_threads: int = 2) -> list[str]:
    """Every setting that defines the work, pinned (a recipe change cannot change the comparison)."""
    return [
        f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "train.eval_every=0", "train.checkpoint_every=0", f"train.total_env_steps={steps}",
        f"train.rollout_steps={ROLLOUT_STEPS}", "train.max_staleness=1", "train.sync_every=1",
        f"env.id={ENV_ID}", "env.num_workers=1", "env.num_envs=1", "env.chunk=1", "env.normalize_reward=false",
        "policy.name=squashed_mlp", f"policy.hidden={HIDDEN}", "policy.activation=relu",
        f"critic.hidden={HIDDEN}", "critic.num_q=2", "critic.norm=none",
        "algorithm.name=sac", f"algorithm.lr={LR}", f"algorithm.gamma={GAMMA}", f"algorithm.tau={TAU}",
        f"algorithm.batch_size={BATCH}", "algorithm.utd_ratio=1.0", f"algorithm.learning_starts={LEARNING_STARTS}",
        "algorithm.n_step=1", "algorithm.policy_delay=1", "algorithm.alpha_init=1.0", "algorithm.autotune_alpha=true",
        f"actor.precision={precision}", f"actor.update_threads={update_threads}", f"seed={seed}",
    ]


def settings(update_threads: int = 2) -> dict:
    common = {
        "env": f"{ENV_ID}, 1 env", "network": f"actor {HIDDEN} relu, 2 critics {HIDDEN} relu", "batch": BATCH,
        "optimiser": f"Adam lr {LR}", "gamma / tau": f"{GAMMA} / {TAU}", "entropy": "auto (alpha0 1, target -1)",
        "random steps": LEARNING_STARTS, "updates per env step": 1, "evaluation": "off", "device": "cpu",
    }
    return {
        "rlweave": {**common, "learner precision": "float32, and bfloat16 autocast as a second side where native (--precision)",
                    "processes": "driver + env/rollout process (slot 1) + learner process (slot 0) + its update helper",
                    "torch threads": "1 per worker process (intra-op)",
                    "learner update threads": (f"{update_threads}: critic and actor parts of each update at once (actor's in the helper process)" if update_threads > 1
                                               else "1: critic and actor parts one after the other"),
                    "weights to rollout": f"every {ROLLOUT_STEPS} env steps"},
        "sb3": {**common, "precision": "float32", "processes": "1", "torch threads": "torch default (2)", "weights to rollout": "same process"},
    }


def run_rlweave(steps: int, skip: int, seed: int, precision: str = "float32", update_threads: int = 2) -> dict:
    from rlweave.config import load_config
    from rlweave.runners.offpolicy import OffPolicyRunner

    with tempfile.TemporaryDirectory(prefix="bench-sac-rlweave-") as run_dir:
        cfg = load_config("sac-pendulum", rlweave_overrides(steps, seed, run_dir, precision, update_threads))
        OffPolicyRunner(cfg, run_dir).run()
        records = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
    prev = 0
    window = []
    for r in records:
        if prev >= skip:
            window.append((r["env_steps"] - prev, r["samples/updates"], r["time/iteration"]))
        prev = r["env_steps"]
    env_steps = sum(w[0] for w in window)
    updates = sum(w[1] for w in window)
    seconds = sum(w[2] for w in window)
    return {"steps_per_s": env_steps / seconds, "updates_per_s": updates / seconds, "env_steps": env_steps,
            "updates": updates, "seconds": seconds,
            "actor_s_per_update": C.median([r["time/actor"] / max(1, r["samples/updates"]) for r in records[5:]])}


def run_sb3(steps: int, skip: int, seed: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    class Window(BaseCallback):
        def __init__(self):
            super().__init__(verbose=0)
            self.t_skip = None
            self.updates_at_skip = 0

        def _on_step(self) -> bool:
            if self.t_skip is None and self.model.num_timesteps >= skip:
                self.t_skip = time.perf_counter()
                self.updates_at_skip = self.model._n_updates
            return True

    env = gym.make(ENV_ID)
    model = SAC("MlpPolicy", env, learning_rate=LR, buffer_size=1_000_000, learning_starts=LEARNING_STARTS,
                batch_size=BATCH, tau=TAU, gamma=GAMMA, train_freq=1, gradient_steps=1, ent_coef="auto",
                policy_kwargs={"net_arch": HIDDEN}, seed=seed, device="cpu", verbose=0)
    cb = Window()
    model.learn(steps, callback=cb)
    seconds = time.perf_counter() - cb.t_skip
    env_steps = model.num_timesteps - skip
    updates = model._n_updates - cb.updates_at_skip
    return {"steps_per_s": env_steps / seconds, "updates_per_s": updates / seconds, "env_steps": env_steps,
            "updates": updates, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--skip", type=int, default=600, help="env steps left out at the start (start-up, warm-up)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=("auto", "both", "bfloat16", "float32"), default="auto",
                   help="rlweave learner precision(s) measured against SB3's float32 (both: two rlweave sides; "
                        "auto: both where this CPU has native bf16, else float32)")
    p.add_argument("--update-threads", type=int, choices=(1, 2), default=2,
                   help="rlweave learner: run the critic and actor parts of each update on 2 threads at once, or on 1")
    args = p.parse_args(argv)
    if args.skip <= LEARNING_STARTS or args.skip >= args.steps:
        p.error(f"--skip must lie between the {LEARNING_STARTS} random steps and --steps")
    C.print_settings("SAC: rlweave vs Stable-Baselines3 (same work)", settings(args.update_threads), {"window": f"env steps {args.skip}..{args.steps}"})

    def fmt(side, r):
        return f"{r['steps_per_s']:.1f} env steps/s, {r['updates_per_s']:.1f} updates/s"

    import torch

    from rlweave.utils.precision import cpu_capability, native_bf16

    bf16_native = native_bf16(torch.device("cpu"))
    if args.precision == "auto":
        precisions = ("bfloat16", "float32") if bf16_native else ("float32",)
        print(f"  precision auto: {' and '.join(precisions)} ({cpu_capability()}, "
              f"{'native' if bf16_native else 'no native'} bfloat16)")
    else:
        precisions = ("bfloat16", "float32") if args.precision == "both" else (args.precision,)
    side = {"bfloat16": "rlweave", "float32": "rlweave-float32" if len(precisions) > 1 else "rlweave"}
    sides = {side[pr]: (lambda pr=pr: run_rlweave(args.steps, args.skip, args.seed, pr, args.update_threads)) for pr in precisions}
    warm, res = C.interleave({**sides, "sb3": lambda: run_sb3(args.steps, args.skip, args.seed)}, args.repeats, describe=fmt)
    sb = res["sb3"]

    def summary(rw: list[dict]) -> dict:
        return {"env_steps_per_s": C.median([r["steps_per_s"] for r in rw]), "updates_per_s": C.median([r["updates_per_s"] for r in rw]),
                "learner_s_per_update": C.median([r["actor_s_per_update"] for r in rw]), "runs": rw}

    out = {"benchmark": "sac-vs-sb3", "precision": precisions[0], "bf16_native": bf16_native, "cpu_capability": cpu_capability()}
    for pr in precisions:
        rw = res[side[pr]]
        steps_ratio = C.ratio_stats([r["steps_per_s"] for r in rw], [r["steps_per_s"] for r in sb])
        upd_ratio = C.ratio_stats([r["updates_per_s"] for r in rw], [r["updates_per_s"] for r in sb])
        suffix = "" if pr == precisions[0] else f"_{pr}"
        out.update({f"ratio{suffix}": steps_ratio["median"], f"ratio_env_steps_per_s{suffix}": steps_ratio,
                    f"ratio_updates_per_s{suffix}": upd_ratio, f"{side[pr]}": {"precision": pr, **summary(rw)}})
        print(f"rlweave ({pr}): {out[side[pr]]['env_steps_per_s']:.1f} env steps/s, {out[side[pr]]['updates_per_s']:.1f} updates/s, "
              f"learner {out[side[pr]]['learner_s_per_update'] * 1e3:.1f} ms/update")
        print(f"  ratio env steps/s: {C.fmt_ratio(steps_ratio)}   ratio updates/s: {C.fmt_ratio(upd_ratio)}   (target >= 1.5)")
    out.update({
        "sb3": {"precision": "float32", "env_steps_per_s": C.median([r["steps_per_s"] for r in sb]),
                "updates_per_s": C.median([r["updates_per_s"] for r in sb]), "runs": sb},
        "settings": settings(args.update_threads), "update_threads": args.update_threads, "window": [args.skip, args.steps], "environment": C.environment_info(),
    })
    print(f"SB3 (float32): {out['sb3']['env_steps_per_s']:.1f} env steps/s, {out['sb3']['updates_per_s']:.1f} updates/s")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
