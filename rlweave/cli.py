"""The ``rlweave`` command: train, resume, eval, collect, plot, timeline, plan, recipes, bench."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from rlweave.utils.plugins import import_object

RUNNERS = {
    "onpolicy": "rlweave.runners.onpolicy:OnPolicyRunner",
    "offpolicy": "rlweave.runners.offpolicy:OffPolicyRunner",
    "llm": "rlweave.runners.llm:LLMRunner",
    "policy_sft": "rlweave.runners.policy_sft:PolicySFTRunner",
}


def _runner_class(name: str):
    return import_object(RUNNERS[name])


def _fail(message: str) -> int:
    print(f"rlweave: error: {message}", file=sys.stderr)
    return 2


def cmd_recipes(args) -> int:
    from rlweave.config import list_recipes

    recipes = list_recipes()
    width = max(len(n) for n in recipes)
    for name, desc in recipes.items():
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_train(args) -> int:
    from rlweave.cluster import PlacementError
    from rlweave.config import ConfigError, load_config

    try:
        cfg = load_config(args.recipe, args.overrides)
        run_dir = Path(cfg.run.dir) if cfg.run.dir else Path("runs") / cfg.recipe / time.strftime("%Y%m%d-%H%M%S")
        if (run_dir / "metrics.jsonl").exists():
            return _fail(f"run.dir: {run_dir} already holds a run; use 'rlweave resume {run_dir}' or another run.dir")
        runner = _runner_class(cfg.runner)(cfg, run_dir)
    except (ConfigError, PlacementError, FileNotFoundError) as e:
        return _fail(str(e))
    print(f"[rlweave] run folder: {run_dir}")
    return _execute(runner)


def cmd_resume(args) -> int:
    from omegaconf import OmegaConf

    from rlweave.config import ConfigError, validate

    run_dir = Path(args.run_dir)
    path = run_dir / "config.yaml"
    if not path.is_file():
        return _fail(f"{run_dir}: no config.yaml (not a run folder)")
    try:
        cfg = validate(OmegaConf.load(path))
        cfg.run.dir = str(run_dir)
        OmegaConf.set_readonly(cfg, True)
        runner = _runner_class(cfg.runner)(cfg, run_dir, resume=True)
    except ConfigError as e:
        return _fail(f"{path}: {e}")
    return _execute(runner)


def _execute(runner) -> int:
    from rlweave.cluster import PlacementError, WorkerError
    from rlweave.config import ConfigError
    from rlweave.envs import EnvError

    try:
        last = runner.run()
    except (ConfigError, PlacementError, FileNotFoundError) as e:
        return _fail(str(e))
    except EnvError as e:  # raised in the driver, e.g. by evaluation
        print(f"rlweave: run stopped: {e}", file=sys.stderr)
        return 1
    except WorkerError as e:
        log = Path(runner.run_dir) / "error.log"
        try:
            log.write_text(f"{e.short}\n\n{e.remote_traceback}", encoding="utf-8")
            where = f" (remote traceback in {log})"
        except OSError:
            where = ""
        print(f"rlweave: run stopped: {e.short}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"rlweave: interrupted{f': {e}' if str(e) else ''}", file=sys.stderr)
        return 130
    summary = {k: v for k, v in last.items() if k in ("iteration", "env_steps", "train/episode_return", "eval/episode_return",
                                                         "train/reward", "eval/accuracy")}
    print(f"[rlweave] done: {json.dumps(summary)}")
    return 0


def cmd_eval(args) -> int:
    from omegaconf import OmegaConf

    from rlweave.config import ConfigError
    from rlweave.models.run_policy import RunPolicyError, load_run_policy, read_run_config
    from rlweave.runners.evaluate import evaluate_policy

    try:  # the run's env and policy only: its training data (demonstrations, init.checkpoint) need not be here
        run_cfg = read_run_config(args.run_dir)
        if run_cfg.runner == "llm":
            return _eval_lm(args, run_cfg)
        if args.all:
            return _fail("--all: the whole test split is for language-model runs; give --episodes N")
        args.episodes = 10 if args.episodes is None else args.episodes
        obs_space, act_space = _spaces(run_cfg)
        run = load_run_policy(args.run_dir, observation_space=obs_space, action_space=act_space)
    except RunPolicyError as e:
        return _fail(str(e))
    except ConfigError as e:
        return _fail(f"{Path(args.run_dir) / 'config.yaml'}: {e}")
    cfg = run.cfg
    videos = args.video or 0
    if videos < 0:
        return _fail(f"--video: must be >= 0, got {videos}")
    if args.max_envs is not None and args.max_envs < 1:
        return _fail(f"--max-envs: must be >= 1, got {args.max_envs}")
    result = evaluate_policy(run.policy, OmegaConf.to_container(cfg.env), args.episodes, seed=args.seed, gamma=cfg.algorithm.gamma,
                             videos=videos, video_dir=Path(args.run_dir) / "videos", tag=f"eval_{run.checkpoint.name}",
                             max_envs=args.max_envs or cfg.train.get("eval_max_envs"))
    result = {"checkpoint": run.checkpoint.name, "episodes": args.episodes, **result}
    if videos and not result.get("eval/videos"):
        print(f"rlweave eval: --video: env '{cfg.env.id}' gives no camera images; no video written", file=sys.stderr)
    print(json.dumps(result))
    return 0


def _eval_lm(args, cfg) -> int:
    """A language-model run: greedy held-out accuracy of its model on ``--episodes`` test prompts
    (default: the run's own ``task.eval_prompts``) or ``--all`` of them, by kind of question."""
    from rlweave.config import ConfigError
    from rlweave.runners.llm_eval import evaluate_lm_run

    if args.video:
        return _fail("--video: a language-model run has no camera images")
    count = None if args.all else (args.episodes if args.episodes is not None else cfg.task.eval_prompts)
    if count is not None and count < 1:
        return _fail(f"--episodes: must be >= 1, got {count}")
    try:
        result = evaluate_lm_run(args.run_dir, cfg, count)
    except ConfigError as e:
        return _fail(str(e))
    print(json.dumps(result))
    return 0


def cmd_collect(args) -> int:
    """Writes a Minari dataset on a run's env (or a recipe's): episodes of the run's policy, of a
    scripted or trained expert (``--expert``), or of random actions."""
    import inspect
    import re

    import torch
    from omegaconf import OmegaConf

    from rlweave.config import ConfigError, load_config
    from rlweave.data.datasets import DatasetError, collect_dataset
    from rlweave.data.experts import ExpertError, load_expert
    from rlweave.envs import env_maker
    from rlweave.models.inputs import float_observations, policy_input
    from rlweave.models.run_policy import RunPolicyError, load_run_policy, read_run_config
    from rlweave.utils.tree import tree_index, tree_stack

    source_path = Path(args.source)
    is_run = (source_path / "config.yaml").is_file()
    if args.episodes < 1:
        return _fail(f"--episodes: must be >= 1, got {args.episodes}")
    if not is_run and not args.expert and args.policy != "random":
        return _fail(f"{args.source}: not a run folder; collecting on a recipe's env needs --expert or --policy random")
    try:
        cfg = read_run_config(source_path) if is_run else load_config(args.source, args.overrides)
        obs_space, act_space = _spaces(cfg)
    except RunPolicyError as e:
        return _fail(str(e))
    except ConfigError as e:
        return _fail(f"{source_path / 'config.yaml' if is_run else args.source}: {e}")
    act_fn = None
    source = "uniform random actions"
    if args.expert:
        try:
            expert = load_expert(args.expert, obs_space, act_space)
        except ExpertError as e:
            return _fail(f"--expert: {e}")
        act_fn = lambda obs: np.asarray(expert(tree_stack([obs])), dtype=np.float32).reshape(act_space.shape)  # noqa: E731
        source = f"expert {args.expert}"
    elif args.policy != "random":
        try:
            run = load_run_policy(source_path, args.checkpoint, observation_space=obs_space, action_space=act_space, chunk=1)
        except RunPolicyError as e:
            return _fail(f"--checkpoint: {e}")
        policy, ckpt = run.policy, run.checkpoint
        deterministic = args.policy == "deterministic"
        noise_rng = torch.Generator().manual_seed(int(args.seed))  # --seed fixes the sampled actions too
        float_obs = float_observations(obs_space)

        def policy_action(obs):
            with torch.inference_mode():
                noise = None if deterministic else policy.sample_noise(1, generator=noise_rng)
                x = policy_input(tree_stack([obs]), float_obs)
                a = policy.env_action(policy.act(x, deterministic=deterministic, noise=noise)[0])
            a = tree_index(a, 0)[0].numpy()
            return np.clip(a, act_space.low, act_space.high) if hasattr(act_space, "low") else a

        act_fn = policy_action
        source = f"{args.policy} policy of {source_path.name}/{ckpt.name}"
    kwargs = dict(OmegaConf.to_container(cfg.env.kwargs))
    if cfg.env.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.env.max_episode_steps
    pixels = OmegaConf.to_container(cfg.env.pixels)
    if pixels.get("enabled"):
        kwargs["pixels"] = pixels
    make = env_maker(cfg.env.id)
    slots = args.slots or (cfg.env.num_workers * cfg.env.num_envs if "slot" in inspect.signature(make).parameters else 1)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", Path(args.out).name).strip("_") or "dataset"
    try:
        info = collect_dataset(lambda **kw: make(**kwargs, **kw), act_fn, args.episodes, args.out, name,
                               seed=args.seed, description=f"{cfg.env.id}: {source}", slots=slots)
    except (DatasetError, ImportError) as e:
        return _fail(str(e))
    print(json.dumps({**info, "env": cfg.env.id, "source": source}))
    return 0


def _spaces(cfg):
    """A recipe's env spaces (for collecting on it: no policy is built)."""
    from omegaconf import OmegaConf

    from rlweave.config import ConfigError
    from rlweave.envs import space_info

    env_cfg = OmegaConf.to_container(cfg.env)
    try:
        return space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
    except Exception as e:  # noqa: BLE001 - any failure to build the env is a config problem here
        raise ConfigError(f"env.id: cannot make '{cfg.env.id}': {str(e).splitlines()[0]}") from None


def _write_figure(draw, *args, **kwargs) -> int:
    try:
        out = draw(*args, **kwargs)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    print(f"[rlweave] wrote {out}")
    return 0


def cmd_plot(args) -> int:
    from rlweave.utils.plot import plot_runs

    return _write_figure(plot_runs, args.run_dirs, args.output, metrics=args.metric, x=args.x)


def cmd_timeline(args) -> int:
    from rlweave.utils.plot import plot_timeline

    return _write_figure(plot_timeline, args.run_dirs, args.output, iteration=args.iteration)


def cmd_plan(args) -> int:
    """Ranks the execution plans of a recipe by predicted iteration time, without training."""
    import torch

    from rlweave.cluster import Cluster, PlacementError
    from rlweave.config import ConfigError, load_config
    from rlweave.flow.profile import offline_planner
    from rlweave.runners.checks import check_compatible_policy

    try:
        cfg = load_config(args.recipe, args.overrides)
        cluster = Cluster.planned(cfg.cluster.num_cpus, cfg.cluster.num_gpus)
        torch.manual_seed(cfg.seed)  # the recipe's initial weights
        _, _, policy = check_compatible_policy(cfg)
        planner = offline_planner(cfg, cluster, policy)
    except (ConfigError, PlacementError, FileNotFoundError) as e:
        return _fail(str(e))
    c = planner.costs
    print(f"[rlweave] {cluster.describe()}; {planner.total_envs} envs, {planner.steps} decisions per iteration")
    print(f"measured: env step {c.env.fixed * 1e3:.2f} ms + {c.env.per_row * 1e3:.3f} ms/env; "
          f"inference {c.infer.fixed * 1e3:.2f} ms + {c.infer.per_row * 1e3:.3f} ms/row; "
          f"cross-process request {(c.remote_overhead or 0) * 1e3:.2f} ms")
    print("(training and weight-sync time are measured in the run; they are the same for every plan here)")
    ranked = planner.rank()
    print(f"{'rank':>4}  {'predicted collect s':>19}  plan")
    for i, p in enumerate(ranked[: args.top], 1):
        print(f"{i:>4}  {p.collect:>19.3f}  {p.plan.label()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ranked": [p.as_dict() for p in ranked], "costs": {
            "env": c.env.as_dict(), "infer": c.infer.as_dict(), "remote_overhead_s": c.remote_overhead}}, indent=1))
    return 0


def benchmarks_dir(package_dir: Path | None = None, cwd: Path | None = None, environ: dict | None = None) -> Path | None:
    """Where the benchmark scripts are. They live in the source tree's ``benchmarks/`` (beside
    ``rlweave/``), not in the installed package, so an installed rlweave finds them only through
    ``RLWEAVE_BENCHMARKS``, or when run from a checkout's root; None when neither has them."""
    environ = os.environ if environ is None else environ
    package_dir = package_dir or Path(__file__).resolve().parent
    candidates = [Path(environ["RLWEAVE_BENCHMARKS"])] if environ.get("RLWEAVE_BENCHMARKS") else []
    candidates += [package_dir.parent / "benchmarks", (cwd or Path.cwd()) / "benchmarks"]
    return next((c for c in candidates if (c / "_common.py").is_file()), None)


def cmd_bench(args) -> int:
    root = benchmarks_dir()
    if root is None:
        return _fail("rlweave bench needs a source checkout: run it from the repository root "
                     "(benchmarks/ is not part of the installed package) or set RLWEAVE_BENCHMARKS=PATH/benchmarks")
    path = root / f"{args.name.replace('-', '_')}.py"
    if not path.is_file():
        names = sorted(p.stem.replace("_", "-") for p in root.glob("*.py") if not p.stem.startswith("_"))
        return _fail(f"unknown benchmark '{args.name}'; known: {', '.join(names)}")
    spec = importlib.util.spec_from_file_location(f"rlweave_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = list(args.rest)
    if args.json:
        argv += ["--json", args.json]
    rc = module.main(argv)
    return rc if isinstance(rc, int) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlweave", description="RL post-training for embodied and agentic AI, on Ray")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("train", help="train a recipe: rlweave train RECIPE [key=value ...]")
    s.add_argument("recipe", help="packaged recipe name (see 'rlweave recipes') or path to a YAML file")
    s.add_argument("overrides", nargs="*", help="Hydra-style overrides, e.g. seed=1 env.num_envs=16")
    s.set_defaults(fn=cmd_train)
    s = sub.add_parser("resume", help="continue a run from its newest checkpoint")
    s.add_argument("run_dir")
    s.set_defaults(fn=cmd_resume)
    s = sub.add_parser("eval", help="evaluate a run's newest checkpoint (deterministic policy)")
    s.add_argument("run_dir")
    s.add_argument("--episodes", type=int, default=None,
                   help="episodes (default 10); for a language-model run, held-out prompts (default: its task.eval_prompts)")
    s.add_argument("--all", action="store_true", help="a language-model run: every prompt of the task's test split")
    s.add_argument("--seed", type=int, default=12345)
    s.add_argument("--video", type=int, nargs="?", const=3, default=0, metavar="N",
                   help="record the first N episodes (default 3) to RUN/videos/ (envs with camera images)")
    s.add_argument("--max-envs", type=int, default=None, metavar="N",
                   help="at most N envs at once, the episodes in batches (default: the run's train.eval_max_envs, else all)")
    s.set_defaults(fn=cmd_eval)
    s = sub.add_parser("plot", help="learning curves of one or more runs to a PNG")
    s.add_argument("run_dirs", nargs="+")
    s.add_argument("-o", "--output", default="curves.png")
    s.add_argument("--metric", action="append", help="metric(s) to plot (default: train and eval returns)")
    s.add_argument("--x", default="env_steps", help="x axis: env_steps, iteration or wall_time")
    s.set_defaults(fn=cmd_plot)
    s = sub.add_parser("recipes", help="list packaged recipes")
    s.set_defaults(fn=cmd_recipes)
    s = sub.add_parser("timeline", help="one iteration of each run's trace.json as a timeline PNG")
    s.add_argument("run_dirs", nargs="+")
    s.add_argument("-o", "--output", default="timeline.png")
    s.add_argument("--iteration", type=int, default=2, help="which iteration (1-based; traced ones only)")
    s.set_defaults(fn=cmd_timeline)
    s = sub.add_parser("plan", help="rank execution plans of a recipe by predicted time (no training)")
    s.add_argument("recipe")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--top", type=int, default=20, help="how many plans to print")
    s.add_argument("--json", metavar="FILE", help="also write the ranking as JSON")
    s.set_defaults(fn=cmd_plan)
    s = sub.add_parser("collect", help="write a Minari dataset: rlweave collect RUN_DIR|RECIPE [overrides...] --episodes N -o DATASET "
                                       "[--expert module:function|RUN_DIR]")
    s.add_argument("source", help="a run folder (its env and policy) or a recipe name (its env; with --expert or --policy random)")
    s.add_argument("overrides", nargs="*", help="config overrides of a recipe, key=value")
    s.add_argument("--expert", default=None, help="who acts: a scripted expert module:function or a run folder")
    s.add_argument("--slots", type=int, default=None,
                   help="episodes take turns over this many env slots (default: the recipe's envs, for suites that assign "
                        "tasks to slots)")
    s.add_argument("--episodes", type=int, required=True)
    s.add_argument("-o", "--out", required=True, help="dataset folder to create")
    s.add_argument("--checkpoint", default=None, help="checkpoint name, e.g. iter_00000050 (default: the latest)")
    s.add_argument("--policy", choices=("deterministic", "stochastic", "random"), default="stochastic")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_collect)
    s = sub.add_parser("bench", help="run a benchmark of a source checkout's benchmarks/: rlweave bench NAME [--json FILE]")
    s.add_argument("name")
    s.add_argument("--json", default=None)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_bench)
    from rlweave.robot.command import add_command as add_robot_command

    add_robot_command(sub)  # robot-server
    from rlweave.serving.commands import add_serving_commands

    add_serving_commands(sub)  # serve
    from rlweave.data.lerobot_cli import add_lerobot_commands

    add_lerobot_commands(sub)  # export-lerobot
    from rlweave.world_models.cli import add_commands as add_world_model_commands

    add_world_model_commands(sub)  # train-world-model, world-model-video
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
