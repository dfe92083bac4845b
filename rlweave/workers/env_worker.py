"""Env worker: steps a batch of environments, asks its rollout worker for actions over channels,
and hands finished trajectories to the actor over the trajectory channel."""

from __future__ import annotations

import time

import numpy as np

from rlweave.cluster import Worker
from rlweave.envs import VectorEnv
from rlweave.workers.channels import ChannelSpec


class EnvWorker(Worker):
    def __init__(
        self,
        env_cfg: dict,
        seed: int,
        gamma: float,
        obs_channel: ChannelSpec,
        action_channel: ChannelSpec,
        trajectory_channel: ChannelSpec,
        num_rollout_workers: int,
        num_actor_workers: int,
    ):
        self.cfg = env_cfg
        self.env = VectorEnv(
            env_cfg["id"],
            env_cfg["num_envs"],
            seed=seed * 100_003 + self.rank,
            chunk=env_cfg["chunk"],
            rank=self.rank,
            max_episode_steps=env_cfg.get("max_episode_steps"),
            pixels=env_cfg.get("pixels"),
            normalize_reward=env_cfg.get("normalize_reward", False),
            gamma=gamma,
            reward_clip=env_cfg.get("reward_clip", 10.0),
            on_nonfinite=env_cfg.get("on_nonfinite", "error"),
            kwargs=env_cfg.get("kwargs"),
        )
        self.rollout_rank = self.rank % num_rollout_workers
        self.actor_rank = self.rank % num_actor_workers
        self.obs_ch = obs_channel.open()
        self.act_ch = action_channel.open()
        self.traj_ch = trajectory_channel.open()

    # -- the two ways of collecting ------------------------------------------------------------
    def collect(self, num_steps: int, version: int) -> dict:
        """``num_steps`` decisions on every env (continuing episodes across iterations)."""
        return self._run(num_steps, version, episodic=None)

    def collect_episodes(self, max_steps: int, version: int, group_size: int) -> dict:
        """One episode per env from a reset; envs in a group of ``group_size`` share the reset seed
        (GRPO). Stops when every episode ended or after ``max_steps`` decisions."""
        n = self.env.num_envs
        groups = n // group_size
        seeds = np.repeat(self.env._seeds(groups), group_size).tolist()
        self.env.reset(seed=seeds)
        group_id = self.rank * groups + np.arange(n) // group_size
        return self._run(max_steps, version, episodic=group_id)

    def _run(self, num_steps: int, version: int, episodic: np.ndarray | None) -> dict:
        env, n = self.env, self.env.num_envs
        obs = env.obs
        space = env.single_action_space
        t_env = t_wait = 0.0
        start_steps, start_dropped = env.steps, env.dropped_episodes
        buf: dict[str, np.ndarray] = {
            "obs": np.empty((num_steps, *obs.shape), dtype=obs.dtype),
            "rewards": np.zeros((num_steps, n), dtype=np.float32),
            "terminated": np.zeros((num_steps, n), dtype=bool),
            "truncated": np.zeros((num_steps, n), dtype=bool),
        }
        active = np.ones(n, dtype=bool)
        mask = np.zeros((num_steps, n), dtype=bool)
        episode_return = np.zeros(n, dtype=np.float64)
        boot_idx: list[tuple[int, int]] = []
        boot_obs: list[np.ndarray] = []
        steps = 0
        for t in range(num_steps):
            buf["obs"][t] = obs
            w0 = time.perf_counter()
            self.obs_ch.put({"env_rank": self.rank, "obs": obs}, key=self.rollout_rank, version=version)
            reply = self.act_ch.get(key=self.rank)
            w1 = time.perf_counter()
            if t == 0:
                for k in ("action", "log_prob", "value"):
                    buf[k] = np.zeros((num_steps, *reply[k].shape), dtype=reply[k].dtype)
            for k in ("action", "log_prob", "value"):
                buf[k][t] = reply[k]
            res = env.step(reply["action"], auto_reset=episodic is None, active=active if episodic is not None else None)
            t_env += time.perf_counter() - w1
            t_wait += w1 - w0
            buf["rewards"][t] = res.reward
            buf["terminated"][t] = res.terminated
            buf["truncated"][t] = res.truncated
            for i, o in res.final_obs.items():
                boot_idx.append((t, i))
                boot_obs.append(o)
            mask[t] = active
            steps = t + 1
            if episodic is not None:
                episode_return += np.where(active, res.reward, 0.0)
                active &= ~(res.terminated | res.truncated)
                if not active.any():
                    break
            obs = res.obs
        self.obs_ch.put({"env_rank": self.rank, "stop": True}, key=self.rollout_rank, version=version)
        traj = {k: v[:steps] for k, v in buf.items()}
        traj["last_obs"] = obs
        traj["boot_idx"] = np.asarray(boot_idx, dtype=np.int64).reshape(-1, 2)
        traj["boot_obs"] = np.asarray(boot_obs, dtype=obs.dtype).reshape(-1, *obs.shape[1:])
        if episodic is not None:
            traj["mask"] = mask[:steps]
            traj["episode_return"] = episode_return.astype(np.float32)
            traj["group_id"] = episodic.astype(np.int64)
        traj["policy_version"] = np.full(1, version, dtype=np.int64)
        self.traj_ch.put(traj, key=self.actor_rank, version=version, weight=1.0)
        stats = env.episode_stats()
        return {
            "env_steps": env.steps - start_steps,
            "decisions": steps * n,
            "episodes": stats,
            "dropped_episodes": env.dropped_episodes - start_dropped,
            "time_env": t_env,
            "time_wait_action": t_wait,
        }

    # -- evaluation ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return self.env.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state)

    def spaces(self):
        return self.env.single_observation_space, self.env.single_action_space
