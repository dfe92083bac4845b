"""DSRL: reinforcement learning in the initial-noise space of a frozen flow (or diffusion) policy.

DSRL ("Steering Your Diffusion Policy with Latent Space Reinforcement Learning", Wagenmaker et al.
2025) leaves a behaviour-cloned flow policy's weights alone and learns, with an ordinary off-policy
agent, *which noise to start its sampler from*: the agent's action is a noise vector w, the frozen
policy integrates its ODE deterministically from x_0 = w, and the env executes the action chunk
that comes out. The agent needs black-box access to the policy only (no gradient through the
sampler), and it starts from the BC policy's behaviour: w = 0 is the policy's own deterministic
action, and noise drawn near N(0, I) its ordinary samples.

**Where it lives here (the choice made): in the env layer, not in a learner.** Seen from the agent,
"decode w through the frozen policy, then step the chunk" is part of the environment's dynamics,
so :class:`NoiseSpaceEnv` is a gymnasium wrapper whose action space is the noise box and whose
observations are the inner env's. Plain SAC on the off-policy runner then *is* DSRL-SAC: the
actor, twin critics, replay, weight sync, checkpoints, evaluation and ``rlweave eval`` work
unchanged, and the registry's ``dsrl`` algorithm is SAC under the name users look for. Why not a
learner of its own: it would duplicate SAC for one extra forward pass, and the frozen policy would
have to travel to the rollout workers and the evaluation loop as a second model.

A suite makes it reachable from a recipe: ``env.id: dsrl/<inner id>`` (e.g.
``dsrl/metaworld/push-v3``) with ``env.kwargs.base_policy: RUN_DIR`` (a trained rlweave run whose
policy is a flow policy: ``flow_mlp``, or a VLA with the flow head). Every other ``env.kwargs`` key
(and ``env.eval_kwargs``, ``env.max_episode_steps``, ``env.pixels``) goes to the inner env, which
must give the observations the base policy was trained on (for a state-based ``flow_mlp`` on
MetaWorld: ``obs: flat``). The base run's weights are loaded once per process and shared by its
envs; they are frozen (``requires_grad`` off) and no code path writes them.

Semantics of one wrapper step (one agent decision):

* ``w`` has ``chunk * act_dim`` entries (the base run's ``env.chunk``); the box is
  ``[-noise_bound, noise_bound]`` (default 1.5, as DSRL bounds its tanh-squashed actor: wide
  enough to reach the tails of N(0, I), narrow enough that the ODE stays in the region the flow
  was trained on);
* the decoded chunk is clipped to the inner env's action box and stepped action by action; the
  chunk stops early when the inner episode ends (termination, e.g. MetaWorld's success, or the
  time limit), so no action of a finished episode is ever executed;
* reward: the sum over the executed actions; ``info`` is the last inner step's, plus
  ``chunk_steps`` (actions executed). The agent's discount therefore applies per chunk.

Counting: the runner's ``env_steps`` and episode lengths count *decisions* (chunks) of this env,
not inner env steps; multiply by the chunk for simulator steps (episodes that end mid-chunk count
the partial chunk as one decision).
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlweave.models.inputs import float_observations, policy_input
from rlweave.utils.tree import tree_stack

__all__ = ["NoiseSpaceEnv", "load_base_policy", "make_env", "metaworld_push_expert", "DEFAULT_NOISE_BOUND"]

DEFAULT_NOISE_BOUND = 1.5

_CACHE: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()


class NoiseSpaceEnv(gym.Wrapper):
    """``env`` acted on through the initial noise of the frozen flow policy ``policy``.

    ``policy`` follows rlweave's policy contract and must be a flow policy: ``act(obs,
    deterministic=True, noise=n)`` integrates the ODE from the first ``chunk * act_dim`` entries of
    ``n`` (the x_0 block of :meth:`sample_noise`'s layout) and ``env_action`` gives the executed
    chunk. That the decoded action really depends on the noise is checked on the first observation
    (a Gaussian or deterministic policy would silently make every w the same action)."""

    def __init__(self, env: gym.Env, policy: torch.nn.Module, noise_bound: float = DEFAULT_NOISE_BOUND):
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Box):
            raise ValueError(f"dsrl: the inner env needs a Box action space, got {env.action_space}")
        if not noise_bound > 0:
            raise ValueError(f"env.kwargs.noise_bound: must be > 0, got {noise_bound}")
        self.policy = policy
        self.chunk = int(policy.chunk)
        self.inner_action_shape = tuple(env.action_space.shape)
        self.noise_dim = self.chunk * int(np.prod(self.inner_action_shape, dtype=np.int64))
        stored = int(policy.sample_noise(1).shape[1])
        if stored < self.noise_dim or stored % self.noise_dim:
            raise ValueError(f"dsrl: the base policy's noise has {stored} entries, not a multiple of its chunk's "
                             f"{self.noise_dim}: not a flow policy over this env's actions")
        self._noise_size = stored
        self.noise_bound = float(noise_bound)
        self.action_space = gym.spaces.Box(-self.noise_bound, self.noise_bound, (self.noise_dim,), dtype=np.float32)
        self._float_obs = float_observations(env.observation_space)
        self._low = np.asarray(env.action_space.low, dtype=np.float32)
        self._high = np.asarray(env.action_space.high, dtype=np.float32)
        # the observation the next decision decodes at; a dict is kept as (key, array) pairs so
        # that env snapshots (rlweave.envs.snapshot keeps plain attributes) carry it across a resume
        self._obs: Any = None
        self._checked = False

    def decode(self, obs: Any, w: np.ndarray) -> np.ndarray:
        """The action chunk ``[chunk, *action_shape]`` the frozen policy makes of noise ``w`` at
        observation ``obs``: its deterministic ODE from x_0 = w (the remaining noise entries,
        which only stochastic samplers read, are zero). Not clipped."""
        w = np.asarray(w, dtype=np.float32).reshape(-1)
        if w.size != self.noise_dim:
            raise ValueError(f"dsrl: noise of {w.size} entries, the action space has {self.noise_dim}")
        noise = torch.zeros(1, self._noise_size)
        noise[0, :self.noise_dim] = torch.from_numpy(w)
        with torch.inference_mode():
            x = policy_input(tree_stack([obs]), self._float_obs)
            stored, _, _ = self.policy.act(x, deterministic=True, noise=noise)
            actions = self.policy.env_action(stored)
        return np.asarray(actions, dtype=np.float32).reshape(self.chunk, *self.inner_action_shape)

    def _check_steerable(self, obs: Any) -> None:
        """Refuses a base policy whose deterministic action ignores its noise (once per env)."""
        a = self.decode(obs, np.zeros(self.noise_dim, np.float32))
        b = self.decode(obs, np.ones(self.noise_dim, np.float32))
        if np.array_equal(a, b):
            raise ValueError("dsrl: the base policy's deterministic action does not depend on its noise; "
                             "env.kwargs.base_policy must be a flow policy (flow_mlp, or a VLA with the flow head)")
        self._checked = True

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        if not self._checked:
            self._check_steerable(obs)
        self._remember(obs)
        return obs, info

    def _remember(self, obs: Any) -> None:
        self._obs = tuple(obs.items()) if isinstance(obs, dict) else obs

    def _current(self) -> Any:
        return dict(self._obs) if isinstance(self._obs, tuple) else self._obs

    def step(self, w: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        if self._obs is None:
            raise RuntimeError("dsrl: step() before reset()")
        chunk = np.clip(self.decode(self._current(), w), self._low, self._high)
        total, terminated, truncated, info, obs = 0.0, False, False, {}, None
        steps = 0
        # rendering suites (manipulation.FrameSkipping) need not render the frames inside the chunk:
        # only its last observation is read (a step that ends the episode renders anyway)
        skips = self.env.unwrapped if hasattr(self.env.unwrapped, "observe_images") else None
        try:
            for c, a in enumerate(chunk):
                if skips is not None:
                    skips.observe_images = c == len(chunk) - 1
                obs, r, terminated, truncated, info = self.env.step(a)
                total += float(r)
                steps += 1
                if terminated or truncated:
                    break
        finally:
            if skips is not None:
                skips.observe_images = True
        self._remember(obs)
        return obs, total, bool(terminated), bool(truncated), {**info, "chunk_steps": steps}


def load_base_policy(run_dir: str | Path, checkpoint: str | None, observation_space: gym.Space,
                     action_space: gym.Space) -> tuple[torch.nn.Module, str]:
    """The frozen policy of the run in ``run_dir`` (``checkpoint``: a folder name under its
    ``checkpoints/``; default the newest verified one) for these spaces, and the checkpoint's name.

    Loaded once per process and (path, checkpoint, spaces): all envs of an env worker share one
    copy. The first load fixes which checkpoint "newest" meant for the process's lifetime, so a
    base run still training cannot change the dynamics under a running DSRL run."""
    from rlweave.models.run_policy import RunPolicyError, load_run_policy

    path = Path(run_dir).expanduser().resolve()
    key = (str(path), checkpoint, repr(observation_space), repr(action_space))
    with _CACHE_LOCK:
        if key not in _CACHE:
            try:
                run = load_run_policy(path, checkpoint, observation_space=observation_space, action_space=action_space)
            except RunPolicyError as e:
                raise ValueError(f"env.kwargs.base_policy: {e}; train a flow policy first (e.g. rlweave train "
                                 "bc-flow-push run.dir=runs/bc-flow-push/base)") from None
            policy = run.policy.eval()
            policy.requires_grad_(False)
            _CACHE[key] = (policy, run.checkpoint.name)
        return _CACHE[key]


def make_env(task: str, base_policy: str | None = None, noise_bound: float = DEFAULT_NOISE_BOUND,
             base_checkpoint: str | None = None, slot: int = 0, **kwargs: Any) -> NoiseSpaceEnv:
    """The ``dsrl`` suite's maker: ``task`` is the inner env id (``dsrl/metaworld/push-v3`` ->
    ``metaworld/push-v3``), built by its own suite with the remaining keywords (``slot`` only when
    that suite takes it); ``base_policy`` is the run folder of the frozen flow policy."""
    from rlweave.envs.vector import env_maker

    if not base_policy:
        raise ValueError("dsrl: env.kwargs.base_policy must name the run folder of a trained flow policy")
    inner_make = env_maker(task)
    if "slot" in inspect.signature(inner_make).parameters:
        kwargs["slot"] = slot
    env = inner_make(**kwargs)
    try:
        policy, ckpt = load_base_policy(base_policy, base_checkpoint, env.observation_space, env.action_space)
        wrapped = NoiseSpaceEnv(env, policy, noise_bound)
    except Exception:
        env.close()
        raise
    wrapped.base_checkpoint = ckpt
    return wrapped


def metaworld_push_expert(obs_batch: Any) -> np.ndarray:
    """MetaWorld's scripted push policy on flat observations (``env.kwargs.obs: flat`` carries no
    instruction to pick the task from): the demonstration source of the ``bc-flow-push`` recipe,
    ``rlweave collect bc-flow-push --expert rlweave.envs.dsrl:metaworld_push_expert``."""
    from rlweave.envs.metaworld_suite import expert

    return expert(obs_batch, task="push-v3")
