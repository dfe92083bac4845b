"""End to end through the ``rlweave`` command: tiny training runs on an embedded Ray, the run
folder they write, resume, other placements and algorithms, DDP, bad input, non-finite envs,
and no Ray processes left behind.

One Ray instance serves the whole module (the runner attaches to it instead of starting its own);
its workers import ``tests.nan_env`` at start-up, so the NaN test env is registered in every env
worker process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray
import torch
from omegaconf import OmegaConf

from rlweave.cli import main
from rlweave.cluster import Cluster
from tests.helpers import QUIET, read_metrics, train
from tests.nan_env import NAN_ENV_ID

REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers
def checkpoints(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": "tests.nan_env.register"},
    )
    yield
    ray.shutdown()


@pytest.fixture
def no_cluster_start(monkeypatch):
    """Makes starting (or attaching to) a cluster fail loudly: for input that must be refused
    before anything starts."""

    class ClusterStarted(AssertionError):
        pass

    def refuse(cls, *args, **kwargs):
        raise ClusterStarted("Cluster.start was called: the input was not refused before anything started")

    monkeypatch.setattr(Cluster, "start", classmethod(refuse))


def assert_refused(capsys, rc: int, run_dir: Path, *fragments: str) -> str:
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got: {err!r}"
    line = lines[0]
    assert line.startswith("rlweave: error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f in line, f"{f!r} not in {line!r}"
    assert not (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "config.yaml").exists()
    return line


# --------------------------------------------------------------------------- bad input (no Ray needed)
@pytest.mark.parametrize(
    "recipe, overrides, fragments",
    [
        ("nosuch-recipe", [], ["unknown recipe 'nosuch-recipe'", "ppo-cartpole", "grpo-cartpole", "ppo-pixels"]),
        ("ppo-cartpole", ["env.foo=1"], ["env.foo", "unknown key"]),
        ("ppo-cartpole", ["env.num_envs=abc"], ["env.num_envs", "'abc'"]),
        ("ppo-cartpole", ["env.num_envs=-1"], ["env.num_envs: must be >= 1, got -1"]),
        ("ppo-cartpole", ["algorithm.gamma=1.5"], ["algorithm.gamma: must be <= 1, got 1.5"]),
        ("ppo-cartpole", ["env.on_nonfinite=ignore"], ["env.on_nonfinite", "'ignore'"]),
        ("ppo-cartpole", ["env.id=NoSuchEnv-v0"], ["env.id", "NoSuchEnv-v0"]),
        (
            "ppo-cartpole",
            ["env.num_workers=3", "actor.num_workers=2"],
            ["actor.num_workers: 2 must divide env.num_workers (3)"],
        ),
        ("grpo-cartpole", ["env.num_envs=6", "algorithm.group_size=4"], ["algorithm.group_size: 4 must divide env.num_envs (6)"]),
        ("ppo-cartpole", ["+placement.groups.bogus.slots=0"], ["placement.groups.bogus"]),
        ("ppo-cartpole", ["actor.strategy=fsdp"], ["actor.strategy: fsdp shards language models"]),
    ],
)
def test_bad_input_is_refused_with_one_line(capsys, tmp_path, no_cluster_start, recipe, overrides, fragments):
    run_dir = tmp_path / "run"
    rc = main(["train", recipe, *overrides, f"run.dir={run_dir}", *QUIET])
    assert_refused(capsys, rc, run_dir, *fragments)
    assert not run_dir.exists()


def test_missing_recipe_file_is_refused(capsys, tmp_path, no_cluster_start):
    rc = main(["train", str(tmp_path / "nope.yaml")])
    line = assert_refused(capsys, rc, tmp_path)
    assert "recipe file not found" in line and "nope.yaml" in line


def _recipe(tmp_path: Path, placement: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "description: tiny\n"
        "env: {num_envs: 2}\n"
        "train: {total_env_steps: 64, rollout_steps: 32}\n" + placement,
        encoding="utf-8",
    )
    return path


def test_unknown_placement_group_in_recipe_is_refused_before_start(capsys, tmp_path, no_cluster_start):
    recipe = _recipe(tmp_path, "placement:\n  groups:\n    bogus: {slots: '0'}\n")
    run_dir = tmp_path / "run"
    rc = main(["train", str(recipe), f"run.dir={run_dir}", *QUIET])
    assert_refused(capsys, rc, run_dir, "placement.groups.bogus: unknown worker group (known: actor, env, rollout)")
    assert not run_dir.exists()


def test_auto_placement_with_fixed_env_slots_is_refused_before_start(capsys, tmp_path, no_cluster_start):
    run_dir = tmp_path / "run"
    rc = main(["train", "ppo-cartpole", "placement.mode=auto", "placement.groups.env.slots=0", f"run.dir={run_dir}", *QUIET])
    assert_refused(capsys, rc, run_dir, "placement.groups: env and rollout slots are the planner's to choose")
    assert not run_dir.exists()


def test_explicit_placement_can_be_given_on_the_command_line():
    """README: placement groups take explicit slots, and overrides use Hydra syntax ('+' for
    keys that are not in the recipe). A group's slots must be settable from the command line."""
    from rlweave.config import load_config

    cfg = load_config("ppo-cartpole", ["+placement.groups.actor.slots=0", "+placement.groups.env.procs_per_slot=2"])
    assert cfg.placement.groups.actor.slots == "0"
    assert cfg.placement.groups.actor.procs_per_slot == 1
    assert cfg.placement.groups.env.procs_per_slot == 2


def test_eval_and_resume_refuse_a_folder_that_is_not_a_run(capsys, tmp_path):
    assert main(["resume", str(tmp_path)]) == 2
    assert main(["eval", str(tmp_path)]) == 2
    _, err = capsys.readouterr()
    assert err.count("rlweave: error: ") == 2
    assert "no config.yaml (not a run folder)" in err


# --------------------------------------------------------------------------- the basic run and its folder
@pytest.fixture(scope="module")
def basic_run(ray_session, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("basic") / "run"
    rc, out = train(
        "ppo-cartpole",
        "train.total_env_steps=2048",
        "env.num_envs=4",
        "train.rollout_steps=64",
        "train.eval_every=2",
        "train.eval_episodes=2",
        "train.checkpoint_every=2",
        "train.keep_checkpoints=2",
        f"run.dir={run_dir}",
        "run.progress=false",
    )
    return rc, out, run_dir


def test_train_exits_zero_and_reports(basic_run):
    rc, out, run_dir = basic_run
    assert rc == 0, out
    assert f"[rlweave] run folder: {run_dir}" in out
    assert "[rlweave] placement collocated (cpu slots): env[1]@node0:0  rollout[1]@node0:0  actor[1]@node0:0" in out
    done = [line for line in out.splitlines() if line.startswith("[rlweave] done: ")]
    assert len(done) == 1
    summary = json.loads(done[0][len("[rlweave] done: "):])
    assert (summary["iteration"], summary["env_steps"]) == (8, 2048)
    assert "eval/episode_return" in summary


def test_run_folder_config_records_derived_placement(basic_run):
    _, _, run_dir = basic_run
    cfg = OmegaConf.load(run_dir / "config.yaml")
    assert cfg.placement.derived.mode == "collocated"
    assert cfg.placement.derived.slot_kind == "cpu"
    assert OmegaConf.to_container(cfg.placement.derived.groups) == {
        "env": ["node0:0"], "rollout": ["node0:0"], "actor": ["node0:0"]}
    assert cfg.recipe == "ppo-cartpole"
    assert cfg.run.dir == str(run_dir)
    assert (cfg.env.num_envs, cfg.train.rollout_steps, cfg.train.total_env_steps) == (4, 64, 2048)
    assert cfg.algorithm.gamma == 0.98  # from the recipe, fully resolved


def test_metrics_jsonl(basic_run):
    _, _, run_dir = basic_run
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert [r["env_steps"] for r in rows] == [i * 4 * 64 for i in range(1, 9)]
    walls = [r["wall_time"] for r in rows]
    assert walls[0] > 0 and all(b > a for a, b in zip(walls, walls[1:]))
    for r in rows:
        for key in ("time/env", "time/actor", "time/rollout", "time/weight_sync", "time/iteration"):
            assert isinstance(r[key], float) and r[key] >= 0, key
        assert r["train/dropped_episodes"] == 0
        assert 1 <= r["train/episode_return"] <= 500
        has_eval = "eval/episode_return" in r
        assert has_eval == (r["iteration"] % 2 == 0), r["iteration"]
        if has_eval:
            assert 1 <= r["eval/episode_return"] <= 500
            assert r["time/eval"] >= 0


def test_tensorboard_events(basic_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, _, run_dir = basic_run
    files = list(run_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/episode_return", "eval/episode_return", "time/env", "time/actor"} <= set(tags)
    assert "iteration" not in tags and "env_steps" not in tags
    assert [e.step for e in acc.Scalars("eval/episode_return")] == [512, 1024, 1536, 2048]
    rows = read_metrics(run_dir)
    assert [e.value for e in acc.Scalars("train/episode_return")] == pytest.approx(
        [r["train/episode_return"] for r in rows])


def test_trace_json(basic_run):
    _, _, run_dir = basic_run
    trace = json.loads((run_dir / "trace.json").read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"env[0]", "rollout[0]", "actor[0]", "driver"} <= set(tracks)
    names = [e["name"] for e in spans]
    assert names.count("collect") == 8
    # per-decision events of the first run.trace_iterations (3) iterations: 64 decisions, k=1
    assert names.count("infer 4 rows") == 3 * 64
    assert names.count("step mb0") == 3 * 64
    assert {e["tid"] for e in spans if e["name"] == "infer 4 rows"} == {tracks["rollout[0]"]}
    assert names.count("train") == 8
    assert names.count("weight_sync") == 8
    assert names.count("eval") == 4
    assert all(e["dur"] >= 0 for e in spans)
    assert {e["tid"] for e in spans if e["name"] == "collect"} == {tracks["env[0]"]}


def test_checkpoints_keep_the_newest(basic_run):
    _, _, run_dir = basic_run
    assert checkpoints(run_dir) == ["iter_00000006", "iter_00000008"]  # keep_checkpoints=2
    last = run_dir / "checkpoints" / "iter_00000008"
    assert sorted(p.name for p in last.iterdir()) == ["actor.pt", "envs.pt", "manifest.json", "rollouts.pt", "runner.pt"]
    runner = torch.load(last / "runner.pt", weights_only=False)
    assert (runner["iteration"], runner["env_steps"], runner["version"]) == (8, 2048, 8)
    actor = torch.load(last / "actor.pt", weights_only=False)
    assert actor["version"] == 8


def test_train_refuses_a_folder_that_holds_a_run(basic_run, capsys):
    _, _, run_dir = basic_run
    before = (run_dir / "metrics.jsonl").read_bytes()
    rc = main(["train", "ppo-cartpole", f"run.dir={run_dir}", *QUIET])
    _, err = capsys.readouterr()
    assert rc == 2
    assert err.startswith("rlweave: error: run.dir: ") and f"rlweave resume {run_dir}" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == before


# --------------------------------------------------------------------------- resume
def test_resume_continues_from_the_remaining_checkpoint(basic_run, tmp_path, capsys):
    rc0, _, original = basic_run
    assert rc0 == 0
    original_metrics = (original / "metrics.jsonl").read_bytes()
    run_dir = tmp_path / "interrupted"
    shutil.copytree(original, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "iter_00000008")  # as if killed before the last one
    before = read_metrics(run_dir)
    assert len(before) == 8  # lines 7 and 8 are still there: resume must rewind them itself

    rc = main(["resume", str(run_dir)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "[rlweave] resumed from iter_00000006: iteration 6, 1536 env steps" in out

    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert [r["env_steps"] for r in rows] == [i * 256 for i in range(1, 9)]
    assert rows[:6] == before[:6]  # the history up to the checkpoint is kept as it was
    assert rows[6]["wall_time"] > rows[5]["wall_time"]
    assert "eval/episode_return" in rows[7]
    assert checkpoints(run_dir) == ["iter_00000006", "iter_00000008"]
    runner = torch.load(run_dir / "checkpoints" / "iter_00000008" / "runner.pt", weights_only=False)
    assert (runner["iteration"], runner["env_steps"]) == (8, 2048)
    assert OmegaConf.load(run_dir / "config.yaml").run.dir == str(run_dir)
    # the folder it was copied from is untouched
    assert (original / "metrics.jsonl").read_bytes() == original_metrics


def test_resume_skips_a_truncated_newest_checkpoint(basic_run, tmp_path, capsys):
    _, _, original = basic_run
    run_dir = tmp_path / "damaged"
    shutil.copytree(original, run_dir)
    actor = run_dir / "checkpoints" / "iter_00000008" / "actor.pt"
    actor.write_bytes(actor.read_bytes()[:100])  # as if the disk filled while it was copied
    rc = main(["resume", str(run_dir)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "iter_00000008: actor.pt has 100 bytes" in out and "moved to iter_00000008.corrupt" in out
    assert "[rlweave] resumed from iter_00000006: iteration 6, 1536 env steps" in out
    assert [r["iteration"] for r in read_metrics(run_dir)] == list(range(1, 9))
    # the damaged one is kept aside for inspection, not deleted
    assert checkpoints(run_dir) == ["iter_00000006", "iter_00000008", "iter_00000008.corrupt"]


# --------------------------------------------------------------------------- other placements and algorithms
def test_grpo_run(ray_session, tmp_path):
    run_dir = tmp_path / "grpo"
    rc, out = train(
        "grpo-cartpole", "env.num_envs=4", "algorithm.group_size=2", "train.rollout_steps=50",
        "train.total_env_steps=600", "train.eval_episodes=2", f"run.dir={run_dir}", *QUIET,
    )
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    steps = [r["env_steps"] for r in rows]
    increments = np.diff([0] + steps)
    # one episode per env from a reset, at most rollout_steps decisions each
    assert all(0 < d <= 4 * 50 for d in increments), steps
    # episodic runs stop on the step budget: the last iteration crossed it, the one before did not
    assert steps[-1] >= 600 and (len(steps) == 1 or steps[-2] < 600), steps
    assert all(r.get("train/episodes", 0) <= 4 for r in rows)
    assert "eval/episode_return" in rows[-1]
    assert OmegaConf.load(run_dir / "config.yaml").algorithm.name == "grpo"
    assert checkpoints(run_dir) == [f"iter_{len(rows):08d}"]


def test_two_env_workers_and_two_ddp_actor_ranks(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "ddp"
    rc = main([
        "train", "ppo-cartpole", "env.num_workers=2", "actor.num_workers=2", "rollout.num_workers=2",
        "cluster.num_cpus=2", "env.num_envs=4", "train.rollout_steps=32", "train.total_env_steps=512",
        "train.eval_episodes=2", f"run.dir={run_dir}", *QUIET,
    ])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "env[2]@node0:0,node0:1  rollout[2]@node0:0,node0:1  actor[2]@node0:0,node0:1" in out
    rows = read_metrics(run_dir)
    assert [(r["iteration"], r["env_steps"]) for r in rows] == [(1, 256), (2, 512)]
    assert checkpoints(run_dir) == ["iter_00000002"]
    envs = torch.load(run_dir / "checkpoints" / "iter_00000002" / "envs.pt", weights_only=False)
    assert [e["steps"] for e in envs] == [256, 256]  # one state per env worker

    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["checkpoint"] == "iter_00000002"
    assert result["episodes"] == 2
    assert 1 <= result["eval/episode_return"] <= 500


# --------------------------------------------------------------------------- non-finite env values
def test_nan_reward_stops_the_run_naming_env_rank_and_step(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "nan"
    rc = main([
        "train", "ppo-cartpole", f"env.id={NAN_ENV_ID}", "env.num_envs=1", "train.rollout_steps=32",
        "train.total_env_steps=64", f"run.dir={run_dir}", *QUIET,
    ])
    _, err = capsys.readouterr()
    assert rc == 1, err
    first = err.strip().splitlines()[0]
    assert first.startswith("rlweave: run stopped: ")
    assert NAN_ENV_ID in first
    assert "env worker rank 0" in first
    assert "step 5" in first
    assert "non-finite reward" in first
    assert "Traceback" not in first
    assert not (run_dir / "metrics.jsonl").exists() or read_metrics(run_dir) == []


def test_nan_reward_dropped_when_configured(ray_session, tmp_path):
    run_dir = tmp_path / "drop"
    rc, out = train(
        "ppo-cartpole", f"env.id={NAN_ENV_ID}", "env.on_nonfinite=drop", "env.num_envs=1",
        "train.rollout_steps=32", "train.total_env_steps=64", "train.eval_every=0", f"run.dir={run_dir}", *QUIET,
    )
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["train/dropped_episodes"] > 0 for r in rows)
    assert all("train/episode_return" not in r for r in rows)  # every episode hit the NaN


def test_evaluation_honours_on_nonfinite_drop():
    """With env.on_nonfinite=drop the run's evaluation envs must drop the same episodes the
    training envs drop, not stop the run (evaluate_policy builds its VectorEnv without it)."""
    from rlweave.models import build_policy
    from rlweave.runners.evaluate import evaluate_policy
    from rlweave.envs import space_info

    obs_space, act_space = space_info(NAN_ENV_ID)
    policy = build_policy(name="mlp", observation_space=obs_space, action_space=act_space, chunk=1, critic=True)
    env_cfg = {"id": NAN_ENV_ID, "chunk": 1, "max_episode_steps": None, "pixels": {"enabled": False},
               "kwargs": {"nan_at": 5}, "on_nonfinite": "drop"}
    result = evaluate_policy(policy, env_cfg, episodes=2, seed=0)
    assert "eval/episode_return" in result
    assert result["eval/episodes"] == 0 and result["eval/dropped_episodes"] == 2


# --------------------------------------------------------------------------- no Ray processes left behind
def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.environ().get("RLWEAVE_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


@pytest.fixture(scope="module")
def separate_process_run(tmp_path_factory):
    """A disaggregated run in its own process: its embedded Ray is sized by cluster.num_cpus=3
    (env, rollout and actor each get a CPU slot). Every process that Ray starts inherits the
    run's environment, so a marker variable finds them, and only them (other Ray instances on
    this machine do not carry it). Returns (exit code, output, run dir, process names seen while
    it ran, processes still alive after it exited)."""
    tmp = tmp_path_factory.mktemp("separate")
    marker = uuid.uuid4().hex
    env = dict(os.environ, RLWEAVE_TEST_MARKER=marker)
    run_dir = tmp / "dis"
    args = ["train", "ppo-cartpole", "placement.mode=disaggregated", "cluster.num_cpus=3", "env.num_envs=4",
            "train.rollout_steps=32", "train.total_env_steps=256", *QUIET, f"run.dir={run_dir}"]
    code = f"import sys; from rlweave.cli import main; sys.exit(main({args!r}))"
    log = tmp / "out.txt"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=f, stderr=subprocess.STDOUT,
                                cwd=str(REPO_ROOT))
        seen: set[str] = set()
        while proc.poll() is None:
            seen |= {p.info["name"] for p in _marked(marker) if p.pid != proc.pid}
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    _, alive = psutil.wait_procs(_marked(marker), timeout=20)
    return proc.returncode, log.read_text(), run_dir, seen, [(p.pid, p.info["name"]) for p in alive]


def test_disaggregated_placement_run(separate_process_run):
    rc, out, run_dir, _, _ = separate_process_run
    assert rc == 0, out[-3000:]
    assert "[rlweave] embedded Ray, 1 node(s), 3 cpu slot(s)" in out
    assert "[rlweave] placement disaggregated (cpu slots): env[1]@node0:0  rollout[1]@node0:1  actor[1]@node0:2" in out
    derived = OmegaConf.load(run_dir / "config.yaml").placement.derived
    assert derived.mode == "disaggregated"
    assert OmegaConf.to_container(derived.groups) == {
        "env": ["node0:0"], "rollout": ["node0:1"], "actor": ["node0:2"]}
    rows = read_metrics(run_dir)
    assert [(r["iteration"], r["env_steps"]) for r in rows] == [(1, 128), (2, 256)]


def test_no_ray_processes_left_behind(separate_process_run):
    rc, out, _, seen, alive = separate_process_run
    assert rc == 0, out[-3000:]
    # the marker does find Ray's own processes while the run is up
    assert {"raylet", "gcs_server"} <= seen, seen
    assert alive == [], f"still running after the run exited: {alive}"


def test_timeline_png_of_one_iteration(basic_run, tmp_path, capsys):
    _, _, run_dir = basic_run
    out = tmp_path / "timeline.png"
    assert main(["timeline", str(run_dir), "-o", str(out), "--iteration", "2"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["timeline", str(run_dir), "-o", str(out), "--iteration", "99"]) == 2
    assert "trace has 8 iterations, asked for iteration 99" in capsys.readouterr().err
