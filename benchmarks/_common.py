"""Shared helpers for the side-by-side benchmarks in this folder (the rules: docs/design.md,
"How speed is measured").

Fairness is built in here, so that every benchmark gets it without repeating it:

* :func:`pair_order` / :func:`interleave`: a discarded warm-up of each side, then pairs in
  A B, B A, A B, ... order, so that a machine getting slower (or faster) during the run moves
  both sides of the ratio alike instead of always penalising the side that runs second;
* :func:`run_side` / :func:`serve_side`: each side runs in a fresh process of its own, started
  with one environment (:func:`side_env`: thread counts, the glibc malloc settings rlweave gives
  its worker processes, flush-denormal), so a tuning rlweave applies to its processes is applied
  to the baseline's too;
* :data:`MIN_TIMED_S`: a run with less timed work than this is flagged, because one run's noise
  (scheduler, page faults, another job on the machine) is then a large part of its figure;
* :func:`report` / :func:`write_json`: one JSON object with the library versions, the CPU model
  and flags, thread and process counts, the order the runs took and each side's effective
  configuration, and :func:`missing_fields` checks that those are there.

Every benchmark imports this module one way: its own folder is appended to ``sys.path`` and it runs
``import _common as C`` (``rlweave bench`` loads a benchmark by path, so the folder is not on the
path by itself).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

MIN_TIMED_S = 1.0
"""Least timed work per run (seconds): below it, a run's own noise is too large a part of it."""

RESULT_MARKER = "RLWEAVE-BENCH-RESULT "
"""A side process prints its result as one line starting with this, after its own output."""

LIBRARIES = ("rlweave", "torch", "numpy", "ray", "tensordict", "gymnasium", "mujoco", "stable-baselines3", "trl",
             "transformers", "accelerate", "datasets", "tokenizers")

PROCESS_ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_",
                    "MALLOC_TRIM_THRESHOLD_", "RLWEAVE_BENCH_THREADS", "RLWEAVE_BENCH_FLUSH_DENORMAL", "RAY_ADDRESS",
                    "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# OpenMP wait settings of the shell that launched the bench are not passed on: OMP_WAIT_POLICY=PASSIVE
# (right for learning runs sharing 2 cores) halves a lone 2-thread process's small-op training loop
# (measured: a SAC-sized update 286 -> 143 iterations/s), so it would handicap a 2-thread baseline
INHERITED_ENV_DROPPED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


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


def fastest(runs: Mapping[str, Sequence[float]]) -> str:
    """The side with the highest median figure: where a baseline has several documented
    configurations, this one is the headline's baseline (docs/design.md, "How speed is measured", rule 2)."""
    return max(runs, key=lambda name: median(runs[name]))


def ratio_vs_fastest(a: Sequence[float], baselines: Mapping[str, Sequence[float]]) -> dict:
    """:func:`ratio_stats` of ``a`` against the fastest of ``baselines`` (per pair), with the
    name of that baseline and the ratio against every other one beside it."""
    best = fastest(baselines)
    out = {**ratio_stats(a, baselines[best]), "baseline": best}
    out["against"] = {name: ratio_stats(a, runs)["median"] for name, runs in baselines.items()}
    return out


# --------------------------------------------------------------------------- order
def pair_order(names: Sequence[str], repeats: int) -> list[list[str]]:
    """The measured rounds: the sides in the given order, then reversed, and so on (A B, B A,
    A B, ... for two sides; A B C, C B A, ... for more). Drift within a run then moves both
    sides of each ratio alike, and over two rounds every side has run first once."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    names = list(names)
    return [names if i % 2 == 0 else names[::-1] for i in range(repeats)]


def protocol(names: Sequence[str], repeats: int, warmup: bool = True) -> dict:
    """How the runs were ordered, for the JSON."""
    rounds = pair_order(names, repeats)
    return {"warmup_discarded": warmup, "rounds": repeats, "order": [" ".join(r) for r in rounds],
            "min_timed_s_per_run": MIN_TIMED_S, "each_side_in_own_process": True}


def interleave(
    sides: Mapping[str, Callable[[], dict]],
    repeats: int,
    warmup: bool = True,
    log: Callable[[str], None] = print,
    describe: Callable[[str, dict], str] | None = None,
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Runs every side once as a warm-up (discarded), then ``repeats`` rounds in
    :func:`pair_order`. Each side is a zero-argument callable returning a dict of figures; one
    that holds ``timed_s`` (its timed work) below :data:`MIN_TIMED_S` is flagged in the log and
    in the dict (``short_run``). Returns ``(warmups, results)``: side -> warm-up dict, side ->
    list of dicts in round order, so ``results[a][i]`` and ``results[b][i]`` are one pair."""
    fmt = describe or (lambda side, r: "")
    rounds = pair_order(list(sides), repeats)
    warmups: dict[str, dict] = {}
    if warmup:
        for name, fn in sides.items():
            log(f"  warm-up  {name:<14} ...")
            r, dt = timed(fn)
            warmups[name] = r
            log(f"  warm-up  {name:<14} {fmt(name, r)}  [{dt:.1f} s, discarded]")
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for i, order in enumerate(rounds):
        for name in order:
            r, dt = timed(sides[name])
            r.setdefault("run_s", dt)
            short = _short(r)
            results[name].append(r)
            log(f"  round {i + 1}/{repeats} {name:<14} {fmt(name, r)}  [{dt:.1f} s]{short}")
    return warmups, results


def _short(r: dict) -> str:
    t = r.get("timed_s")
    if isinstance(t, (int, float)) and t < MIN_TIMED_S:
        r["short_run"] = True
        return f"  (only {t:.2f} s timed, under {MIN_TIMED_S:.0f} s: raise the run's length)"
    return ""


def grow_until(run: Callable[[int], float], n: int, min_s: float = MIN_TIMED_S, max_n: int = 1 << 20) -> int:
    """Doubles ``n`` until ``run(n)`` (which returns its timed seconds) takes at least ``min_s``;
    returns that ``n``. For benchmarks whose unit of work (an item, a step) is far below a second."""
    while n < max_n and run(n) < min_s:
        n *= 2
    return n


# --------------------------------------------------------------------------- processes
def rlweave_malloc_settings() -> dict[str, str]:
    """The glibc malloc settings rlweave gives its worker processes (``MALLOC_SETTINGS`` in the
    cluster layer, found wherever that module now lives), so the baseline's process gets them too."""
    try:
        import pkgutil

        import rlweave.cluster as cluster

        for mod in pkgutil.iter_modules(cluster.__path__):
            settings = getattr(importlib.import_module(f"rlweave.cluster.{mod.name}"), "MALLOC_SETTINGS", None)
            if isinstance(settings, dict):
                return dict(settings)
    except ImportError:
        pass
    return {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


def side_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every side's process in one benchmark: the same for all sides.
    ``threads``: OpenMP / torch intra-op threads of the side's main process (rlweave's workers
    set their own per slot, as they always do); malloc settings as rlweave's workers get them (a
    value already in the environment wins there too); flush-denormal switched on by
    :func:`apply_process_settings`; an embedded Ray of its own for every run."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in INHERITED_ENV_DROPPED}
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "RLWEAVE_BENCH_THREADS": str(threads),
                "RLWEAVE_BENCH_FLUSH_DENORMAL": "1", "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"})
    for key, value in rlweave_malloc_settings().items():
        env.setdefault(key, value)
    return env


def apply_process_settings() -> dict:
    """Run first in a side's process: torch threads and flush-denormal (rlweave's worker hosts
    call ``torch.set_flush_denormal(True)`` too). Returns the process's effective settings."""
    import torch

    threads = int(os.environ.get("RLWEAVE_BENCH_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    flush = os.environ.get("RLWEAVE_BENCH_FLUSH_DENORMAL") == "1" and bool(torch.set_flush_denormal(True))
    return {"pid": os.getpid(), "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "flush_denormal": flush, "env": {k: os.environ.get(k) for k in PROCESS_ENV_KEYS}}


def paired_parser(prog: str, doc: str | None, repeats: int = 3, threads: int = 1):
    """The argument parser of a two-sided benchmark with the flags every such benchmark shares
    (``--json``, ``--repeats``, ``--threads`` and the hidden side flags), so their meaning and help
    are the same everywhere; the benchmark adds its own."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the figures, settings and versions as one JSON object")
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"measured rounds, A B then B A (>= 3 for a claim); default {repeats}")
    parser.add_argument("--threads", type=int, default=threads,
                        help=f"torch / OpenMP threads of each side's main process; default {threads}")
    add_side_args(parser)
    return parser


def add_side_args(parser) -> None:
    """The hidden flags a benchmark's side process is started with (see :func:`run_side`)."""
    import argparse

    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--side-params", default="{}", help=argparse.SUPPRESS)


def serve_side(fn: Callable[..., dict], params_json: str) -> int:
    """In a side's process: applies the process settings, runs ``fn(**params)`` and prints its
    result as the marker line :func:`run_side` reads. Only rank 0 prints under a multi-process
    launcher (``RANK`` in the environment)."""
    settings = apply_process_settings()
    result = fn(**json.loads(params_json))
    if result is None:  # a non-zero rank of a multi-process launch
        return 0
    result.setdefault("process", settings)
    print(RESULT_MARKER + json.dumps(_clean(result)), flush=True)
    return 0


def run_side(script: str | Path, side: str, params: Mapping[str, Any], threads: int,
             launcher: Sequence[str] | None = None, timeout: float | None = None) -> dict:
    """Runs one side in a fresh process (``script --side SIDE --side-params JSON``, or under
    ``launcher``, e.g. ``accelerate launch ...``) with :func:`side_env` and returns its result.
    Raises with the tail of its output when it fails."""
    cmd = [*(launcher or [sys.executable]), str(script), "--side", side, "--side-params", json.dumps(dict(params))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=side_env(threads), timeout=timeout)
    lines = [x[len(RESULT_MARKER):] for x in proc.stdout.splitlines() if x.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-8:]
        raise RuntimeError(f"side {side} failed (exit {proc.returncode}):\n  " + "\n  ".join(tail))
    return json.loads(lines[0])


# --------------------------------------------------------------------------- the machine
def load_average() -> float | None:
    """The machine's 1-minute load average (other work beside the benchmark), where known."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def cpu_info() -> dict:
    """CPU model and flags (from /proc/cpuinfo where there is one), and the physical cores."""
    model, flags = platform.processor() or "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("?", "", "x86_64"):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    simd = [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4"))]
    return {"cpu_model": model, "cpu_flags_simd": simd, "cpu_flags": " ".join(flags), "cpus": os.cpu_count()}


def library_versions() -> dict:
    """Installed versions of the libraries a benchmark may use (None where absent)."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    """The source tree's commit (with ``-dirty`` when it has uncommitted changes), where known."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment_info() -> dict:
    """Versions, CPU, cores and thread settings, for the settings printout and the JSON file."""
    info: dict = {"python": sys.version.split()[0], "platform": platform.platform(terse=True), **cpu_info(),
                  "load_avg_1m": load_average(), "commit": git_commit(), "versions": library_versions(),
                  "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


# --------------------------------------------------------------------------- report
REQUIRED_FIELDS = ("benchmark", "command", "headline", "protocol", "environment", "process_env", "sides")
REQUIRED_ENVIRONMENT = ("cpu_model", "cpu_flags", "cpus", "versions")


def command(benchmark: str, argv: Sequence[str]) -> str:
    """The command line that reproduces a run, without its ``--json`` output path."""
    args, skip = [], False
    for a in argv:
        if skip or a.startswith("--json="):
            skip = False
            continue
        if a == "--json":
            skip = True
            continue
        args.append(a)
    return " ".join(["rlweave bench", benchmark, *args])


def report(benchmark: str, argv: Sequence[str], headline: str, sides: Mapping[str, Mapping[str, Any]],
           repeats: int, warmup: bool = True, threads: int | None = None) -> dict:
    """The common part of a benchmark's JSON: what ran, how, where, and each side's
    configuration as the benchmark asked for it (a side's own process adds what it actually had,
    under ``runs``)."""
    return {"benchmark": benchmark, "command": command(benchmark, argv), "headline": headline,
            "protocol": protocol(list(sides), repeats, warmup), "environment": environment_info(),
            "process_env": {k: v for k, v in side_env(threads or 1).items() if k in PROCESS_ENV_KEYS},
            "sides": {name: dict(cfg) for name, cfg in sides.items()}}


def missing_fields(obj: Mapping[str, Any]) -> list[str]:
    """Which of the fields every benchmark JSON must hold (docs/design.md, "How speed is measured", rule 6) are absent."""
    missing = [k for k in REQUIRED_FIELDS if k not in obj]
    env = obj.get("environment") or {}
    missing += [f"environment.{k}" for k in REQUIRED_ENVIRONMENT if k not in env]
    missing += [f"sides.{name}" for name, cfg in (obj.get("sides") or {}).items() if not cfg]
    return missing


# --------------------------------------------------------------------------- printing
def print_settings(title: str, sides: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any] | None = None) -> None:
    """Prints one table: a row per setting, a column per side; rows whose values differ are
    marked with ``*`` so a mismatch in the work is visible at a glance."""
    print(title)
    for k, v in (common or {}).items():
        print(f"  {k}: {v}")
    names = list(sides)
    keys: list[str] = []
    for s in sides.values():
        keys += [k for k in s if k not in keys]
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


def _clean(v):
    """NaN and infinity become null (JSON has neither)."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(path: str | None, obj: dict) -> None:
    """Writes ``obj`` as one JSON object (NaN becomes null), atomically; says which of the
    required fields are missing (the benchmarks that are not side-by-side comparisons have none
    of the side fields)."""
    if not path:
        return
    missing = missing_fields(obj) if "sides" in obj else []
    if missing:
        print(f"note: {path} lacks {', '.join(missing)}")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
