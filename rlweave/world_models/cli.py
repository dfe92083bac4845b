"""The world-model commands of ``rlweave`` (registered by :func:`add_commands`):

    rlweave train-world-model DATASET -o MODEL_DIR [--epochs N] [--horizon H] [--members E] ...
    rlweave world-model-video RUN_DIR|MODEL_DIR [--model MODEL_DIR] [-o FILE] [--seed S] [--steps T]

``world-model-video`` on a run folder plays the run's deterministic policy in the real env beside
the model's open-loop imagination under the same actions (the model: the run's own
``world_model/...`` env, or ``--model``), written to ``RUN_DIR/videos/real_vs_imagined.gif``; on a
model folder it does the same with uniform random actions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["add_commands"]


def _fail(message: str) -> int:
    print(f"rlweave: error: {message}", file=sys.stderr)
    return 2


def cmd_train_world_model(args) -> int:
    from rlweave.world_models.base import WorldModelError
    from rlweave.world_models.train import train_world_model

    if not Path(args.dataset).exists():
        return _fail(f"dataset {args.dataset}: no such folder (write one with: rlweave collect RECIPE --policy random "
                     "--episodes N -o DATASET)")
    out = args.out or str(Path("runs") / "world_models" / Path(args.dataset).name)
    settings = {}
    for item in args.set or []:
        key, eq, value = item.partition("=")
        try:
            if not eq or not key:
                raise ValueError
            parts = [int(v) for v in value.split(",")]
        except ValueError:
            return _fail(f"--set: expected KEY=INT or KEY=INT,INT,... (e.g. members=5, hidden=200,200,200), got {item!r}")
        settings[key] = parts[0] if len(parts) == 1 and key != "hidden" else tuple(parts)

    def show(rec: dict) -> None:
        if not args.quiet:
            extra = "".join(f", {k.split('/')[1].replace('_', ' ')} {rec[k]:.3g}" for k in ("valid/obs_mse", "valid/reward_mse") if k in rec)
            print(f"[world model] epoch {rec['epoch']:>3}: train loss {rec['train/loss']:.4f}, held-out loss "
                  f"{rec['valid/loss']:.4f}{extra}, {rec['time/epoch']:.1f} s", flush=True)

    try:
        summary = train_world_model(args.dataset, out, kind=args.kind, epochs=args.epochs, horizon=args.horizon,
                                    batch_size=args.batch_size, lr=args.lr, valid_fraction=args.valid_fraction, seed=args.seed,
                                    max_steps=args.max_steps, settings=settings, log=show)
    except (WorldModelError, ImportError) as e:
        return _fail(str(e))
    print(json.dumps({"model": out, **summary}))
    return 0


def cmd_world_model_video(args) -> int:
    from rlweave.world_models.base import CONFIG_FILE, WorldModelError, load_world_model

    source = Path(args.source)
    is_run = (source / "config.yaml").is_file()
    try:
        if is_run:
            act, model_dir = _run_policy(source, args.model)
        elif (source / CONFIG_FILE).is_file():
            act, model_dir = None, source
        else:
            return _fail(f"{source}: neither a run folder (config.yaml) nor a world-model folder ({CONFIG_FILE})")
        model = load_world_model(model_dir, cache=False)
        if act is None:
            rng = np.random.default_rng(args.seed)
            space = model.action_space
            act = lambda obs: rng.uniform(space.low, space.high).astype(np.float32)  # noqa: E731
        from rlweave.world_models.video import write_real_vs_imagined

        out = args.output or str(source / ("videos" if is_run else ".") / "real_vs_imagined.gif")
        info = write_real_vs_imagined(out, model, act, seed=args.seed, steps=args.steps)
    except (WorldModelError, ValueError, ImportError) as e:
        return _fail(str(e).splitlines()[0])
    info["obs_mse_last"] = info.pop("obs_mse_by_step")[-1]
    print(json.dumps({"model": str(model_dir), **info}))
    return 0


def _run_policy(run_dir: Path, model: str | None):
    """``act(obs)`` of the run's deterministic policy, and the model folder to compare with."""
    import torch

    from rlweave.models.inputs import float_observations, policy_input
    from rlweave.models.run_policy import load_run_policy, read_run_config
    from rlweave.utils.tree import tree_index, tree_stack
    from rlweave.world_models.base import WorldModelError, load_world_model

    cfg = read_run_config(run_dir)
    env_id = str(cfg.env.id)
    if model is None:
        if not env_id.startswith("world_model/"):
            raise WorldModelError(f"{run_dir}: env.id '{env_id}' is not a world model; name one with --model MODEL_DIR")
        model = env_id.partition("/")[2]
    wm = load_world_model(model, cache=False)
    run = load_run_policy(run_dir, observation_space=wm.observation_space, action_space=wm.action_space, chunk=1)
    policy, float_obs = run.policy, float_observations(wm.observation_space)
    low, high = wm.action_space.low, wm.action_space.high

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            a = policy.env_action(policy.act(policy_input(tree_stack([obs]), float_obs), deterministic=True)[0])
        return np.clip(tree_index(a, 0)[0].numpy(), low, high)

    return act, model


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers ``train-world-model`` and ``world-model-video`` on the ``rlweave`` parser."""
    s = sub.add_parser("train-world-model", help="train a world model on a Minari dataset: rlweave train-world-model DATASET -o DIR")
    s.add_argument("dataset", help="a Minari dataset folder (rlweave collect ... -o DATASET)")
    s.add_argument("-o", "--out", default=None, help="model folder to write (default runs/world_models/<dataset name>)")
    s.add_argument("--kind", default="auto", help="auto (images: pixel_rnn, else mlp_ensemble), mlp_ensemble or pixel_rnn")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a model setting: mlp_ensemble members=5, hidden=200,200,200; pixel_rnn latent=128, width=32, seq_len=10")
    s.add_argument("--epochs", type=int, default=None, help="default per kind: 50 (mlp_ensemble), 20 (pixel_rnn)")
    s.add_argument("--horizon", type=int, default=50, help="open-loop steps the prediction error is measured over")
    s.add_argument("--batch-size", type=int, default=None, help="default per kind: 256 / 32")
    s.add_argument("--lr", type=float, default=None, help="default per kind: 1e-3 / 3e-4")
    s.add_argument("--valid-fraction", type=float, default=0.1, help="share of episodes held out")
    s.add_argument("--max-steps", type=int, default=None, help="use only the dataset's first N steps (whole episodes)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    s.set_defaults(fn=cmd_train_world_model)
    s = sub.add_parser("world-model-video", help="real vs imagined video: rlweave world-model-video RUN_DIR|MODEL_DIR")
    s.add_argument("source", help="a run folder (its policy acts) or a world-model folder (random actions)")
    s.add_argument("--model", default=None, help="world-model folder (default: the run's env.id world_model/<folder>)")
    s.add_argument("-o", "--output", default=None, help="video file (default RUN_DIR/videos/real_vs_imagined.gif)")
    s.add_argument("--seed", type=int, default=0, help="the real env's reset seed")
    s.add_argument("--steps", type=int, default=None, help="at most this many steps (default: the env's time limit)")
    s.set_defaults(fn=cmd_world_model_video)
