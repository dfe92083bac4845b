"""The embodied on-policy workflow (PPO, GRPO): env -> rollout -> actor, connected by channels.

Logical workflow, the same under every placement::

    env workers --obs--> rollout workers --actions--> env workers     (per decision)
    env workers --trajectories--> actor workers                        (per iteration)
    actor rank 0 --weights (bucketed, versioned, checksummed)--> rollout workers

Physically, when env and rollout groups sit on identical slots they share host processes and the
obs/action channels are in-process; otherwise both are Ray channels. The driver below reads as a
one-process program: each line is a call on a whole worker group.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms import get_algorithm
from rlweave.channel import Channel
from rlweave.cluster import Cluster, PlacementError, WorkerGroup, make_plan, wait_all
from rlweave.config import ConfigError
from rlweave.envs import space_info
from rlweave.models import build_policy
from rlweave.runners.evaluate import evaluate_policy
from rlweave.utils.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlweave.utils.metrics import MetricsWriter, Progress, Trace, truncate_metrics
from rlweave.workers.actor_worker import ActorWorker
from rlweave.workers.channels import ChannelSpec
from rlweave.workers.env_worker import EnvWorker
from rlweave.workers.rollout_worker import RolloutWorker
from rlweave.workers.weights import resolve_buckets, unpack_into


def check_compatible(cfg: DictConfig):
    """Checks what the schema cannot (cross-field rules, env and policy fit) before any worker
    starts. Returns the env's (observation_space, action_space)."""
    try:
        spec = get_algorithm(cfg.algorithm.name)
    except KeyError as e:
        raise ConfigError(f"algorithm.name: {e.args[0]}") from None
    if cfg.env.num_workers % cfg.actor.num_workers:
        raise ConfigError(
            f"actor.num_workers: {cfg.actor.num_workers} must divide env.num_workers ({cfg.env.num_workers}) "
            "so every actor rank trains on the same amount of data"
        )
    if spec.episodic_groups and cfg.env.num_envs % cfg.algorithm.group_size:
        raise ConfigError(
            f"algorithm.group_size: {cfg.algorithm.group_size} must divide env.num_envs ({cfg.env.num_envs})"
        )
    env_cfg = OmegaConf.to_container(cfg.env)
    try:
        obs_space, act_space = space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
    except Exception as e:  # noqa: BLE001 - any failure to build the env is a config problem here
        raise ConfigError(f"env.id: cannot make '{cfg.env.id}': {str(e).splitlines()[0]}") from None
    try:
        build_policy(observation_space=obs_space, action_space=act_space, chunk=cfg.env.chunk, **_policy_kwargs(cfg))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy.name: {str(e).splitlines()[0]}") from None
    return obs_space, act_space


def plan_placement(cfg: DictConfig, cluster: Cluster):
    """The placement plan of the env/rollout/actor groups on ``cluster`` (PlacementError if bad)."""
    explicit = {k: OmegaConf.to_container(v) for k, v in cfg.placement.groups.items()}
    workers = {"env": cfg.env.num_workers, "rollout": cfg.rollout.num_workers, "actor": cfg.actor.num_workers}
    plan = make_plan(cluster, workers, cfg.placement.mode, explicit, cfg.placement.oversubscribe)
    n_env, n_roll, n_act = (plan.groups[g].num_workers for g in ("env", "rollout", "actor"))
    if n_env % n_act:
        raise PlacementError(f"placement.groups.actor: {n_act} actor ranks must divide {n_env} env workers")
    if n_env % n_roll:
        raise PlacementError(f"placement.groups.rollout: {n_roll} rollout workers must divide {n_env} env workers")
    return plan


def _policy_kwargs(cfg: DictConfig) -> dict:
    p = OmegaConf.to_container(cfg.policy)
    name = p.pop("name")
    kwargs: dict = {"name": name, "critic": get_algorithm(cfg.algorithm.name).uses_critic}
    if name == "mlp":
        kwargs.update(hidden=tuple(p["hidden"]), activation=p["activation"], normalize_obs=p["normalize_obs"],
                      log_std_init=p["log_std_init"], ortho_init=p["ortho_init"])
    else:
        kwargs.update(log_std_init=p["log_std_init"])
    return kwargs


class OnPolicyRunner:
    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.spec = get_algorithm(cfg.algorithm.name)
        self.obs_space, self.act_space = check_compatible(cfg)
        if not cfg.cluster.address:
            # The embedded cluster's inventory is known in advance: refuse a bad placement before
            # Ray starts or the run folder is made. (An attached cluster is checked after attaching.)
            plan_placement(cfg, Cluster.planned(cfg.cluster.num_cpus, cfg.cluster.num_gpus))
        e = cfg.env
        self.steps_per_iteration = e.num_workers * e.num_envs * cfg.train.rollout_steps * e.chunk
        # Episodic algorithms (GRPO) collect a variable number of steps: they stop on the step budget.
        self.iterations = (
            10**9 if self.spec.episodic_groups else max(1, math.ceil(cfg.train.total_env_steps / self.steps_per_iteration))
        )
        self.iteration = 0
        self.version = 0
        self.env_steps = 0
        self.wall_offset = 0.0
        self.groups: list[WorkerGroup] = []
        self.channels: list[Channel] = []
        self.cluster: Cluster | None = None

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        cfg = self.cfg
        c = cfg.cluster
        self.cluster = Cluster.start(address=c.address, num_cpus=c.num_cpus, num_gpus=c.num_gpus, dashboard=c.dashboard, local=c.local)
        plan = self.plan = plan_placement(cfg, self.cluster)
        print(f"[rlweave] {self.cluster.describe()}")
        print(f"[rlweave] {plan.describe()}")
        n_env, n_roll, n_act = (plan.groups[g].num_workers for g in ("env", "rollout", "actor"))
        fused = plan.groups["env"].slots == plan.groups["rollout"].slots
        local_io = fused or self.cluster.local
        run_id = uuid.uuid4().hex[:8]
        obs_ch = ChannelSpec(f"{run_id}/obs", local=local_io)
        act_ch = ChannelSpec(f"{run_id}/actions", local=local_io)
        traj_ch = ChannelSpec(f"{run_id}/trajectories", local=self.cluster.local)
        for spec in (obs_ch, act_ch, traj_ch):
            if not spec.local:
                self.channels.append(Channel.create(spec.name))
        env_cfg = OmegaConf.to_container(cfg.env)
        seed = cfg.seed
        self.env = WorkerGroup(
            EnvWorker, plan.groups["env"], self.cluster,
            args=(env_cfg, seed, cfg.algorithm.gamma, obs_ch, act_ch, traj_ch, n_roll, n_act),
        )
        self.groups.append(self.env)
        served = [sum(1 for e in range(n_env) if e % n_roll == r) for r in range(n_roll)]
        pkw = _policy_kwargs(cfg)
        self.rollout = WorkerGroup(
            RolloutWorker, plan.groups["rollout"], self.cluster,
            args=(pkw, self.obs_space, self.act_space, cfg.env.chunk, seed, obs_ch, act_ch, served[0]),
            colocate_with=self.env if fused else None,
        )
        self.groups.append(self.rollout)
        self.actor = WorkerGroup(
            ActorWorker, plan.groups["actor"], self.cluster,
            args=(OmegaConf.to_container(cfg.algorithm), pkw, self.obs_space, self.act_space, cfg.env.chunk,
                  seed, traj_ch, n_env // n_act),
            init_dist=True,
        )
        self.groups.append(self.actor)
        self.eval_policy = build_policy(observation_space=self.obs_space, action_space=self.act_space, chunk=cfg.env.chunk, **pkw)

    def _sync_weights(self) -> float:
        t0 = time.perf_counter()
        packet = self.actor.call("export_weights", ranks=[0]).wait()[0]
        checksums = self.rollout.run("load_weights", packet)
        if any(c != packet.checksum for c in checksums):
            raise RuntimeError(f"weight sync v{packet.version}: rollout checksums {checksums} != actor {packet.checksum}")
        self._last_packet = packet
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ checkpoints
    def _save(self) -> None:
        parts = {
            "actor": self.actor.call("state_dict", ranks=[0]).wait()[0],
            "envs": self.env.run("state_dict"),
            "rollouts": self.rollout.run("state_dict"),
            "runner": {
                "iteration": self.iteration,
                "version": self.version,
                "env_steps": self.env_steps,
                "wall_time": self._wall(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                "torch": torch.get_rng_state(),
            },
        }
        save_checkpoint(self.run_dir, self.iteration, parts, keep=self.cfg.train.keep_checkpoints)

    def _restore(self) -> None:
        path = latest_checkpoint(self.run_dir)
        if path is None:
            raise FileNotFoundError(f"no checkpoint under {self.run_dir / 'checkpoints'} to resume from")
        state = load_checkpoint(path)
        self.actor.run("load_state_dict", state["actor"])
        self.env.call_each("load_state_dict", [(s,) for s in state["envs"]]).wait()
        self.rollout.call_each("load_state_dict", [(s,) for s in state["rollouts"]]).wait()
        r = state["runner"]
        self.iteration, self.version, self.env_steps = r["iteration"], r["version"], r["env_steps"]
        self.wall_offset = r["wall_time"]
        np.random.set_state(r["numpy"])
        random.setstate(r["python"])
        torch.set_rng_state(r["torch"])
        truncate_metrics(self.run_dir, self.iteration)
        print(f"[rlweave] resumed from {path.name}: iteration {self.iteration}, {self.env_steps} env steps")

    def _wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self._t_start

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._t_start = time.perf_counter()
        last: dict = {}
        try:
            self._start()
            if not self.resume:
                np.random.seed(cfg.seed)
                random.seed(cfg.seed)
                torch.manual_seed(cfg.seed)
            self._write_config()
            if self.resume:
                self._restore()
            self._sync_weights()
            metrics = MetricsWriter(self.run_dir, tensorboard=cfg.run.tensorboard)
            trace = Trace(self.run_dir)
            progress = Progress(cfg.train.total_env_steps, enabled=cfg.run.progress)
            try:
                while self.iteration < self.iterations and self.env_steps < cfg.train.total_env_steps:
                    last = self._iteration(metrics, trace, progress)
            finally:
                progress.close()
                metrics.close()
                trace.write()
            if not latest_checkpoint(self.run_dir) or latest_checkpoint(self.run_dir).name != f"iter_{self.iteration:08d}":
                self._save()
        finally:
            self.shutdown()
        return last

    def _iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        if self.spec.episodic_groups:
            h_env = self.env.call("collect_episodes", cfg.train.rollout_steps, self.version, cfg.algorithm.group_size)
        else:
            h_env = self.env.call("collect", cfg.train.rollout_steps, self.version)
        h_roll = self.rollout.call("serve", self.version)
        h_act = self.actor.call("train", self.version, self.env_steps / cfg.train.total_env_steps)
        env_out, _, act_out = wait_all([h_env, h_roll, h_act])
        t1 = time.perf_counter()
        self.version += 1
        t_sync = self._sync_weights()
        self.iteration += 1
        steps = sum(o["env_steps"] for o in env_out)
        self.env_steps += steps
        t_iter = time.perf_counter() - t0
        record: dict = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time": None}
        returns = [r for o in env_out for r in o["episodes"]["return"]]
        lengths = [r for o in env_out for r in o["episodes"]["length"]]
        success = [r for o in env_out for r in o["episodes"]["success"]]
        if returns:
            record["train/episode_return"] = float(np.mean(returns))
            record["train/episode_length"] = float(np.mean(lengths))
            record["train/episodes"] = len(returns)
        if success:
            record["train/success_rate"] = float(np.mean(success))
        record["train/dropped_episodes"] = sum(o["dropped_episodes"] for o in env_out)
        for k in act_out[0]:
            if k.startswith("train/"):
                record[k] = float(np.mean([a[k] for a in act_out]))
        record["time/env"] = max(o["time_env"] for o in env_out)
        record["time/env_wait_action"] = max(o["time_wait_action"] for o in env_out)
        record["time/rollout"] = h_roll.duration
        record["time/actor"] = max(a["time/actor_train"] for a in act_out)
        record["time/weight_sync"] = t_sync
        record["time/iteration"] = t_iter
        record["perf/env_steps_per_s"] = steps / t_iter
        for name, h in (("env", h_env), ("rollout", h_roll)):
            for rank, d in zip(h.ranks, h.durations):
                trace.span(f"{name}[{rank}]", h.method, t0, d)
        for rank, a in enumerate(act_out):
            trace.span(f"actor[{rank}]", "train", t1 - a["time/actor_train"], a["time/actor_train"])
        trace.span("driver", "weight_sync", t1, t_sync)
        ev = cfg.train.eval_every
        final = self.iteration >= self.iterations or self.env_steps >= cfg.train.total_env_steps
        if ev and (self.iteration % ev == 0 or final):
            t_e = time.perf_counter()
            record.update(self.evaluate())
            record["time/eval"] = time.perf_counter() - t_e
            trace.span("driver", "eval", t_e, record["time/eval"])
        record["wall_time"] = self._wall()
        metrics.log(record)
        progress.update(self.iteration, self.env_steps, record.get("train/episode_return"), record.get("eval/episode_return"))
        ce = cfg.train.checkpoint_every
        if ce and self.iteration % ce == 0:
            self._save()
        return record

    def evaluate(self) -> dict:
        unpack_into(self.eval_policy, resolve_buckets(self._last_packet.buckets))
        env_cfg = OmegaConf.to_container(self.cfg.env)
        return evaluate_policy(self.eval_policy, env_cfg, self.cfg.train.eval_episodes, seed=self.cfg.seed + 10_000 + self.iteration, gamma=self.cfg.algorithm.gamma)

    def _write_config(self) -> None:
        cfg = OmegaConf.to_container(self.cfg)
        cfg["placement"]["derived"] = self.plan.as_dict()
        path = self.run_dir / "config.yaml"
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)), encoding="utf-8")
        tmp.replace(path)

    def shutdown(self) -> None:
        for g in reversed(self.groups):
            g.shutdown()
        self.groups = []
        for ch in self.channels:
            try:
                ch.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self.channels = []
        if self.cluster is not None:
            self.cluster.shutdown()
