"""Env worker: steps a batch of environments, asks its rollout worker for actions (request/reply,
through a :class:`~rlweave.cluster.Peer`), and hands finished trajectories to the actor over the
trajectory channel."""

from __future__ import annotations

import time

import numpy as np

from rlweave.cluster import Peer, Worker
from rlweave.envs import VectorEnv
from rlweave.utils.memory import peak_rss_mb
from rlweave.workers.channels import ChannelSpec
from rlweave.data.replay import NStepWriter
from rlweave.sync.weights import WeightPacket
from rlweave.cluster.dispatch import group_method
from rlweave.utils.tree import tree_index, tree_map, tree_set, tree_stack, tree_zeros


class EnvWorker(Worker):
    """Steps a batch of environments (its share of the run's envs) and asks its rollout worker for
    each decision's actions; on-policy it sends finished trajectories to its actor rank, off-policy
    and in imitation it writes n-step transitions (labelled by an expert in imitation). Env stepping
    lives apart from inference so the two can be placed, fused or pipelined as the plan says."""
    def __init__(
        self,
        env_cfg: dict,
        seed: int,
        gamma: float,
        rollout: Peer,
        trajectory_channel: ChannelSpec,
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
        self.rollout = rollout
        self.actor_rank = self.rank % num_actor_workers
        self.seed = seed
        self.decisions = 0  # policy decisions taken so far: with the seed, fixes the sampling noise
        self.traj_ch = trajectory_channel.open()
        self.micro_batches = 1
        self.record_events = False
        self.gamma = gamma
        self.writer: NStepWriter | None = None  # off-policy: n-step transitions, made on first use
        self.random_rng = np.random.default_rng([seed, self.rank, 7])  # warm-up actions

    # -- the two ways of collecting ------------------------------------------------------------
    @group_method("all", blocking=False)
    def collect(self, num_steps: int, version: int) -> dict:
        """``num_steps`` decisions on every env (continuing episodes across iterations)."""
        return self._run(num_steps, version, episodic=None)

    @group_method("all", blocking=False)
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
        """The decision loop. The envs are split into ``self.micro_batches`` contiguous slices that
        take turns: while the rollout worker computes actions for one slice, this worker steps
        another (with k = 1 the two strictly alternate). Each slice has one request in flight; the
        slices are stepped in order, each as soon as its reply is there."""
        env, n = self.env, self.env.num_envs
        k = self.micro_batches
        slices = [slice(j * n // k, (j + 1) * n // k) for j in range(k)]
        obs = env.obs
        t_env = t_wait = 0.0
        start_steps, start_dropped = env.steps, env.dropped_episodes
        buf: dict[str, np.ndarray] = {
            "obs": tree_zeros(num_steps, obs),  # rows after an episodic slice ends stay 0
            "rewards": np.zeros((num_steps, n), dtype=np.float32),
            "terminated": np.zeros((num_steps, n), dtype=bool),
            "truncated": np.zeros((num_steps, n), dtype=bool),
        }
        active = np.ones(n, dtype=bool)
        mask = np.zeros((num_steps, n), dtype=bool)
        episode_return = np.zeros(n, dtype=np.float64)
        boot_idx: list[tuple[int, int]] = []
        boot_obs: list = []
        t_infer = 0.0
        events: list[tuple[str, float, float]] | None = [] if self.record_events else None
        live = [True] * k  # slice still has steps to take (episodic: some env still active)
        last_t = [-1] * k
        pending = [None] * k
        for j, sl in enumerate(slices):
            tree_set(buf["obs"], (0, sl), tree_index(obs, sl))
            pending[j] = self._request(tree_index(obs, sl), sl, version, 0)
        for t in range(num_steps):
            for j, sl in enumerate(slices):
                if not live[j]:
                    continue
                w0 = time.perf_counter()
                reply, _ = self.rollout.result(pending[j])
                w1 = time.perf_counter()
                t_infer += reply["time/compute"]
                if "action" not in buf:
                    for key in ("action", "log_prob", "value"):
                        buf[key] = np.zeros((num_steps, n, *reply[key].shape[1:]), dtype=reply[key].dtype)
                for key in ("action", "log_prob", "value"):
                    buf[key][t, sl] = reply[key]
                act = active[sl] if episodic is not None else None
                res = env.step(reply.get("env_action", reply["action"]), auto_reset=episodic is None, active=act, envs=sl)
                buf["rewards"][t, sl] = res.reward
                buf["terminated"][t, sl] = res.terminated
                buf["truncated"][t, sl] = res.truncated
                for i, o in res.final_obs.items():
                    boot_idx.append((t, sl.start + i))
                    boot_obs.append(o)
                mask[t, sl] = active[sl]
                last_t[j] = t
                if episodic is not None:
                    episode_return[sl] += np.where(active[sl], res.reward, 0.0)
                    active[sl] &= ~(res.terminated | res.truncated)
                    live[j] = bool(active[sl].any())
                w2 = time.perf_counter()
                if t + 1 < num_steps and live[j]:
                    tree_set(buf["obs"], (t + 1, sl), res.obs)
                    pending[j] = self._request(res.obs, sl, version, t + 1)
                w3 = time.perf_counter()
                t_wait += (w1 - w0) + (w3 - w2)  # waiting for the reply, sending the next request
                t_env += w2 - w1
                if events is not None:
                    events += [("wait", w0, w1 - w0), (f"step mb{j}", w1, w2 - w1), ("request", w2, w3 - w2)]
            if not any(live):
                break
        obs = env.obs
        steps = max(last_t) + 1
        self.decisions += num_steps
        traj = {k_: tree_index(v, slice(0, steps)) for k_, v in buf.items()}
        traj["last_obs"] = obs
        traj["boot_idx"] = np.asarray(boot_idx, dtype=np.int64).reshape(-1, 2)
        traj["boot_obs"] = tree_stack(boot_obs) if boot_obs else tree_zeros(0, tree_index(obs, 0))
        if episodic is not None:
            traj["mask"] = mask[:steps]
            traj["episode_return"] = episode_return.astype(np.float32)
            traj["group_id"] = episodic.astype(np.int64)
        traj["policy_version"] = np.full(1, version, dtype=np.int64)
        traj["env_rank"] = np.full(1, self.rank, dtype=np.int64)
        traj["env_steps"] = np.full(1, env.steps - start_steps, dtype=np.int64)
        t_put = time.perf_counter()
        self.traj_ch.put(traj, key=self.actor_rank, version=version, weight=1.0)
        t_put = time.perf_counter() - t_put
        stats = env.episode_stats()
        return {
            "env_rank": self.rank,
            "env_steps": env.steps - start_steps,
            "decisions": int(mask[:steps].sum()) if episodic is not None else steps * n,
            "episodes": stats,
            "dropped_episodes": env.dropped_episodes - start_dropped,
            "time/env": t_env,
            "time/wait_action": t_wait,
            "time/infer": t_infer,
            "time/put": t_put,
            "rollout_rank": self.rollout.rank,
            "micro_batches": k,
            "peak_rss_mb": peak_rss_mb(),
            "events": events,
        }

    @group_method("all")
    def configure_expert(self, expert: str, gate: str = "none", threshold: float = 0.5, operator: str | None = None) -> None:
        """Imitation: the expert that labels this worker's states, and the intervention gate."""
        from rlweave.data.experts import load_expert, load_gate

        self.expert = load_expert(expert, self.env.single_observation_space, self.env.single_action_space)
        self.gate = load_gate(gate, threshold, operator)

    @group_method("all", blocking=False)
    def collect_transitions(self, num_steps: int, n_step: int = 1, random_actions: bool = False,
                            labelling: str | None = None, beta: float = 0.0, weights: WeightPacket | None = None) -> dict:
        """Off-policy collection: ``num_steps`` decisions on every env with the rollout worker's
        current policy (or uniform random actions: the warm-up before learning starts), written as
        n-step transitions to this worker's replay shard through the transition channel (one item
        per call). Each transition carries the policy version that acted.

        Imitation (``labelling`` set, see ``AlgorithmSpec.labelling``): the stored action is the
        expert's label. ``"expert"``: the expert acts; ``"mixture"``: the expert acts on each env
        with probability ``beta``, else the learner; ``"gated"``: the learner acts unless the gate
        hands the step to the expert, and only those steps are stored.

        ``weights``: a packet the rollout worker loads before the first decision (the runner's
        weight sync, carried by the collection call instead of a call of its own); the reply's
        ``weights_checksum`` is what the rollout worker loaded."""
        t_load = time.perf_counter()
        loaded = None if weights is None else self.rollout.result(self.rollout.submit("load_weights", weights))[0]
        t_load = time.perf_counter() - t_load
        env, n = self.env, self.env.num_envs
        if self.writer is None:
            self.writer = NStepWriter(n_step, self.gamma ** env.chunk, n)
        space = env.single_action_space
        obs = env.obs
        start_steps, start_dropped = env.steps, env.dropped_episodes
        t_env = t_wait = t_infer = 0.0
        versions: set[int] = set()
        labels = interventions = 0
        for t in range(num_steps):
            w0 = time.perf_counter()
            keep = None
            if random_actions:
                action = self.random_rng.uniform(space.low, space.high, size=(n, env.chunk, *space.shape)).astype(space.dtype)
                version = -1  # no policy acted
            elif labelling == "expert" or (labelling == "mixture" and beta >= 1.0):
                action, version = None, -1
            else:
                reply, _ = self.rollout.result(self._request(obs, slice(0, n), None, t))
                action, version = reply.get("env_action", reply["action"]), int(reply["version"])
                t_infer += reply["time/compute"]
            stored = None
            if labelling is not None:
                label = np.asarray(self.expert(obs), dtype=np.float32).reshape(n, env.chunk, *space.shape)
                if action is None:
                    takeover = np.ones(n, dtype=bool)
                elif labelling == "mixture":
                    takeover = self.random_rng.random(n) < beta
                else:  # gated
                    takeover = np.asarray(self.gate(obs, action.reshape(n, -1), label.reshape(n, -1)), dtype=bool)
                    keep = takeover
                    interventions += int(takeover.sum())
                action = label if action is None else np.where(takeover.reshape(n, *([1] * (label.ndim - 1))), label, action)
                stored = label
                labels += int(n if keep is None else keep.sum())
            versions.add(version)
            w1 = time.perf_counter()
            res = env.step(action)
            next_obs = res.obs.copy()
            for i, o in res.final_obs.items():
                next_obs[i] = o  # a truncated episode bootstraps from where it stopped
            done = res.terminated | res.truncated
            self.writer.add(obs, (action if stored is None else stored).reshape(n, -1), res.reward, next_obs,
                            res.terminated | res.dropped, done | res.dropped, version, keep=keep)
            obs = res.obs
            t_wait += w1 - w0
            t_env += time.perf_counter() - w1
        self.decisions += num_steps
        batch = self.writer.pop()
        t_put = time.perf_counter()
        self.traj_ch.put({"transitions": batch, "env_rank": self.rank}, key=self.actor_rank, version=max(versions), weight=1.0)
        t_put = time.perf_counter() - t_put
        return {
            "env_rank": self.rank,
            "env_steps": env.steps - start_steps,
            "transitions": 0 if batch is None else len(batch["reward"]),
            "labels": labels,
            "interventions": interventions,
            "versions": sorted(versions),
            "episodes": env.episode_stats(),
            "dropped_episodes": env.dropped_episodes - start_dropped,
            "time/env": t_env,
            "time/wait_action": t_wait,
            "time/infer": t_infer,
            "time/put": t_put,
            "time/weight_load": t_load,
            "weights_checksum": loaded,
            "peak_rss_mb": peak_rss_mb(),
        }

    def _request(self, obs: np.ndarray, envs: slice, version: int | None, t: int):
        """Asks the rollout worker for the actions of envs ``envs`` at decision ``t``. The sampling
        noise is seeded by (seed, env rank, decision), so the actions do not depend on the
        micro-batch split or on which rollout replica answers."""
        noise_seed = int(np.random.SeedSequence([self.seed, self.rank, self.decisions + t]).generate_state(1)[0])
        rows = (envs.start, envs.stop, self.env.num_envs)
        return self.rollout.submit("infer", tree_map(np.ascontiguousarray, obs), version, noise_seed, rows)

    @group_method("peers")
    def configure_rollout(self, rollout: Peer) -> None:
        """The rollout worker this env worker asks for actions (set after a plan switch)."""
        self.rollout = rollout

    @group_method("all")
    def configure(
        self,
        micro_batches: int | None = None,
        record_events: bool | None = None,
        rollout: Peer | None = None,
        num_actor_workers: int | None = None,
    ) -> None:
        """Changes how this worker runs, between iterations (a plan switch): the pipeline depth,
        event recording, and the rollout worker and actor rank it talks to."""
        if micro_batches is not None:
            if micro_batches < 1 or self.env.num_envs % micro_batches:
                raise ValueError(
                    f"rollout.micro_batches: {micro_batches} must be >= 1 and divide env.num_envs ({self.env.num_envs})"
                )
            self.micro_batches = micro_batches
        if record_events is not None:
            self.record_events = record_events
        if rollout is not None:
            self.rollout = rollout
        if num_actor_workers is not None:
            self.actor_rank = self.rank % num_actor_workers

    # -- evaluation ----------------------------------------------------------------------------
    @group_method("all")
    def state_dict(self) -> dict:
        return {**self.env.state_dict(), "decisions": self.decisions, "seed": self.seed,
                "writer": self.writer.state_dict() if self.writer else None,
                "random_rng": self.random_rng.bit_generator.state}

    @group_method("per_rank")
    def load_state_dict(self, state: dict) -> None:
        self.env.load_state_dict(state)
        self.decisions = state.get("decisions", 0)
        self.seed = state.get("seed", self.seed)
        if state.get("writer") is not None:
            self.writer = NStepWriter(state["writer"].get("n", 1), self.gamma ** self.env.chunk, self.env.num_envs)
            self.writer.load_state_dict(state["writer"])
        if "random_rng" in state:
            self.random_rng.bit_generator.state = state["random_rng"]

    def spaces(self):
        return self.env.single_observation_space, self.env.single_action_space
