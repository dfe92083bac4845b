"""PPO env-steps/s: rlweave against Stable-Baselines3 on HalfCheetah-v5, the same work, one run.

Both sides train PPO from scratch on HalfCheetah-v5 with 8 envs x 256 steps per iteration (2048
env steps), 10 epochs of minibatch 64, separate 64x64 tanh actor and critic MLPs, fused Adam 3e-4
(SB3: ``policy_kwargs=dict(optimizer_kwargs=dict(fused=True))``, its documented hook; rlweave's
actor always uses fused Adam), observation and reward normalisation, no evaluation. Each run does
``--iterations`` + 1 iterations (default 20 + 1); the first (start-up effects, lazy imports,
allocator growth) is not counted.

Headline: env-steps/s of the *full loop* (rollout + training + weight sync; docs/design.md, "How speed is measured", rule 4),
by the wall clock on both sides: the env steps of iterations 2..N over the time from the end of
iteration 1 to the end of iteration N.

  rlweave  ``wall_time`` of the run's first and last metrics.jsonl records (the driver's clock,
           so its bookkeeping between iterations counts); the sum of the iterations' own
           ``time/iteration`` is printed beside it.
  SB3      a callback stamps ``_on_rollout_start``; from the second rollout's start to the end of
           ``learn()`` (collect_rollouts + logging + train()).

Also reported: the wall clock of the whole run including start-up (rlweave: the embedded Ray, its
worker processes, the final checkpoint and shutdown; SB3: building envs and model), all N + 1
iterations, as ``wall_ratio``.

Sides, each in a fresh process with one environment (``_common.side_env``: ``--threads`` torch /
OpenMP threads, rlweave's glibc malloc settings, flush-denormal):

  rlweave      the 8 envs in ``--env-workers`` env workers (default 2, one per core, each with
               its rollout replica in its process), the learner in one actor process
  sb3-dummy    one process, DummyVecEnv (envs stepped in turn in the training process)
  sb3-subproc  SubprocVecEnv (one process per env; the training process waits on pipes)

The faster SB3 side (median) is the headline baseline; the ratio against the other is printed
and written beside it. One difference in what is computed: rlweave's reward scaling keeps its
return statistics per env worker (4 envs each), SB3's VecNormalize over all 8.

Order: a warm-up run of each side (discarded), then ``--repeats`` rounds in A B C, C B A, ...
order; per side the median, and the median / min / max of the per-round ratios.

    rlweave bench ppo-vs-sb3 [--json FILE] [--iterations N] [--repeats R] [--threads T]
    python benchmarks/ppo_vs_sb3.py [same flags]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

ENV_ID = "HalfCheetah-v5"
NUM_ENVS = 8
ROLLOUT_STEPS = 256
EPOCHS = 10
MINIBATCH = 64
LR = 3e-4
GAMMA = 0.99
GAE_LAMBDA = 0.95
CLIP = 0.2
VF_COEF = 0.5
ENT_COEF = 0.0
MAX_GRAD_NORM = 0.5
ADAM_EPS = 1e-5
STEPS_PER_ITER = NUM_ENVS * ROLLOUT_STEPS
SB3_SIDES = {"sb3-dummy": "DummyVecEnv", "sb3-subproc": "SubprocVecEnv"}
SB3_ADAM = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}

RLWEAVE_TIME_KEYS = ("time/iteration", "time/env", "time/env_wait_action", "time/rollout", "time/actor", "time/weight_sync")


# =========================================================================== rlweave side
def rlweave_overrides(iterations: int, seed: int, run_dir: str, extra: list[str], env_workers: int = 1) -> list[str]:
    """Every setting that defines the work is pinned here, so a change to the packaged recipe
    cannot silently change what is compared."""
    return [
        f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "train.eval_every=0", "train.checkpoint_every=0",
        f"train.total_env_steps={(iterations + 1) * STEPS_PER_ITER}", f"train.rollout_steps={ROLLOUT_STEPS}",
        f"env.id={ENV_ID}", f"env.num_envs={NUM_ENVS // env_workers}", f"env.num_workers={env_workers}",
        f"rollout.num_workers={env_workers}",  # one rollout replica per env worker (fused with it)
        "actor.num_workers=1", "actor.update_threads=2",  # the value loss in the learner's helper process, same numbers
        "env.chunk=1", "env.max_episode_steps=null", "env.pixels.enabled=false",
        "env.normalize_reward=true", "env.reward_clip=10.0",
        "policy.name=mlp", "policy.hidden=[64,64]", "policy.activation=tanh", "policy.normalize_obs=true",
        "policy.log_std_init=0.0", "policy.ortho_init=true",
        "algorithm.name=ppo", f"algorithm.epochs={EPOCHS}", f"algorithm.minibatch_size={MINIBATCH}", f"algorithm.lr={LR}",
        "algorithm.lr_anneal=false",  # SB3 default: constant learning rate
        "algorithm.clip_anneal=false", "algorithm.value_clip=null",  # SB3 default clip_range_vf=None
        "algorithm.clip_eps_high=null", "algorithm.dual_clip=null", "algorithm.norm_adv=true",
        f"algorithm.gamma={GAMMA}", f"algorithm.gae_lambda={GAE_LAMBDA}", f"algorithm.clip_eps={CLIP}",
        f"algorithm.vf_coef={VF_COEF}", f"algorithm.ent_coef={ENT_COEF}", f"algorithm.max_grad_norm={MAX_GRAD_NORM}",
        f"seed={seed}", *extra,
    ]


def _rlweave_adam_impl() -> str:
    """Which Adam implementation rlweave's PPO actor asks torch for (read from its source: the
    optimiser lives in a worker process, out of this process's reach)."""
    import importlib
    import inspect

    for name in ("rlweave.workers.actor_worker", "rlweave.workers.actor"):
        try:
            src = inspect.getsource(importlib.import_module(name))
        except (ImportError, OSError, TypeError):
            continue
        for impl in ("fused", "foreach"):
            if f"{impl}=True" in src:
                return impl
        return "torch default (single-tensor on CPU)"
    return "?"


def rlweave_settings(extra: list[str], env_workers: int) -> dict:
    from rlweave.config import load_config

    cfg = load_config("ppo-halfcheetah", rlweave_overrides(5, 0, "unused", extra, env_workers))
    n_envs = cfg.env.num_workers * cfg.env.num_envs
    return {
        "envs": f"{n_envs} ({cfg.env.num_workers} env worker(s) x {cfg.env.num_envs}, gymnasium sync vector env)",
        "steps/iter": n_envs * cfg.train.rollout_steps,
        "epochs x minibatch": f"{cfg.algorithm.epochs} x {cfg.algorithm.minibatch_size}",
        "network": f"actor {list(cfg.policy.hidden)} {cfg.policy.activation} + critic (separate)",
        "optimiser": f"Adam lr {cfg.algorithm.lr} eps {ADAM_EPS}, {_rlweave_adam_impl()}",
        "gamma / lambda / clip": f"{cfg.algorithm.gamma} / {cfg.algorithm.gae_lambda} / {cfg.algorithm.clip_eps}",
        "obs / reward normalisation": f"policy running mean/std / env worker (clip {cfg.env.reward_clip})",
        "evaluation": "off" if cfg.train.eval_every == 0 else f"every {cfg.train.eval_every}",
        "torch threads": "1 per worker process (a CPU slot is one core)",
        "processes": f"driver + {cfg.env.num_workers} env+rollout process(es) + 1 actor process"
                     + (" + its helper process (the value loss, actor.update_threads=2)" if cfg.actor.update_threads > 1 else ""),
    }


def run_rlweave(iterations: int, seed: int, extra: list[str], keep_dir: str | None, env_workers: int) -> dict:
    """One rlweave run, in this (side) process."""
    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.runners.onpolicy import OnPolicyRunner

    tmp = None if keep_dir else tempfile.TemporaryDirectory(prefix="bench-ppo-rlweave-")
    run_dir = tmp.name if tmp else os.path.join(keep_dir, f"rlweave-{time.strftime('%H%M%S')}-{os.getpid()}")
    try:
        t0 = time.perf_counter()
        cfg = load_config("ppo-halfcheetah", rlweave_overrides(iterations, seed, run_dir, extra, env_workers))
        OnPolicyRunner(cfg, run_dir).run()
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines() if x.strip()]
        resolved = OmegaConf.to_container(OmegaConf.load(Path(run_dir, "config.yaml")))
    finally:
        if tmp is not None:
            tmp.cleanup()
    prev = 0
    for r in records:
        r["_steps"], prev = r["env_steps"] - prev, r["env_steps"]
    measured = records[1:]
    if not measured:
        raise RuntimeError("rlweave run logged fewer than 2 iterations; raise --iterations")
    steps = sum(r["_steps"] for r in measured)
    gap = records[-1]["wall_time"] - records[0]["wall_time"]
    loop = sum(r["time/iteration"] for r in measured)
    plan = resolved.get("placement", {}).get("derived", {})
    groups = plan.get("groups", {})
    fused = groups.get("env") == groups.get("rollout")
    procs = len(groups.get("env", [])) + (0 if fused else len(groups.get("rollout", []))) + len(groups.get("actor", []))
    return {
        "steps_per_s": steps / gap, "timed_s": gap, "steps_per_s_sum_of_iterations": steps / loop,
        "wall_steps_per_s": records[-1]["env_steps"] / wall, "wall_s": wall,
        "startup_s": records[0]["wall_time"] - records[0]["time/iteration"], "iterations_measured": len(measured),
        "breakdown_mean_s": {k: C.mean([r.get(k, float("nan")) for r in measured]) for k in RLWEAVE_TIME_KEYS},
        "effective": {"placement": plan, "worker_processes": procs, "env_rollout_fused": fused,
                      "adam": _rlweave_adam_impl(), **{k: resolved.get(k) for k in ("env", "rollout", "actor", "algorithm", "policy")}},
    }


# =========================================================================== SB3 side
def sb3_settings(vec: str, adam: str, threads: int) -> dict:
    return {
        "envs": f"{NUM_ENVS} ({vec} + Monitor)",
        "steps/iter": STEPS_PER_ITER,
        "epochs x minibatch": f"{EPOCHS} x {MINIBATCH}",
        "network": "actor [64, 64] tanh + critic (separate)",
        "optimiser": f"Adam lr {LR} eps {ADAM_EPS}, {adam} (policy_kwargs optimizer_kwargs)",
        "gamma / lambda / clip": f"{GAMMA} / {GAE_LAMBDA} / {CLIP}",
        "obs / reward normalisation": "VecNormalize (clip 10 / clip 10.0)",
        "evaluation": "off",
        "torch threads": f"{threads} (torch.set_num_threads)",
        "processes": "1" if vec == "DummyVecEnv" else f"1 + {NUM_ENVS} env processes",
    }


def run_sb3(iterations: int, seed: int, adam: str, vec: str) -> dict:
    """One SB3 run, in this (side) process."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    class Stamps(BaseCallback):
        def __init__(self):
            super().__init__(verbose=0)
            self.starts: list[tuple[float, int]] = []

        def _on_rollout_start(self) -> None:
            self.starts.append((time.perf_counter(), self.model.num_timesteps))

        def _on_step(self) -> bool:
            return True

    t0 = time.perf_counter()
    cls = {"DummyVecEnv": DummyVecEnv, "SubprocVecEnv": SubprocVecEnv}[vec]
    venv = VecNormalize(make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed, vec_env_cls=cls),
                        norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=GAMMA)
    model = PPO("MlpPolicy", venv, n_steps=ROLLOUT_STEPS, batch_size=MINIBATCH, n_epochs=EPOCHS, learning_rate=LR,
                gamma=GAMMA, gae_lambda=GAE_LAMBDA, clip_range=CLIP, ent_coef=ENT_COEF, vf_coef=VF_COEF,
                max_grad_norm=MAX_GRAD_NORM, clip_range_vf=None, normalize_advantage=True,
                policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh, ortho_init=True,
                                   log_std_init=0.0, optimizer_kwargs=dict(eps=ADAM_EPS, **SB3_ADAM[adam])),
                device="cpu", seed=seed, verbose=0)
    cb = Stamps()
    t_built = time.perf_counter()
    model.learn(total_timesteps=(iterations + 1) * STEPS_PER_ITER, callback=cb, progress_bar=False)
    t_end = time.perf_counter()
    venv.close()
    if len(cb.starts) < 2:
        raise RuntimeError("SB3 ran fewer than 2 iterations; raise --iterations")
    (t1, s1), (t_first, _) = cb.starts[1], cb.starts[0]
    opt = model.policy.optimizer
    return {
        "steps_per_s": (model.num_timesteps - s1) / (t_end - t1), "timed_s": t_end - t1,
        "wall_steps_per_s": model.num_timesteps / (t_end - t0), "wall_s": t_end - t0, "startup_s": t_built - t0,
        "iterations_measured": len(cb.starts) - 1, "first_iteration_s": t1 - t_first,
        "effective": {"vec_env": type(venv.venv).__name__, "n_envs": venv.num_envs, "optimizer": type(opt).__name__,
                      "optimizer_defaults": {k: v for k, v in opt.defaults.items() if isinstance(v, (int, float, bool, str, type(None), tuple))},
                      "n_steps": model.n_steps, "batch_size": model.batch_size, "n_epochs": model.n_epochs,
                      "torch_threads": torch.get_num_threads()},
    }


# =========================================================================== driver
def _side(name: str, **params) -> dict:
    if name == "rlweave":
        return run_rlweave(**params)
    return run_sb3(vec=SB3_SIDES[name], **params)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = C.paired_parser("rlweave bench ppo-vs-sb3", __doc__)
    ap.add_argument("--iterations", type=int, default=20, help="measured iterations per run (one more is run first); default 20")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up run of each side (quick checks only)")
    ap.add_argument("--env-workers", type=int, default=2, choices=(1, 2, 4, 8),
                    help="rlweave env workers (each with its rollout replica in its process); default 2, one per core")
    ap.add_argument("--rlweave-set", action="append", default=[], metavar="KEY=VALUE", help="extra rlweave override")
    ap.add_argument("--sb3-adam", choices=sorted(SB3_ADAM), default="fused", help="SB3's Adam implementation; default fused")
    ap.add_argument("--sb3-vec", choices=("both", *SB3_SIDES), default="both", help="SB3 vector envs to measure; default both")
    ap.add_argument("--keep-runs", metavar="DIR", help="keep rlweave's run folders (metrics.jsonl, trace.json) under DIR")
    args = ap.parse_args(argv)
    if args.side:
        return C.serve_side(lambda **p: _side(args.side, **p), args.side_params)
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")
    try:
        import stable_baselines3
    except ImportError:
        print("ppo-vs-sb3 needs Stable-Baselines3: bash scripts/setup.sh dev,bench  (the 'bench' extra)")
        return 1
    if args.keep_runs:
        os.makedirs(args.keep_runs, exist_ok=True)
    sb3_names = list(SB3_SIDES) if args.sb3_vec == "both" else [args.sb3_vec]
    configs = {"rlweave": rlweave_settings(args.rlweave_set, args.env_workers),
               **{n: sb3_settings(SB3_SIDES[n], args.sb3_adam, args.threads) for n in sb3_names}}
    out = C.report("ppo-vs-sb3", argv, "full-loop env-steps/s over iterations "
                   "2..N by the wall clock; ratio = median over rounds of rlweave / the faster SB3 side", configs,
                   args.repeats, not args.no_warmup, args.threads)
    C.print_settings(f"ppo-vs-sb3: PPO env-steps/s, rlweave vs Stable-Baselines3 {stable_baselines3.__version__}, same work",
                     configs, common={"machine": f"{out['environment']['cpu_model']}, {out['environment']['cpus']} cpus, "
                                                 f"load {out['environment']['load_avg_1m']}",
                                      "per run": f"{args.iterations + 1} iterations x {STEPS_PER_ITER} env steps, the first not counted",
                                      "order": " | ".join(out["protocol"]["order"]), "process env": out["process_env"]})
    here = Path(__file__).resolve()
    params = {"rlweave": dict(iterations=args.iterations, seed=args.seed, extra=args.rlweave_set, keep_dir=args.keep_runs,
                              env_workers=args.env_workers)}
    params.update({n: dict(iterations=args.iterations, seed=args.seed, adam=args.sb3_adam) for n in sb3_names})
    sides = {n: (lambda n=n: C.run_side(here, n, params[n], args.threads)) for n in configs}
    describe = lambda side, r: (f"loop {r['steps_per_s']:7.0f} steps/s | with start-up {r['wall_steps_per_s']:6.0f} steps/s "  # noqa: E731
                                f"({r['wall_s']:.1f} s, start-up {r['startup_s']:.1f} s)")
    t_start = time.perf_counter()
    _, res = C.interleave(sides, args.repeats, warmup=not args.no_warmup, describe=describe)
    elapsed = time.perf_counter() - t_start
    sps = {n: [r["steps_per_s"] for r in res[n]] for n in res}
    wall = {n: [r["wall_steps_per_s"] for r in res[n]] for n in res}
    ratio = C.ratio_vs_fastest(sps["rlweave"], {n: sps[n] for n in sb3_names})
    wall_ratio = C.ratio_stats(wall["rlweave"], wall[ratio["baseline"]])
    print(f"\nresults over {args.repeats} rounds (env-steps/s; median of runs)")
    for n in res:
        print(f"  {n:<12} full loop {C.median(sps[n]):7.0f}   with start-up {C.median(wall[n]):7.0f}   "
              f"start-up {C.median([r['startup_s'] for r in res[n]]):5.1f} s")
    print(f"  rlweave, sum of its iterations' own times: {C.median([r['steps_per_s_sum_of_iterations'] for r in res['rlweave']]):.0f} steps/s")
    stages = {k.split("/")[1]: C.median([r["breakdown_mean_s"][k] for r in res["rlweave"]]) for k in RLWEAVE_TIME_KEYS}
    print("  rlweave seconds per iteration: " + ", ".join(f"{k} {v:.3f}" for k, v in stages.items()))
    for n, v in ratio["against"].items():
        print(f"  rlweave / {n}: {v:.2f}")
    print(f"\nratio (rlweave / {ratio['baseline']}, the faster SB3 side; full loop), median of {args.repeats} rounds: "
          f"{C.fmt_ratio(ratio)}; with start-up {wall_ratio['median']:.2f}  [{elapsed:.0f} s; {out['command']}]")
    out.update({
        "baseline": f"stable-baselines3 {stable_baselines3.__version__} PPO, {ratio['baseline']} (the faster SB3 side)",
        "ratio": ratio["median"], "ratio_min": ratio["min"], "ratio_max": ratio["max"], "ratios": ratio["ratios"],
        "ratio_against": ratio["against"], "wall_ratio": wall_ratio["median"], "wall_ratio_min": wall_ratio["min"],
        "wall_ratio_max": wall_ratio["max"],
        "steps_per_s": {n: C.median(v) for n, v in sps.items()}, "wall_steps_per_s": {n: C.median(v) for n, v in wall.items()},
        "settings": {"iterations_measured": args.iterations, "steps_per_iteration": STEPS_PER_ITER, "seed": args.seed,
                     "threads": args.threads, "env_workers": args.env_workers, "sb3_adam": args.sb3_adam,
                     "rlweave_overrides": args.rlweave_set},
        "runs": res, "elapsed_s": elapsed,
    })
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
