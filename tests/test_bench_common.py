"""The fairness helpers every benchmark shares (benchmarks/_common.py) and how ``rlweave bench``
finds the benchmarks: fast checks, no benchmark runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def C():
    spec = importlib.util.spec_from_file_location("bench_common_under_test", ROOT / "benchmarks" / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_alternate_a_b_b_a(C):
    assert C.pair_order(["A", "B"], 4) == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert C.pair_order(["A", "B", "C"], 2) == [["A", "B", "C"], ["C", "B", "A"]]
    with pytest.raises(ValueError):
        C.pair_order(["A", "B"], 0)


def test_interleave_runs_warmup_then_abba_and_flags_short_runs(C):
    calls = []

    def side(name, timed):
        def run():
            calls.append(name)
            return {"timed_s": timed}
        return run

    warm, res = C.interleave({"A": side("A", 2.0), "B": side("B", 0.1)}, repeats=3, log=lambda _: None)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B"]
    assert set(warm) == {"A", "B"} and len(res["A"]) == len(res["B"]) == 3
    assert all(r.get("short_run") for r in res["B"]) and not any(r.get("short_run") for r in res["A"])


def test_ratio_against_the_fastest_baseline(C):
    r = C.ratio_vs_fastest([10.0, 12.0, 11.0], {"slow": [5.0, 5.0, 5.0], "fast": [8.0, 10.0, 9.0]})
    assert r["baseline"] == "fast"
    assert r["median"] == pytest.approx(11.0 / 9.0)
    assert r["against"]["slow"] == pytest.approx(2.2)


def test_grow_until_reaches_the_minimum_time(C):
    assert C.grow_until(lambda n: n * 0.01, 4, min_s=1.0) == 128


def test_report_holds_every_required_field(C):
    out = C.report("demo", ["--repeats", "3", "--json", "x.json"], "items/s", {"a": {"k": 1}, "b": {"k": 2}}, 3, threads=2)
    assert C.missing_fields(out) == []
    assert out["command"] == "rlweave bench demo --repeats 3"
    assert out["protocol"]["order"] == ["a b", "b a", "a b"]
    env = out["environment"]
    assert env["cpu_model"] and env["cpus"] and "torch" in env["versions"]
    assert out["process_env"]["OMP_NUM_THREADS"] == "2"
    assert out["process_env"]["MALLOC_ARENA_MAX"]
    assert C.missing_fields({"benchmark": "x", "sides": {"a": {}}}) != []


def test_side_env_is_the_same_for_every_side_and_carries_rlweaves_malloc_settings(C):
    import pkgutil

    import rlweave.cluster

    found = [m.name for m in pkgutil.iter_modules(rlweave.cluster.__path__)
             if hasattr(__import__(f"rlweave.cluster.{m.name}", fromlist=["_"]), "MALLOC_SETTINGS")]
    assert found, "rlweave's worker processes no longer declare MALLOC_SETTINGS: update _common.rlweave_malloc_settings"
    env = C.side_env(1, base={})
    assert env == C.side_env(1, base={})
    for key, value in C.rlweave_malloc_settings().items():
        assert env[key] == value
    assert env["RLWEAVE_BENCH_FLUSH_DENORMAL"] == "1" and env["OMP_NUM_THREADS"] == "1"


def test_side_env_drops_the_launching_shells_openmp_wait_policy(C):
    env = C.side_env(2, base={"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "HOME": "/x"})
    assert "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env and env["HOME"] == "/x"
    assert "OMP_WAIT_POLICY" in C.PROCESS_ENV_KEYS  # recorded in every side's effective settings


def test_a_side_runs_in_its_own_process_with_the_settings(C, tmp_path):
    script = tmp_path / "side.py"
    script.write_text(
        "import argparse, os, sys\n"
        f"sys.path.append({str(ROOT / 'benchmarks')!r})\n"
        "import _common as C\n"
        "p = argparse.ArgumentParser(); C.add_side_args(p); a = p.parse_args()\n"
        "sys.exit(C.serve_side(lambda x: {'x': x * 2, 'pid': os.getpid()}, a.side_params))\n"
    )
    r = C.run_side(script, "demo", {"x": 21}, threads=1)
    assert r["x"] == 42 and r["pid"] != __import__("os").getpid()
    assert r["process"]["flush_denormal"] is True and r["process"]["torch_threads"] == 1
    assert r["process"]["env"]["MALLOC_ARENA_MAX"]


def test_write_json_turns_nan_into_null(C, tmp_path):
    path = tmp_path / "r.json"
    C.write_json(str(path), {"benchmark": "x", "ratio": float("nan"), "runs": [1.0, float("inf")]})
    assert json.loads(path.read_text()) == {"benchmark": "x", "ratio": None, "runs": [1.0, None]}


def test_bench_finds_benchmarks_in_a_checkout_or_says_it_needs_one(tmp_path, capsys):
    from rlweave.cli import benchmarks_dir, main

    assert benchmarks_dir() == ROOT / "benchmarks"
    installed = tmp_path / "site-packages" / "rlweave"  # an installed package: no benchmarks/ beside it
    installed.mkdir(parents=True)
    assert benchmarks_dir(installed, cwd=tmp_path, environ={}) is None
    assert benchmarks_dir(installed, cwd=ROOT, environ={}) == ROOT / "benchmarks"
    assert benchmarks_dir(installed, cwd=tmp_path, environ={"RLWEAVE_BENCHMARKS": str(ROOT / "benchmarks")}) == ROOT / "benchmarks"

    import rlweave.cli as cli

    original = cli.benchmarks_dir
    cli.benchmarks_dir = lambda: None
    try:
        assert main(["bench", "channel"]) == 2
    finally:
        cli.benchmarks_dir = original
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a source checkout" in err[0]


def test_every_benchmark_imports_common_one_way_and_exits_with_main():
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.name.startswith("_"):
            continue
        src = path.read_text()
        assert "sys.exit(main())" in src, path.name
        assert "spec_from_file_location" not in src, path.name
        if "_common" in src:
            assert "import _common as C" in src, path.name


def test_gpu_check_says_in_one_line_that_there_is_no_gpu():
    import os
    import shutil
    import subprocess

    import torch

    if torch.cuda.is_available() or shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: scripts/gpu-check.sh would run its checks (minutes)")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "no GPU" in lines[0]
