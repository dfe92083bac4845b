"""PPO env-steps/s: rlweave against Stable-Baselines3 on HalfCheetah-v5, the same work, one run.

Both sides train PPO from scratch on HalfCheetah-v5 with 8 envs x 256 steps per iteration (2048
env steps), 10 epochs of minibatch 64, separate 64x64 tanh actor and critic MLPs, Adam 3e-4,
observation and reward normalisation, no evaluation. Each side runs ``--iterations`` + 1
iterations; the first (start-up effects, lazy imports, allocator growth) is discarded.

Headline: env-steps/s of the *full loop* (rollout + training + weight sync; BENCHMARKS.md rule 4)
= env steps of iterations 2..N / the sum of their wall times:

  rlweave  per-iteration ``time/iteration`` from the run's metrics.jsonl (the driver's time from
           dispatching collect/serve/train to the end of the weight sync).
  SB3      a callback stamps ``_on_rollout_start`` / ``_on_rollout_end``; an iteration is one
           rollout start to the next (the last one ends when ``learn()`` returns): collect_rollouts
           + logging + train(). Model construction and the first reset are outside.

Also reported, not the headline: the wall clock of the whole run including start-up (rlweave: the
embedded Ray, its worker processes, the final checkpoint and shutdown; SB3: building envs and
model), over all N + 1 iterations.

Layout: by default rlweave steps the 8 envs in 2 env workers of 4 (one per core, each with its
rollout replica in its process) and trains in one actor process; SB3 runs in one process, its
faster setting here (DummyVecEnv; SubprocVecEnv pays a pipe round trip per env per step). The
work is the same: envs, steps, network, epochs and minibatches; only where it runs differs, which
is what rlweave chooses. ``--env-workers 1`` measures the single-env-worker layout. One
difference in what is computed: rlweave's reward scaling keeps its return statistics per env
worker (4 envs each), SB3's VecNormalize over all 8.

Order: a warm-up run of each side (discarded), then ``--repeats`` interleaved pairs
(rlweave, SB3, rlweave, SB3, ...); per side the median, and the median / min / max of the
per-pair ratios rlweave / SB3.

    rlweave bench ppo-vs-sb3 [--json FILE] [--iterations N] [--repeats R]
    python benchmarks/ppo_vs_sb3.py [same flags]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # same on both sides; rlweave's workers set it to 1 too
# rlweave starts an embedded Ray per run. Without an address, ray.init() attaches to whatever Ray
# cluster another user on this machine started with `ray start` (/tmp/ray/ray_current_cluster) and
# then refuses num_cpus; "local" makes it always start its own instance, as the benchmark intends.
os.environ.setdefault("RAY_ADDRESS", "local")

_HERE = Path(__file__).resolve().parent


def _load_common():
    name = "rlweave_bench__common"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


C = _load_common()

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

RLWEAVE_TIME_KEYS = ("time/iteration", "time/env", "time/env_wait_action", "time/rollout", "time/actor", "time/weight_sync")


# =========================================================================== rlweave side
def rlweave_overrides(iterations: int, seed: int, run_dir: str, extra: list[str], env_workers: int = 1) -> list[str]:
    """Every setting that defines the work is pinned here, so a change to the packaged recipe
    cannot silently change what is compared."""
    return [
        f"run.dir={run_dir}",
        "run.progress=false",
        "run.tensorboard=false",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"train.total_env_steps={(iterations + 1) * STEPS_PER_ITER}",
        f"train.rollout_steps={ROLLOUT_STEPS}",
        f"env.id={ENV_ID}",
        f"env.num_envs={NUM_ENVS // env_workers}",
        f"env.num_workers={env_workers}",
        f"rollout.num_workers={env_workers}",  # one rollout replica per env worker (fused with it)
        "actor.num_workers=1",
        "env.chunk=1",
        "env.max_episode_steps=null",
        "env.pixels.enabled=false",
        "env.normalize_reward=true",
        "env.reward_clip=10.0",
        "policy.name=mlp",
        "policy.hidden=[64,64]",
        "policy.activation=tanh",
        "policy.normalize_obs=true",
        "policy.log_std_init=0.0",
        "policy.ortho_init=true",
        "algorithm.name=ppo",
        f"algorithm.epochs={EPOCHS}",
        f"algorithm.minibatch_size={MINIBATCH}",
        f"algorithm.lr={LR}",
        "algorithm.lr_anneal=false",  # SB3 default: constant learning rate
        "algorithm.clip_anneal=false",
        "algorithm.value_clip=null",  # SB3 default clip_range_vf=None
        "algorithm.clip_eps_high=null",
        "algorithm.dual_clip=null",
        "algorithm.norm_adv=true",
        f"algorithm.gamma={GAMMA}",
        f"algorithm.gae_lambda={GAE_LAMBDA}",
        f"algorithm.clip_eps={CLIP}",
        f"algorithm.vf_coef={VF_COEF}",
        f"algorithm.ent_coef={ENT_COEF}",
        f"algorithm.max_grad_norm={MAX_GRAD_NORM}",
        f"seed={seed}",
        *extra,
    ]


def _rlweave_adam_impl() -> str:
    """Which Adam implementation rlweave's actor asks torch for (read from its source)."""
    import inspect

    from rlweave.workers.actor_worker import ActorWorker

    try:
        src = inspect.getsource(ActorWorker.__init__)
    except (OSError, TypeError):
        return "?"
    for impl in ("fused", "foreach"):
        if f"{impl}=True" in src:
            return impl
    return "torch default (single-tensor on CPU)"


def rlweave_settings(extra: list[str], env_workers: int = 1) -> dict:
    from rlweave.config import load_config

    cfg = load_config("ppo-halfcheetah", rlweave_overrides(5, 0, "/tmp/unused", extra, env_workers))
    plan_note = f"{cfg.placement.mode}: env {cfg.env.num_workers}, rollout {cfg.rollout.num_workers}, actor {cfg.actor.num_workers}"
    return {
        "env": cfg.env.id,
        "envs": f"{cfg.env.num_workers * cfg.env.num_envs} ({cfg.env.num_workers} env worker(s) x {cfg.env.num_envs}, gymnasium sync vector env)",
        "steps/env/iter": cfg.train.rollout_steps,
        "steps/iter": cfg.env.num_workers * cfg.env.num_envs * cfg.train.rollout_steps,
        "epochs": cfg.algorithm.epochs,
        "minibatch": cfg.algorithm.minibatch_size,
        "grad steps/iter": cfg.algorithm.epochs * (cfg.env.num_workers * cfg.env.num_envs * cfg.train.rollout_steps // cfg.algorithm.minibatch_size),
        "network": f"actor {list(cfg.policy.hidden)} {cfg.policy.activation} + critic {list(cfg.policy.hidden)} {cfg.policy.activation} (separate)",
        "optimiser": f"Adam lr {cfg.algorithm.lr} eps {ADAM_EPS} ({'annealed' if cfg.algorithm.lr_anneal else 'constant'})",
        "Adam implementation": _rlweave_adam_impl(),
        "gamma / lambda": f"{cfg.algorithm.gamma} / {cfg.algorithm.gae_lambda}",
        "clip / vf / ent": f"{cfg.algorithm.clip_eps} / {cfg.algorithm.vf_coef} / {cfg.algorithm.ent_coef}",
        "max grad norm": cfg.algorithm.max_grad_norm,
        "value clipping": "off" if cfg.algorithm.value_clip is None else cfg.algorithm.value_clip,
        "adv normalised": "per minibatch" if cfg.algorithm.norm_adv else "no",
        "obs normalisation": "in policy (running mean/std, clip 10)" if cfg.policy.normalize_obs else "off",
        "reward normalisation": f"env worker (return std, clip {cfg.env.reward_clip})" if cfg.env.normalize_reward else "off",
        "evaluation": "off" if cfg.train.eval_every == 0 else f"every {cfg.train.eval_every}",
        "dtype / device": "float32 / cpu",
        "torch threads": "1 per Ray worker process (CPU slot = 1 core)",
        "processes": f"driver + Ray worker processes ({plan_note}; see below)",
    }


def run_rlweave(iterations: int, seed: int, extra: list[str], keep_dir: str | None, env_workers: int = 1) -> dict:
    from rlweave.config import load_config
    from rlweave.runners.onpolicy import OnPolicyRunner

    tmp = None
    if keep_dir:
        run_dir = os.path.join(keep_dir, f"rlweave-{time.strftime('%H%M%S')}-{time.time_ns() % 10**6}")
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench-ppo-rlweave-")
        run_dir = tmp.name
    try:
        for attempt in range(3):
            t0 = time.perf_counter()
            cfg = load_config("ppo-halfcheetah", rlweave_overrides(iterations, seed, run_dir, extra, env_workers))
            try:
                OnPolicyRunner(cfg, run_dir).run()
                break
            except Exception as e:  # noqa: BLE001 - only Ray's start-up timeout is retried
                if "timed out during startup" not in str(e) or attempt == 2:
                    raise
                print(f"  (rlweave run: Ray failed to start on a loaded machine -- {str(e).splitlines()[0]!r}; retrying)")
                for name in ("metrics.jsonl", "config.yaml"):
                    Path(run_dir, name).unlink(missing_ok=True)
        wall = time.perf_counter() - t0
        records = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
        plan = {}
        cfg_path = Path(run_dir, "config.yaml")
        if cfg_path.is_file():
            from omegaconf import OmegaConf

            plan = OmegaConf.to_container(OmegaConf.load(cfg_path)).get("placement", {}).get("derived", {})
    finally:
        if tmp is not None:
            tmp.cleanup()
    prev = 0
    for r in records:
        r["_steps"] = r["env_steps"] - prev
        prev = r["env_steps"]
    groups = plan.get("groups", {})
    fused = groups.get("env") == groups.get("rollout")
    worker_procs = len(groups.get("env", [])) + (0 if fused else len(groups.get("rollout", []))) + len(groups.get("actor", []))
    measured = records[1:]
    if not measured:
        raise RuntimeError("rlweave run logged fewer than 2 iterations; raise --iterations")
    steps = sum(r["_steps"] for r in measured)
    loop = sum(r["time/iteration"] for r in measured)
    # Gap between consecutive records' wall_time: the loop plus the driver's bookkeeping between
    # iterations (metrics line, trace spans) -- a check on the headline, not the headline.
    gap = records[-1]["wall_time"] - records[0]["wall_time"]
    total_steps = sum(r["_steps"] for r in records)
    startup = records[0]["wall_time"] - records[0]["time/iteration"]
    breakdown = {k: C.mean([r.get(k, float("nan")) for r in measured]) for k in RLWEAVE_TIME_KEYS}
    return {
        "steps_per_s": steps / loop,
        "steps_per_s_record_gap": steps / gap if gap > 0 else float("nan"),
        "wall_steps_per_s": total_steps / wall,
        "wall_s": wall,
        "startup_s": startup,
        "first_iteration_s": records[0]["time/iteration"],
        "iterations_measured": len(measured),
        "env_steps_measured": steps,
        "loop_s": loop,
        "breakdown_mean_s": breakdown,
        "plan": plan,
        "worker_processes": worker_procs,
        "env_rollout_fused": fused,
    }


# =========================================================================== SB3 side
SB3_ADAM = {
    "default": ({}, "torch default (single-tensor on CPU), as SB3 ships"),
    "fused": ({"fused": True}, "fused (optimizer_kwargs fused=True)"),
    "foreach": ({"foreach": True}, "foreach (optimizer_kwargs foreach=True)"),
}


def sb3_settings(adam: str = "default") -> dict:
    return {
        "env": ENV_ID,
        "envs": f"{NUM_ENVS} (DummyVecEnv + Monitor; faster than Subproc on 2 cores)",
        "steps/env/iter": ROLLOUT_STEPS,
        "steps/iter": STEPS_PER_ITER,
        "epochs": EPOCHS,
        "minibatch": MINIBATCH,
        "grad steps/iter": EPOCHS * (STEPS_PER_ITER // MINIBATCH),
        "network": "actor [64, 64] tanh + critic [64, 64] tanh (separate)",
        "optimiser": f"Adam lr {LR} eps {ADAM_EPS} (constant)",
        "Adam implementation": SB3_ADAM[adam][1],
        "gamma / lambda": f"{GAMMA} / {GAE_LAMBDA}",
        "clip / vf / ent": f"{CLIP} / {VF_COEF} / {ENT_COEF}",
        "max grad norm": MAX_GRAD_NORM,
        "value clipping": "off",
        "adv normalised": "per minibatch",
        "obs normalisation": "VecNormalize(norm_obs, clip_obs 10)",
        "reward normalisation": "VecNormalize(norm_reward, clip_reward 10.0)",
        "evaluation": "off",
        "dtype / device": "float32 / cpu",
        "torch threads": "1 (torch.set_num_threads(1))",
        "processes": "1 (the benchmark's own process)",
    }


def _sb3_classes():
    """SB3 helper classes, built on first use so importing this file needs no SB3."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class TimedVecEnv(VecEnvWrapper):
        """Times env stepping (VecNormalize + DummyVecEnv + Monitor) inside the rollout."""

        def __init__(self, venv):
            super().__init__(venv)
            self.step_time = 0.0

        def reset(self):
            return self.venv.reset()

        def step_async(self, actions):
            self._t0 = time.perf_counter()
            self.venv.step_async(actions)

        def step_wait(self):
            out = self.venv.step_wait()
            self.step_time += time.perf_counter() - self._t0
            return out

    class IterationTimer(BaseCallback):
        def __init__(self, venv):
            super().__init__(verbose=0)
            self.venv = venv
            self.starts: list[float] = []
            self.rollout_ends: list[float] = []
            self.env_time: list[float] = []
            self.steps_at_start: list[int] = []

        def _on_rollout_start(self) -> None:
            self.starts.append(time.perf_counter())
            self.steps_at_start.append(self.model.num_timesteps)
            self.venv.step_time = 0.0

        def _on_rollout_end(self) -> None:
            self.rollout_ends.append(time.perf_counter())
            self.env_time.append(self.venv.step_time)

        def _on_step(self) -> bool:
            return True

    return TimedVecEnv, IterationTimer


def run_sb3(iterations: int, seed: int, adam: str = "default") -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)
    TimedVecEnv, IterationTimer = _sb3_classes()
    t0 = time.perf_counter()
    venv = make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed, vec_env_cls=DummyVecEnv)
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, clip_reward=10.0, gamma=GAMMA)
    venv = TimedVecEnv(venv)
    model = PPO(
        "MlpPolicy",
        venv,
        n_steps=ROLLOUT_STEPS,
        batch_size=MINIBATCH,
        n_epochs=EPOCHS,
        learning_rate=LR,
        gamma=GAMMA,
        gae_lambda=GAE_LAMBDA,
        clip_range=CLIP,
        ent_coef=ENT_COEF,
        vf_coef=VF_COEF,
        max_grad_norm=MAX_GRAD_NORM,
        clip_range_vf=None,
        normalize_advantage=True,
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            ortho_init=True,
            log_std_init=0.0,
            optimizer_kwargs=dict(eps=ADAM_EPS, **SB3_ADAM[adam][0]),
        ),
        device="cpu",
        seed=seed,
        verbose=0,
    )
    cb = IterationTimer(venv)
    t_built = time.perf_counter()
    model.learn(total_timesteps=(iterations + 1) * STEPS_PER_ITER, callback=cb, progress_bar=False)
    t_end = time.perf_counter()
    venv.close()
    bounds = cb.starts + [t_end]
    steps_end = cb.steps_at_start + [model.num_timesteps]
    iters = []
    for i in range(len(cb.starts)):
        iters.append(
            {
                "steps": steps_end[i + 1] - steps_end[i],
                "iteration": bounds[i + 1] - bounds[i],
                "rollout": cb.rollout_ends[i] - bounds[i],
                "env_step": cb.env_time[i],
                "train": bounds[i + 1] - cb.rollout_ends[i],  # logging + train()
            }
        )
    measured = iters[1:]
    if not measured:
        raise RuntimeError("SB3 ran fewer than 2 iterations; raise --iterations")
    steps = sum(it["steps"] for it in measured)
    loop = sum(it["iteration"] for it in measured)
    breakdown = {k: C.mean([it[k] for it in measured]) for k in ("iteration", "rollout", "env_step", "train")}
    return {
        "steps_per_s": steps / loop,
        "wall_steps_per_s": model.num_timesteps / (t_end - t0),
        "wall_s": t_end - t0,
        "startup_s": t_built - t0,
        "first_iteration_s": iters[0]["iteration"],
        "iterations_measured": len(measured),
        "env_steps_measured": steps,
        "loop_s": loop,
        "breakdown_mean_s": breakdown,
    }


# =========================================================================== report
def _print_breakdown(rl: list[dict], sb: list[dict]) -> dict:
    """Mean seconds per measured iteration, median over the repeats."""
    rb = {k: C.median([r["breakdown_mean_s"][k] for r in rl]) for k in RLWEAVE_TIME_KEYS}
    sbb = {k: C.median([r["breakdown_mean_s"][k] for r in sb]) for k in ("iteration", "rollout", "env_step", "train")}
    it = rb["time/iteration"]
    collect = rb["time/env"] + rb["time/env_wait_action"]
    other = it - collect - rb["time/actor"] - rb["time/weight_sync"]
    pct = lambda x, tot: f"{100 * x / tot:5.1f}%"  # noqa: E731
    print()
    print("where an iteration's time goes (seconds per 2048-step iteration: mean over measured iterations, median over repeats)")
    print(f"  rlweave  iteration                         {it:7.3f}  100.0%")
    print(f"    collect (env worker: env + wait action)  {collect:7.3f}  {pct(collect, it)}   [serve on the rollout worker: time/rollout {rb['time/rollout']:.3f}]")
    print(f"      time/env (step envs, reward norm, bufs){rb['time/env']:7.3f}  {pct(rb['time/env'], it)}")
    print(f"      time/env_wait_action (obs->action)     {rb['time/env_wait_action']:7.3f}  {pct(rb['time/env_wait_action'], it)}"
          f"   = {1e3 * rb['time/env_wait_action'] / ROLLOUT_STEPS:.2f} ms per decision (policy forward + 2 channel hops)")
    print(f"    time/actor (actor train: GAE + 320 updates + obs stats) {rb['time/actor']:7.3f}  {pct(rb['time/actor'], it)}")
    print(f"    time/weight_sync                         {rb['time/weight_sync']:7.3f}  {pct(rb['time/weight_sync'], it)}")
    print(f"    other (dispatch, trajectory hand-off, gather; stages may overlap by ms) {other:7.3f}  {pct(other, it)}")
    s_it = sbb["iteration"]
    s_pol = sbb["rollout"] - sbb["env_step"]
    print(f"  SB3      iteration                         {s_it:7.3f}  100.0%")
    print(f"    collect_rollouts                         {sbb['rollout']:7.3f}  {pct(sbb['rollout'], s_it)}")
    print(f"      env step (VecNormalize+DummyVecEnv+Monitor) {sbb['env_step']:7.3f}  {pct(sbb['env_step'], s_it)}")
    print(f"      policy forward + buffer + python       {s_pol:7.3f}  {pct(s_pol, s_it)}   = {1e3 * s_pol / ROLLOUT_STEPS:.2f} ms per decision")
    print(f"    train (320 updates; incl. logging)       {sbb['train']:7.3f}  {pct(sbb['train'], s_it)}")
    return {
        "rlweave": {**{k.replace("time/", ""): v for k, v in rb.items()}, "collect": collect, "other": other},
        "sb3": {**sbb, "rollout_minus_env": s_pol},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="rlweave bench ppo-vs-sb3", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the headline figures as one JSON object")
    ap.add_argument("--iterations", type=int, default=5, help="measured iterations per run (one more is run and discarded); default 5")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rlweave/SB3 pairs after the warm-up (>= 3 for a claim); default 3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up run of each side (quick checks only)")
    ap.add_argument("--env-workers", type=int, default=2, choices=(1, 2, 4, 8),
                    help="rlweave env workers (each with its own rollout replica fused into its process); the 8 envs "
                         "are split between them; default 2 (one per core of a 2-core machine, the faster layout here)")
    ap.add_argument("--rlweave-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra rlweave override (e.g. placement.mode=disaggregated); shown in the settings")
    ap.add_argument("--sb3-adam", choices=sorted(SB3_ADAM), default="default",
                    help="Adam implementation on the SB3 side (default: as SB3 ships, torch's single-tensor loop on CPU)")
    ap.add_argument("--keep-runs", metavar="DIR", help="keep rlweave's run folders (metrics.jsonl, trace.json) under DIR")
    args = ap.parse_args(argv)
    if args.iterations < 1:
        ap.error("--iterations must be >= 1")

    import torch

    torch.set_num_threads(1)  # the SB3 side runs in this process
    import gymnasium  # noqa: F401  (for the version printout)
    import mujoco  # noqa: F401
    import numpy  # noqa: F401
    import ray  # noqa: F401

    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise SystemExit("ppo-vs-sb3 needs Stable-Baselines3: bash scripts/setup.sh dev,bench  (the 'bench' extra)") from None

    rl_set = rlweave_settings(args.rlweave_set, args.env_workers)
    sb_set = sb3_settings(args.sb3_adam)
    env_info = C.environment_info()
    total_iters = args.iterations + 1
    C.print_settings(
        f"ppo-vs-sb3: PPO env-steps/s, rlweave vs Stable-Baselines3 {stable_baselines3.__version__}, same work",
        {"rlweave": rl_set, "SB3": sb_set},
        common={
            "machine": ", ".join(f"{k} {v}" for k, v in env_info.items()),
            "per run": f"{total_iters} iterations x {STEPS_PER_ITER} = {total_iters * STEPS_PER_ITER} env steps; the first iteration is discarded",
            "order": f"{'no warm-up' if args.no_warmup else 'warm-up of each side (discarded)'}, then {args.repeats} pairs: rlweave, SB3, rlweave, SB3, ...",
            "headline": "env-steps/s of the full loop (rollout + train + weight sync) over iterations 2..N, per-pair ratio rlweave / SB3",
            "extra rlweave overrides": " ".join(args.rlweave_set) or "none",
            "RAY_ADDRESS": f"{os.environ.get('RAY_ADDRESS')} (rlweave starts its own embedded Ray for every run)",
        },
    )
    print()
    if args.keep_runs:
        os.makedirs(args.keep_runs, exist_ok=True)

    sides = {
        "rlweave": lambda: run_rlweave(args.iterations, args.seed, args.rlweave_set, args.keep_runs, args.env_workers),
        "sb3": lambda: run_sb3(args.iterations, args.seed, args.sb3_adam),
    }
    describe = lambda side, r: (  # noqa: E731
        f"loop {r['steps_per_s']:7.0f} steps/s  | wall incl. start-up {r['wall_steps_per_s']:6.0f} steps/s "
        f"({r['wall_s']:.1f} s, start-up {r['startup_s']:.1f} s, 1st iter {r['first_iteration_s']:.2f} s)"
    )
    t_start = time.perf_counter()
    warmups, res = C.interleave(sides, args.repeats, warmup=not args.no_warmup, describe=describe)
    elapsed = time.perf_counter() - t_start
    rl, sb = res["rlweave"], res["sb3"]

    rl_sps = [r["steps_per_s"] for r in rl]
    sb_sps = [r["steps_per_s"] for r in sb]
    ratio = C.ratio_stats(rl_sps, sb_sps)
    wall_ratio = C.ratio_stats([r["wall_steps_per_s"] for r in rl], [r["wall_steps_per_s"] for r in sb])

    print()
    print(f"results over {args.repeats} pairs (env-steps/s; median of runs)")
    print(f"  full loop (headline)   rlweave {C.median(rl_sps):7.0f}   SB3 {C.median(sb_sps):7.0f}   ratio rlweave/SB3 {C.fmt_ratio(ratio)}")
    print(f"  wall incl. start-up    rlweave {C.median([r['wall_steps_per_s'] for r in rl]):7.0f}   SB3 {C.median([r['wall_steps_per_s'] for r in sb]):7.0f}"
          f"   ratio rlweave/SB3 {C.fmt_ratio(wall_ratio)}   ({total_iters} iterations incl. the first)")
    print(f"  start-up s (median)    rlweave {C.median([r['startup_s'] for r in rl]):7.1f}   SB3 {C.median([r['startup_s'] for r in sb]):7.1f}"
          "   (rlweave: embedded Ray + workers + first weight sync; SB3: envs + model)")
    print(f"  rlweave loop incl. driver bookkeeping between iterations: {C.median([r['steps_per_s_record_gap'] for r in rl]):.0f} steps/s")
    breakdown = _print_breakdown(rl, sb)
    plan = rl[0].get("plan", {})
    r0 = rl[0]
    print()
    print(f"  rlweave placement used: {json.dumps(plan)}")
    print(f"  rlweave processes: driver + {r0['worker_processes']} Ray worker process(es)"
          f"{' (env+rollout fused per slot, plus the actor)' if r0['env_rollout_fused'] else ''}"
          f" + Ray's own (GCS, raylet, ...); SB3: 1 process. Machine load average (1 min) at the end: {C.load_average()}")
    print()
    print(f"ratio (rlweave / SB3 PPO env-steps/s, full loop), median of {args.repeats} pairs: {ratio['median']:.2f} "
          f"(min {ratio['min']:.2f}, max {ratio['max']:.2f})  [{elapsed:.0f} s; rlweave bench ppo-vs-sb3"
          f" --iterations {args.iterations} --repeats {args.repeats}]")

    out = {
        "benchmark": "ppo-vs-sb3",
        "baseline": f"stable-baselines3 {stable_baselines3.__version__} PPO (DummyVecEnv, 1 process)",
        "headline": "full-loop env-steps/s over iterations 2..N; ratio = median of per-pair rlweave/SB3",
        "ratio": ratio["median"],
        "ratio_min": ratio["min"],
        "ratio_max": ratio["max"],
        "ratios": ratio["ratios"],
        "rlweave_steps_per_s": C.median(rl_sps),
        "sb3_steps_per_s": C.median(sb_sps),
        "rlweave_steps_per_s_runs": rl_sps,
        "sb3_steps_per_s_runs": sb_sps,
        "wall_ratio": wall_ratio["median"],
        "wall_ratio_min": wall_ratio["min"],
        "wall_ratio_max": wall_ratio["max"],
        "rlweave_wall_steps_per_s": C.median([r["wall_steps_per_s"] for r in rl]),
        "sb3_wall_steps_per_s": C.median([r["wall_steps_per_s"] for r in sb]),
        "rlweave_startup_s": C.median([r["startup_s"] for r in rl]),
        "sb3_startup_s": C.median([r["startup_s"] for r in sb]),
        "breakdown_s_per_iteration": breakdown,
        "rlweave_plan": plan,
        "rlweave_worker_processes": r0["worker_processes"],
        "settings": {
            "iterations_measured": args.iterations,
            "iterations_run": total_iters,
            "steps_per_iteration": STEPS_PER_ITER,
            "repeats": args.repeats,
            "warmup": not args.no_warmup,
            "seed": args.seed,
            "sb3_adam": args.sb3_adam,
            "rlweave_overrides": args.rlweave_set,
            "env_workers": args.env_workers,
            "rlweave": rl_set,
            "sb3": sb_set,
            "machine": env_info,
        },
        "runs": {"rlweave": rl, "sb3": sb},
        "elapsed_s": elapsed,
    }
    C.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
