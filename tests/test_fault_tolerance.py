"""Fault tolerance and exact resume: a run stopped (by request or signal) and resumed, or one whose
worker process is killed mid-run, ends with the same metrics as an uninterrupted run of the seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import QUIET, read_metrics, run_cli
from rlweave.cli import _runner_class
from rlweave.config import load_config

# timing, memory and the planner's timing-based predictions differ between any two runs
_VOLATILE = ("time/", "perf/", "mem/", "plan/")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time" and not k.startswith(_VOLATILE)} for r in rows]


def _run(recipe: str, overrides: list[str], run_dir: Path, on_iteration=None):
    cfg = load_config(recipe, [*overrides, f"run.dir={run_dir}", *QUIET])
    runner = _runner_class(cfg.runner)(cfg, run_dir)
    runner.run(on_iteration=on_iteration)
    return runner


# MuJoCo episodes (1000 steps) are always running at an iteration boundary: the checkpoint must
# carry them, not restart them
PPO = ["run.deterministic=true", "env.id=HalfCheetah-v5", "env.num_workers=1", "rollout.num_workers=1", "env.num_envs=2", "train.rollout_steps=64",
       "train.total_env_steps=768", "algorithm.epochs=2", "algorithm.minibatch_size=64", "train.eval_every=3",
       "train.eval_episodes=1", "env.max_episode_steps=200", "train.checkpoint_every=2"]
SAC = ["run.deterministic=true", "policy.hidden=[32,32]", "critic.hidden=[32,32]", "algorithm.batch_size=32", "algorithm.learning_starts=150",
       "train.rollout_steps=50", "train.total_env_steps=600", "train.eval_every=3", "train.eval_episodes=1",
       "env.num_envs=2", "train.checkpoint_every=2"]


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tmp_path_factory):
    """The uninterrupted run of a recipe with given overrides (its stable metrics), made once for
    every test here that compares an interrupted run with it."""
    done: dict[tuple, list[dict]] = {}

    def get(recipe: str, overrides: list[str]) -> list[dict]:
        key = (recipe, tuple(overrides))
        if key not in done:
            whole = tmp_path_factory.mktemp("whole")
            _run(recipe, overrides, whole)
            done[key] = _stable(read_metrics(whole))
        return done[key]
    return get


def _stop_at(k: int):
    def cb(runner, record):
        if runner.iteration == k:
            runner.request_stop("test stop")
    return cb


@pytest.mark.parametrize("recipe, overrides, stop", [("ppo-halfcheetah", PPO, 3), ("sac-pendulum", SAC, 3)], ids=["ppo", "sac"])
def test_stopped_and_resumed_run_matches_the_uninterrupted_one(uninterrupted, tmp_path, recipe, overrides, stop):
    parted = tmp_path / "parted"
    runner = _run(recipe, overrides, parted, on_iteration=_stop_at(stop))
    assert runner.iteration == stop and len(read_metrics(parted)) == stop
    assert (parted / "checkpoints" / f"iter_{stop:08d}").is_dir()  # the stop wrote its checkpoint
    rc, out = run_cli("resume", str(parted))
    assert rc == 0, out
    a, b = uninterrupted(recipe, overrides), _stable(read_metrics(parted))
    assert len(a) == len(b) == 6
    assert a == b


@pytest.mark.parametrize("recipe, overrides, group, steps, last_ckpt", [
    ("ppo-halfcheetah", PPO, "env", 128, "iter_00000002"),
    ("sac-pendulum", SAC, "rollout", 100, "iter_00000002"),
], ids=["ppo-env", "sac-rollout"])
def test_killed_worker_is_replaced_and_the_run_ends_as_if_nothing_happened(uninterrupted, tmp_path, capsys, recipe, overrides,
                                                                           group, steps, last_ckpt):
    hit = tmp_path / "hit"
    whole = uninterrupted(recipe, overrides)
    killed = []

    def kill_during_next_iteration(runner, record):
        if runner.iteration == 3 and not killed:
            pid = getattr(runner, group).host_info("pid")[0]
            killed.append(pid)
            threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()

    runner = _run(recipe, overrides, hit, on_iteration=kill_during_next_iteration)
    out = capsys.readouterr().out
    assert killed and runner.restarts == 1
    assert "worker process died" in out and f"restart 1/3: worker groups rebuilt, continuing from {last_ckpt}" in out
    rows = read_metrics(hit)
    assert [r["env_steps"] for r in rows] == [steps * i for i in range(1, 7)]  # every sample counted once
    assert _stable(rows) == whole


def test_no_restarts_left_stops_the_run_with_the_worker_named(ray_session, tmp_path, capsys):
    def kill(runner, record):
        if runner.iteration == 1:
            threading.Timer(0.05, os.kill, (runner.env.host_info("pid")[0], signal.SIGKILL)).start()

    # env and rollout share that process (fused): whichever call notices first names the other too
    with pytest.raises(Exception, match=r"worker (env\[rank 0\] failed in .*worker process died"
                                        r"|rollout\[rank 0\] failed in .*worker process died .*also hosted env\[rank 0\])"):
        _run("ppo-halfcheetah", [*PPO, "train.max_restarts=0"], tmp_path / "r", on_iteration=kill)


def test_deterministic_mode_refuses_timing_driven_placement(capsys, tmp_path):
    from rlweave.cli import main

    rc = main(["train", "ppo-cartpole", "run.deterministic=true", "placement.mode=auto", f"run.dir={tmp_path / 'r'}", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2 and "run.deterministic: placement.mode=auto re-plans from timings" in err, err


def test_sigterm_writes_a_checkpoint_and_exits_0(tmp_path):
    run_dir = tmp_path / "sig"
    cmd = [sys.executable, "-m", "rlweave.cli", "train", "ppo-halfcheetah", *PPO, "train.total_env_steps=100000",
           "train.checkpoint_every=0", f"run.dir={run_dir}", *QUIET]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_ADDRESS": "local"})
    deadline = time.time() + 120
    while time.time() < deadline and not ((run_dir / "metrics.jsonl").exists() and read_metrics(run_dir)):
        time.sleep(0.2)
    assert read_metrics(run_dir), "the run never finished an iteration"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert time.time() - t0 < 30
    rows = read_metrics(run_dir)
    n = rows[-1]["iteration"]
    assert "SIGTERM: stopped at iteration" in out and f"rlweave resume {run_dir}" in out
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"iter_{n:08d}"]


def test_a_second_signal_stops_at_once(tmp_path):
    run_dir = tmp_path / "sig2"
    # iterations long enough that the first signal cannot finish one before the second arrives
    cmd = [sys.executable, "-m", "rlweave.cli", "train", "ppo-halfcheetah", *PPO, "train.total_env_steps=10000000",
           "train.rollout_steps=4000", "train.checkpoint_every=0", f"run.dir={run_dir}", *QUIET]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_ADDRESS": "local"})
    deadline = time.time() + 120
    while time.time() < deadline and not (run_dir / "config.yaml").exists():  # written once the handlers are in place
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    # the second signal only once the first has been handled: two signals that arrive while the main
    # thread is inside one C call are handled once (Python runs a handler per pending signal number)
    head = ""
    for line in proc.stdout:
        head += line
        if "SIGINT: finishing this iteration" in line:
            break
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    out = head + rest
    assert time.time() - t0 < 20
    assert proc.returncode == 130, out
    assert "SIGINT: finishing this iteration" in out and "rlweave: interrupted" in out
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").glob("iter_*"))
