"""The embodied off-policy workflow (SAC, CrossQ, RLPD, and imitation: BC, DAgger, HG-DAgger):
env -> rollout, env -> replay, replay -> actor; and the offline one (IQL, offline BC): dataset ->
replay -> actor, with the env only in evaluation.

Logical workflow::

    env workers --obs / actions (request, reply)--> rollout workers     (per decision)
    env workers --n-step transitions (channel)--> replay shard           (per iteration)
    replay shard --sampled batches (in-process)--> actor (learner)       (per update)
    actor --weights (bucketed, versioned, checksummed)--> rollout workers (every train.sync_every iterations)

Weight sync is carried by the calls the iteration makes anyway: the learner's ``train`` call
returns the new version's packet, and the next iteration's collection call hands it to the
rollout worker, which loads it before the first decision. So the sync costs the loop no serial
round trips of its own (two Ray calls after every ``train``, ~9 ms of a ~170 ms SAC iteration
before), and the weights each decision uses are the same as with a sync at the end of the
iteration. A run's start, resume, restart or layout switch still syncs directly.

Asynchronous: in iteration i the env workers collect ``train.rollout_steps`` decisions with the
rollout's current weights *while* the learner ingests the transitions of iteration i-1 and runs
the updates they make due (``algorithm.utd_ratio`` updates per env step, after
``algorithm.learning_starts`` steps of random actions). A transition therefore reaches the learner
at most ``train.sync_every`` policy versions after the one that acted; ``train.max_staleness``
bounds that (0 = collect, then train, in turn). Which transitions the learner takes in each
iteration is fixed by the driver, not by timing, so a run is reproducible.

The replay shard lives in the learner's process (a sample is a function call); env and rollout
share processes when their slots are identical (an action request is then a function call too).

Offline algorithms (registry kind ``offline``) start neither env nor rollout workers: the replay
holds the dataset alone, an iteration is ``train.updates_per_iteration`` gradient updates, and the
run ends after ``train.total_updates``; evaluation runs the learner's policy in the driver.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlweave.cluster import Cluster, GroupPlacement, PlacementError, WorkerGroup, make_plan, wait_all
from rlweave.models import build_policy
from rlweave.models.run_policy import initial_policy_state, policy_kwargs
from rlweave.runners.records import StageClock, total, update_only_record, worst
from rlweave.runners.common import Budget, RunnerBase
from rlweave.runners.warmup import initial_policy_source
from rlweave.utils.metrics import MetricsWriter, Progress, Trace
from rlweave.data.datasets import load_transitions
from rlweave.workers.env_worker import EnvWorker
from rlweave.workers.offpolicy_actor import OffPolicyActorWorker
from rlweave.workers.replay import ReplayBufferWorker
from rlweave.workers.rollout_worker import RolloutWorker
from rlweave.sync.weights import verify_sync


class OffPolicyRunner(RunnerBase):
    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False):
        super().__init__(cfg, run_dir, resume)
        self.ingested_steps = 0  # handed to the learner (the updates due are counted on these)
        self.updates = 0
        self.pending_items = 0  # transition batches in the channel, not yet ingested
        self.pending_steps = 0
        self.carried_weights = None  # the packet the next collection call hands to the rollout workers
        self.offline = self.spec.kind == "offline"

    def _layout_candidates(self, cluster: Cluster) -> list:
        return offpolicy_layouts(self.cfg, cluster, offline=self.spec.kind == "offline")

    def _after_iteration(self, record: dict) -> None:
        """``placement.mode=auto``: each candidate layout runs two learning iterations (the first
        carries its start-up), the second is timed; then the fastest measured. Iterations before
        ``learning_starts`` make no update and say nothing about a layout: not counted."""
        self._try_layouts(record["time/iteration"] if record.get("samples/updates", 0) > 0 else None)

    def _budget(self) -> Budget:
        if self.offline:
            return Budget(self.updates, self.cfg.train.total_updates, "updates")
        return super()._budget()

    def _total_updates(self) -> int:
        """The gradient updates the run will make: its budget offline, else those its env steps owe."""
        a, t = self.cfg.algorithm, self.cfg.train
        if self.offline:
            return t.total_updates
        return max(1, math.floor(a.utd_ratio * max(0, t.total_env_steps - a.learning_starts)))

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        cfg = self.cfg
        self._start_cluster()
        plan = self.plan
        self.trans_spec = self._open_channel("transitions")
        self.pkw = policy_kwargs(cfg)
        algo = OmegaConf.to_container(cfg.algorithm)
        self.actor = WorkerGroup(
            OffPolicyActorWorker, plan.groups["actor"], self.cluster,
            args=(algo, self.pkw, OmegaConf.to_container(cfg.critic), self.obs_space, self.act_space, cfg.env.chunk, cfg.seed,
                  self._total_updates(), cfg.actor.precision, cfg.actor.update_threads, cfg.actor.update_helper),
            wait=False,  # the env group starts while the learner builds
        )
        self.groups.append(self.actor)
        if not self.offline:
            self.env = WorkerGroup(
                EnvWorker, plan.groups["env"], self.cluster,
                args=(OmegaConf.to_container(cfg.env), cfg.seed, cfg.algorithm.gamma, None, self.trans_spec, 1), wait=False,
            )
            self.groups.append(self.env)
        if cfg.actor.precision != "float32":  # resolved by each learner rank on its own device
            for line in dict.fromkeys(self.actor.describe_precision()):
                print(f"[rlweave] {line}")
        # the replay shard lives in the learner's process: sampling is a function call
        offline = cfg.replay.offline_dataset
        share = 1.0 if self.offline else cfg.replay.offline_share if offline else 0.0
        mix = {"offline": share, "online": 1.0 - share} if offline else {"online": 1.0}
        if offline:  # read while the learner builds
            data, self.dataset_stats = load_transitions(offline, self.obs_space, self.act_space, cfg.algorithm.gamma)
        self.replay = WorkerGroup(
            ReplayBufferWorker, GroupPlacement("replay", list(plan.groups["actor"].slots)), self.cluster,
            args=(cfg.replay.capacity, cfg.seed, self.trans_spec, mix, ("offline",)), colocate_with=self.actor,
        )
        self.groups.append(self.replay)
        if offline:
            s = self.dataset_stats
            note = ""
            if cfg.replay.offline_reward_scale == "return_range":
                scale = 1000.0 / max(s["return_max"] - s["return_min"], 1e-6)
                data["reward"] = data["reward"] * scale
                note = f"; rewards x {scale:.4g} (1000 / return range)"
            self.replay.add(data, "offline", max(cfg.replay.capacity, len(data["reward"])))
            print(f"[rlweave] offline dataset {offline}: {s['episodes']} episodes, {s['steps']} steps, "
                  f"return {s['return_mean']:.1f} +- {s['return_std']:.1f}; {share:.0%} of every batch{note}")
        self.actor.configure_replay(self.replay)
        self.init_source = initial_policy_source(self)  # offline-to-online: the actor starts from a BC run
        if self.init_source is not None:  # a resume or restart then loads its own checkpoint over these
            fresh = self.actor.load_initial_weights(initial_policy_state(self.init_source))[0]
            note = f"; {len(fresh)} tensors it lacks start fresh" if fresh else ""
            print(f"[rlweave] policy starts from {self.init_source} (critics fresh){note}")
        self.eval_policy = build_policy(observation_space=self.obs_space, action_space=self.act_space, chunk=cfg.env.chunk, **self.pkw)
        if self.offline:
            print("[rlweave] offline: no env or rollout workers; the env only evaluates (in the driver)")
            self.env = self.rollout = None
            return
        if self.spec.labelling is not None:  # imitation: the expert lives beside the envs it labels
            im = cfg.imitation
            self.env.configure_expert(im.expert, im.gate if self.spec.labelling == "gated" else "none", im.gate_threshold, im.operator)
        fused = plan.groups["rollout"].slots == plan.groups["env"].slots
        self.rollout = WorkerGroup(
            RolloutWorker, plan.groups["rollout"], self.cluster,
            args=(self.pkw, self.obs_space, self.act_space, cfg.env.chunk),
            colocate_with=self.env if fused else None, wait=False,
        )
        self.groups.append(self.rollout)
        self.env.configure_rollout(self.rollout)

    def _sync_weights(self) -> float:
        """A direct sync (start, resume, restart, layout switch): nothing left to carry."""
        self.carried_weights = None
        return 0.0 if self.offline else super()._sync_weights()  # offline: no rollout to sync

    # ------------------------------------------------------------------ checkpoints
    def _parts(self) -> dict:
        if self.pending_items:  # a checkpoint holds every collected transition: staged in the replay shard
            self.replay.stage(self.pending_items)
        parts = {
            "actor": self.actor.state_dict(),
            "replay": self.replay.state_dict(),
            "envs": self.env.state_dict() if self.env is not None else [],
            "rollouts": self.rollout.state_dict() if self.rollout is not None else [],
            "runner": {**self._driver_state(), "ingested_steps": self.ingested_steps, "updates": self.updates,
                       "pending_items": self.pending_items, "pending_steps": self.pending_steps},
        }
        return parts

    def _restore_parts(self, state: dict) -> None:
        r = state["runner"]
        self.actor.load_state_dict(state["actor"])
        self.replay.load_state_dict(state["replay"])
        if self.env is not None:
            self.env.load_state_dict(state["envs"])
            self.rollout.load_state_dict(state["rollouts"])
        self.ingested_steps, self.updates = r["ingested_steps"], r["updates"]
        # the transitions in flight at the checkpoint are staged in the replay shard's state
        self.pending_items, self.pending_steps = r.get("pending_items", 0), r.get("pending_steps", 0)

    def _updates_due(self, steps: int) -> int:
        """Updates the learner owes once ``steps`` env steps have reached it: ``utd_ratio`` per
        step beyond ``learning_starts``, minus those already done."""
        a = self.cfg.algorithm
        return max(0, math.floor(a.utd_ratio * max(0, steps - a.learning_starts)) - self.updates)

    def _offline_iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        """``train.updates_per_iteration`` updates on the dataset (fewer for the last one)."""
        t = self.cfg.train
        due = min(t.updates_per_iteration, t.total_updates - self.updates)
        t0 = time.perf_counter()
        act_out = self.actor.train(due, 0, None).wait()
        t_iter = time.perf_counter() - t0
        self.updates += due
        self.iteration += 1
        record = update_only_record(self.iteration, act_out, due, t_iter)
        trace.span("actor[0]", "train", t0, t_iter)
        return self._finish_record(record, metrics, trace, progress, final=self.updates >= t.total_updates)

    def _iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        """One iteration of the workflow: env workers collect transitions (their rollout workers act
        with the weights the previous update carried) while the learner takes in the previous
        iteration's transitions and makes ``algorithm.utd_ratio`` updates per env step (with
        ``train.max_staleness=0``: collect, then train on everything collected)."""
        if self.offline:
            return self._offline_iteration(metrics, trace, progress)
        cfg, t = self.cfg, self.cfg.train
        clock = StageClock()
        # a policy that starts from another run acts from the first step; learning still waits
        random_actions = self.env_steps < cfg.algorithm.learning_starts and self.init_source is None
        beta = cfg.imitation.beta * cfg.imitation.beta_decay ** self.iteration  # DAgger's mixing schedule (0**0 = 1)
        carried, self.carried_weights = self.carried_weights, None
        h_env = self.env.collect_transitions(t.rollout_steps, cfg.algorithm.n_step, random_actions, self.spec.labelling, beta, carried)
        if t.max_staleness == 0:  # collect, then train on everything collected so far
            self.pending_items += self.env.world_size
            self.pending_steps += total(h_env.wait(), "env_steps")
        due = self._updates_due(self.ingested_steps + self.pending_steps)
        export = (self.iteration + 1) % t.sync_every == 0  # this iteration's new weights go to the next collection
        env_out, act_out = wait_all([h_env, self.actor.train.submit(due, self.pending_items, t.max_staleness, export)])
        t_trained = time.perf_counter()
        steps = self._advance(env_out, due)
        if carried is not None:
            verify_sync(carried, [o["weights_checksum"] for o in env_out])
        if export:
            self.carried_weights = self._last_packet = act_out.pop("weights")
        record = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time": None, **self._episode_metrics(env_out),
                  **self._sample_metrics(env_out, act_out, due, random_actions, beta),
                  **self._stage_metrics(h_env, env_out, act_out, clock, steps, due)}
        self._trace_iteration(trace, clock.start, t_trained, h_env, env_out, act_out, carried is not None)
        return self._finish_record(record, metrics, trace, progress, final=self.env_steps >= t.total_env_steps)

    def _advance(self, env_out: list[dict], due: int) -> int:
        """The counters after an iteration: the transitions taken in, the updates made, and those
        left pending for the next iteration. Returns the env steps collected."""
        steps = total(env_out, "env_steps")
        self.ingested_steps += self.pending_steps
        self.updates += due
        if self.cfg.train.max_staleness == 0:
            self.pending_items = self.pending_steps = 0
        else:  # this iteration's transitions are taken in by the next one
            self.pending_items, self.pending_steps = self.env.world_size, steps
        self.env_steps += steps
        self.iteration += 1
        return steps

    def _sample_metrics(self, env_out: list[dict], act_out: dict, due: int, random_actions: bool, beta: float) -> dict:
        record = {**{k: v for k, v in act_out.items() if k.startswith("train/")},
                  "samples/produced": total(env_out, "transitions"), "samples/ingested": act_out["ingested"],
                  "samples/updates": due, "samples/staleness": act_out["staleness"], "samples/random_actions": int(random_actions)}
        if self.spec.labelling is not None:
            record["samples/labels"] = total(env_out, "labels")
            record["samples/interventions"] = total(env_out, "interventions")
            record["samples/expert_share"] = beta if self.spec.labelling == "mixture" else float(self.spec.labelling == "expert")
        return record

    def _stage_metrics(self, h_env, env_out: list[dict], act_out: dict, clock: StageClock, steps: int, due: int) -> dict:
        t_iter = clock.elapsed()
        record = {"time/collect": h_env.duration, "time/env": worst(env_out, "time/env"),
                  "time/env_wait_action": worst(env_out, "time/wait_action"), "time/trajectory_put": worst(env_out, "time/put"),
                  "time/actor": act_out["time/actor_train"], "time/actor_wait": act_out["time/actor_wait"],
                  "time/weight_sync": worst(env_out, "time/weight_load"),  # inside collection, beside training
                  "time/iteration": t_iter, "perf/env_steps_per_s": steps / t_iter, "perf/updates_per_s": due / t_iter,
                  "mem/env_peak_rss_mb": worst(env_out, "peak_rss_mb"), "mem/actor_peak_rss_mb": act_out["peak_rss_mb"]}
        if self._layouts is not None:
            record["plan/layout"] = self._layouts.index
        return record

    def _trace_iteration(self, trace: Trace, t0: float, t_trained: float, h_env, env_out, act_out, carried: bool) -> None:
        for rank, d in enumerate(h_env.durations):
            trace.span(f"env[{rank}]", "collect_transitions", t0, d)
        trace.span("actor[0]", "train", t_trained - act_out["time/actor_train"], act_out["time/actor_train"])
        if carried:
            for rank, o in enumerate(env_out):
                trace.span(f"env[{rank}]", "weight_sync", t0, o["time/weight_load"])

    def _eval_packet(self):
        """The learner's latest weights (not the rollout's copy, which may be a sync behind)."""
        return self.actor.export_weights()


def offpolicy_layouts(cfg: DictConfig, cluster: Cluster, offline: bool = False) -> list[tuple[str, object]]:
    """The layouts ``placement.mode=auto`` tries for an off-policy run (they choose every group's
    slots; ``placement.groups`` is not used): the learner on the first slot with the env workers
    and their rollout replicas beside it, and, with two slots or more, the env and rollout workers
    on the second slot, apart from the learner. Which wins depends on how busy collection keeps its
    slot (a cheap env leaves the learner's core almost free). An offline run has only a learner."""
    workers = {"env": cfg.env.num_workers, "rollout": cfg.rollout.num_workers, "actor": 1}
    n = cluster.num_slots

    def layout(first: int):
        """Env and rollout workers spread over slots ``first..`` (as many as there are env workers)."""
        span = min(workers["env"], n - first)
        if span < 1 or workers["env"] % span or workers["rollout"] % span:
            return None
        slots = f"{first}-{first + span - 1}"
        explicit = {"actor": {"slots": "0"}, "env": {"slots": slots, "procs_per_slot": workers["env"] // span},
                    "rollout": {"slots": slots, "procs_per_slot": workers["rollout"] // span}}
        try:
            return make_plan(cluster, workers, "collocated", explicit, cfg.placement.oversubscribe)
        except PlacementError:
            return None

    layouts = [("learner beside collection", layout(0))]
    if not offline:
        layouts.append(("learner apart", layout(1)))
    layouts = [(label, plan) for label, plan in layouts if plan is not None]
    if not layouts:
        raise PlacementError(f"placement.mode: auto found no layout for {workers['env']} env and {workers['rollout']} rollout "
                             f"workers on {n} {cluster.slot_kind} slot(s); choose the slots or set placement.oversubscribe=true")
    return layouts
