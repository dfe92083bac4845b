"""Experiment trackers (run.loggers): W&B in offline mode and MLflow with a file store under the run
folder get every metrics.jsonl record at its step, exactly once, across a stop, a crash and two
resumes, in one tracker run; a missing package, an unreachable server or a failing client costs one
warning line, never the run; an unknown name is refused before anything starts."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from helpers import read_metrics, run_cli
from rlweave.cli import _runner_class
from rlweave.config import load_config
from rlweave.utils.trackers import TRACKERS, RunInfo, Tracker, Trackers

# CartPole PPO in one process (no Ray): 64 env steps an iteration, 6 iterations, a few seconds
FAST = ["cluster.local=true", "env.num_envs=4", "train.rollout_steps=16", "train.total_env_steps=384", "train.eval_every=2",
        "train.eval_episodes=1", "train.checkpoint_every=2", "algorithm.epochs=1", "algorithm.minibatch_size=64",
        "policy.hidden=[16,16]", "run.progress=false"]


@pytest.fixture
def tracker_env(monkeypatch):
    """No network: W&B offline, MLflow's default store (the run folder), quiet clients."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def _runner(run_dir: Path, *overrides: str, recipe: str = "ppo-cartpole"):
    cfg = load_config(recipe, [*FAST, *overrides, f"run.dir={run_dir}"])
    return _runner_class(cfg.runner)(cfg, run_dir)


def _stopped_crashed_resumed(run_dir: Path, *overrides: str) -> list[int]:
    """Stops at iteration 2 (checkpoint 2), resumes and crashes after iteration 3 (newest checkpoint
    still 2: iteration 3 is re-run by the next resume), resumes to the end. Returns the steps of
    metrics.jsonl (env_steps)."""
    def stop(runner, record):
        if runner.iteration == 2:
            runner.request_stop("test stop")

    _runner(run_dir, *overrides).run(on_iteration=stop)

    def crash(runner, record):
        if runner.iteration == 3:
            raise RuntimeError("driver crash")

    cfg = load_config("ppo-cartpole", [*FAST, *overrides, f"run.dir={run_dir}"])
    with pytest.raises(RuntimeError, match="driver crash"):
        _runner_class(cfg.runner)(cfg, run_dir, resume=True).run(on_iteration=crash)
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2, 3]  # iteration 3 reached the trackers
    rc, out = run_cli("resume", str(run_dir))
    assert rc == 0, out
    steps = [r["env_steps"] for r in read_metrics(run_dir)]
    assert steps == [64 * i for i in range(1, 7)]
    return steps


# --------------------------------------------------------------------------- W&B's own files
def _wandb_records(path: Path):
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (32 KiB blocks, 7-byte record
    headers, a record split over blocks as FIRST/MIDDLE/LAST) of ``wandb_internal_pb2.Record``
    protobufs. The Python client no longer ships a reader (its core reads them), so this is one."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), path
    pos, parts, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0:  # zero padding to the block's end
            pos += left - 7
            continue
        chunk, pos = data[pos : pos + length], pos + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            yield rec


def _wandb_history(run_dir: Path) -> tuple[set[str], list[dict], dict]:
    """(run ids, history rows in logging order, config) over every offline part of the run.
    W&B's service (one per process, here the test's) writes a run's file after ``run.finish()``
    returns; its teardown waits for every write, so the files are read after it."""
    import wandb

    wandb.teardown()
    ids, rows, config = set(), [], {}
    parts = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)
    for path in parts:
        for rec in _wandb_records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
            elif kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
            elif kind == "config":
                config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.config.update})
    return ids, rows, config


def test_wandb_offline_run_stopped_and_resumed_is_one_run_with_each_step_once(tracker_env, tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    steps = _stopped_crashed_resumed(run_dir, "run.loggers=[tensorboard,wandb]", "run.name=cartpole-a", "run.tags=[smoke]")
    ids, rows, config = _wandb_history(run_dir)
    assert len(ids) == 1 and len(list((run_dir / "wandb").glob("offline-run-*"))) == 3  # three parts, one run id
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"] == next(iter(ids))
    logged = [r["_step"] for r in rows]
    assert logged == steps  # in order, none twice: the re-run iteration 3 was not sent again
    evals = [r["_step"] for r in rows if "eval/episode_return" in r]
    assert evals == [r["env_steps"] for r in read_metrics(run_dir) if "eval/episode_return" in r]
    assert config["placement"]["derived"]["flow"]["mode"] == "collocated"  # the derived placement
    assert config["algorithm"]["name"] == "ppo"
    assert any(k.startswith("curves/") for r in rows for k in r)  # the learning-curve image, with its file
    assert list((run_dir / "wandb").glob("offline-run-*/files/media/images/curves_*.png"))
    # TensorBoard took the re-run iteration again and hid the first attempt's (purge_step)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/episode_return")] == steps
    assert [e.value for e in acc.Scalars("train/episode_return")] == pytest.approx(
        [r["train/episode_return"] for r in read_metrics(run_dir)])


def test_mlflow_file_store_run_stopped_and_resumed_is_one_run_with_each_step_once(tracker_env, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    steps = _stopped_crashed_resumed(run_dir, "run.loggers=[mlflow]", "run.name=cartpole-b", "run.group=smoke")
    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    assert (run.info.run_name, run.data.tags["group"], run.info.status) == ("cartpole-b", "smoke", "FINISHED")
    history = client.get_metric_history(run.info.run_id, "train/episode_return")
    assert sorted(m.step for m in history) == steps  # each step once
    evals = client.get_metric_history(run.info.run_id, "eval/episode_return")
    assert sorted(m.step for m in evals) == [r["env_steps"] for r in read_metrics(run_dir) if "eval/episode_return" in r]
    assert run.data.params["placement.derived.flow.mode"] == "collocated" and run.data.params["algorithm.name"] == "ppo"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "curves"} <= artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "curves")] == ["curves/curves.png"]


def test_restart_after_a_worker_failure_sends_no_step_twice(tracker_env, tmp_path):
    """A worker process dies after iteration 3 (newest checkpoint: 2): the groups are rebuilt and
    iteration 3 runs again; MLflow keeps its first copy, TensorBoard takes the new one."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlweave.cluster.errors import PROCESS_DIED, WorkerError

    run_dir = tmp_path / "run"
    runner = _runner(run_dir, "run.loggers=[tensorboard,mlflow]")
    after = runner._after_iteration

    def dies_once(record):
        if runner.iteration == 3 and not runner.restarts:
            raise WorkerError("env", 0, "collect", PROCESS_DIED)
        after(record)

    runner._after_iteration = dies_once
    runner.run()
    assert runner.restarts == 1
    steps = [r["env_steps"] for r in read_metrics(run_dir)]
    assert steps == [64 * i for i in range(1, 7)]
    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/episode_return")) == steps
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/episode_return")] == steps


def test_media_reach_wandb_and_mlflow(tracker_env, tmp_path):
    """Images, videos (e.g. evaluation episodes, where a run records them) and tables."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(tmp_path / "episode.gif", save_all=True, append_images=frames[1:])
    frames[0].save(tmp_path / "img.png")
    info = RunInfo(run_dir=tmp_path, name="media", group=None, tags=[], project=None, config={"seed": 0})
    trackers = Trackers(["wandb", "mlflow"], info, "env_steps")
    trackers.log({"iteration": 1, "env_steps": 5, "train/x": 1.0})
    trackers.log_image("curves", tmp_path / "img.png", 5)
    trackers.log_video("eval/video", tmp_path / "episode.gif", 5)
    trackers.log_table("eval/samples", ["prompt", "response", "reward"], [["1+1=", "2", 1.0]], 5)
    ids = trackers.state()
    trackers.close()
    assert set(ids) == {"wandb", "mlflow"}
    media = {p.parent.name for p in (tmp_path / "wandb").glob("offline-run-*/files/media/*/*")}
    assert media == {"images", "videos", "table"}
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    rid = ids["mlflow"]["run_id"]
    assert [a.path for a in client.list_artifacts(rid, "eval/video/step_0000000005")] == ["eval/video/step_0000000005/episode.gif"]
    assert [a.path for a in client.list_artifacts(rid, "eval/samples")] == ["eval/samples/step_0000000005.json"]


# --------------------------------------------------------------------------- never stop training
def test_missing_package_and_unreachable_server_cost_one_warning_each(tracker_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if rlweave[wandb] were not installed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    run_dir = tmp_path / "run"
    _runner(run_dir, "run.loggers=[tensorboard,wandb,mlflow]").run()
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning: run.loggers" in line]
    assert len(warnings) == 2, err
    assert "wandb cannot start: wandb is not installed (pip install 'rlweave[wandb]')" in warnings[0]
    assert "mlflow cannot start: MLflow server 127.0.0.1:9 cannot be reached" in warnings[1]
    assert len(read_metrics(run_dir)) == 6  # the run went on to its end
    assert list(run_dir.glob("events.out.tfevents.*"))  # with the logger that works


class _Flaky(Tracker):
    """Raises on its second record."""

    name = "flaky"
    seen: list[int] = []

    def __init__(self, info: RunInfo) -> None:
        type(self).seen = []

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if len(self.seen) == 1:
            raise ConnectionError("server went away\nsecond line")
        self.seen.append(step)

    def close(self, status: str) -> None:
        pass


class _Keeper(_Flaky):
    name = "keeper"
    kept: list[int] = []

    def __init__(self, info: RunInfo) -> None:
        type(self).kept = []

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.kept.append(step)


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(TRACKERS, "flaky", _Flaky)
    monkeypatch.setitem(TRACKERS, "keeper", _Keeper)
    info = RunInfo(run_dir=tmp_path, name="r", group=None, tags=[], project=None, config={})
    trackers = Trackers(["flaky", "keeper"], info, "env_steps")
    for step in (10, 20, 30):
        trackers.log({"iteration": step // 10, "env_steps": step, "train/x": 1.0})
    trackers.close()
    err = capsys.readouterr().err.splitlines()
    assert err == ["[rlweave] warning: run.loggers: flaky failed: server went away; the run continues without it"]
    assert _Flaky.seen == [10] and _Keeper.kept == [10, 20, 30]


def test_unknown_logger_is_refused_before_start(tmp_path, capsys):
    rc, _ = run_cli("train", "ppo-cartpole", *FAST, "run.loggers=[tensorboard,neptune]", f"run.dir={tmp_path / 'r'}")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "rlweave: error: run.loggers: 'neptune' is not one of tensorboard, wandb, mlflow"
    assert not (tmp_path / "r").exists()


def test_tensorboard_false_still_turns_tensorboard_off(tmp_path):
    cfg = load_config("ppo-cartpole", [*FAST, "run.tensorboard=false", "run.loggers=[tensorboard,mlflow]"])
    assert _runner_class(cfg.runner)(cfg, tmp_path / "r").loggers == ["mlflow"]


# --------------------------------------------------------------------------- language models
def test_llm_run_logs_a_samples_table_per_evaluation_at_the_iteration(tracker_env, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    tiny = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
            "model.intermediate_size=64", "model.vocab_size=300", "run.progress=false", "task.eval_prompts=8",
            "cluster.num_cpus=2", "cluster.local=true", "init.sft_recipe=null", "rollout.prompts_per_iteration=4",
            "algorithm.group_size=2", "rollout.max_new_tokens=4", "train.total_iterations=2", "train.eval_every=1",
            "train.checkpoint_every=1", "run.loggers=[mlflow]", f"run.dir={tmp_path / 'lm'}"]
    cfg = load_config("grpo-arith", tiny)
    _runner_class(cfg.runner)(cfg, tmp_path / "lm").run()
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'lm' / 'mlruns'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")) == [0, 1, 2]  # the iteration
    tables = sorted(a.path for a in client.list_artifacts(run.info.run_id, "eval/samples"))
    assert tables == ["eval/samples/step_0000000001.json", "eval/samples/step_0000000002.json"]
    local = client.download_artifacts(run.info.run_id, tables[0], str(tmp_path / "dl"))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == ["prompt", "response", "reward"] and 1 <= len(table["data"]) <= 8
    assert all(isinstance(p, str) and p and isinstance(r, float) for p, _, r in table["data"])
