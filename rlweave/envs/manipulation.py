"""The contract every manipulation suite (MetaWorld, LIBERO, ManiSkill, ...) follows.

One env's observation is a flat ``gymnasium.spaces.Dict``:

* ``"image"``: ``Box(0, 255, (H, W, 3), uint8)``, the first camera, upright (top of the scene at
  row 0). Further cameras are ``"image_<camera name>"``, same layout. Absent without pixels.
* ``"state"``: ``Box(float32)``, proprioception only (e.g. end-effector xyz + gripper opening):
  what a real robot knows about itself. Object and goal positions are not in it.
* ``"instruction"``: ``Box(0, 255, (L,), uint8)`` (L = 64 for MetaWorld, 128 for LIBERO: the suite's), the task's language instruction as UTF-8 bytes,
  zero-padded (:func:`encode_instruction`). Text travels as an array, so channels, replay buffers,
  ``tree_stack`` and checkpoints carry it like any other leaf; models decode or tokenize it.
* ``"privileged"`` (optional): ``Box(float32)``, the simulator's full state, for scripted experts
  and diagnostics only. Models must ignore it: it does not exist on a real robot.

``info["success"]`` (bool) is set on every step and ``info["task_name"]`` names the task, so the
env layer reports success per task in multi-task runs. Actions are a ``Box`` in [-1, 1].

Rendering: MuJoCo's offscreen defaults (4x multisampling, shadows, reflections) cost about 15x at
64x64 on a CPU (llvmpipe; ~10 fps against ~150 fps measured) and carry nothing a policy needs.
:func:`fast_offscreen` must run BEFORE the render context is made (the buffer size and sample
count are fixed when the context is created); :func:`fast_scene` then switches the scene's
shadow and reflection flags off.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable

import numpy as np

INSTRUCTION_LENGTH = 64

__all__ = [
    "INSTRUCTION_LENGTH", "encode_instruction", "decode_instruction", "decode_instructions", "fast_offscreen",
    "fast_scene", "instruction_space",
]


def encode_instruction(text: str, length: int = INSTRUCTION_LENGTH) -> np.ndarray:
    """``text`` as UTF-8 bytes zero-padded to ``length`` (uint8). Too long is an error, not a
    silent cut: a truncated instruction could name another task."""
    data = text.encode("utf-8")
    if len(data) > length:
        raise ValueError(f"instruction is {len(data)} bytes, longer than {length}: {text!r}")
    if b"\x00" in data:
        raise ValueError(f"instruction contains a NUL byte (the padding): {text!r}")
    out = np.zeros(length, dtype=np.uint8)
    out[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out


def decode_instruction(array: Any) -> str:
    """The text of one encoded instruction (a numpy array or a torch tensor of bytes)."""
    raw = np.asarray(array.cpu() if hasattr(array, "cpu") else array, dtype=np.uint8).reshape(-1)
    return raw.tobytes().split(b"\x00", 1)[0].decode("utf-8")


def decode_instructions(batch: Any) -> list[str]:
    """Texts of a batch of encoded instructions ``[n, length]``."""
    raw = np.asarray(batch.cpu() if hasattr(batch, "cpu") else batch, dtype=np.uint8)
    return [decode_instruction(row) for row in raw.reshape(-1, raw.shape[-1])]


def instruction_space(length: int = INSTRUCTION_LENGTH):
    """The ``"instruction"`` leaf of the observation space."""
    import gymnasium as gym

    return gym.spaces.Box(0, 255, (length,), dtype=np.uint8)


def fast_offscreen(model: Any, width: int, height: int) -> None:
    """Sets an ``MjModel``'s offscreen buffer to ``width`` x ``height`` with no multisampling.
    Call before the renderer (``mujoco.Renderer``) is created: both are read when it makes its
    framebuffer, and a buffer smaller than the default 640x480 is also cheaper to clear."""
    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = int(width)
    model.vis.global_.offheight = int(height)


def fast_scene(scene: Any) -> None:
    """Switches shadows and reflections off on an ``mjvScene`` (each costs a render pass)."""
    import mujoco

    scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


def release_gl_context() -> None:
    """Makes no GL context current in this thread (EGL only). Why: a worker process may call an
    env from more than one thread (Ray actors run calls on their own threads), and an EGL
    context still current in the thread that last rendered cannot be made current in another
    (EGL_BAD_ACCESS). MuJoCo's renderer makes its context current before every frame, so
    releasing it after each observation costs one call and lets any thread render next."""
    import os

    if os.environ.get("MUJOCO_GL") != "egl":
        return
    from mujoco import egl

    if egl.EGL_DISPLAY is not None:
        egl.EGL.eglMakeCurrent(egl.EGL_DISPLAY, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_SURFACE, egl.EGL.EGL_NO_CONTEXT)


_LIVE_RENDERERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_AT_EXIT: list[bool] = []


def track_renderer(renderer: Any) -> None:
    """Remembers a live ``mujoco.Renderer``, to free it at exit. The exit hook is registered after
    the first EGL context exists, i.e. after mujoco registered its own ``eglTerminate``, so it runs
    first (atexit is last-in, first-out): freeing from ``__del__`` after termination fails noisily.
    Shared by every suite that renders with its own renderers."""
    _LIVE_RENDERERS.add(renderer)
    if not _AT_EXIT:
        atexit.register(_close_renderers)
        _AT_EXIT.append(True)


def _close_renderers() -> None:
    for renderer in list(_LIVE_RENDERERS):
        renderer.close()


class FrameSkipping:
    """What a rendering suite mixes in so that a chunk renders once: ``VectorEnv`` sets
    ``observe_images = False`` for the steps inside an action chunk whose observation nobody
    reads (only a decision's last observation goes to the policy), and the suite then returns its
    previous frames instead of rendering. A step that ends the episode renders anyway (its
    observation is the final one), and so does every reset. Rendering is most of a pixel env's
    step on a CPU (98% of MetaWorld's at 64x64), so chunks of 4 step about 4x faster."""

    observe_images: bool = True
    _frames: dict | None = None

    def frames(self, render: Callable[[], dict], fresh: bool = True) -> dict:
        """The camera images: ``render()``'s when ``fresh`` or wanted, else the previous ones."""
        if fresh or self.observe_images or self._frames is None:
            self._frames = render()
        return dict(self._frames)


def offscreen_renderer(model: Any, data: Any, width: int, height: int) -> Any:
    """A ``mujoco.Renderer`` of ``width`` x ``height`` with the fast settings applied before it
    exists (no multisampling, a framebuffer of the image's size, no shadows or reflections),
    freed at exit, its context released for other threads; ``data`` is forwarded once so camera
    frames are valid for :func:`camera_up_is_down`."""
    import mujoco

    fast_offscreen(model, width, height)  # before the renderer: it sizes its framebuffer from these
    renderer = mujoco.Renderer(model, height=height, width=width)
    track_renderer(renderer)
    fast_scene(renderer.scene)
    mujoco.mj_forward(model, data)
    release_gl_context()  # the renderer's construction left its context current in this thread
    return renderer


def camera_up_is_down(model: Any, data: Any, camera: str) -> tuple[int, bool]:
    """The camera's id and whether its image-up axis points down in the world (a camera mounted
    upside down, such as MetaWorld's corners or LIBERO's agentview: its images are turned 180°)."""
    import mujoco

    cid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    return cid, float(data.cam_xmat[cid].reshape(3, 3)[2, 1]) < 0.0  # world z of the image's up axis


def render_cameras(renderer: Any, data: Any, cameras: list[tuple[str, str, bool]], scene_option: Any = None) -> dict:
    """One image per ``(observation key, camera, turn 180°)``, upright, then the GL context released
    (the next frame may come from another thread of this process)."""
    out = {}
    for key, camera, turn in cameras:
        if scene_option is None:
            renderer.update_scene(data, camera=camera)
        else:
            renderer.update_scene(data, camera=camera, scene_option=scene_option)
        img = renderer.render()
        out[key] = np.ascontiguousarray(img[::-1, ::-1]) if turn else img
    release_gl_context()
    return out

