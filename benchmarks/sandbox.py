"""What the code sandbox costs per run: isolated sandbox runs against plain subprocess runs of the same
program, measured in one run.

  A  sandbox      ``Sandbox.run`` with namespaces (network, mount, PID), read-only remounts, scratch
                  tmpfs, pids cgroup, rlimits, dropped capabilities (rlweave.agents.sandbox);
  U  unisolated   ``Sandbox.run`` with ``allow_unisolated`` forced: rlimits, cgroup and the clean
                  environment only (what is left where namespaces are unavailable);
  B  subprocess   baseline: ``subprocess.run([python, "-I", "-c", code])`` with a clean environment
                  and a timeout, no isolation (what a tool without a sandbox would do).

Every run is a fresh Python process in all three sides, so the figure is the whole per-call
latency an agent's ``python`` tool pays. Each side runs the program enough times for at least 1 s
of timed work (twice the count that took 1 s when probed); rounds alternate the order of the sides. Headline:
runs/s of A over B (median of the per-round ratios), and the median latency per run of each side.

    rlweave bench sandbox [--json FILE] [--repeats N] [--code "print(sum(range(1000)))"]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

from rlweave.agents import sandbox as sb  # noqa: E402

LIMITS = sb.SandboxLimits(cpu_s=5, wall_s=20, memory_mb=1024, nproc=32)


def _sandbox_runner(isolated: bool):
    box = sb.Sandbox(LIMITS, allow_unisolated=not isolated)

    def once(code: str) -> None:
        res = box._run(code, None, isolated=isolated)
        if not res.ok:
            raise RuntimeError(f"sandbox run failed: {res.summary()} {res.stderr[-300:]}")
    return once


def _subprocess_once(code: str) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True, timeout=20, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlweave bench sandbox")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--code", default="print(sum(range(1000)))")
    p.add_argument("--json")
    args = p.parse_args(argv)
    problem = sb.isolation_problem()
    if problem is not None:
        print(f"the sandbox cannot isolate here ({problem}); side A needs namespaces")
        return 1
    fns = {"sandbox": _sandbox_runner(True), "unisolated": _sandbox_runner(False), "subprocess": _subprocess_once}
    counts = {name: 2 * C.grow_until(lambda n, f=f: C.timed(lambda: [f(args.code) for _ in range(n)])[1], 2)
              for name, f in fns.items()}

    def side(name: str):
        def run() -> dict:
            n = counts[name]
            start = time.perf_counter()
            for _ in range(n):
                fns[name](args.code)
            dt = time.perf_counter() - start
            return {"runs": n, "timed_s": dt, "runs_per_s": n / dt, "ms_per_run": 1000 * dt / n}
        return run

    print(f"sandbox overhead: {args.repeats} rounds, program {args.code!r}, runs per side {counts}")
    _, results = C.interleave({name: side(name) for name in fns}, args.repeats,
                              describe=lambda s, r: f"{r['ms_per_run']:.0f} ms/run")
    rate = {name: [r["runs_per_s"] for r in rs] for name, rs in results.items()}
    vs = C.ratio_stats(rate["sandbox"], rate["subprocess"])
    vs_u = C.ratio_stats(rate["unisolated"], rate["subprocess"])
    ms = {name: C.median([r["ms_per_run"] for r in rs]) for name, rs in results.items()}
    print(f"ms per run (median): sandbox {ms['sandbox']:.0f}, unisolated {ms['unisolated']:.0f}, "
          f"subprocess {ms['subprocess']:.0f}")
    print(f"runs/s, sandbox / subprocess: {C.fmt_ratio(vs)}; unisolated / subprocess: {C.fmt_ratio(vs_u)}")
    headline = f"sandbox runs/s over plain subprocess: {vs['median']:.2f}"
    out = C.report("sandbox", argv or [], headline, {
        "sandbox": {"isolation": "net+mount+pid namespaces, read-only remount, tmpfs scratch, caps dropped",
                    "limits": str(LIMITS), "cgroup": bool(sb._pids_cgroup_parents())},
        "unisolated": {"isolation": "none (rlimits, cgroup, clean env)", "limits": str(LIMITS)},
        "subprocess": {"isolation": "none", "limits": "timeout only"}}, args.repeats)
    out["protocol"]["each_side_in_own_process"] = "every run is a fresh process, in every side"
    out.update({"runs": counts, "ms_per_run": ms, "ratio_sandbox_vs_subprocess": vs,
                "ratio_unisolated_vs_subprocess": vs_u, "results": results})
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
