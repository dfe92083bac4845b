"""A scripted expert for LIBERO "pick up the <bowl> ... and place it on the <target>" tasks (the
LIBERO-Spatial kind), so that ``rlweave collect RECIPE --expert rlweave.envs.libero_expert:expert``
can record demonstrations: the PyPI LIBERO ships task files and start states but no demonstrations.
Measured on LIBERO-Spatial tasks 0 and 1 (every one of the 40 train-split start states of each).

Decisions, and why:

* Stateless, as the collect contract asks (each call sees only observations): every step's phase is
  inferred from the state (where the bowl is relative to the hand, how far the fingers are shut,
  where the bowl is relative to the target), as MetaWorld's scripted policies do. A missed or
  slipped pinch therefore falls back to "reach the bowl again" by itself.
* Objects come from ``privileged`` (robosuite's flattened sim state: time, qpos, qvel). Which qpos
  rows hold the bowl and the target depends on the task's compiled model, so the task's env is
  built once per task in this process (``ControlEnv``, ~5 s) and only the goal's object names and
  the free-joint addresses are kept (cached); a row's task is found from its instruction.
* Grasp at the rim: with the hand pointing down the Panda's fingers close along world y, so the hand
  goes to the bowl's wall on its -y or +y side (the bowl's centre plus ``(0, -/+RIM, .)``), low
  enough that the pads straddle the wall, and pinches it. The side is the one whose outer finger
  lands clear of the other objects (a ramekin beside the bowl's wall stops the hand short of it).
* The hand is held pointing down, fingers along y, by a P-controller on its orientation: OSC's
  zero rotation only holds the current orientation, which drifts.
* Actions are P-control towards a waypoint (OSC deltas: 1.0 = 5 cm or 0.5 rad a step), clipped
  to [-1, 1]; gripper -1 open, +1 close.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["expert", "TaskLayout", "task_layout"]

RIM = 0.047  # bowl wall radius (its upper wall geoms sit 4.7 cm from its centre)
GRASP_Z = 0.032  # hand (eef site) height above the bowl's origin when pinching the wall
HOVER_Z = 0.12  # hand height above the bowl's origin before descending onto it
CARRY_Z = 0.14  # bowl origin height above the target's origin while carrying
RELEASE_Z = 0.035  # open once the bowl's origin is this close above the target's
FINGER_REACH = 0.045  # the open outer finger's distance beyond the pinched wall
SIDE_MARGIN = 0.01  # the -y side (nearer the robot's centre line) unless +y is clearer by this much
POS_GAIN = 1.0 / 0.05  # OSC: a position action of 1 moves the goal 5 cm
ROT_GAIN = 1.0 / 0.5  # OSC: a rotation action of 1 turns the goal 0.5 rad
OPEN_WIDTH = 0.07  # finger joint spread (q1 - q2) of an open hand (~0.078 fully open)
PINCH_WIDTH = 0.02  # below this the fingers are shut (on the wall, or on nothing)
# the hand pointing down, fingers along world y (the eef body's orientation at LIBERO's start)
DOWN = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]])


@dataclass(frozen=True)
class TaskLayout:
    """What the expert needs of one task: the first qpos row of the free joints of the object, the
    target and the other loose objects (positions are ``qpos[a : a + 3]``), and the sim state's
    length, to check a row against."""

    obj: str
    target: str
    obj_qpos: int
    target_qpos: int
    state_len: int
    others: tuple[int, ...] = ()  # what the outer finger must miss


@lru_cache(maxsize=None)
def _instruction_index() -> dict[str, list[tuple[str, int]]]:
    """Instruction -> (suite, task) candidates, LIBERO-Spatial first."""
    from rlweave.envs.libero_suite import SUITES, _suite

    out: dict[str, list[tuple[str, int]]] = {}
    for suite in SUITES:
        bench = _suite(suite)
        for i in range(bench.get_num_tasks()):
            out.setdefault(bench.get_task(i).language, []).append((suite, i))
    return out


@lru_cache(maxsize=None)
def task_layout(suite: str, index: int) -> TaskLayout:
    """Builds the task's env once (compiling its model) to read the goal's objects and their qpos rows."""
    import mujoco
    from libero.libero.envs.env_wrapper import ControlEnv

    from rlweave.envs.libero_suite import task_info

    info = task_info(suite, index)
    with contextlib.redirect_stdout(io.StringIO()):
        core = ControlEnv(bddl_file_name=info["bddl"], use_camera_obs=False, has_offscreen_renderer=False,
                          ignore_done=True, horizon=10**9, control_freq=20)
    try:
        goal = core.env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() != "on" or "bowl" not in goal[0][1]:
            raise ValueError(f"libero expert: task {suite}/{index} ({info['instruction']!r}) has goal {goal}; "
                             "only 'put a bowl on something' tasks are scripted")
        _, obj, target = goal[0]
        model = core.env.sim.model._model

        def qpos_of(name: str) -> int:
            joint = core.env.get_object(name).joints[-1]
            return int(model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)])

        others = tuple(qpos_of(name) for name, o in core.env.objects_dict.items()
                       if name not in (obj, target) and o.joints)
        return TaskLayout(obj, target, qpos_of(obj), qpos_of(target), len(core.get_sim_state()), others)
    finally:
        core.close()


def _layout_for(instruction: str, state_len: int) -> TaskLayout:
    candidates = _instruction_index().get(instruction)
    if not candidates:
        raise ValueError(f"libero expert: no LIBERO task has the instruction {instruction!r}")
    layouts = [task_layout(s, i) for s, i in candidates]
    for layout in layouts:
        if layout.state_len == state_len:
            return layout
    raise ValueError(f"libero expert: instruction {instruction!r}: no task's sim state has {state_len} values")


def _rotation_error(axis_angle: np.ndarray) -> np.ndarray:
    """World-frame axis-angle that turns the hand from its orientation to :data:`DOWN` (OSC applies
    rotation deltas in the world frame), the short way round."""
    import mujoco

    angle = float(np.linalg.norm(axis_angle))
    current = np.array([1.0, 0.0, 0.0, 0.0])
    if angle > 1e-9:
        mujoco.mju_axisAngle2Quat(current, axis_angle / angle, angle)
    down, inverse, error = np.empty(4), np.empty(4), np.empty(4)
    mujoco.mju_mat2Quat(down, DOWN.flatten())
    mujoco.mju_negQuat(inverse, current)
    mujoco.mju_mulQuat(error, down, inverse)
    if error[0] < 0:
        error = -error
    out = np.empty(3)
    mujoco.mju_quat2Vel(out, error, 1.0)
    return out


def _move(eef: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """A position action towards ``goal`` (P-control, saturating at 5 cm a step)."""
    return np.clip((goal - eef) * POS_GAIN, -1.0, 1.0)


def _side(eef: np.ndarray, bowl: np.ndarray, target: np.ndarray, qpos: np.ndarray, layout: TaskLayout) -> float:
    """Which side of the bowl (-1: -y, +1: +y) to pinch. A hand already at one side keeps it (so
    the choice cannot flip mid-grasp or while carrying); otherwise the side whose outer finger lands
    farther from every other object (a neighbour under the finger blocks the descent)."""
    for s in (-1.0, 1.0):
        if np.linalg.norm(bowl[:2] + [0.0, s * RIM] - eef[:2]) < 0.02 and eef[2] < bowl[2] + GRASP_Z + 0.04:
            return s
    centres = [qpos[a:a + 2] for a in layout.others] + [target[:2]]

    def clearance(s: float) -> float:
        finger = bowl[:2] + [0.0, s * (RIM + FINGER_REACH)]
        return min(float(np.linalg.norm(c - finger)) for c in centres)

    return -1.0 if clearance(-1.0) >= clearance(1.0) - SIDE_MARGIN else 1.0


def act(state: np.ndarray, sim_state: np.ndarray, layout: TaskLayout) -> np.ndarray:
    """One row's action, from its proprioception ``state`` and ``privileged`` sim state."""
    eef, width = state[:3].astype(np.float64), float(state[6] - state[7])
    qpos = sim_state[1:]  # robosuite's flattened state: time, qpos, qvel
    bowl = qpos[layout.obj_qpos:layout.obj_qpos + 3].astype(np.float64)
    target = qpos[layout.target_qpos:layout.target_qpos + 3].astype(np.float64)
    side = _side(eef, bowl, target, qpos, layout)
    grasp = bowl + [0.0, side * RIM, GRASP_Z]  # the hand's place when pinching the wall
    action = np.zeros(7)
    action[3:6] = np.clip(_rotation_error(state[3:6].astype(np.float64)) * ROT_GAIN, -1.0, 1.0)

    to_grasp = grasp - eef
    near = np.linalg.norm(to_grasp[:2]) < 0.012 and abs(to_grasp[2]) < 0.01
    bowl_xy_off = np.linalg.norm(bowl[:2] - target[:2])
    # held: the fingers are shut and the bowl is still at the hand. Shut on the wall (~4 mm) and on
    # nothing (~2 mm, still closing) are too close to tell apart by width: a missed pinch shows as
    # the bowl staying behind when the hand rises, and is retried from there.
    held = width < PINCH_WIDTH and np.linalg.norm(to_grasp) < 0.03
    if held:  # carry: up, over the target, down, and let go just above it
        action[6] = 1.0
        place = eef + (target - bowl)  # the hand's place that puts the bowl (as it hangs) on the target
        if bowl_xy_off < 0.01 and bowl[2] - target[2] < RELEASE_Z:
            action[6] = -1.0
        elif bowl_xy_off < 0.015:
            action[:3] = _move(eef, place)
        elif bowl[2] - target[2] < CARRY_Z - 0.03 and bowl_xy_off > 0.05:
            action[:3] = _move(eef, np.array([eef[0], eef[1], eef[2] + 0.05]))
        else:
            action[:3] = _move(eef, place + [0.0, 0.0, CARRY_Z])  # over to the target, high
        return action
    action[6] = -1.0
    if bowl_xy_off < 0.02 and bowl[2] - target[2] < RELEASE_Z + 0.02:  # placed: let go, back off upwards
        action[:3] = _move(eef, np.array([eef[0], eef[1], target[2] + CARRY_Z + GRASP_Z]))
        return action
    if near and width >= PINCH_WIDTH:  # at the wall, not yet shut: pinch (still pressing on down)
        action[:3] = _move(eef, grasp)
        action[6] = 1.0
        return action
    if width < OPEN_WIDTH:  # closed (on nothing, or let go): open and rise before reaching again
        action[:3] = _move(eef, np.array([eef[0], eef[1], max(eef[2], grasp[2] + 0.02)]))
        return action
    if np.linalg.norm(to_grasp[:2]) > 0.01:  # above the wall first, then straight down
        hover = grasp + [0.0, 0.0, HOVER_Z - GRASP_Z]
        low = eef[2] < grasp[2] + 0.03
        goal = np.array([eef[0], eef[1], hover[2]]) if low and np.linalg.norm(to_grasp[:2]) > 0.03 else hover
        action[:3] = _move(eef, goal)
    else:
        action[:3] = _move(eef, grasp)
    return action


def expert(obs_batch: Any) -> np.ndarray:
    """The scripted expert: ``expert(obs) -> actions [n, 7]`` for a batched LIBERO observation
    dict (rows may be different tasks; each row's instruction names its task)."""
    from rlweave.envs.manipulation import decode_instructions

    states = _numpy(obs_batch["state"]).reshape(-1, 8)
    sims = _numpy(obs_batch["privileged"]).reshape(len(states), -1)
    texts = decode_instructions(obs_batch["instruction"])
    out = [act(s, p, _layout_for(t, p.shape[0])) for s, p, t in zip(states, sims, texts)]
    return np.stack(out).astype(np.float32)


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)
