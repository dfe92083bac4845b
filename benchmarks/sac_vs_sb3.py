"""SAC env-steps/s and gradient updates/s: rlweave against Stable-Baselines3, the same work, one run.

Both sides train SAC from scratch on Pendulum-v1 with the SB3-zoo settings: 1 env, 256x256 ReLU
actor and twin critics, batch 256, fused Adam lr 1e-3 (SB3: ``policy_kwargs=dict(optimizer_kwargs=
dict(fused=True))``), gamma 0.99, tau 0.005, automatic entropy tuning (initial alpha 1, target
entropy -1), 100 random steps before learning, then one gradient update per env step (SB3
``train_freq=1, gradient_steps=1``; rlweave ``algorithm.utd_ratio=1``), no evaluation.

Headline, per side, by the wall clock over the steady part of the run (env steps ``--skip`` ..
``--steps``; learning is on throughout): env steps/s and gradient updates/s of the *full loop*
(collection + training + weight sync), and the ratios rlweave / SB3.

  rlweave  ``wall_time`` of the metrics.jsonl record where the run crossed ``--skip`` env steps
           to that of the last record (the driver's clock). Env and its rollout replica share one
           process on CPU slot 1; the learner owns slot 0 and trains while the env collects (the
           asynchronous runner, ``train.max_staleness=1``), the actor's part of each update in a
           helper process (``--update-threads 2``).
  SB3      a callback stamps the clock when ``num_timesteps`` crosses ``--skip``, and again when
           ``learn()`` returns.

Sides, each in a fresh process with one environment (``_common.side_env``: ``--threads`` torch /
OpenMP threads of the main process, rlweave's glibc malloc settings, flush-denormal):

  rlweave        float32 (like for like: SB3 has only float32; this is the headline ``ratio``)
  rlweave-bf16   ``actor.precision=bfloat16`` (hidden-layer matmuls under autocast), measured
                 only where this CPU multiplies bf16 natively or ``--precision both``; its ratio
                 is the separate, labelled ``ratio_bfloat16``
  sb3-dummy      DummyVecEnv (the env stepped in the training process)
  sb3-subproc    SubprocVecEnv (the env in a process of its own)

The faster SB3 side (median) is the headline baseline. SB3 2.9 has no asynchronous-training
option or callback (training runs inside ``learn()`` between env steps), so none is measured.

Order: a warm-up run of each side (discarded), then ``--repeats`` rounds in A B C D, D C B A, ...
order; per side the median, and the median / min / max of the per-round ratios.

    rlweave bench sac-vs-sb3 [--json FILE] [--steps N] [--skip N] [--repeats R] [--precision P] [--threads T]
    python benchmarks/sac_vs_sb3.py [same flags]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

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
SB3_SIDES = {"sb3-dummy": "DummyVecEnv", "sb3-subproc": "SubprocVecEnv"}


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


def settings(update_threads: int, threads: int, precisions: list[str], sb3: list[str]) -> dict:
    common = {
        "env": f"{ENV_ID}, 1 env", "network": f"actor {HIDDEN} relu, 2 critics {HIDDEN} relu", "batch": BATCH,
        "optimiser": f"Adam lr {LR}, fused", "gamma / tau": f"{GAMMA} / {TAU}", "entropy": "auto (alpha0 1, target -1)",
        "random steps": LEARNING_STARTS, "updates per env step": 1, "evaluation": "off", "device": "cpu",
    }
    helper = (f"{update_threads}: critic and actor parts at once (actor's in a helper process)" if update_threads > 1
              else "1: critic and actor parts one after the other")
    rl = {**common, "processes": "driver + env/rollout process (slot 1) + learner process (slot 0) + its update helper",
          "torch threads": "1 per worker process", "learner update threads": helper,
          "weights to rollout": f"every {ROLLOUT_STEPS} env steps"}
    out = {("rlweave" if p == "float32" else "rlweave-bf16"): {**rl, "precision": p if p == "float32" else "bfloat16 autocast"}
           for p in precisions}
    for name in sb3:
        out[name] = {**common, "precision": "float32", "vec env": SB3_SIDES[name],
                     "processes": "1" if name == "sb3-dummy" else "1 + 1 env process", "torch threads": str(threads),
                     "weights to rollout": "same process"}
    return out


def run_rlweave(steps: int, skip: int, seed: int, precision: str, update_threads: int) -> dict:
    """One rlweave run, in this (side) process."""
    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.runners.offpolicy import OffPolicyRunner

    with tempfile.TemporaryDirectory(prefix="bench-sac-rlweave-") as run_dir:
        cfg = load_config("sac-pendulum", rlweave_overrides(steps, seed, run_dir, precision, update_threads))
        OffPolicyRunner(cfg, run_dir).run()
        records = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
        resolved = OmegaConf.to_container(OmegaConf.load(Path(run_dir, "config.yaml")))
    start = next(i for i, r in enumerate(records) if r["env_steps"] >= skip)
    window = records[start + 1:]
    if not window:
        raise RuntimeError("rlweave run ended at --skip; raise --steps")
    seconds = window[-1]["wall_time"] - records[start]["wall_time"]
    env_steps = window[-1]["env_steps"] - records[start]["env_steps"]
    updates = sum(r["samples/updates"] for r in window)
    return {"steps_per_s": env_steps / seconds, "updates_per_s": updates / seconds, "env_steps": env_steps,
            "updates": updates, "timed_s": seconds,
            "steps_per_s_sum_of_iterations": env_steps / sum(r["time/iteration"] for r in window),
            "learner_s_per_update": C.median([r["time/actor"] / max(1, r["samples/updates"]) for r in window]),
            "effective": {k: resolved.get(k) for k in ("actor", "algorithm", "placement", "train")}}


def run_sb3(steps: int, skip: int, seed: int, vec: str) -> dict:
    """One SB3 run, in this (side) process."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    class Window(BaseCallback):
        def __init__(self):
            super().__init__(verbose=0)
            self.t_skip, self.steps_at_skip, self.updates_at_skip = None, 0, 0

        def _on_step(self) -> bool:
            if self.t_skip is None and self.model.num_timesteps >= skip:
                self.t_skip, self.steps_at_skip = time.perf_counter(), self.model.num_timesteps
                self.updates_at_skip = self.model._n_updates
            return True

    env = make_vec_env(lambda: gym.make(ENV_ID), n_envs=1, seed=seed,
                       vec_env_cls={"DummyVecEnv": DummyVecEnv, "SubprocVecEnv": SubprocVecEnv}[vec])
    model = SAC("MlpPolicy", env, learning_rate=LR, buffer_size=1_000_000, learning_starts=LEARNING_STARTS,
                batch_size=BATCH, tau=TAU, gamma=GAMMA, train_freq=1, gradient_steps=1, ent_coef="auto",
                policy_kwargs={"net_arch": HIDDEN, "optimizer_kwargs": {"fused": True}}, seed=seed, device="cpu", verbose=0)
    cb = Window()
    model.learn(steps, callback=cb)
    seconds = time.perf_counter() - cb.t_skip
    env.close()
    env_steps = model.num_timesteps - cb.steps_at_skip
    updates = model._n_updates - cb.updates_at_skip
    opt = model.critic.optimizer
    return {"steps_per_s": env_steps / seconds, "updates_per_s": updates / seconds, "env_steps": env_steps,
            "updates": updates, "timed_s": seconds,
            "effective": {"vec_env": vec, "optimizer": type(opt).__name__, "fused": opt.defaults.get("fused"),
                          "train_freq": str(model.train_freq), "gradient_steps": model.gradient_steps,
                          "batch_size": model.batch_size, "torch_threads": torch.get_num_threads()}}


def _side(name: str, **params) -> dict:
    if name.startswith("rlweave"):
        return run_rlweave(**params)
    return run_sb3(vec=SB3_SIDES[name], **params)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = C.paired_parser("rlweave bench sac-vs-sb3", __doc__, threads=2)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--skip", type=int, default=600, help="env steps left out at the start (start-up, warm-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=("auto", "both", "float32"), default="auto",
                   help="rlweave sides: float32 always (the headline); a bfloat16 side too where native (auto) or always (both)")
    p.add_argument("--update-threads", type=int, choices=(1, 2), default=2,
                   help="rlweave learner: critic and actor parts of each update at once (2) or one after the other (1)")
    p.add_argument("--sb3-vec", choices=("both", *SB3_SIDES), default="both")
    p.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up run of each side (quick checks only)")
    args = p.parse_args(argv)
    if args.side:
        return C.serve_side(lambda **kw: _side(args.side, **kw), args.side_params)
    if args.skip <= LEARNING_STARTS or args.skip >= args.steps:
        p.error(f"--skip must lie between the {LEARNING_STARTS} random steps and --steps")
    import torch

    from rlweave.utils.precision import cpu_capability, native_bf16

    bf16_native = native_bf16(torch.device("cpu"))
    precisions = ["float32"] + (["bfloat16"] if args.precision == "both" or (args.precision == "auto" and bf16_native) else [])
    sb3 = list(SB3_SIDES) if args.sb3_vec == "both" else [args.sb3_vec]
    configs = settings(args.update_threads, args.threads, precisions, sb3)
    out = C.report("sac-vs-sb3", argv, "env steps/s of the full loop by the wall clock over the window; ratio = median over "
                   "rounds of rlweave float32 / the faster SB3 side (bf16: ratio_bfloat16, separate)", configs,
                   args.repeats, not args.no_warmup, args.threads)
    C.print_settings("sac-vs-sb3: rlweave vs Stable-Baselines3 (same work)", configs,
                     {"window": f"env steps {args.skip}..{args.steps}", "order": " | ".join(out["protocol"]["order"]),
                      "bf16": f"{cpu_capability()}, {'native' if bf16_native else 'emulated'}", "process env": out["process_env"]})
    here = Path(__file__).resolve()
    params = {"rlweave": dict(steps=args.steps, skip=args.skip, seed=args.seed, precision="float32", update_threads=args.update_threads)}
    if "bfloat16" in precisions:
        params["rlweave-bf16"] = {**params["rlweave"], "precision": "bfloat16"}
    params.update({n: dict(steps=args.steps, skip=args.skip, seed=args.seed) for n in sb3})
    sides = {n: (lambda n=n: C.run_side(here, n, params[n], args.threads)) for n in params}
    fmt = lambda side, r: f"{r['steps_per_s']:.1f} env steps/s, {r['updates_per_s']:.1f} updates/s"  # noqa: E731
    _, res = C.interleave(sides, args.repeats, warmup=not args.no_warmup, describe=fmt)
    steps = {n: [r["steps_per_s"] for r in res[n]] for n in res}
    updates = {n: [r["updates_per_s"] for r in res[n]] for n in res}
    out.update({"bf16_native": bf16_native, "cpu_capability": cpu_capability(), "precision": "float32",
                "steps_per_s": {n: C.median(v) for n, v in steps.items()},
                "updates_per_s": {n: C.median(v) for n, v in updates.items()}})
    print()
    for n in res:
        print(f"  {n:<13} {out['steps_per_s'][n]:7.1f} env steps/s  {out['updates_per_s'][n]:7.1f} updates/s")
    for side, suffix, label in (("rlweave", "", "float32, like for like (headline)"), ("rlweave-bf16", "_bfloat16", "bfloat16 (separate line)")):
        if side not in res:
            continue
        r = C.ratio_vs_fastest(steps[side], {n: steps[n] for n in sb3})
        u = C.ratio_stats(updates[side], updates[r["baseline"]])
        out.update({f"ratio{suffix}": r["median"], f"ratio{suffix}_min": r["min"], f"ratio{suffix}_max": r["max"],
                    f"ratio_env_steps_per_s{suffix}": r, f"ratio_updates_per_s{suffix}": u})
        print(f"ratio {side} / {r['baseline']} ({label}): env steps/s {C.fmt_ratio(r)}, updates/s {C.fmt_ratio(u)}"
              + "".join(f"; vs {n} {v:.2f}" for n, v in r["against"].items()))
    out["baseline"] = f"stable-baselines3 SAC, {out['ratio_env_steps_per_s']['baseline']} (the faster SB3 side)"
    out.update({"settings": {"window": [args.skip, args.steps], "seed": args.seed, "threads": args.threads,
                             "update_threads": args.update_threads, "precisions": precisions},
                "sb3_async_training": "not available in stable-baselines3 2.x (no such option or callback)", "runs": res})
    print(f"[{out['command']}]")
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
