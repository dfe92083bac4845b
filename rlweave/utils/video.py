"""Episode videos a person can watch: camera frames, upscaled, with what the episode was about.

An evaluation's camera images are small (64x64 is typical for policies trained from pixels), so
each frame is upscaled by an integer factor with nearest-neighbour sampling (no blur: the video
shows exactly the pixels the policy saw). The text goes on strips above and below the image, not
over it, so no part of the camera view is hidden: the instruction on top, the step at the bottom,
and on the last frame the bottom strip turns green ("success") or red ("failure").

GIF is the default because it needs nothing beyond Pillow (imageio's ``pillow`` plugin): it plays
in browsers, notebooks, W&B and GitHub without a codec or an ``ffmpeg`` binary. MP4 (much smaller
for long episodes) is written when ``imageio-ffmpeg`` is importable.

Cost: Pillow's GIF writer quantizes every RGB frame to a palette by median cut, which at 256x256
costs about as much as 20 MuJoCo renders. Here the episode gets one palette (median cut over a
mosaic of up to 16 of its raw frames, plus the strip colours), each raw frame is mapped to it
*before* upscaling (16x fewer pixels at scale 4), and the strips are drawn straight in palette
indices (no anti-aliasing), so the writer receives ready index images.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["VideoError", "mp4_available", "write_episode_video"]

# palette indices 0-3: the strips' colours (the rest of the palette is the episode's own)
STRIP, TEXT, SUCCESS, FAILURE = 0, 1, 2, 3
_STRIP_RGB = [(32, 32, 32), (245, 245, 245), (30, 150, 60), (190, 40, 40)]
_SUFFIXES = {"gif": ".gif", "mp4": ".mp4"}
_MOSAIC_FRAMES = 16


class VideoError(ValueError):
    """Frames that cannot be written, or a format that is not installed; the message says which."""


def mp4_available() -> bool:
    """Whether MP4 can be written: imageio's ffmpeg plugin finds its binary through ``imageio-ffmpeg``."""
    return importlib.util.find_spec("imageio_ffmpeg") is not None


def write_episode_video(
    path: str | Path,
    frames: Sequence[np.ndarray],
    instruction: str | None = None,
    success: bool | None = None,
    fps: float = 15.0,
    format: str = "auto",  # noqa: A002 - the word users know from imageio
    min_size: int = 256,
) -> Path:
    """Writes one episode's ``frames`` (uint8 ``[H, W, 3]``, all the same size) as a video and
    returns the path written.

    ``format``: ``"gif"``, ``"mp4"`` or ``"auto"``. With ``"auto"`` a ``.gif`` suffix of ``path``
    means GIF; otherwise MP4 is preferred when ``imageio-ffmpeg`` is installed, GIF when not (so an
    ``.mp4`` path without it still gets a video, as GIF). The returned path's suffix always matches
    the format. Asking for ``"mp4"`` when it cannot be written is an error. Frames are upscaled by
    the smallest integer factor that makes both sides at least ``min_size``. ``success`` ``None``
    (the env reports no success) leaves the last frame's strip grey. The last frame is held for a
    second, so the outcome can be read before a viewer loops the video."""
    fmt = _choose_format(Path(path), format)
    out = _with_suffix(Path(path), _SUFFIXES[fmt])
    frames = _checked(frames)
    h, w = frames[0].shape[:2]
    scale = max(1, math.ceil(min_size / min(h, w)))
    palette = _palette(frames)
    header = _header(instruction, w * scale)
    footers = [_footer(f"step {t}/{len(frames) - 1}", w * scale, t == len(frames) - 1, success)
               for t in range(len(frames))]
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        import imageio.v3 as iio

        lut = _palette_image(palette)
        images = [_stack(header, _upscale(_indices(f, lut), scale), foot) for f, foot in zip(frames, footers)]
        # per-frame delays in ms: GIF counts 1/100 s, and browsers play delays under 20 ms at 100 ms
        step_ms = max(20, int(round(100.0 / max(fps, 1e-3))) * 10)
        durations = [step_ms] * (len(images) - 1) + [max(step_ms, 1000)]
        iio.imwrite(out, np.stack(images), extension=".gif", plugin="pillow", is_batch=True, mode="L",
                    palette=palette.tobytes(), duration=durations, loop=0)
    else:
        import imageio.v2 as iio2  # the ffmpeg plugin is imageio's legacy (v2) writer

        rgb = palette.reshape(-1, 3)
        images = [_stack(rgb[header] if header is not None else None, _upscale(f, scale), rgb[foot])
                  for f, foot in zip(frames, footers)]
        images += [images[-1]] * (max(1, int(round(fps))) - 1)  # one rate for all frames: hold by repeating
        iio2.mimwrite(out, _even(np.stack(images)), format="FFMPEG", fps=fps, macro_block_size=1)
    return out


# --------------------------------------------------------------------------- format and path
def _choose_format(path: Path, format: str) -> str:  # noqa: A002
    if format not in ("auto", "gif", "mp4"):
        raise VideoError(f"video format: expected 'auto', 'gif' or 'mp4', got {format!r}")
    if format == "mp4" and not mp4_available():
        raise VideoError("video format 'mp4' needs imageio-ffmpeg (pip install imageio-ffmpeg); 'gif' needs nothing")
    if format != "auto":
        return format
    if path.suffix.lower() == ".gif":
        return "gif"
    return "mp4" if mp4_available() else "gif"


def _with_suffix(path: Path, suffix: str) -> Path:
    """``path`` ending in ``suffix``: a video suffix is replaced, anything else (a checkpoint name
    with dots) is kept and the suffix appended."""
    if path.suffix.lower() in _SUFFIXES.values():
        return path.with_suffix(suffix)
    return path.with_name(path.name + suffix)


def _checked(frames: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(frames) == 0:
        raise VideoError("no frames to write")
    out = [np.asarray(f) for f in frames]
    first = out[0]
    if first.dtype != np.uint8 or first.ndim != 3 or first.shape[2] != 3:
        raise VideoError(f"frames must be uint8 [H, W, 3]; got {first.dtype} {first.shape}")
    for t, f in enumerate(out):
        if f.shape != first.shape or f.dtype != np.uint8:
            raise VideoError(f"frame {t}: {f.dtype} {f.shape}, the first frame is uint8 {first.shape}")
    return out


# --------------------------------------------------------------------------- palette
def _palette(frames: list[np.ndarray]) -> np.ndarray:
    """256 distinct RGB entries (uint8 ``[768]``): the strip colours, then a median cut of a mosaic
    of up to 16 evenly spaced frames, then filler. Distinct, because Pillow's GIF writer matches a
    given palette's entries by colour."""
    from PIL import Image

    picks = frames[:: max(1, len(frames) // _MOSAIC_FRAMES)][:_MOSAIC_FRAMES]
    mosaic = Image.fromarray(np.concatenate(picks, axis=0))
    q = mosaic.quantize(colors=256 - len(_STRIP_RGB), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    used = sorted({i for _, i in q.getcolors(256)})
    raw = np.asarray(q.getpalette("RGB"), dtype=np.uint8).reshape(-1, 3)
    entries: list[tuple[int, int, int]] = []
    seen: set[tuple[int, int, int]] = set()
    for colour in list(_STRIP_RGB) + [tuple(int(c) for c in raw[i]) for i in used]:
        if colour not in seen:
            seen.add(colour)
            entries.append(colour)
    g = 0
    while len(entries) < 256:  # filler: greys not yet present (any distinct colour would do)
        c = (g % 256, g % 256, (g // 256) % 256)
        g += 1
        if c not in seen:
            seen.add(c)
            entries.append(c)
    return np.asarray(entries, dtype=np.uint8).reshape(-1)


def _palette_image(palette: np.ndarray):
    from PIL import Image

    lut = Image.new("P", (1, 1))
    lut.putpalette(palette.tobytes())
    return lut


def _indices(frame: np.ndarray, lut) -> np.ndarray:
    """Each pixel's nearest palette entry (no dithering: dots that flicker from frame to frame)."""
    from PIL import Image

    return np.asarray(Image.fromarray(frame).quantize(palette=lut, dither=Image.Dither.NONE))


def _upscale(image: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(image, scale, axis=0), scale, axis=1) if scale > 1 else image


def _stack(header: np.ndarray | None, body: np.ndarray, footer: np.ndarray) -> np.ndarray:
    return np.concatenate(([header] if header is not None else []) + [body, footer], axis=0)


# --------------------------------------------------------------------------- strips
def _font(size: int):
    """Pillow's default font, at ``size`` where this Pillow can scale it (FreeType), else its bitmap."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()


def _strip(width: int, lines: int):
    """A blank strip of ``lines`` text lines, as an index image, its draw handle, font and line height."""
    from PIL import Image, ImageDraw

    font = _font(max(11, width // 22))
    probe = ImageDraw.Draw(Image.new("L", (1, 1)))
    left, top, right, bottom = probe.textbbox((0, 0), "Ag", font=font)
    line_h = int(bottom) + 3
    img = Image.new("L", (width, line_h * lines + 6), STRIP)
    draw = ImageDraw.Draw(img)
    draw.fontmode = "1"  # no anti-aliasing: every pixel is one of the strip's palette indices
    return img, draw, font, line_h


def _header(instruction: str | None, width: int, max_lines: int = 3) -> np.ndarray | None:
    """The instruction, word-wrapped to the video's width (at most ``max_lines`` lines)."""
    if not instruction:
        return None
    img, draw, font, line_h = _strip(width, 1)
    lines: list[str] = []
    for word in instruction.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width - 8:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] += " ..."
    img, draw, font, line_h = _strip(width, len(lines))
    for k, line in enumerate(lines):
        draw.text((4, 3 + k * line_h), line, fill=TEXT, font=font)
    return np.asarray(img)


def _footer(label: str, width: int, last: bool, success: bool | None) -> np.ndarray:
    """The step counter; on the last frame, on a green or red strip saying how the episode ended."""
    img, draw, font, _ = _strip(width, 1)
    if last and success is not None:
        draw.rectangle((0, 0, width, img.height), fill=SUCCESS if success else FAILURE)
        draw.text((4, 3), "success" if success else "failure", fill=TEXT, font=font)
    draw.text((width - 4 - draw.textlength(label, font=font), 3), label, fill=TEXT, font=font)
    return np.asarray(img)


def _even(frames: np.ndarray) -> np.ndarray:
    """Pads height and width to even sizes: H.264 in yuv420p cannot encode odd ones."""
    _, h, w, _ = frames.shape
    if h % 2 == 0 and w % 2 == 0:
        return frames
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
