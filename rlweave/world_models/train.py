"""Training a world model from a dataset, and measuring it where it matters: open loop, over the
imagination horizon, on held-out episodes.

``train_world_model`` writes one model folder:

* ``world_model.json``: kind, settings, real env id, spaces, and how it was trained (dataset,
  episodes and steps used, held-out episodes, seed);
* the kind's weights (``weights.pt``);
* ``starts_all.npy`` / ``starts_initial.npy``: real observations of the *training* episodes, the
  world-model env's start states;
* ``training.jsonl``: one record per epoch (train loss, held-out one-step errors);
* ``prediction_error.json`` and ``prediction_error.png``: the multi-step open-loop error at
  h = 1..H on every held-out window of H steps (observation MSE in raw and in per-dimension
  standardised units, reward absolute error), beside the error of "nothing changes" (the start
  observation held), the yardstick that says whether the model learned any dynamics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from rlweave.world_models.base import WorldModel, WorldModelError, is_image_space
from rlweave.world_models.data import Trajectories, dataset_env_id, load_trajectories

__all__ = ["train_world_model", "prediction_error", "plot_prediction_error", "build_model", "KIND_DEFAULTS", "MAX_STARTS_BYTES"]

MAX_STARTS_BYTES = 64 << 20  # start states kept in the folder: a random subset beyond this size

# kind -> (its constructor settings and their defaults, its training defaults): what --set may change
KIND_DEFAULTS: dict[str, tuple[dict, dict]] = {
    "mlp_ensemble": ({"members": 5, "hidden": (200, 200, 200)}, {"epochs": 50, "batch_size": 256, "lr": 1e-3}),
    "pixel_rnn": ({"latent": 128, "width": 32, "seq_len": 10}, {"epochs": 20, "batch_size": 32, "lr": 3e-4}),
}


def build_model(kind: str, obs_space, act_space, env_id: str, limit: int | None, seed: int, settings: dict) -> WorldModel:
    """A fresh model of ``kind`` (``auto``: ``pixel_rnn`` for camera images, else ``mlp_ensemble``)."""
    if kind == "auto":
        kind = "pixel_rnn" if is_image_space(obs_space) else "mlp_ensemble"
    if kind not in KIND_DEFAULTS:
        raise WorldModelError(f"--kind: unknown world-model kind {kind!r}; known: auto, {', '.join(KIND_DEFAULTS)}")
    defaults = KIND_DEFAULTS[kind][0]
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise WorldModelError(f"--set: kind {kind} has no setting(s) {unknown}; it has {sorted(defaults)}")
    if kind == "pixel_rnn":
        from rlweave.world_models.pixel import PixelWorldModel as cls
    else:
        from rlweave.world_models.ensemble import EnsembleWorldModel as cls
    return cls(obs_space, act_space, env_id, max_episode_steps=limit, seed=seed, **{**defaults, **settings})


def split_episodes(n: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Episode indices for training and held-out (at least one episode each when n >= 2)."""
    if n < 2:
        raise WorldModelError(f"dataset: {n} episode(s); a world model needs at least 2 (one is held out to measure it)")
    order = np.random.default_rng(seed).permutation(n)
    k = min(n - 1, max(1, int(round(n * valid_fraction))))
    return np.sort(order[k:]), np.sort(order[:k])


def prediction_error(model: WorldModel, held_out: Trajectories, horizon: int, max_windows: int = 2000, seed: int = 0) -> dict:
    """Open-loop error at h = 1..``horizon`` over held-out windows (at most ``max_windows``, drawn
    evenly at random): the model starts from the window's real first observation and is given
    the real actions, never the real observations after. Observation errors are also reported
    per standardised dimension (divided by each dimension's variance over the windows), so that
    dimensions of large range do not hide the rest."""
    w = held_out.windows(horizon, max_windows, seed)
    pred = model.rollout(w["obs0"], w["actions"])
    real = w["obs"].reshape(len(w["obs"]), horizon, -1).astype(np.float32)
    imag = pred["obs"].reshape(real.shape).astype(np.float32)
    var = real.reshape(-1, real.shape[-1]).var(0)
    var = np.maximum(var, 0.01 * var.mean() + 1e-8)  # constant dimensions (an image's background) do not divide by ~0
    sq = (imag - real) ** 2
    held = (w["obs0"].reshape(len(real), 1, -1).astype(np.float32) - real) ** 2  # "nothing changes": the start held
    return {
        "horizon": list(range(1, horizon + 1)),
        "windows": int(len(real)),
        "obs_mse": sq.mean(axis=(0, 2)).tolist(),
        "obs_nmse": (sq / var).mean(axis=(0, 2)).tolist(),
        "reward_mae": np.abs(pred["reward"] - w["rewards"]).mean(0).tolist(),
        "return_error": np.abs(pred["reward"].sum(1) - w["rewards"].sum(1)).mean().item(),
        "uncertainty": pred["uncertainty"].mean(0).tolist(),
        "baseline_hold_obs_nmse": (held / var).mean(axis=(0, 2)).tolist(),
    }


def plot_prediction_error(err: dict, out: str | Path, title: str = "") -> Path:
    """The open-loop error curves as a PNG (log scale: errors grow by orders of magnitude)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = err["horizon"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(h, err["obs_nmse"], label="world model")
    axes[0].plot(h, err["baseline_hold_obs_nmse"], "--", color="grey", label="start observation held")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("imagination step h")
    axes[0].set_ylabel("observation MSE (standardised)")
    axes[0].legend()
    axes[1].plot(h, err["reward_mae"], color="C1")
    axes[1].set_xlabel("imagination step h")
    axes[1].set_ylabel("reward absolute error")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"open-loop prediction error on {err['windows']} held-out windows")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _write_starts(out: Path, train: Trajectories, seed: int) -> dict:
    initial = np.stack([o[0] for o in train.obs])
    everything = np.concatenate([o[:-1] for o in train.obs])
    cap = max(len(initial), MAX_STARTS_BYTES // max(1, everything[0].nbytes))
    if len(everything) > cap:
        everything = everything[np.sort(np.random.default_rng(seed).choice(len(everything), cap, replace=False))]
    np.save(out / "starts_initial.npy", initial)
    np.save(out / "starts_all.npy", everything)
    return {"starts_initial": int(len(initial)), "starts_all": int(len(everything))}


def train_world_model(dataset: str | Path, out: str | Path, kind: str = "auto", epochs: int | None = None, horizon: int = 50,
                      batch_size: int | None = None, lr: float | None = None, valid_fraction: float = 0.1, seed: int = 0,
                      max_steps: int | None = None, settings: dict | None = None,
                      log: Callable[[dict], None] | None = None) -> dict:
    """Trains a world model of ``kind`` (``settings``: its constructor's, see :data:`KIND_DEFAULTS`;
    ``epochs``/``batch_size``/``lr`` default per kind) on the Minari dataset ``dataset`` (its first
    ``max_steps`` steps, whole episodes, when given) and writes the model folder ``out`` (which
    must not hold a model). Returns the summary also stored in ``world_model.json`` under ``training``."""
    out = Path(out)
    if (out / "world_model.json").exists():
        raise WorldModelError(f"-o {out}: already holds a world model; choose another folder")
    for name, value, least in (("--epochs", epochs, 1), ("--horizon", horizon, 1), ("--batch-size", batch_size, 1)):
        if value is not None and value < least:
            raise WorldModelError(f"{name}: must be >= {least}, got {value}")
    if not 0 < valid_fraction < 1:
        raise WorldModelError(f"--valid-fraction: must be in (0, 1), got {valid_fraction}")
    trajs, obs_space, act_space = load_trajectories(dataset)
    if max_steps is not None:
        keep, total = [], 0
        for i, a in enumerate(trajs.actions):
            if total + len(a) > max_steps:
                break
            keep.append(i)
            total += len(a)
        trajs = trajs.subset(keep)
    env_id, limit = dataset_env_id(dataset)
    model = build_model(kind, obs_space, act_space, env_id, limit, seed, dict(settings or {}))
    fit_defaults = KIND_DEFAULTS[model.kind][1]
    epochs = epochs or fit_defaults["epochs"]
    batch_size = batch_size or fit_defaults["batch_size"]
    lr = lr or fit_defaults["lr"]
    train_idx, valid_idx = split_episodes(len(trajs), valid_fraction, seed)
    train, valid = trajs.subset(train_idx), trajs.subset(valid_idx)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "training.jsonl", "w", encoding="utf-8") as f:
        def record(rec: dict) -> None:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if log is not None:
                log(rec)

        epochs_log = model.fit(train, valid, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, log=record)
    err = prediction_error(model, valid, min(horizon, max(len(a) for a in valid.actions)), seed=seed)
    (out / "prediction_error.json").write_text(json.dumps(err, indent=1), encoding="utf-8")
    plot_prediction_error(err, out / "prediction_error.png",
                          f"{env_id}: open-loop error, {err['windows']} held-out windows of {len(err['horizon'])} steps")
    summary = {"dataset": str(Path(dataset).resolve()), "episodes": len(trajs), "steps": trajs.steps,
               "train_episodes": len(train), "held_out_episodes": len(valid), "epochs": epochs, "batch_size": batch_size,
               "lr": lr, "seed": seed, **_write_starts(out, train, seed),
               "best_valid_loss": min(r["valid/loss"] for r in epochs_log),
               "obs_nmse_h1": err["obs_nmse"][0], "obs_nmse_hH": err["obs_nmse"][-1]}
    model.save(out)
    cfg_file = out / "world_model.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    cfg["training"] = summary
    cfg_file.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return summary
