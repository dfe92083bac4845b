"""The environment contract: a batch of gymnasium environments stepped together.

:class:`VectorEnv` wraps gymnasium's synchronous vector env (on 2 cores it beats the async one) in
same-step auto-reset mode and adds what every rlweave workflow needs from the env layer:

* action chunks: one policy decision carries ``chunk`` env actions, stepped here;
* episode statistics (return, length, success) computed from the raw rewards;
* optional reward scaling (running std of the discounted return, as in PPO implementations);
* a check that observations and rewards are finite, failing with env id, worker rank and step
  (or dropping the offending episode and counting it, when configured);
* the final observation of truncated episodes, so learners can bootstrap through time limits;
* observations that are one array or a flat ``gymnasium.spaces.Dict`` of boxes (manipulation
  suites: images, state, instruction bytes), handled leaf by leaf through :mod:`rlweave.utils.tree`;
* multi-task suites: a maker that takes ``slot`` learns each env's global index (rank * num_envs +
  i) to pick its task, and ``info["task_name"]`` splits the success statistics per task.

Simulators register a *suite* (``gym`` is built in); ``suite/task`` ids go to that suite's maker,
imported lazily so a missing optional simulator only fails when asked for.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from rlweave.envs.snapshot import restore_env, snapshot_env
from rlweave.utils.tree import Tree, tree_copy, tree_index, tree_items, tree_set, tree_shapes, tree_stack


class EnvError(RuntimeError):
    """An environment misbehaved; the message names env id, worker rank and step."""


# --------------------------------------------------------------------------- suites (registry)
# suite name -> "module:function" building ONE gymnasium env: fn(task, render: dict | None, **kwargs)
# (a maker may also take ``slot``: the env's global index, for suites that assign tasks to envs)
SUITES: dict[str, tuple[str, str]] = {
    "gym": ("rlweave.envs.gym_suite:make_env", ""),
    "metaworld": ("rlweave.envs.metaworld_suite:make_env", "metaworld"),
    "libero": ("rlweave.envs.libero_suite:make_env", "libero"),
    "dsrl": ("rlweave.envs.dsrl:make_env", ""),  # dsrl/<inner id>: noise-space actions of a frozen flow policy
    "remote": ("rlweave.robot.client:make_env", "robot"),  # remote/<host>:<port>: a robot served by rlweave robot-server
    "world_model": ("rlweave.world_models.env:make_env", ""),  # world_model/<model folder>: imagined rollouts
}


def register_suite(name: str, target: str, extra: str = "") -> None:
    """Registers a simulator suite by import path, so its package is imported only when used."""
    SUITES[name] = (target, extra)


def env_maker(env_id: str) -> Callable[..., gym.Env]:
    """The maker of ``env_id`` with its task bound: call it with the suite's keywords. A partial,
    so ``inspect.signature`` still shows which keywords (``slot``) the suite takes."""
    suite, _, task = env_id.partition("/") if "/" in env_id and env_id.split("/")[0] in SUITES else ("gym", "", env_id)
    target, extra = SUITES[suite]
    module, _, fn = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        hint = f"; install it with: pip install 'rlweave[{extra}]'" if extra else ""
        raise EnvError(f"env.id '{env_id}': suite '{suite}' is not installed ({e}){hint}") from None
    return functools.partial(getattr(mod, fn), task)


# --------------------------------------------------------------------------- statistics
@dataclass
class EpisodeStats:
    """Accumulates raw per-env returns and reports finished episodes.

    Once an env reports ``info["task_name"]``, finished successes are also kept per task and
    :meth:`pop` adds ``success_by_task`` (a multi-task mean hides which tasks are solved); runs on
    single-task envs keep exactly the three plain keys."""

    num_envs: int
    returns: np.ndarray = field(init=False)
    lengths: np.ndarray = field(init=False)
    finished_returns: list = field(default_factory=list)
    finished_lengths: list = field(default_factory=list)
    finished_success: list = field(default_factory=list)
    success_by_task: dict = field(default_factory=dict)
    has_tasks: bool = False

    def __post_init__(self) -> None:
        self.returns = np.zeros(self.num_envs, dtype=np.float64)
        self.lengths = np.zeros(self.num_envs, dtype=np.int64)

    def finish(self, i: int, success: float | None, task: str | None = None) -> None:
        self.finished_returns.append(float(self.returns[i]))
        self.finished_lengths.append(int(self.lengths[i]))
        if success is not None:
            self.finished_success.append(float(success))
        if task is not None:
            self.has_tasks = True
            if success is not None:
                self.success_by_task.setdefault(task, []).append(float(success))
        self.returns[i] = 0.0
        self.lengths[i] = 0

    def drop(self, i: int) -> None:
        self.returns[i] = 0.0
        self.lengths[i] = 0

    def pop(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "return": self.finished_returns, "length": self.finished_lengths, "success": self.finished_success,
        }
        if self.has_tasks:
            out["success_by_task"] = self.success_by_task
        self.finished_returns, self.finished_lengths, self.finished_success = [], [], []
        self.success_by_task = {}
        return out


class RewardScaler:
    """Divides rewards by the running std of the discounted return (PPO's reward normalisation)."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.ret = np.zeros(num_envs, dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, reward: np.ndarray, done: np.ndarray, envs: slice = slice(None)) -> np.ndarray:
        """Scales the rewards of envs ``envs`` (all by default; a micro-batch steps a slice)."""
        self.ret[envs] = self.ret[envs] * self.gamma + reward
        self._update(self.ret[envs])
        self.ret[envs][done] = 0.0
        scaled = reward / np.sqrt(self.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip) if self.clip > 0 else scaled

    def _update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = float(x.mean()), float(x.var()), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var, self.count = m2 / total, total

    def state_dict(self) -> dict:
        return {"ret": self.ret.copy(), "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, s: dict) -> None:
        self.ret, self.mean, self.var, self.count = s["ret"].copy(), s["mean"], s["var"], s["count"]


def draw_seeds(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` episode seeds from ``rng``: the one rule for a vector env's resets, so an evaluation
    run in batches can give each episode the seed it has when all its envs run at once."""
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=n)]


# --------------------------------------------------------------------------- the vector env
@dataclass
class StepResult:
    """One policy decision's outcome over the batch (rewards summed over the chunk).

    ``obs`` is the observation for the next decision: after a finished episode, the first
    observation of the next one."""

    obs: Tree  # [n, ...] array, or a dict of such arrays for Dict observation spaces
    reward: np.ndarray  # possibly scaled; raw rewards go to the episode statistics
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Tree]  # env index -> last observation of a truncated episode
    dropped: np.ndarray  # envs whose episode was dropped for non-finite values


class VectorEnv:
    """``num_envs`` gymnasium envs stepped in one process.

    The envs are stepped in a plain loop rather than through ``gym.vector.SyncVectorEnv`` because an
    action chunk must stop stepping an env whose episode ended mid-chunk (a vector env would keep
    stepping its freshly reset episode with the rest of the old chunk).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        chunk: int = 1,
        rank: int = 0,
        max_episode_steps: int | None = None,
        pixels: dict | None = None,
        normalize_reward: bool = False,
        gamma: float = 0.99,
        reward_clip: float = 10.0,
        on_nonfinite: str = "error",
        kwargs: dict | None = None,
        first_slot: int | None = None,
    ):
        self.env_id, self.num_envs, self.chunk, self.rank = env_id, num_envs, chunk, rank
        self.on_nonfinite = on_nonfinite
        make = env_maker(env_id)
        make_kwargs: dict[str, Any] = dict(kwargs or {})
        if max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = max_episode_steps
        if pixels and pixels.get("enabled"):
            make_kwargs["pixels"] = pixels
        takes_slot = "slot" in inspect.signature(make).parameters
        first_slot = rank * num_envs if first_slot is None else first_slot  # an evaluation batch gives its own
        self.envs = [
            make(**make_kwargs, slot=first_slot + i) if takes_slot else make(**make_kwargs) for i in range(num_envs)
        ]
        # suites that can skip rendering inside a chunk (manipulation.FrameSkipping): rendered once a decision
        self._skips = [env.unwrapped if chunk > 1 and hasattr(env.unwrapped, "observe_images") else None for env in self.envs]
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self._box = isinstance(self.single_action_space, gym.spaces.Box)
        self._obs_shape = _space_shapes(env_id, self.single_observation_space)
        self.stats = EpisodeStats(num_envs)
        # per env, the success flag of its latest finished episode (NaN: none yet, or not reported);
        # the statistics' lists are in finishing order, evaluation videos need it by env
        self.last_success = np.full(num_envs, np.nan)
        self.scaler = RewardScaler(num_envs, gamma, reward_clip) if normalize_reward else None
        self.steps = 0  # env steps taken by this worker (every env, every chunk element)
        self.dropped_episodes = 0
        self._obs: Tree | None = None
        self._rng = np.random.default_rng(seed)

    def _seeds(self, n: int) -> list[int]:
        return draw_seeds(self._rng, n)

    # -- reset/step --------------------------------------------------------------------------
    def reset(self, seed: list[int] | None = None) -> Tree:
        """Resets every env (``seed``: one per env; default: drawn from this worker's RNG)."""
        seeds = self._seeds(self.num_envs) if seed is None else list(seed)
        obs = tree_stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        self._check(obs, None, "reset")
        self._obs = obs
        self.stats.returns[:] = 0
        self.stats.lengths[:] = 0
        return obs

    @property
    def obs(self) -> Tree:
        return self.reset() if self._obs is None else self._obs

    def step(
        self,
        actions: np.ndarray,
        auto_reset: bool = True,
        active: np.ndarray | None = None,
        envs: slice = slice(None),
    ) -> StepResult:
        """Steps one decision of the envs ``envs`` (all by default; a pipelined micro-batch steps a
        contiguous slice): ``actions`` is [len(envs), chunk, *action_shape], and so is every array
        of the result (``final_obs`` keys are indices within the slice). A finished env is reset at
        once (its final observation is kept when the episode was truncated), unless ``auto_reset``
        is off; envs with ``active[i] == False`` are not stepped at all."""
        lo, hi, _ = envs.indices(self.num_envs)
        n = hi - lo
        obs = tree_copy(tree_index(self.obs, slice(lo, hi)))
        total = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        dropped = np.zeros(n, dtype=bool)
        success = np.full(n, np.nan)
        task: list[str | None] = [None] * n
        final_obs: dict[int, Tree] = {}
        if self._box:
            space = self.single_action_space
            actions = np.clip(actions, space.low, space.high)
        for i, env in enumerate(self.envs[lo:hi]):
            if active is not None and not active[i]:
                continue
            skips = self._skips[lo + i]
            for c in range(self.chunk):
                if skips is not None:  # only the chunk's last observation is read: render that one
                    skips.observe_images = c == self.chunk - 1
                try:
                    o, r, te, tr, info = env.step(actions[i, c])
                except Exception as e:  # noqa: BLE001 - re-raised with where it happened
                    raise EnvError(
                        f"env '{self.env_id}' (env worker rank {self.rank}, env {lo + i}, step {self.steps + 1}) "
                        f"raised {type(e).__name__}: {e}"
                    ) from e
                self.steps += 1
                if tree_shapes(o) != self._obs_shape:
                    raise EnvError(
                        f"env '{self.env_id}' (env worker rank {self.rank}, env {lo + i}, step {self.steps}) returned an "
                        f"observation of shape {tree_shapes(o)}; its observation space has shape {self._obs_shape}"
                    )
                if not _finite(o, r):
                    if self.on_nonfinite == "error":
                        what = "reward" if _finite(o, 0.0) else "observation"
                        raise EnvError(
                            f"env '{self.env_id}' (env worker rank {self.rank}, env {lo + i}, step {self.steps}) "
                            f"returned a non-finite {what}"
                        )
                    dropped[i] = True
                    break
                total[i] += r
                self.stats.returns[lo + i] += r
                self.stats.lengths[lo + i] += 1
                tree_set(obs, i, o)
                if te or tr:
                    terminated[i], truncated[i] = bool(te), bool(tr and not te)
                    if "success" in info or "is_success" in info:
                        success[i] = float(info.get("success", info.get("is_success")))
                    task[i] = info.get("task_name")
                    break
        done = terminated | truncated
        for i in np.flatnonzero(done):
            self.stats.finish(lo + int(i), None if np.isnan(success[i]) else success[i], task[i])
            self.last_success[lo + int(i)] = success[i]
            if truncated[i]:
                final_obs[int(i)] = tree_copy(tree_index(obs, i))
        for i in np.flatnonzero(dropped):
            self.dropped_episodes += 1
            self.stats.drop(lo + int(i))
            total[i] = 0.0
            terminated[i] = True  # the episode ends here for the learner; nothing to bootstrap
        if auto_reset:
            for i in np.flatnonzero(done | dropped):
                tree_set(obs, i, self.envs[lo + i].reset(seed=self._seeds(1)[0])[0])
        scaled = self.scaler(total, terminated | truncated, envs) if self.scaler is not None else total
        if hi - lo == self.num_envs:
            self._obs = obs
        else:  # a new array: observations handed out earlier never change under their holder
            whole = tree_copy(self._obs)
            tree_set(whole, slice(lo, hi), obs)
            self._obs = whole
        return StepResult(obs, scaled.astype(np.float32), terminated, truncated, final_obs, dropped)

    # -- checks ------------------------------------------------------------------------------
    def _check(self, obs: Tree, reward: np.ndarray | None, where: str) -> None:
        for i in range(self.num_envs):
            if not _finite(tree_index(obs, i), 0.0 if reward is None else reward[i]):
                raise EnvError(
                    f"env '{self.env_id}' (env worker rank {self.rank}, env {i}, step {self.steps}) "
                    f"returned a non-finite observation on {where}"
                )

    def episode_stats(self) -> dict[str, Any]:
        """Finished episodes since the last call: ``return``, ``length``, ``success`` lists, and
        ``success_by_task`` ({task name: successes}) for envs that report ``info["task_name"]``."""
        return self.stats.pop()

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: RNG, counters, reward scaler, and the running
        episodes (each env's snapshot, the current observations, the partial returns)."""
        return {
            "rng": self._rng.bit_generator.state,
            "steps": self.steps,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "dropped_episodes": self.dropped_episodes,
            "episodes": None if self._obs is None else {
                "envs": [snapshot_env(env) for env in self.envs],
                "obs": tree_copy(self._obs),
                "returns": self.stats.returns.copy(),
                "lengths": self.stats.lengths.copy(),
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self._rng.bit_generator.state = state["rng"]
        self.steps = state["steps"]
        self.dropped_episodes = state.get("dropped_episodes", 0)
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        running = state.get("episodes")
        if running is None:
            self._obs = None  # the next collect starts fresh episodes from the restored RNG
            return
        if len(running["envs"]) != self.num_envs:
            raise ValueError(f"env state holds {len(running['envs'])} envs, this worker has {self.num_envs}")
        for env, snap in zip(self.envs, running["envs"]):
            restore_env(env, snap)
        self._obs = tree_copy(running["obs"])
        self.stats.returns[:] = running["returns"]
        self.stats.lengths[:] = running["lengths"]

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _finite(obs: Tree, reward) -> bool:
    """Reward and every floating leaf finite (images, bytes and integer leaves cannot be NaN)."""
    if not np.isfinite(reward):
        return False
    for _, leaf in tree_items(obs):
        o = np.asarray(leaf)
        if o.dtype.kind == "f" and not np.isfinite(o).all():
            return False
    return True


def _space_shapes(env_id: str, space: gym.Space) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """The per-step observation shape to check against: one shape, or one per key of a flat Dict
    of boxes (nested dicts and other leaf spaces are refused here, once, not at some later step)."""
    if isinstance(space, gym.spaces.Dict):
        bad = [k for k, s in space.spaces.items() if not isinstance(s, gym.spaces.Box)]
        if bad:
            raise EnvError(
                f"env '{env_id}': Dict observation key(s) {bad} are not Box spaces; only flat dicts of boxes are supported"
            )
        return {k: tuple(s.shape) for k, s in space.spaces.items()}
    return tuple(space.shape or ())


def space_info(env_id: str, pixels: dict | None = None, kwargs: dict | None = None) -> tuple[gym.Space, gym.Space]:
    """Observation and action spaces of one env, without keeping it (driver-side set-up)."""
    make_kwargs = dict(kwargs or {})
    if pixels and pixels.get("enabled"):
        make_kwargs["pixels"] = pixels
    env = env_maker(env_id)(**make_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


os.environ.setdefault("MUJOCO_GL", "egl")
