"""The embodied on-policy workflow (PPO, GRPO): env -> rollout -> actor, connected by channels.

Logical workflow, the same under every placement::

    env workers --obs / actions (request, reply)--> rollout workers   (per decision, per micro-batch)
    env workers --trajectories (channel)--> actor workers              (per iteration)
    actor rank 0 --weights (bucketed, versioned, checksummed)--> rollout workers

Physically (a :class:`~rlweave.flow.FlowPlan`): when env and rollout groups sit on identical slots
they share host processes and a request is a function call; otherwise it is one Ray call. Each env
worker's envs are split into ``micro_batches`` slices so env stepping and inference overlap. With
``placement.mode=auto`` the :class:`~rlweave.flow.Planner` measures the first iterations, predicts
every candidate plan and switches to the fastest at an iteration boundary. The driver below reads as
a one-process program: each line is a call on a whole worker group.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlweave.cluster import GroupPlacement, PlacementError, WorkerGroup, wait_all
from rlweave.config import ConfigError
from rlweave.flow import FlowPlan, Planner, Replanner, physical_cores, plan_from_groups
from rlweave.models import build_policy
from rlweave.models.run_policy import initial_policy_state, policy_kwargs
from rlweave.runners.common import RunnerBase
from rlweave.runners.records import StageClock, prefixed_means, total, worst
from rlweave.runners.warmup import initial_policy_source
from rlweave.utils.metrics import MetricsWriter, Progress, Trace, write_text_atomic
from rlweave.workers.actor_worker import ActorWorker
from rlweave.workers.env_worker import EnvWorker
from rlweave.workers.rollout_worker import RolloutWorker


class OnPolicyRunner(RunnerBase):
    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False):
        super().__init__(cfg, run_dir, resume)
        e = cfg.env
        self.total_envs = e.num_workers * e.num_envs  # of the logical workflow: plans never change it
        if e.num_envs % cfg.rollout.micro_batches:
            raise ConfigError(f"rollout.micro_batches: {cfg.rollout.micro_batches} must divide env.num_envs ({e.num_envs})")
        self.version = 0
        self.generation = 0  # env group rebuilds so far: new env workers get fresh seeds
        self.env: WorkerGroup | None = None
        self.rollout: WorkerGroup | None = None
        self.flow: FlowPlan | None = None
        self.recording = False  # env and rollout workers record per-micro-batch trace events
        self.replanner: Replanner | None = None  # placement.mode=auto

    @property
    def steps_per_iteration(self) -> int:
        return self.total_envs * self.cfg.train.rollout_steps * self.cfg.env.chunk

    @property
    def iterations(self) -> int:
        # Episodic algorithms (GRPO) collect a variable number of steps: they stop on the step budget.
        if self.spec.episodic_groups:
            return 10**9
        left = max(0, self.cfg.train.total_env_steps - self.env_steps)
        return self.iteration + math.ceil(left / self.steps_per_iteration)

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        cfg = self.cfg
        self._start_cluster(" (start of placement.mode=auto)" if cfg.placement.mode == "auto" else "")
        plan = self.plan
        n_act = plan.groups["actor"].num_workers
        self.traj_spec = self._open_channel("trajectories")
        self.pkw = policy_kwargs(cfg)
        self.actor = WorkerGroup(
            ActorWorker, plan.groups["actor"], self.cluster,
            args=(OmegaConf.to_container(cfg.algorithm), self.pkw, self.obs_space, self.act_space, cfg.env.chunk,
                  cfg.seed, self.traj_spec, max(1, plan.groups["env"].num_workers // n_act)),
            kwargs={"update_threads": cfg.actor.update_threads if self.split_critic else 1},
            init_dist=True, wait=False,  # the env and rollout groups start while the learner builds
        )
        self.groups.append(self.actor)
        if cfg.actor.update_threads > 1 and not self.split_critic:
            print(f"[rlweave] actor.update_threads={cfg.actor.update_threads}: policy '{cfg.policy.name}' has no critic apart "
                  "from its actor, so its update runs in one process")
        if cfg.placement.mode == "auto":
            planner = Planner(
                slots=self.cluster.slots(),
                total_envs=self.total_envs, steps=cfg.train.rollout_steps, cores=physical_cores(self.cluster),
                max_micro_batches=cfg.planner.max_micro_batches, env_multiple=n_act, margin=cfg.planner.margin, min_gain=cfg.planner.min_gain,
                gpu_slots=self.cluster.slot_kind == "gpu",
            )
            self.replanner = Replanner(planner, cfg.planner.verify)
            first = self.replanner.first_plan()
        else:
            first = plan_from_groups(plan.groups["env"], plan.groups["rollout"], cfg.rollout.micro_batches)
        self._apply_flow(first, initial=True)
        source = initial_policy_source(self)
        if source is not None:  # a resume or restart then loads its own checkpoint over these
            fresh = self.actor.load_initial_weights(initial_policy_state(source), cfg.init.obs_stats == "keep")
            note = f"; {len(fresh)} tensors it lacks start fresh ({', '.join(sorted({k.split('.')[0] for k in fresh}))})" if fresh else ""
            print(f"[rlweave] policy starts from {source}{note}")
        self.eval_policy = build_policy(observation_space=self.obs_space, action_space=self.act_space, chunk=cfg.env.chunk, **self.pkw)

    def _apply_flow(self, flow: FlowPlan, initial: bool = False) -> None:
        """Lays the env and rollout groups out as ``flow`` says, between iterations. The rollout
        group is rebuilt (its state is the weights, re-sent here); the env group is kept when its
        layout is unchanged and rebuilt otherwise (per-worker env counts change with the worker
        count, so running episodes end at the switch; the trajectories already sent are complete).
        A failure leaves the previous layout running and raises."""
        cfg = self.cfg
        if self.total_envs % flow.num_env or (self.total_envs // flow.num_env) % flow.micro_batches:
            raise PlacementError(f"plan {flow.label()}: {self.total_envs} envs do not split into {flow.num_env} workers x {flow.micro_batches} micro-batches")
        n_act = self.actor.world_size
        if flow.num_env % n_act:
            raise PlacementError(f"plan {flow.label()}: {n_act} actor ranks must divide {flow.num_env} env workers")
        old_env, old_rollout, old_flow = self.env, self.rollout, self.flow
        rebuild_env = old_flow is None or old_flow.env_slots != flow.env_slots
        new_env = old_env
        try:
            if old_rollout is not None:
                old_rollout.detach()
            if rebuild_env:
                if old_env is not None:
                    old_env.shutdown()
                    self.generation += 1
                env_cfg = OmegaConf.to_container(cfg.env)
                env_cfg["num_envs"] = self.total_envs // flow.num_env
                new_env = WorkerGroup(
                    EnvWorker, self._placement(flow, "env"), self.cluster,
                    args=(env_cfg, cfg.seed + 1_000_003 * self.generation, cfg.algorithm.gamma, None, self.traj_spec, n_act),
                    wait=False,  # a separate rollout group starts beside it
                )
            self._start_rollout(flow, new_env)
        except Exception:
            if initial:
                raise
            # back to the previous layout, built afresh (episodes restart), and say so
            print(f"[rlweave] plan switch to {flow.label()} failed; going back to {old_flow.label()}")
            for g in {id(x): x for x in (new_env, old_env) if x is not None}.values():
                g.shutdown()
            self.env, self.rollout, self.flow = None, None, None
            self.groups = [self.actor]
            self.generation += 1
            self._apply_flow(old_flow, initial=True)
            self._load_rollout_weights()
            raise
        if not initial:
            self._load_rollout_weights()
        print(f"[rlweave] flow plan: {flow.label()}")

    def _start_rollout(self, flow: FlowPlan, env: WorkerGroup) -> None:
        """Starts the rollout group of ``flow`` (inside ``env``'s processes when fused), makes
        ``flow`` current, and points every env worker at its rollout worker and pipeline depth."""
        rollout = WorkerGroup(
            RolloutWorker, self._placement(flow, "rollout"), self.cluster,
            args=(self.pkw, self.obs_space, self.act_space, self.cfg.env.chunk),
            colocate_with=env if flow.fused else None, wait=False,
        )
        self.env, self.rollout, self.flow = env, rollout, flow
        self.groups = [self.actor, env, rollout]
        env.configure_rollout(rollout)
        env.configure(micro_batches=flow.micro_batches, num_actor_workers=self.actor.world_size, record_events=self.recording)

    def _placement(self, flow: FlowPlan, group: str) -> GroupPlacement:
        """``group``'s slots under ``flow``, with the torch threads its ``placement.groups`` entry
        asks for (a flow plan carries slots only; without this the configured threads were lost)."""
        placed = flow.placements()[group]
        threads = self.plan.groups[group].threads if group in self.plan.groups else None
        return placed if threads is None else GroupPlacement(group, list(placed.slots), threads)

    def _load_rollout_weights(self) -> None:
        packet = getattr(self, "_last_packet", None)
        if packet is not None:
            self.rollout.load_weights(packet)

    # ------------------------------------------------------------------ scaling
    def scale_env(self, num_workers: int) -> None:
        """Adds or removes env workers at an iteration boundary (by API; the planner changes the
        layout through plans). Each worker keeps its env count, so the batch grows or shrinks;
        workers that stay keep their episodes, and every trajectory of the last iteration was
        already delivered, so no sample is lost or counted twice."""
        n_act = self.actor.world_size
        if num_workers < 1 or num_workers % n_act:
            raise ValueError(f"env.num_workers: {num_workers} must be a positive multiple of the {n_act} actor rank(s)")
        slots = self.cluster.slots()
        old = list(self.flow.env_slots)
        env_slots = tuple(old[:num_workers] + [slots[r % len(slots)] for r in range(len(old), num_workers)])
        per_worker = self.total_envs // self.flow.num_env
        rollout_slots = env_slots if self.flow.fused else self.flow.rollout_slots
        flow = FlowPlan(env_slots, rollout_slots, self.flow.micro_batches)
        self.rollout.detach()
        self.env.resize(GroupPlacement("env", list(env_slots)))
        self.total_envs = per_worker * num_workers
        self._start_rollout(flow, self.env)
        self._load_rollout_weights()
        print(f"[rlweave] env workers scaled to {num_workers}: {self.flow.label()}")

    # ------------------------------------------------------------------ checkpoints
    def _parts(self) -> dict:
        parts = {
            "actor": self.actor.state_dict(),
            "envs": self.env.state_dict(),
            "rollouts": self.rollout.state_dict(),
            "runner": {
                **self._driver_state(),
                "version": self.version,
                "flow": self.flow.as_tuple(),
                **(self.replanner.state_dict() if self.replanner else {"planner": None, "planner_run": None}),
            },
        }
        return parts

    def _restore_parts(self, state: dict) -> None:
        r = state["runner"]
        if r.get("flow") is not None and FlowPlan.from_tuple(r["flow"]) != self.flow:
            self._apply_flow(FlowPlan.from_tuple(r["flow"]))
        if self.replanner:
            self.replanner.load_state_dict(r, r["iteration"])
        self.actor.load_state_dict(state["actor"])
        self.env.load_state_dict(state["envs"])
        self.rollout.load_state_dict(state["rollouts"])
        self.version = r["version"]

    def _more(self) -> bool:
        return self.iteration < self.iterations and self.env_steps < self.cfg.train.total_env_steps

    def _after_iteration(self, record: dict) -> None:
        """``placement.mode=auto``: the plan the next iteration runs under (:class:`~rlweave.flow.Replanner`),
        applied before the checkpoint, so a resumed run continues under the plan chosen here."""
        if self.replanner is None:
            return
        plan = self.replanner.next_plan(self.flow, record, self.iteration, self.cfg.train.rollout_steps)
        if plan is None or plan == self.flow:
            return
        try:
            self._apply_flow(plan)
        except Exception as e:  # noqa: BLE001 - the run continues on its previous plan
            print(f"[rlweave] planner: could not switch to {plan.label()} ({e}); staying on {self.flow.label()}")

    def _iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        """One iteration of the workflow: env workers collect (asking rollout workers for actions)
        while each actor rank computes advantages and updates on the trajectories sent to it; then
        the weights go to the rollout workers, and an evaluation runs when due."""
        cfg = self.cfg
        self._record_events(self.iteration < cfg.run.trace_iterations)
        clock = StageClock(trace)
        if self.spec.episodic_groups:
            h_env = self.env.collect_episodes(cfg.train.rollout_steps, self.version, cfg.algorithm.group_size)
        else:
            h_env = self.env.collect(cfg.train.rollout_steps, self.version)
        h_act = self.actor.train(self.version, self.env_steps / cfg.train.total_env_steps, self.env.world_size)
        env_out, act_out = wait_all([h_env, h_act])
        t_trained = time.perf_counter()
        roll_out = self.rollout.stats()
        shared = self.actor_shares_rollout_slots()
        released = self.rollout.offload() if shared else None  # the trainer's turn on the shared slots
        self.version += 1
        with clock.stage("weight_sync"):
            self._sync_weights()
        moved = self.actor.offload() if shared and self.cluster.slot_kind == "gpu" else None  # the rollout's turn next
        self.iteration += 1
        steps = sum(o["env_steps"] for o in env_out)
        self.env_steps += steps
        record = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time": None, **self._episode_metrics(env_out)}
        record.update(self._sample_metrics(act_out, steps))
        record.update(self._stage_metrics(h_env, env_out, roll_out, act_out, clock, steps))
        record.update(self._plan_metrics(shared, released, moved, record["time/iteration"]))
        self._trace_iteration(trace, clock.start, t_trained, h_env, env_out, roll_out, act_out)
        final = self.iteration >= self.iterations or self.env_steps >= cfg.train.total_env_steps
        return self._finish_record(record, metrics, trace, progress, final)

    def _record_events(self, recording: bool) -> None:
        """Env and rollout workers record per-micro-batch trace events (a call only on a change)."""
        if recording != self.recording:
            self.recording = recording
            self.env.configure(record_events=recording)
            self.rollout.configure(recording)

    def _sample_metrics(self, act_out: list[dict], steps: int) -> dict:
        """What the actor ranks trained on, checked: every trajectory once, of the version that ran."""
        received = [x for a in act_out for x in a["received"]]
        if len({x[0] for x in received}) != len(received) or any(x[1] != self.version - 1 for x in received):
            raise RuntimeError(f"iteration {self.iteration}: trajectories duplicated or off-policy: {received}")
        return {**prefixed_means(act_out, "train/"), "samples/produced": steps,
                "samples/trained": sum(x[2] for x in received), "samples/trajectories": len(received)}

    def _stage_metrics(self, h_env, env_out, roll_out, act_out, clock: StageClock, steps: int) -> dict:
        """Stage times (each the slowest rank's), throughput and memory of one iteration."""
        t_iter = clock.elapsed()
        record = {**clock.record(), "time/iteration": t_iter, "time/collect": h_env.duration,
                  "time/env": worst(env_out, "time/env"), "time/env_wait_action": worst(env_out, "time/wait_action"),
                  "time/rollout": worst(roll_out, "time/compute"), "time/rollout_per_env_worker": worst(env_out, "time/infer"),
                  "time/trajectory_put": worst(env_out, "time/put"), "time/actor": worst(act_out, "time/actor_train"),
                  "time/actor_wait": min(a["time/actor_wait"] for a in act_out),
                  "perf/env_steps_per_s": steps / t_iter, "perf/collect_steps_per_s": steps / max(1e-9, h_env.duration),
                  "mem/env_peak_rss_mb": worst(env_out, "peak_rss_mb"), "mem/rollout_peak_rss_mb": worst(roll_out, "peak_rss_mb"),
                  "mem/actor_peak_rss_mb": worst(act_out, "peak_rss_mb")}
        for key in ("device/allocated_mb", "device/peak_mb"):
            if key in act_out[0]:
                record[f"mem/actor_{key.split('/')[1]}"] = worst(act_out, key)
        return record

    def _plan_metrics(self, shared: bool, released, moved, t_iter: float) -> dict:
        """The layout this iteration ran under, what moved off the shared slots, and the planner's prediction."""
        f = self.flow
        record = {"plan/env_workers": f.num_env, "plan/rollout_workers": f.num_rollout, "plan/micro_batches": f.micro_batches,
                  "plan/fused": int(f.fused), "plan/rollout_offloaded": int(shared)}
        if moved is not None:
            record["mem/actor_device_mb_before_offload"] = max(m["before"].get("allocated_mb", 0.0) for m in moved)
            record["mem/actor_device_mb_after_offload"] = max(m["after"].get("allocated_mb", 0.0) for m in moved)
        if released is not None:
            record["mem/rollout_released_params"] = total(released, "released_params")
        prediction = self.replanner.prediction if self.replanner else None
        if prediction is not None and prediction.plan == f:
            record["plan/predicted_iteration"] = prediction.iteration
            record["plan/error"] = abs(prediction.iteration - t_iter) / t_iter
        return record

    def _trace_iteration(self, trace: Trace, t0: float, t_trained: float, h_env, env_out, roll_out, act_out) -> None:
        for rank, (o, d) in enumerate(zip(env_out, h_env.durations)):
            trace.span(f"env[{rank}]", h_env.method, t0, d, {"plan": self.flow.label()})
            for name, start, dur in o["events"] or []:
                trace.span(f"env[{rank}]", name, start, dur)
        for rank, o in enumerate(roll_out):
            for name, start, dur in o["events"] or []:
                trace.span(f"rollout[{rank}]", name, start, dur)
        for rank, a in enumerate(act_out):
            trace.span(f"actor[{rank}]", "train", t_trained - a["time/actor_train"], a["time/actor_train"])

    def actor_shares_rollout_slots(self) -> bool:
        return bool(set(self.actor.placement.slots) & set(self.flow.rollout_slots))

    def _derived(self) -> dict:
        return {**self.plan.as_dict(), "flow": self.flow.as_dict()}

    def _stop_groups(self) -> None:
        super()._stop_groups()
        self.env = self.rollout = self.flow = None  # a restart lays out fresh groups

    def _on_shutdown(self) -> None:
        if self.replanner and self.replanner.log:
            write_text_atomic(self.run_dir / "plans.json", json.dumps(self.replanner.log, indent=1))

