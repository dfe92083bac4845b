"""Loads a LeRobot v3 dataset folder with LeRobot's own reader (PyPI ``lerobot-dataset``, module
``ledataset``) and prints what it read as JSON, for tests/test_lerobot_format.py to compare with
rlweave's reader. Run under .venv-lerobot (it pins datasets/numpy versions that rlweave's
environment does not have); it imports nothing from rlweave.

PyPI has no torchvision built for the CPU torch this environment gets (its builds are for CUDA
torch: importing one fails on its C operators), and ``ledataset`` imports torchvision only to turn
PIL images into float tensors (``transforms.ToTensor``). That one conversion is given here as a
stand-in module; everything else is LeRobot's reader as published.

Usage: python lerobot_reader_check.py DATASET_DIR
"""

import json
import sys
import types

import numpy as np
import torch


def _to_tensor_stand_in() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except Exception:  # noqa: BLE001
        pass

    class ToTensor:  # torchvision's ToTensor on an RGB PIL image: float [C, H, W] in [0, 1]
        def __call__(self, image):
            return torch.from_numpy(np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0)

    import importlib.machinery

    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    tv.transforms = types.ModuleType("torchvision.transforms")
    tv.transforms.__spec__ = importlib.machinery.ModuleSpec("torchvision.transforms", None)
    tv.transforms.ToTensor = ToTensor
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = tv, tv.transforms


_to_tensor_stand_in()
from ledataset.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402


def main() -> None:
    ds = LeRobotDataset("local/rlweave-check", root=sys.argv[1])
    frames = [ds[i] for i in range(len(ds))]
    out = {"num_frames": ds.num_frames, "num_episodes": ds.num_episodes, "fps": ds.fps,
           "features": sorted(ds.features), "camera_keys": list(ds.meta.camera_keys),
           "tasks": sorted(set(f["task"] for f in frames)),
           "episode_lengths": [int(e["length"]) for e in ds.meta.episodes],
           "stats_keys": sorted(ds.meta.stats["action"]),
           "action": np.stack([f["action"].numpy() for f in frames]).tolist(),
           "reward": [float(f["next.reward"]) for f in frames]}
    for key in ds.meta.camera_keys:  # LeRobot hands images out as float [C, H, W] in [0, 1]
        out[key] = np.stack([f[key].numpy() for f in frames]).round(6).tolist()
    state = [k for k in ds.features if k == "observation.state"]
    if state:
        out["observation.state"] = np.stack([f["observation.state"].numpy() for f in frames]).tolist()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
