"""Soak: does a long run's memory stay flat? Resident memory of every process of one run (driver,
Ray's GCS and raylet, every worker), sampled through the run.

Starts ``rlweave train RECIPE`` (default ``ppo-halfcheetah``, with a step budget it will not reach)
as a subprocess, sums the resident set size (RSS) of its whole process tree every
``--interval`` seconds for ``--minutes``, then stops it with SIGTERM (the graceful stop: a final
checkpoint and exit status 0, checked). The baseline is the median of the samples in the minute
after ``--warmup`` minutes (allocators, caches and Ray's workers have settled); the end figure is
the median of the samples in the last minute. The verdict is end / warm-up <= ``--limit`` (1.10:
within 10%).

    rlweave bench soak --minutes 30 [--recipe ppo-halfcheetah] [--json F] [-- key=value ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402


def tree_rss(root: psutil.Process) -> dict[int, tuple[str, float]]:
    """RSS (MiB) of ``root`` and every descendant: pid -> (name, MiB)."""
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            name = p.name()  # Ray names worker processes after their actor class (ray::_RayHost)
            out[p.pid] = (name, p.memory_info().rss / 2**20)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="ppo-halfcheetah")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=3.0, help="minutes before the baseline minute")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--limit", type=float, default=1.10, help="largest end / warm-up ratio that passes")
    p.add_argument("--keep", default=None, help="run folder to keep (default: a temporary one)")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = p.parse_args(argv)
    run_dir = Path(args.keep or tempfile.mkdtemp(prefix="bench-soak-")) / "run"
    cmd = [sys.executable, "-m", "rlweave.cli", "train", args.recipe, "train.total_env_steps=1000000000",
           f"run.dir={run_dir}", "run.progress=false", *args.overrides]
    print(f"soak: {' '.join(cmd[3:])} for {args.minutes:g} min, RSS of the whole process tree every {args.interval:g} s")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / "soak.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_ADDRESS": "local"})
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, float, int]] = []  # (minutes, MiB, processes)
    warm_by_pid: dict[int, tuple[str, float]] = {}
    last_by_pid: dict[int, tuple[str, float]] = {}
    t0 = time.perf_counter()
    try:
        while (elapsed := (time.perf_counter() - t0) / 60) < args.minutes:
            if proc.poll() is not None:
                raise RuntimeError(f"the run exited early with status {proc.returncode}; see {log.name}")
            by_pid = tree_rss(root)
            samples.append((elapsed, sum(mb for _, mb in by_pid.values()), len(by_pid)))
            if not warm_by_pid and elapsed >= args.warmup:
                warm_by_pid = by_pid
            last_by_pid = by_pid
            time.sleep(args.interval)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        log.close()
    warm = [mb for m, mb, _ in samples if args.warmup <= m < args.warmup + 1]
    end = [mb for m, mb, _ in samples if m >= args.minutes - 1]
    warm_mb, end_mb = statistics.median(warm), statistics.median(end)
    ratio = end_mb / warm_mb
    steps = None
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        lines = metrics.read_text().splitlines()
        steps = int(__import__("json").loads(lines[-1])["env_steps"]) if lines else None
    passed = ratio <= args.limit and rc == 0
    growth = sorted(((last_by_pid[p][1] - warm_by_pid[p][1], last_by_pid[p][0], p) for p in warm_by_pid if p in last_by_pid),
                    reverse=True)
    for mb, name, pid in growth[:3]:
        print(f"  grew most: {name} (pid {pid}): {mb:+.1f} MiB between warm-up and the end")
    print(f"RSS after warm-up {warm_mb:.0f} MiB, at the end {end_mb:.0f} MiB: ratio {ratio:.3f} (limit {args.limit}); "
          f"peak {max(mb for _, mb, _ in samples):.0f} MiB; {samples[-1][2]} processes; {steps} env steps; "
          f"SIGTERM exit status {rc}; {'PASS' if passed else 'FAIL'}")
    C.write_json(args.json, {
        "benchmark": "soak", "recipe": args.recipe, "minutes": args.minutes, "ratio": ratio, "warm_mb": warm_mb,
        "end_mb": end_mb, "peak_mb": max(mb for _, mb, _ in samples), "limit": args.limit, "passed": passed,
        "exit_status_after_sigterm": rc, "env_steps": steps, "overrides": args.overrides,
        "growth_by_process_mb": [{"process": name, "pid": pid, "mb": round(mb, 1)} for mb, name, pid in growth],
        "samples": [{"minute": round(m, 3), "rss_mb": round(mb, 1), "processes": n} for m, mb, n in samples],
        "environment": C.environment_info(),
    })
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
