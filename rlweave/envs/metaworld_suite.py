"""The MetaWorld suite (v3, 50 Sawyer tasks): ``metaworld/<task>``, ``metaworld/mt10``,
``metaworld/mt50`` and comma lists ``metaworld/reach-v3,push-v3``, following the manipulation
contract of :mod:`rlweave.envs.manipulation`.

Decisions, and why:

* Multi-task: the maker takes ``slot`` (the env's global index, rank * num_envs + i) and runs task
  ``tasks[slot % len(tasks)]``, so a run's envs cover the tasks round-robin whatever the number of
  workers, and a task keeps its envs across restarts.
* Initial states: MetaWorld draws object and goal positions from the env's own RNG when
  ``seeded_rand_vec`` is on; ``reset(seed=s)`` seeds it with ``2 * s`` in the ``train`` split and
  ``2 * s + 1`` in the ``test`` split. The two splits therefore never start an episode from the
  same seed: held-out evaluation (``split: test``) sees initial states training never drew. (The
  MT benchmarks have no test tasks; MetaWorld's own MT1 instead fixes 50 goals per task.)
* Episodes end on success by default (``terminate_on_success``), as in MetaWorld's evaluation, so
  the success flag at the end of an episode means "solved it" and finished envs stop spending steps.
  ``max_episode_steps`` defaults to 200 (MetaWorld's horizon is 500; the scripted experts solve the
  MT10 tasks well within 200).
* Images come from one ``mujoco.Renderer`` per env (it makes its own EGL context current before
  every frame), built after :func:`~rlweave.envs.manipulation.fast_offscreen`. Gymnasium's viewer,
  which MetaWorld's ``render()`` uses, renders into whatever context is current: closing or
  creating another env in the same process blacked its frames out. Cameras whose image-up axis
  points downwards in the world (MetaWorld's ``corner`` cameras are mounted upside down) are
  turned 180 degrees, so every image has the top of the scene at row 0.
* Exact resume: the env's snapshot is the simulator state plus the model fields MetaWorld moves at
  reset (object and goal bodies and sites), plus its plain attributes and RNG. Some attributes
  are live views into the simulator (every task's ``init_left_pad`` follows the pad, a few tasks'
  goal or object positions follow a body): they are restored as views again, not frozen copies,
  or the rewards after a resume would differ.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is first imported: offscreen rendering without a display

import gymnasium as gym  # noqa: E402
import metaworld  # noqa: F401 - the suite's one dependency; missing -> EnvError naming the extra
import mujoco
import numpy as np
from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3

from rlweave.envs.manipulation import (
    INSTRUCTION_LENGTH, decode_instructions, encode_instruction, instruction_space,
    FrameSkipping, camera_up_is_down, offscreen_renderer, render_cameras,
)
from rlweave.envs.snapshot import restore_env, snapshot_env

__all__ = ["make_env", "MetaWorldEnv", "expert", "INSTRUCTIONS", "CAMERAS", "parse_tasks", "instruction_for"]

CAMERAS = ("corner", "corner2", "corner3", "corner4", "gripperPOV", "behindGripper")
BENCHMARKS = {"mt10": list(MT10_V3), "mt50": list(MT50_V3)}
# model fields MetaWorld's reset_model moves (object/goal bodies and sites, weld constraints)
_MODEL_FIELDS = ("body_pos", "body_quat", "site_pos", "site_quat", "geom_pos", "geom_quat", "eq_data")
# simulator arrays that MetaWorld attributes may be live views of (``init_left_pad = get_body_com(...)``)
_DATA_VIEW_FIELDS = ("xpos", "xipos", "site_xpos", "geom_xpos", "qpos", "mocap_pos")

INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "put the ring on the peg",
    "basketball-v3": "put the ball in the basket",
    "bin-picking-v3": "move the puck from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button behind the wall from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "take the ring off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door",
    "hand-insert-v3": "put the hand in the hole",
    "drawer-close-v3": "close the drawer",
    "drawer-open-v3": "open the drawer",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail in",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate sideways into the goal",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate sideways out of the goal",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg from the side",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "push the bottle with the stick",
    "stick-pull-v3": "pull the bottle with the stick",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "push the puck back to the goal",
    "reach-v3": "reach the goal",
    "reach-wall-v3": "reach the goal behind the wall",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "open the window",
    "window-close-v3": "close the window",
}


def instruction_for(task: str) -> str:
    """The task's instruction; a readable default from the name for tasks not in the table."""
    return INSTRUCTIONS.get(task) or task.rsplit("-v", 1)[0].replace("-", " ")


def parse_tasks(spec: str) -> list[str]:
    """``reach-v3`` / ``mt10`` / ``mt50`` / ``reach-v3,push-v3`` -> the list of task names."""
    if spec.lower() in BENCHMARKS:
        return list(BENCHMARKS[spec.lower()])
    tasks = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in ALL_V3_ENVIRONMENTS]
    if not tasks or unknown:
        raise ValueError(
            f"env.id 'metaworld/{spec}': unknown MetaWorld task(s) {unknown or [spec]}; use a v3 task such as "
            f"'reach-v3', 'mt10', 'mt50' or a comma list (all tasks: {', '.join(ALL_V3_ENVIRONMENTS)})"
        )
    return tasks


# env.kwargs.reward: MetaWorld's shaped reward; 1 on the step that succeeds; or -1 on every other
# step (DSRL's sparse convention: a soft-Q learner's entropy bonus, paid every step, is small
# beside a cost paid every step, where it swamps a single 1 at the end)
REWARDS = ("dense", "success", "step_cost")


class MetaWorldEnv(FrameSkipping, gym.Env):
    """One MetaWorld task as a manipulation-contract env (or MetaWorld's flat 39-D state with
    ``obs="flat"``, for state-based policies)."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        task: str,
        pixels: dict | None = None,
        max_episode_steps: int | None = 200,
        split: str = "train",
        obs: str = "dict",
        terminate_on_success: bool = True,
        reward: str = "dense",
    ):
        if task not in ALL_V3_ENVIRONMENTS:
            parse_tasks(task)  # raises the one-line error
        if split not in ("train", "test"):
            raise ValueError(f"env.kwargs.split: '{split}' is not 'train' or 'test'")
        if obs not in ("dict", "flat"):
            raise ValueError(f"env.kwargs.obs: '{obs}' is not 'dict' or 'flat'")
        pixels = pixels if pixels and pixels.get("enabled", True) else None
        if pixels and obs == "flat":
            raise ValueError("env.kwargs.obs: 'flat' has no room for images; use obs: dict with env.pixels")
        self.task_name = task
        self.instruction_text = instruction_for(task)
        self._instruction = encode_instruction(self.instruction_text)
        self.max_episode_steps = int(max_episode_steps or 500)
        self._split = 1 if split == "test" else 0
        self._flat = obs == "flat"
        self.terminate_on_success = bool(terminate_on_success)
        if reward not in REWARDS:
            raise ValueError(f"env.kwargs.reward: '{reward}' is not one of {', '.join(REWARDS)}")
        self.reward = reward

        core = ALL_V3_ENVIRONMENTS[task]()
        core._partially_observable = False  # the goal is part of the (privileged) state
        core.__dict__.pop("sawyer_observation_space", None)  # cached for the old observability
        core._freeze_rand_vec = False
        core.seeded_rand_vec = True  # object/goal positions from core.np_random: seeded resets
        core._set_task_called = True
        core.max_path_length = self.max_episode_steps
        self._core = core
        self._raw_dim = int(core.sawyer_observation_space.shape[0])

        self._renderer: mujoco.Renderer | None = None
        self._cameras: list[tuple[str, str, bool]] = []  # (obs key, camera name, turn 180 degrees)
        spaces: dict[str, gym.Space] = {}
        if pixels:
            self._setup_pixels(pixels, spaces)
        box = gym.spaces.Box(-np.inf, np.inf, (self._raw_dim,), dtype=np.float32)
        if self._flat:
            self.observation_space = box
        else:
            spaces["state"] = gym.spaces.Box(-np.inf, np.inf, (4,), dtype=np.float32)
            spaces["instruction"] = instruction_space(INSTRUCTION_LENGTH)
            spaces["privileged"] = box
            self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)

    def _setup_pixels(self, pixels: dict, spaces: dict) -> None:
        w, h = int(pixels.get("width", 64)), int(pixels.get("height", 64))
        cameras = list(pixels.get("cameras") or ["corner"])
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"env.pixels.cameras: unknown MetaWorld camera(s) {unknown}; known: {list(CAMERAS)}")
        if int(pixels.get("frame_stack", 1)) > 1:
            raise ValueError("env.pixels.frame_stack: not supported by the metaworld suite (state carries the motion)")
        model, data = self._core.model, self._core.data
        self._renderer = offscreen_renderer(model, data, w, h)
        for j, cam in enumerate(cameras):
            _, upside_down = camera_up_is_down(model, data, cam)
            key = "image" if j == 0 else f"image_{cam}"
            self._cameras.append((key, cam, upside_down))
            spaces[key] = gym.spaces.Box(0, 255, (h, w, 3), dtype=np.uint8)

    # -- gymnasium API -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self._core.seed(2 * int(seed) + self._split)  # disjoint train/test seed sets
        raw, _ = self._core.reset()
        return self._observe(raw), {"success": False, "task_name": self.task_name}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        raw, reward, _, truncated, info = self._core.step(np.asarray(action, dtype=np.float32))
        success = bool(info.get("success", False))
        if self.reward == "success":  # 1 on the step that succeeds: an episode's return is its success
            reward = float(success)
        elif self.reward == "step_cost":  # -1 on every step that does not succeed: the return counts the steps to success
            reward = float(success) - 1.0
        info = dict(info, success=success, task_name=self.task_name)
        terminated = success and self.terminate_on_success
        truncated = bool(truncated or self._core.curr_path_length >= self.max_episode_steps)
        return self._observe(raw, fresh=terminated or truncated), float(reward), terminated, truncated and not terminated, info

    def _observe(self, raw: np.ndarray, fresh: bool = True) -> Any:
        raw = np.asarray(raw, dtype=np.float32)
        if self._flat:
            return raw
        out: dict[str, np.ndarray] = self.frames(self._render_all, fresh) if self._cameras else {}
        out["state"] = raw[:4].copy()  # end-effector xyz, gripper opening
        out["instruction"] = self._instruction.copy()
        out["privileged"] = raw
        return out

    def _render_all(self) -> dict[str, np.ndarray]:
        return render_cameras(self._renderer, self._core.data, self._cameras)

    def close(self) -> None:
        """Frees this env's renderer only: its own EGL context, released before its GL objects,
        so the other envs' contexts in this process keep rendering."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._core.close()

    # -- exact resume (rlweave.envs.snapshot calls these on the core class) ---------------------
    def get_snapshot(self) -> dict:
        core = self._core
        return {
            "core": snapshot_env(core),
            "model": {f: getattr(core.model, f).copy() for f in _MODEL_FIELDS},
            "views": _data_views(core),
        }

    def set_snapshot(self, state: dict) -> None:
        core = self._core
        for f, value in state["model"].items():
            getattr(core.model, f)[:] = value
        restore_env(core, state["core"])
        for name, (field, offset, shape) in state.get("views", {}).items():
            flat = getattr(core.data, field).reshape(-1)
            setattr(core, name, flat[offset: offset + int(np.prod(shape))].reshape(shape))
        # positions only, for rendering: mj_forward would also run the constraint solver, whose
        # result differs slightly from the restored warm-start and would change the next step
        mujoco.mj_kinematics(core.model, core.data)
        mujoco.mj_comPos(core.model, core.data)
        mujoco.mj_camlight(core.model, core.data)
        for site in core._target_site_config:  # as MetaWorld's step does after simulating
            core._set_pos_site(*site)


def _data_views(core: Any) -> dict[str, tuple[str, int, tuple[int, ...]]]:
    """Attributes of ``core`` that are contiguous views into its ``MjData``: name -> (field, element
    offset, shape), enough to point them into another env's data."""
    out: dict[str, tuple[str, int, tuple[int, ...]]] = {}
    for name, value in vars(core).items():
        if not isinstance(value, np.ndarray) or value.base is None or not value.flags.c_contiguous:
            continue
        for field in _DATA_VIEW_FIELDS:
            arr = getattr(core.data, field)
            if np.shares_memory(value, arr):
                start = value.__array_interface__["data"][0] - arr.__array_interface__["data"][0]
                out[name] = (field, start // arr.itemsize, tuple(value.shape))
                break
    return out


def make_env(
    task: str,
    pixels: dict | None = None,
    max_episode_steps: int | None = 200,
    split: str = "train",
    obs: str = "dict",
    terminate_on_success: bool = True,
    slot: int = 0,
    task_block: int = 1,
    reward: str = "dense",
) -> MetaWorldEnv:
    """The suite's maker: ``task`` is a task, ``mt10``/``mt50`` or a comma list; env ``slot`` runs
    ``tasks[(slot // task_block) % len(tasks)]``. ``task_block``: how many consecutive envs share a
    task (GRPO sets it to its group size: a group must be one task from one initial state)."""
    tasks = parse_tasks(task)
    if task_block < 1:
        raise ValueError(f"env.kwargs.task_block: must be >= 1, got {task_block}")
    return MetaWorldEnv(tasks[(slot // task_block) % len(tasks)], pixels=pixels, max_episode_steps=max_episode_steps,
                        split=split, obs=obs, terminate_on_success=terminate_on_success, reward=reward)




# --------------------------------------------------------------------------- scripted experts
@lru_cache(maxsize=None)
def _task_of_instruction() -> dict[str, str]:
    return {instruction_for(t): t for t in ALL_V3_ENVIRONMENTS}


@lru_cache(maxsize=None)
def _policy(task: str) -> Any:
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[task]()


def expert(obs_batch: Any, task: str | None = None) -> np.ndarray:
    """MetaWorld's scripted policies as an expert: ``expert(obs) -> actions [n, 4]``.

    ``obs_batch`` is the batched contract dict: each row's instruction picks its task's policy
    (``metaworld.policies``), which acts on the row's ``privileged`` state. For ``obs="flat"``
    batches (no instruction) name the ``task``."""
    if isinstance(obs_batch, dict):
        states = _numpy(obs_batch["privileged"])
        if task is None:
            lookup = _task_of_instruction()
            texts = decode_instructions(obs_batch["instruction"])
            unknown = sorted({t for t in texts if t not in lookup})
            if unknown:
                raise ValueError(f"metaworld expert: no MetaWorld task has the instruction(s) {unknown}")
            tasks = [lookup[t] for t in texts]
        else:
            tasks = [task] * len(states)
    else:
        if task is None:
            raise ValueError("metaworld expert: a flat observation carries no instruction; pass task=")
        states = _numpy(obs_batch)
        tasks = [task] * len(states)
    states = states.reshape(len(tasks), -1).astype(np.float64)
    with warnings.catch_warnings():  # their gains exceed 1 by design; the env clips, and so do we
        warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
        actions = np.stack([_policy(t).get_action(s) for t, s in zip(tasks, states)])
    return np.clip(actions, -1.0, 1.0).astype(np.float32)


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
