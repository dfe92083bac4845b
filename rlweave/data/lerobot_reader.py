"""Reading LeRobot v3 dataset folders as rlweave datasets (:class:`LeRobotEpisodes`: the interface
rlweave's dataset readers use for Minari datasets, so demonstrations, offline and off-policy
replay take either). The layout and what rlweave writes into it: :mod:`rlweave.data.lerobot_format`.

A frame's next observation is the next frame's; the last frame's is its own, as LeRobot's own RL
buffer does (the format stores no final observation). Camera features come back as uint8
``[H, W, 3]``: PNG image features decoded with Pillow, video features decoded with PyAV and picked
by the episode's ``from_timestamp`` plus the frame's ``timestamp``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Iterator

import gymnasium as gym
import numpy as np

from rlweave.data.lerobot_format import (INFO_PATH, INSTRUCTION_LEAF, TASKS_PATH, VIDEO_PATH, LeRobotEpisode,
                                         LeRobotFormatError)

__all__ = ["LeRobotEpisodes"]


class LeRobotEpisodes:
    """A LeRobot v3 dataset folder read as rlweave's readers read a Minari dataset:
    ``observation_space``, ``action_space``, ``total_episodes``, ``iterate_episodes()``. Foreign
    datasets (no ``rlweave`` entry in info.json) map ``observation.state`` to ``state`` and
    ``observation.images.<camera>`` to ``<camera>``; one observation feature alone is the array
    observation."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.info = json.loads((self.path / INFO_PATH).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise LeRobotFormatError(f"dataset {self.path}: cannot read {INFO_PATH}: {e}") from None
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith("v3."):
            raise LeRobotFormatError(f"dataset {self.path}: LeRobot codebase_version {version or '?'}; rlweave reads v3.x")
        feats = self.info["features"]
        meta = self.info.get("rlweave") or {}
        obs_names = [k for k in feats if k.startswith("observation.")]
        if "action" not in feats or not obs_names:
            raise LeRobotFormatError(f"dataset {self.path}: needs an 'action' and at least one 'observation.*' feature")
        self.leaves: dict[str, str | None] = meta.get("leaves") or (
            {obs_names[0]: None} if len(obs_names) == 1 else {k: k.rsplit(".", 1)[1] for k in obs_names})
        self.instruction_length = meta.get("instruction_length")
        spaces = {}
        for name, leaf in self.leaves.items():
            ft = feats[name]
            shape = tuple(ft["shape"])
            spaces[leaf] = (gym.spaces.Box(0, 255, shape, np.uint8) if ft["dtype"] in ("image", "video")
                            else gym.spaces.Box(-np.inf, np.inf, shape, np.float32))
        if self.instruction_length:
            spaces[INSTRUCTION_LEAF] = gym.spaces.Box(0, 255, (int(self.instruction_length),), np.uint8)
        self.observation_space = spaces[None] if None in spaces else gym.spaces.Dict(spaces)
        act_shape = tuple(meta.get("action_shape") or feats["action"]["shape"])
        self.action_space = gym.spaces.Box(-np.inf, np.inf, act_shape, np.float32)
        self.total_episodes = int(self.info["total_episodes"])
        self.total_steps = int(self.info["total_frames"])

    def _tasks(self) -> dict[int, str]:
        import pyarrow.parquet as pq

        table = pq.read_table(self.path / TASKS_PATH)
        index_col = next((c for c in table.column_names if c != "task_index"), None)
        return {int(i): str(t) for i, t in zip(table.column("task_index").to_pylist(), table.column(index_col).to_pylist())}

    def _frames(self) -> dict[str, np.ndarray]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted((self.path / "data").glob("*/*.parquet"))
        if not files:
            raise LeRobotFormatError(f"dataset {self.path}: no data/*/*.parquet files")
        table = pa.concat_tables([pq.read_table(f) for f in files])
        out: dict[str, np.ndarray] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            ft = self.info["features"].get(name, {})
            if ft.get("dtype") == "image":
                out[name] = np.stack([_decode_png(b) for b in col.field("bytes").to_pylist()])
            elif pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
                out[name] = np.stack([np.asarray(r) for r in col.to_pylist()]) if len(col) else np.zeros((0, 1))
            else:
                out[name] = col.to_numpy(zero_copy_only=False)
            if ft and ft.get("dtype") != "image":  # shape-(1,) features are flat [N] here
                shape = [] if list(ft["shape"]) == [1] else ft["shape"]
                out[name] = out[name].reshape(len(out[name]), *shape)
        videos = [k for k, ft in self.info["features"].items() if ft.get("dtype") == "video" and k in self.leaves]
        if videos:
            out.update(self._video_frames(videos, out["episode_index"], out["timestamp"]))
        return out

    def _video_frames(self, names: list[str], episode: np.ndarray, timestamp: np.ndarray) -> dict[str, np.ndarray]:
        """Each row's frame of each video feature: the frame at the episode's ``from_timestamp``
        plus the row's ``timestamp`` in the episode's mp4 file (each file decoded once)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from rlweave.data.lerobot_video import read_video

        meta = pa.concat_tables([pq.read_table(f) for f in sorted((self.path / "meta/episodes").glob("*/*.parquet"))])
        rows = {int(e["episode_index"]): e for e in meta.to_pylist()}
        fps = float(self.info["fps"])
        template = self.info.get("video_path") or VIDEO_PATH
        out = {}
        for name in names:
            decoded: dict[tuple[int, int], np.ndarray] = {}
            frames = np.empty((len(episode), *self.info["features"][name]["shape"]), np.uint8)
            for i, (ep, ts) in enumerate(zip(episode.reshape(-1), timestamp.reshape(-1))):
                e = rows.get(int(ep))
                if e is None:
                    raise LeRobotFormatError(f"dataset {self.path}: episode {int(ep)} has no row in meta/episodes")
                key = (int(e[f"videos/{name}/chunk_index"]), int(e[f"videos/{name}/file_index"]))
                if key not in decoded:
                    decoded[key] = read_video(self.path / template.format(video_key=name, chunk_index=key[0], file_index=key[1]))
                index = int(round((float(e[f"videos/{name}/from_timestamp"]) + float(ts)) * fps))
                video = decoded[key]
                if not 0 <= index < len(video):
                    raise LeRobotFormatError(f"dataset {self.path}: {name} has no frame at {index / fps:.3f} s "
                                             f"(episode {int(ep)}; the file holds {len(video)} frames)")
                frames[i] = video[index]
            out[name] = frames
        return out

    def iterate_episodes(self) -> Iterator[LeRobotEpisode]:
        from rlweave.envs.manipulation import encode_instruction

        frames = self._frames()
        tasks = self._tasks()
        order = np.lexsort((frames["frame_index"], frames["episode_index"]))
        frames = {k: v[order] for k, v in frames.items()}
        episodes, starts = np.unique(frames["episode_index"], return_index=True)
        ends = list(starts[1:]) + [len(frames["episode_index"])]
        for ep, a, b in zip(episodes, starts, ends):
            n = b - a
            task = tasks.get(int(frames["task_index"][a]), "")
            obs = {}
            for name, leaf in self.leaves.items():
                v = frames[name][a:b].reshape(n, *self.observation_space[leaf].shape) if leaf is not None else \
                    frames[name][a:b].reshape(n, *self.observation_space.shape)
                obs[leaf] = np.concatenate([v, v[-1:]]).astype(np.uint8 if v.dtype == np.uint8 else np.float32)
            if self.instruction_length:
                obs[INSTRUCTION_LEAF] = np.repeat(encode_instruction(task, int(self.instruction_length))[None], n + 1, 0)
            done = frames["next.done"][a:b].astype(bool).reshape(n) if "next.done" in frames else np.arange(n) == n - 1
            # foreign data without next.terminated: a done frame counts as a termination
            term = frames["next.terminated"][a:b].astype(bool).reshape(n) if "next.terminated" in frames else done
            infos = {"success": frames["next.success"][a:b].astype(bool).reshape(n)} if "next.success" in frames else {}
            rewards = frames["next.reward"][a:b].astype(np.float32).reshape(n) if "next.reward" in frames else np.zeros(n, np.float32)
            yield LeRobotEpisode(int(ep), obs[None] if None in obs else obs,
                                 frames["action"][a:b].astype(np.float32).reshape(n, *self.action_space.shape),
                                 rewards, term, done & ~term, infos, task)


def _decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
