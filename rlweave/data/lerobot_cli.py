"""``rlweave export-lerobot DATASET -o DIR``: an rlweave (Minari) dataset as a LeRobot v3 dataset
folder (:mod:`rlweave.data.lerobot_format`). Registered by :mod:`rlweave.cli` in one call; the
parser imports nothing heavy, the command imports its implementation when it runs."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["add_lerobot_commands"]


def _export(args: Any) -> int:
    from rlweave.data.datasets import DatasetError
    from rlweave.data.lerobot_format import export_lerobot

    if args.fps is not None and args.fps < 1:
        print(f"rlweave export-lerobot: --fps: must be >= 1, got {args.fps}", file=sys.stderr)
        return 2
    try:
        info = export_lerobot(args.dataset, args.out, fps=args.fps, task=args.task, robot_type=args.robot_type,
                              images=args.images)
    except (DatasetError, ImportError) as e:
        print(f"rlweave export-lerobot: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


def add_lerobot_commands(sub: Any) -> None:
    s = sub.add_parser("export-lerobot", help="write a dataset (rlweave collect's) as a LeRobot v3 dataset folder: "
                                              "rlweave export-lerobot DATASET -o DIR")
    s.add_argument("dataset", help="a dataset folder made by rlweave collect (Minari format)")
    s.add_argument("-o", "--out", required=True, help="LeRobot dataset folder to create")
    s.add_argument("--fps", type=int, default=None, help="frames per second (default: the env's render_fps, else 30)")
    s.add_argument("--task", default=None, help="task text of episodes without an instruction (default: the env id)")
    s.add_argument("--robot-type", default=None, help="info.json's robot_type")
    s.add_argument("--images", choices=("video", "png"), default="video",
                   help="camera images as mp4 videos (LeRobot's default; lossy AV1) or lossless PNG frames in the parquet")
    s.set_defaults(fn=_export)
