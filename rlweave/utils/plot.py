"""Learning curves from run folders (``rlweave plot``)."""

from __future__ import annotations

from pathlib import Path

from rlweave.utils.metrics import read_metrics

DEFAULT_METRICS = ("train/episode_return", "eval/episode_return")


def plot_runs(run_dirs: list[str], output: str, metrics: list[str] | None = None, x: str = "env_steps") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(metrics or DEFAULT_METRICS)
    runs = []
    for d in run_dirs:
        records = read_metrics(d)
        if not records:
            raise FileNotFoundError(f"{d}: no metrics.jsonl with records")
        runs.append((Path(d), records))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        drawn = 0
        for path, records in runs:
            pts = [(r[x], r[metric]) for r in records if r.get(metric) is not None and r.get(x) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=_label(path, run_dirs))
                drawn += 1
        ax.set_title(metric)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
    if not any(ax.lines for ax in axes[0]):
        raise ValueError(f"none of the runs has values for {', '.join(metrics)}")
    fig.tight_layout()
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _label(path: Path, all_dirs: list[str]) -> str:
    parts = path.resolve().parts
    return "/".join(parts[-2:]) if len(all_dirs) > 1 else path.name


_COLOURS = {"step": "#1f77b4", "infer": "#ff7f0e", "train": "#2ca02c", "weight_sync": "#9467bd", "wait": "#d9d9d9",
            "request": "#a6a6a6", "eval": "#8c564b"}


def _colour(name: str) -> str | None:
    for prefix, colour in _COLOURS.items():
        if name.startswith(prefix):
            return colour
    return None  # whole-call spans (collect) are drawn as an outline only


def plot_timeline(run_dirs: list[str], output: str, iteration: int = 2) -> Path:
    """One iteration of each run's ``trace.json`` as a timeline (one row per worker): env steps,
    inference, waits, training and weight sync. The iteration is the ``iteration``-th ``collect``
    call of env[0] (its per-micro-batch events exist for the first ``run.trace_iterations``)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(run_dirs), 1, figsize=(12, 2.2 + 2.0 * len(run_dirs)), squeeze=False, sharex=True)
    for ax, d in zip(axes[:, 0], run_dirs):
        path = Path(d) / "trace.json"
        if not path.is_file():
            raise FileNotFoundError(f"{d}: no trace.json")
        events = json.loads(path.read_text())["traceEvents"]
        tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        spans = [e for e in events if e["ph"] == "X"]
        collects = sorted((e for e in spans if e["name"] == "collect" and tracks[e["tid"]] == "env[0]"), key=lambda e: e["ts"])
        if len(collects) < iteration:
            raise ValueError(f"{d}: trace has {len(collects)} iterations, asked for iteration {iteration}")
        start = collects[iteration - 1]["ts"]
        end = collects[iteration]["ts"] if len(collects) > iteration else max(e["ts"] + e["dur"] for e in spans)
        rows = sorted({tracks[e["tid"]] for e in spans if start <= e["ts"] < end}, key=lambda n: ("envrolloutactordriver".find(n.split("[")[0]), n))
        for y, row in enumerate(rows):
            for e in spans:
                if tracks[e["tid"]] != row or not start <= e["ts"] < end:
                    continue
                colour = _colour(e["name"])
                x0, w = (e["ts"] - start) / 1e3, e["dur"] / 1e3
                if colour is None:
                    ax.broken_barh([(x0, w)], (y - 0.45, 0.9), facecolors="none", edgecolors="black", linewidth=0.6)
                else:
                    ax.broken_barh([(x0, w)], (y - 0.35, 0.7), facecolors=colour)
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the iteration started")
        title = Path(d).name
        cfg = Path(d) / "config.yaml"
        if cfg.is_file():
            from omegaconf import OmegaConf

            flow = OmegaConf.load(cfg).placement.derived.get("flow")
            if flow:
                title += f": {flow['mode']}, env {','.join(flow['env'])}, rollout {','.join(flow['rollout'])}, k={flow['micro_batches']}"
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    fig.legend(handles, list(_COLOURS), loc="lower center", ncol=len(_COLOURS), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
