"""Shared helpers for the side-by-side benchmarks in this folder (see BENCHMARKS.md).

* :func:`interleave` runs a warm-up of each side (discarded) and then the sides in turn,
  A B A B ..., for ``repeats`` rounds;
* :func:`ratio_stats` / :func:`median` summarise the per-pair ratios and per-side figures;
* :func:`print_settings` prints the settings of every side in one table (rule 1: same work);
* :func:`environment_info` names versions, cores and thread settings (rule 2: same resources);
* :func:`write_json` writes the headline figures as one JSON object (rule 6).

The ``rlweave bench`` command imports a benchmark by path, so ``benchmarks/`` is not on
``sys.path``: a benchmark loads this file by path too (see ``_load_common`` in ppo_vs_sb3.py).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence


# --------------------------------------------------------------------------- timing
class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> "Stopwatch":
        self.t0 = time.perf_counter()
        self.seconds = float("nan")
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0


def timed(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, float]:
    """Calls ``fn`` and returns ``(result, wall seconds)``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


# --------------------------------------------------------------------------- statistics
def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.fmean(xs) if xs else float("nan")


def ratio_stats(a: Sequence[float], b: Sequence[float]) -> dict:
    """Per-pair ratios ``a[i] / b[i]`` and their median, min and max."""
    if len(a) != len(b):
        raise ValueError(f"ratio_stats: {len(a)} figures against {len(b)}")
    ratios = [x / y if y else float("nan") for x, y in zip(a, b)]
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios), "ratios": ratios}


# --------------------------------------------------------------------------- interleaving
def interleave(
    sides: Mapping[str, Callable[[], dict]],
    repeats: int,
    warmup: bool = True,
    log: Callable[[str], None] = print,
    describe: Callable[[str, dict], str] | None = None,
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Runs every side once as a warm-up (discarded), then ``repeats`` rounds of all sides in
    the order given (A B A B ...). Each side is a zero-argument callable returning a dict of
    figures. Returns ``(warmups, results)``: side -> warm-up dict, side -> list of dicts.
    ``describe(side, result)`` formats one line of progress per run."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    fmt = describe or (lambda side, r: "")
    warmups: dict[str, dict] = {}
    if warmup:
        for name, fn in sides.items():
            log(f"  warm-up  {name:<10} ...")
            r, dt = timed(fn)
            warmups[name] = r
            log(f"  warm-up  {name:<10} {fmt(name, r)}  [{dt:.1f} s, discarded]")
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(repeats):
        for name, fn in sides.items():
            r, dt = timed(fn)
            results[name].append(r)
            log(f"  pair {i + 1}/{repeats} {name:<10} {fmt(name, r)}  [{dt:.1f} s]")
    return warmups, results


# --------------------------------------------------------------------------- printing
def load_average() -> float | None:
    """The machine's 1-minute load average (other work beside the benchmark), where known."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def environment_info() -> dict:
    """Versions, cores and thread settings, for the settings printout and the JSON file."""
    info: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "cpus": os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_avg_1m": load_average(),
    }
    for mod in ("torch", "numpy", "ray", "gymnasium", "mujoco", "stable_baselines3"):
        m = sys.modules.get(mod)
        if m is not None:
            info[mod] = getattr(m, "__version__", "?")
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


def print_settings(title: str, sides: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any] | None = None) -> None:
    """Prints one table: a row per setting, a column per side; rows whose values differ are
    marked with ``*`` so a mismatch in the work is visible at a glance."""
    print(title)
    if common:
        for k, v in common.items():
            print(f"  {k}: {v}")
    names = list(sides)
    keys: list[str] = []
    for s in sides.values():
        for k in s:
            if k not in keys:
                keys.append(k)
    kw = max([len(k) for k in keys] + [7])
    cols = {n: max([len(n)] + [len(str(sides[n].get(k, "-"))) for k in keys]) for n in names}
    header = f"    {'setting':<{kw}} | " + " | ".join(f"{n:<{cols[n]}}" for n in names)
    print(header)
    print("    " + "-" * (len(header) - 4))
    for k in keys:
        vals = [str(sides[n].get(k, "-")) for n in names]
        mark = " " if len(set(vals)) == 1 else "*"
        print(f"  {mark} {k:<{kw}} | " + " | ".join(f"{v:<{cols[n]}}" for v, n in zip(vals, names)))
    print("    (* = differs between the sides)")


def fmt_ratio(stats: dict, digits: int = 2) -> str:
    return f"{stats['median']:.{digits}f} (min {stats['min']:.{digits}f}, max {stats['max']:.{digits}f})"


def write_json(path: str | None, obj: dict) -> None:
    """Writes ``obj`` as one JSON object (NaN becomes null)."""
    if not path:
        return

    def clean(v):
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(clean(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
