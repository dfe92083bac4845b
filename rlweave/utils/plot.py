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
