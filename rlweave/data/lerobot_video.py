"""Camera streams of LeRobot v3 datasets as mp4 files, with PyAV (FFmpeg's libraries).

Why video: LeRobot stores cameras as video (``dtype: video`` features; episodes concatenated in
``videos/<camera>/chunk-XXX/file-YYY.mp4``, each episode's span given by ``from_timestamp`` /
``to_timestamp`` in the episodes metadata), a tenth or less of the bytes of PNG frames, and that is
what other tools expect of robot datasets. Encoding follows LeRobot's defaults (AV1 by SVT-AV1,
yuv420p, a key frame every 2 frames, crf 30); it is lossy, so rlweave's own round trips that must
be exact (simulated demonstrations) can keep PNG frames instead (``images="png"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["VideoWriter", "read_video", "require_av"]

CODEC = "libsvtav1"
OPTIONS = {"g": "2", "crf": "30", "preset": "12"}


def require_av():
    try:
        import av
    except ImportError:
        raise ImportError("LeRobot videos need PyAV: pip install 'rlweave[robot]' (or write PNG frames: --images png)") from None
    return av


class VideoWriter:
    """One camera's mp4 file: episodes are appended one after another; :meth:`add` returns the
    episode's ``(from_timestamp, to_timestamp)`` in the file."""

    def __init__(self, path: str | Path, fps: int, height: int, width: int, codec: str = CODEC):
        av = require_av()
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration to stderr otherwise
        self.path, self.fps, self.frames = Path(path), int(fps), 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), "w")
        options = dict(OPTIONS) if codec == CODEC else {k: v for k, v in OPTIONS.items() if k != "preset"}
        self._stream = self._container.add_stream(codec, self.fps, options=options)
        self._stream.pix_fmt = "yuv420p"
        self._stream.width, self._stream.height = int(width), int(height)
        self._av = av

    def add(self, frames: np.ndarray) -> tuple[float, float]:
        start = self.frames
        for image in frames:
            frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
            self.frames += 1
        return start / self.fps, self.frames / self.fps

    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def close(self) -> None:
        for packet in self._stream.encode():  # flush the encoder's delayed frames
            self._container.mux(packet)
        self._container.close()

    def info(self) -> dict:
        """The ``info`` entry LeRobot keeps on a video feature."""
        return {"video.height": self._stream.height, "video.width": self._stream.width, "video.codec": "av1"
                if self._stream.codec_context.name == CODEC else self._stream.codec_context.name,
                "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": self.fps, "video.channels": 3,
                "has_audio": False}


def read_video(path: str | Path) -> np.ndarray:
    """Every frame of an mp4 file, in order, as uint8 ``[N, H, W, 3]``."""
    av = require_av()
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path}: no video frames")
    return np.stack(frames)
