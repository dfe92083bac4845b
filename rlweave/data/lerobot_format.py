"""Robot episodes in the LeRobot dataset format (v3.0): written from rlweave datasets, read back as
rlweave datasets for the offline and supervised recipes.

Why this format: it is what robot-learning code reads and writes (LeRobot's recorders, openpi's
and others' fine-tuning), so episodes rlweave collects (from a simulator now, from a robot later)
can be used elsewhere, and theirs here. The layout followed is LeRobot's ``v3.0``::

    meta/info.json                                  codebase_version, fps, features, totals, paths
    meta/stats.json                                 per feature: min, max, mean, std, count, q01..q99
    meta/tasks.parquet                              task string (index) -> task_index
    meta/episodes/chunk-000/file-000.parquet        one row per episode: length, tasks, where its rows are, its stats
    data/chunk-000/file-000.parquet                 one row per frame (episodes concatenated; a new file past
                                                    data_files_size_in_mb, a new chunk every chunks_size files)

Frames hold ``observation.state`` (float vector), camera images ``observation.images.<camera>``
(``images="video"``, the default: ``video`` features, one mp4 per camera and file,
:mod:`rlweave.data.lerobot_video`; ``images="png"``: ``image`` features, PNG bytes in the parquet,
lossless, the layout LeRobot writes when videos are off), ``action``, ``next.reward``, ``next.done``, ``next.success`` where the env
reports success, and the standard ``timestamp``/``frame_index``/``episode_index``/``index``/
``task_index``. The instruction of a manipulation observation becomes the frame's task. rlweave
also writes ``next.terminated`` (termination, as opposed to a time limit: what bootstrapping needs)
and, in ``info.json``, an ``rlweave`` entry mapping features back to observation leaves.

Read back (:class:`LeRobotEpisodes`, the interface rlweave's dataset readers use): a frame's
next observation is the next frame's; the last frame's is its own, as LeRobot's own RL buffer
does (the format stores no final observation).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import gymnasium as gym
import numpy as np

from rlweave.data.datasets import DatasetError

__all__ = ["CODEBASE_VERSION", "LeRobotEpisode", "LeRobotFormatError", "is_lerobot_dataset", "write_lerobot_dataset",
           "export_lerobot"]

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
VIDEO_FILE_MB = 200  # a video file is closed past this size
CHUNKS_SIZE = 1000  # files per chunk folder
DATA_FILE_MB = 100  # a data file is closed past this size
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
INSTRUCTION_LEAF = "instruction"
_INDEX_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
                   "task_index": "int64"}


class LeRobotFormatError(DatasetError):
    """A folder that is not a readable LeRobot v3 dataset, or episodes that cannot be written as one."""


def is_lerobot_dataset(path: str | Path) -> bool:
    return (Path(path) / INFO_PATH).is_file()


# ---------------------------------------------------------------------------------------- episodes
@dataclass
class LeRobotEpisode:
    """One episode as rlweave's readers take it (Minari's episode fields): ``observations`` has one
    row more than ``actions`` (see the module docstring for the last one)."""

    id: int
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict
    task: str


def _feature_of_leaf(leaf: str | None, shape: tuple, dtype: np.dtype) -> tuple[str, dict]:
    """The LeRobot feature of one observation leaf (None: the observation is one array)."""
    if dtype == np.uint8 and len(shape) == 3 and shape[-1] == 3:
        return f"observation.images.{leaf or 'image'}", {"dtype": "image", "shape": list(shape),
                                                         "names": ["height", "width", "channels"]}
    if len(shape) != 1:
        raise LeRobotFormatError(f"observation leaf {leaf or 'observation'}: shape {shape} is neither a vector nor an RGB image")
    name = "observation.state" if leaf in (None, "state") else f"observation.{leaf}"
    return name, {"dtype": "float32", "shape": [int(shape[0])], "names": None}


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _is_camera(ft: dict) -> bool:
    return ft.get("dtype") in ("image", "video")


def _stats(values: np.ndarray, image: bool = False) -> dict:
    """LeRobot's per-feature statistics of ``values`` [N, ...]: over frames (vectors) or over frames
    and pixels per channel, in [0, 1], shaped [C, 1, 1] (images)."""
    x = values.astype(np.float64)
    if image:
        x = x.reshape(-1, x.shape[-1]) / 255.0
    else:
        x = x.reshape(len(x), -1)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0), "count": np.array([len(values)])}
    for q in QUANTILES:
        out[f"q{int(round(q * 100)):02d}"] = np.quantile(x, q, axis=0)
    if image:
        out = {k: (v if k == "count" else v.reshape(-1, 1, 1)) for k, v in out.items()}
    return {k: v.tolist() for k, v in out.items()}


def _aggregate(parts: list[dict]) -> dict:
    """Dataset statistics from per-episode ones (nothing but the episodes' stats held in memory):
    exact min, max, count, mean and (pooled) std; quantiles as the count-weighted mean of the
    episodes' quantiles, as LeRobot aggregates them."""
    arr = [{k: np.asarray(v, np.float64) for k, v in p.items()} for p in parts]
    counts = np.array([float(a["count"][0]) for a in arr])
    w = (counts / counts.sum()).reshape(-1, *([1] * arr[0]["mean"].ndim))
    means = np.stack([a["mean"] for a in arr])
    mean = (w * means).sum(0)
    var = (w * (np.stack([a["std"] for a in arr]) ** 2 + means ** 2)).sum(0) - mean ** 2
    out = {"min": np.min([a["min"] for a in arr], 0), "max": np.max([a["max"] for a in arr], 0), "mean": mean,
           "std": np.sqrt(np.maximum(var, 0.0)), "count": np.array([int(counts.sum())])}
    for k in arr[0]:
        if k.startswith("q"):
            out[k] = (w * np.stack([a[k] for a in arr])).sum(0)
    return {k: v.tolist() for k, v in out.items()}


def write_lerobot_dataset(episodes: Iterable[LeRobotEpisode], out: str | Path, observation_space: gym.Space,
                          action_space: gym.Space, fps: int, robot_type: str | None = None,
                          data_file_mb: float = DATA_FILE_MB, images: str = "video") -> dict:
    """Writes ``episodes`` as a LeRobot v3 dataset folder at ``out`` (which must not exist);
    ``images``: camera images as ``"video"`` (mp4) or ``"png"`` (in the parquet). Returns the
    totals and the feature names written."""
    if images not in ("video", "png"):
        raise LeRobotFormatError(f"images: 'video' or 'png', got {images!r}")
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    if out.exists():
        raise LeRobotFormatError(f"{out}: already exists; choose another -o")
    leaves = dict(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else {None: observation_space}
    instruction_length = None
    obs_features: dict[str, tuple[str | None, dict]] = {}
    for leaf, space in leaves.items():
        if leaf == INSTRUCTION_LEAF:
            instruction_length = int(space.shape[0])
            continue
        name, ft = _feature_of_leaf(leaf, tuple(space.shape), np.dtype(space.dtype))
        if ft["dtype"] == "image" and images == "video":
            from rlweave.data.lerobot_video import require_av

            require_av()  # before anything is written
            ft = {**ft, "dtype": "video"}
        obs_features[name] = (leaf, ft)
    act_shape = tuple(getattr(action_space, "shape", ()) or (1,))
    features: dict[str, dict] = {name: ft for name, (_, ft) in obs_features.items()}
    features["action"] = {"dtype": "float32", "shape": [int(np.prod(act_shape))], "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.terminated"] = {"dtype": "bool", "shape": [1], "names": None}
    features.update({k: {"dtype": d, "shape": [1], "names": None} for k, d in _INDEX_FEATURES.items()})

    tasks: dict[str, int] = {}
    episode_rows: list[dict] = []
    stats_parts: dict[str, list] = {}
    has_success = None
    writer, file_rows, chunk_index, file_index, total = None, 0, 0, 0, 0
    videos: dict[str, Any] = {}  # camera feature -> [VideoWriter, chunk_index, file_index]
    out.mkdir(parents=True)
    try:
        for ep in episodes:
            n = len(ep.actions)
            if n == 0:
                continue
            ep_index = len(episode_rows)  # contiguous from 0, as LeRobot indexes episodes
            success = ep.infos.get("success") if ep.infos else None
            if has_success is None:
                has_success = success is not None
                if has_success:
                    features = {**{k: v for k, v in features.items() if k not in _INDEX_FEATURES},
                                "next.success": {"dtype": "bool", "shape": [1], "names": None},
                                **{k: v for k, v in features.items() if k in _INDEX_FEATURES}}
            task_index = tasks.setdefault(ep.task, len(tasks))
            cols: dict[str, Any] = {}
            for name, (leaf, ft) in obs_features.items():
                values = np.asarray(ep.observations if leaf is None else ep.observations[leaf])[:n]
                cols[name] = values
            cols["action"] = np.asarray(ep.actions, dtype=np.float32).reshape(n, -1)
            cols["next.reward"] = np.asarray(ep.rewards, dtype=np.float32).reshape(n)
            term = np.asarray(ep.terminations, dtype=bool).reshape(n)
            cols["next.done"] = term | np.asarray(ep.truncations, dtype=bool).reshape(n)
            cols["next.terminated"] = term
            if has_success:
                flags = np.asarray(success if success is not None else np.zeros(n), dtype=bool).reshape(-1)
                cols["next.success"] = flags[-n:]  # Minari keeps the reset's info first: the step infos are the last n
            frame = np.arange(n, dtype=np.int64)
            cols["timestamp"] = (frame / float(fps)).astype(np.float32)
            cols["frame_index"] = frame
            cols["episode_index"] = np.full(n, ep_index, dtype=np.int64)
            cols["index"] = total + frame
            cols["task_index"] = np.full(n, task_index, dtype=np.int64)
            table = _frames_table(cols, features, pa)
            if writer is not None and file_rows and writer_bytes(writer) > data_file_mb * 1024 * 1024:
                writer.close()
                writer, file_rows = None, 0
                file_index += 1
                if file_index == CHUNKS_SIZE:
                    chunk_index, file_index = chunk_index + 1, 0
            if writer is None:
                path = out / DATA_PATH.format(chunk_index=chunk_index, file_index=file_index)
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(path, table.schema, compression="snappy")
            writer.write_table(table)
            row = {"episode_index": ep_index, "tasks": [ep.task], "length": n, "data/chunk_index": chunk_index,
                   "data/file_index": file_index, "dataset_from_index": total, "dataset_to_index": total + n}
            for name in (k for k, ft in features.items() if ft["dtype"] == "video"):
                row.update(_add_video(videos, out, name, cols[name], fps))
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            ep_stats = {name: _stats(v, _is_camera(features[name])) for name, v in cols.items()}
            for name, st in ep_stats.items():
                stats_parts.setdefault(name, []).append(st)
            row.update({f"stats/{name}/{k}": v for name, s in ep_stats.items() for k, v in s.items()})
            episode_rows.append(row)
            file_rows += n
            total += n
    except BaseException:
        import shutil

        if writer is not None:
            writer.close()
        for video in videos.values():
            video[0].close()
        shutil.rmtree(out, ignore_errors=True)  # no half-written dataset left behind
        raise
    if writer is not None:
        writer.close()
    for name, video in videos.items():
        video[0].close()
        features[name]["info"] = video[0].info()
    if not episode_rows:
        raise LeRobotFormatError(f"{out}: no episode with a step to write")
    stats = {name: _aggregate(parts) for name, parts in stats_parts.items()}
    episodes_path = out / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episode_rows), episodes_path, compression="snappy")
    pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name=None)).to_parquet(out / TASKS_PATH)
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(episode_rows),
        "total_frames": total, "total_tasks": len(tasks), "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": int(data_file_mb), "video_files_size_in_mb": 200, "fps": int(fps),
        "splits": {"train": f"0:{len(episode_rows)}"}, "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if videos else None,
        "features": features,
        "rlweave": {"observation": "dict" if isinstance(observation_space, gym.spaces.Dict) else "array",
                    "leaves": {name: leaf for name, (leaf, _) in obs_features.items()},
                    "instruction_length": instruction_length, "action_shape": list(act_shape)},
    }
    (out / INFO_PATH).write_text(json.dumps(info, indent=4))
    (out / STATS_PATH).write_text(json.dumps(stats, indent=4))
    return {"episodes": len(episode_rows), "frames": total, "tasks": len(tasks), "fps": int(fps),
            "features": sorted(features), "path": str(out)}


def _add_video(videos: dict, out: Path, name: str, frames: np.ndarray, fps: int) -> dict:
    """Appends one episode's frames of camera feature ``name`` to its current mp4 (a new file past
    VIDEO_FILE_MB) and returns the episode's ``videos/<name>/...`` metadata."""
    from rlweave.data.lerobot_video import VideoWriter

    state = videos.get(name)
    if state is not None and state[0].size_bytes() > VIDEO_FILE_MB * 1024 * 1024:
        state[0].close()
        chunk, file = state[1], state[2] + 1
        if file == CHUNKS_SIZE:
            chunk, file = chunk + 1, 0
        state = None
    else:
        chunk, file = (state[1], state[2]) if state is not None else (0, 0)
    if state is None:
        path = out / VIDEO_PATH.format(video_key=name, chunk_index=chunk, file_index=file)
        state = videos[name] = [VideoWriter(path, fps, frames.shape[1], frames.shape[2]), chunk, file]
    start, end = state[0].add(frames)
    return {f"videos/{name}/chunk_index": chunk, f"videos/{name}/file_index": file,
            f"videos/{name}/from_timestamp": start, f"videos/{name}/to_timestamp": end}


def writer_bytes(writer: Any) -> int:
    """Bytes a parquet writer has put in its file so far."""
    return Path(writer.where).stat().st_size if isinstance(writer.where, (str, Path)) else 0


def _frames_table(cols: dict[str, np.ndarray], features: dict[str, dict], pa: Any) -> Any:
    """One episode's frames as an arrow table with the types LeRobot's reader maps its features to
    (``datasets``: fixed-size lists for vectors, ``{bytes, path}`` structs for images)."""
    arrays, names = [], []
    for name in features:
        if name not in cols:
            continue
        ft, v = features[name], cols[name]
        if ft["dtype"] == "video":  # in the mp4 files, not the parquet
            continue
        if ft["dtype"] == "image":
            arr = pa.StructArray.from_arrays([pa.array([_png(img) for img in v], pa.binary()),
                                              pa.array([None] * len(v), pa.string())], names=["bytes", "path"])
        elif v.ndim == 2 and list(ft["shape"]) != [1]:  # a shape-(1,) feature is a scalar column in LeRobot
            arr = pa.FixedSizeListArray.from_arrays(pa.array(v.astype(np.float32).reshape(-1)), v.shape[1])
        elif v.ndim == 2:
            arr = pa.array(v.reshape(-1).astype(np.float32))
        else:
            arr = pa.array(v)
        arrays.append(arr)
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


# ---------------------------------------------------------------------------------------- export
def export_lerobot(dataset: str | Path, out: str | Path, fps: int | None = None, task: str | None = None,
                   robot_type: str | None = None, images: str = "video") -> dict:
    """Writes the rlweave (Minari) dataset at ``dataset`` as a LeRobot v3 dataset at ``out``.
    ``fps``: frames per second (default: the env's ``render_fps``, else 30); ``task``: the task
    of episodes whose observations carry no instruction (default: the dataset's env id); ``images``:
    cameras as mp4 (``"video"``) or PNG frames in the parquet (``"png"``)."""
    from rlweave.data.datasets import open_dataset

    if is_lerobot_dataset(dataset):
        raise LeRobotFormatError(f"{dataset}: already a LeRobot dataset")
    ds = open_dataset(dataset)
    env_id = _env_id(ds)
    fps = int(fps or _env_fps(ds) or 30)
    default_task = task or env_id or Path(dataset).name

    def episodes() -> Iterator[LeRobotEpisode]:
        from rlweave.envs.manipulation import decode_instruction

        for ep in ds.iterate_episodes():
            obs = ep.observations
            text = default_task
            if isinstance(obs, dict) and INSTRUCTION_LEAF in obs:
                text = decode_instruction(np.asarray(obs[INSTRUCTION_LEAF])[0])
            infos = getattr(ep, "infos", None) or {}
            yield LeRobotEpisode(int(ep.id), obs, np.asarray(ep.actions), np.asarray(ep.rewards),
                                 np.asarray(ep.terminations), np.asarray(ep.truncations),
                                 {"success": np.asarray(infos["success"])} if "success" in infos else {}, text)

    return write_lerobot_dataset(episodes(), out, ds.observation_space, ds.action_space, fps, robot_type=robot_type,
                                 images=images)


def _env_id(ds: Any) -> str | None:
    spec = getattr(ds, "spec", None)
    env_spec = getattr(spec, "env_spec", None)
    return getattr(env_spec, "id", None)


def _env_fps(ds: Any) -> int | None:
    """The env's ``render_fps`` from its class, without making the env."""
    try:
        env_spec = ds.spec.env_spec
        creator = gym.envs.registration.load_env_creator(env_spec.entry_point)
        fps = getattr(creator, "metadata", {}).get("render_fps")
        return int(fps) if fps else None
    except Exception:  # noqa: BLE001 - any failure: the caller's default
        return None
