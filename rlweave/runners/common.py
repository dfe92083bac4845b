"""What every runner shares before its workers start: the cross-field config checks, the
placement of the env / rollout / actor groups, and the policy's constructor arguments."""

from __future__ import annotations

import random
import signal
import threading
import uuid
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlweave.channel import Channel
from rlweave.cluster import Cluster, WorkerError
from rlweave.config import ConfigError
from rlweave.runners.checks import algorithm_for_runner, check_compatible_policy, plan_placement
from rlweave.runners.layouts import LayoutTrials
from rlweave.runners.tracking import Tracking
from rlweave.runners.evaluate import evaluate_policy
from rlweave.runners.inputs import record_or_check_inputs
from rlweave.sync.weights import resolve_buckets, unpack_into, verify_sync
from rlweave.utils.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from rlweave.utils.metrics import MetricsWriter, Progress, Trace, truncate_metrics, write_text_atomic
from rlweave.workers.channels import ChannelSpec
from rlweave.utils.trackers import Trackers, resolve_loggers

class Budget(NamedTuple):
    """How far a run is towards its end: ``done`` of ``total`` ``unit`` (steps, updates, iters)."""

    done: int
    total: int
    unit: str


class RunnerBase(Tracking):
    """The driver skeleton every embodied runner shares: refuse bad input before anything starts,
    start or attach to the cluster, seed, write the run's config, resume, loop over iterations with
    checkpoints and a callback, write a final checkpoint, and shut every group down.

    A runner provides ``_start()`` (its worker groups), ``_iteration(metrics, trace, progress)``
    (one iteration, returning its metrics record), ``_parts()`` (its checkpoint's parts) and
    ``_restore_parts(state)``, and may override ``_more()`` (whether to run another iteration),
    ``_after_iteration(record)`` (e.g. re-planning, before the checkpoint) and ``_derived()`` (what
    config.yaml records).

    Fault tolerance lives here, once for every runner: when a worker process dies, the worker
    groups are rebuilt and the run continues from its newest checkpoint (or its start), at most
    ``train.max_restarts`` times; SIGINT/SIGTERM end the run after the current iteration with a
    checkpoint (a second signal stops at once)."""

    def __init__(self, cfg: DictConfig, run_dir, resume: bool = False):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.spec = algorithm_for_runner(cfg)
        self._check()
        try:
            self.loggers = resolve_loggers(list(cfg.run.loggers), cfg.run.tensorboard)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self._trackers: Trackers | None = None  # open while run() runs; they outlive restarts
        self._saved_trackers: dict | None = None  # the checkpoint's tracker state (run ids), when resuming
        self._samples: tuple | None = None  # language models: rows for the next evaluation's samples table
        if not cfg.cluster.address:
            # The embedded cluster's inventory is known in advance: refuse a bad placement before
            # Ray starts or the run folder is made. (An attached cluster is checked after attaching.)
            self._plan_placement(Cluster.planned(cfg.cluster.num_cpus, cfg.cluster.num_gpus))
        self.iteration = 0
        self.env_steps = 0
        self.wall_offset = 0.0
        self.groups: list = []
        self.channels: list = []
        self.cluster: Cluster | None = None
        self._last_packet = None
        self._score: float | None = None  # this iteration's evaluation return, if any: its checkpoint's score
        self._stop_reason: str | None = None  # set by a signal or request_stop(): stop at the next boundary
        self._initial: dict | None = None  # the run's state at its start: where a restart without checkpoint begins
        self.restarts = 0

    # ------------------------------------------------------------------ to provide
    def _check(self) -> None:
        """Refuses a config this runner cannot run, before anything starts."""
        self.obs_space, self.act_space, policy = check_compatible_policy(self.cfg)
        self.split_critic = bool(getattr(policy, "split_critic", False))  # the on-policy value loss may run apart

    def _plan_placement(self, cluster: Cluster):
        """The groups' placement: with ``placement.mode=auto``, the first of the runner's candidate
        layouts, each then timed in turn (:meth:`_try_layouts`); otherwise the configured slots.
        The one ``auto`` path of every runner without a cost model (the embodied on-policy runner
        has one: its planner, :mod:`rlweave.flow`)."""
        candidates = self._layout_candidates(cluster) if self.cfg.placement.mode == "auto" else None
        if candidates is not None:
            self._layouts = LayoutTrials(candidates)
            return self._layouts.plan
        return self._configured_plan(cluster)

    def _layout_candidates(self, cluster: Cluster) -> list | None:
        """(label, plan) layouts ``placement.mode=auto`` measures; None: the runner plans otherwise."""
        return None

    def _configured_plan(self, cluster: Cluster):
        return plan_placement(self.cfg, cluster)

    def _start(self) -> None:
        raise NotImplementedError

    def _iteration(self, metrics, trace, progress) -> dict:
        raise NotImplementedError

    def _parts(self) -> dict:
        """The checkpoint's parts (name -> object), ``runner`` among them (see ``_driver_state``)."""
        raise NotImplementedError

    def _save(self) -> None:
        """Saves this iteration's checkpoint, scored by this iteration's evaluation return, if it
        had one (``train.keep_best`` keeps the best-scored one beside the newest ``train.keep_checkpoints``)."""
        t = self.cfg.train
        save_checkpoint(self.run_dir, self.iteration, self._parts(), keep=t.keep_checkpoints, score=self._score,
                        keep_best=t.keep_best)

    def _restore_parts(self, state: dict) -> None:
        raise NotImplementedError

    def _more(self) -> bool:
        done, total, _ = self._budget()
        return done < total and not self._reached_eval_target()

    def _reached_eval_target(self) -> bool:
        target = self.cfg.train.stop_at_eval
        return target is not None and self._score is not None and self._score >= target

    def _budget(self) -> Budget:
        """What the run counts towards its end, the one place each runner says it: env steps by
        default; updates (offline, SFT) or iterations (language-model RL) where a runner says so."""
        return Budget(self.env_steps, self.cfg.train.total_env_steps, "steps")

    _owns_cluster = True  # False for a run nested in another (an SFT warm-up): the outer one shuts it down
    _score_metric = "eval/episode_return"  # what keep_best ranks checkpoints by
    _progress_keys = ("train/episode_return", "eval/episode_return")  # the progress line's two figures
    _progress_labels = ("return", "eval")

    def _after_iteration(self, record: dict) -> None:
        return None

    # placement.mode=auto by trial (runners without a cost model): set by _plan_placement
    _layouts: LayoutTrials | None = None

    def _try_layouts(self, seconds: float | None) -> None:
        """Counts an iteration of ``seconds`` (None: not representative, not counted) towards the
        current layout's trial and moves to the next layout, or the chosen one, when due."""
        if self._layouts is None or self._layouts.chosen or seconds is None or not self._more():
            return
        k = self._layouts.observe(seconds)
        if k is not None:
            self._switch_layout(k)

    def _switch_layout(self, k: int) -> None:
        """Moves the run to candidate layout ``k`` at this iteration boundary: the state of every
        group (the checkpoint's parts) goes to the new layout's workers, so nothing is lost or
        repeated."""
        parts = self._parts()
        self._stop_groups()
        self._layouts.index = k
        self.plan = self._layouts.plan
        self._start()
        self._restore_parts(parts)
        self._sync_weights()
        print(f"[rlweave] placement auto: {self._layouts.label}: {self.plan.describe()}")

    def _after_run(self) -> None:
        """After the final checkpoint, before the workers stop (e.g. export the model)."""
        return None

    def _derived(self) -> dict:
        return self.plan.as_dict()

    # ------------------------------------------------------------------ shared steps
    def _start_cluster(self, note: str = "") -> None:
        if self.cluster is not None:  # a restart rebuilds the worker groups on the cluster it has
            return
        c = self.cfg.cluster
        self.cluster = Cluster.start(address=c.address, num_cpus=c.num_cpus, num_gpus=c.num_gpus, dashboard=c.dashboard, local=c.local,
                                     peer_calls=c.peer_calls)
        self.plan = self._plan_placement(self.cluster)
        print(f"[rlweave] {self.cluster.describe()}")
        print(f"[rlweave] {self.plan.describe()}{note}")

    def _open_channel(self, kind: str) -> ChannelSpec:
        """A channel of this run between worker groups (``trajectories``, ``transitions``): named
        uniquely, created on the cluster unless the run is local, closed with the run."""
        spec = ChannelSpec(f"{uuid.uuid4().hex[:8]}/{kind}", local=self.cluster.local)
        if not spec.local:
            self.channels.append(Channel.create(spec.name))
        return spec

    def _sync_weights(self) -> float:
        """Actor rank 0's weights to every rollout worker, verified by checksum."""
        t0 = time.perf_counter()
        packet = self.actor.export_weights()
        verify_sync(packet, self.rollout.load_weights(packet))
        self._last_packet = packet
        return time.perf_counter() - t0

    def _driver_state(self) -> dict:
        """The driver's counters and random states, for the checkpoint's ``runner`` part."""
        return {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time": self._wall(),
                "numpy": np.random.get_state(), "python": random.getstate(), "torch": torch.get_rng_state(),
                "trackers": self._trackers.state() if self._trackers is not None else {}}

    def _restore(self) -> None:
        def skip(path, reason: str) -> None:
            aside = path.with_name(path.name + ".corrupt")
            path.rename(aside)  # kept for inspection, out of the way of later saves and retention
            print(f"[rlweave] {reason}; skipped (moved to {aside.name}), trying the previous checkpoint")

        path = latest_checkpoint(self.run_dir, on_skip=skip)
        if path is None:
            raise FileNotFoundError(f"no usable checkpoint under {self.run_dir / 'checkpoints'} to resume from")
        self._restore_state(load_checkpoint(path, verify=False))  # latest_checkpoint verified it
        print(f"[rlweave] resumed from {path.name}: iteration {self.iteration}, {self.env_steps} env steps")

    def _restore_state(self, state: dict) -> None:
        r = state["runner"]
        self._restore_parts(state)
        self.iteration, self.env_steps, self.wall_offset = r["iteration"], r["env_steps"], r["wall_time"]
        np.random.set_state(r["numpy"])
        random.setstate(r["python"])
        torch.set_rng_state(r["torch"])
        self._saved_trackers = r.get("trackers")
        truncate_metrics(self.run_dir, self.iteration)

    @staticmethod
    def _episode_metrics(env_out: list[dict]) -> dict:
        """Training-episode statistics of one iteration, from every env worker's report."""
        out: dict = {}
        returns = [r for o in env_out for r in o["episodes"]["return"]]
        if returns:
            out["train/episode_return"] = float(np.mean(returns))
            out["train/episode_length"] = float(np.mean([r for o in env_out for r in o["episodes"]["length"]]))
            out["train/episodes"] = len(returns)
        success = [r for o in env_out for r in o["episodes"]["success"]]
        if success:
            out["train/success_rate"] = float(np.mean(success))
        by_task: dict[str, list] = {}  # multi-task suites: which task a policy gains or loses while training
        for o in env_out:
            for task, flags in (o["episodes"].get("success_by_task") or {}).items():
                by_task.setdefault(task, []).extend(flags)
        for task, flags in sorted(by_task.items()):
            out[f"train/success_rate/{task}"] = float(np.mean(flags))
        out["train/dropped_episodes"] = sum(o["dropped_episodes"] for o in env_out)
        return out

    def _finish_record(self, record: dict, metrics, trace, progress, final: bool) -> dict:
        """Evaluates when due (every ``train.eval_every`` iterations and at the end), then logs the
        iteration's record and moves the progress line."""
        self._score = None  # a checkpoint is scored only by an evaluation of its own iteration
        if self._eval_due(final):
            t_e = time.perf_counter()
            record.update(self.evaluate())
            record["time/eval"] = time.perf_counter() - t_e
            self._score = record.get(self._score_metric)
            if self._reached_eval_target():
                print(f"[rlweave] {self._score_metric} {self._score:.4g} reached train.stop_at_eval={self.cfg.train.stop_at_eval}: "
                      "the run ends here")
            trace.span("driver", "eval", t_e, record["time/eval"])
        record["wall_time"] = self._wall()
        metrics.log(record)
        self._log_samples(record)
        progress.update(self.iteration, self._budget()[0], *(record.get(k) for k in self._progress_keys))
        return record

    def evaluate(self) -> dict:
        """Deterministic episodes of the newest policy in envs of the driver's own, seeded by the
        iteration (embodied runners; the language-model runner evaluates in its rollout engines)."""
        unpack_into(self.eval_policy, resolve_buckets(self._eval_packet().buckets))
        env_cfg = OmegaConf.to_container(self.cfg.env)
        return evaluate_policy(self.eval_policy, env_cfg, self.cfg.train.eval_episodes,
                               seed=self.cfg.seed + 10_000 + self.iteration, gamma=self.cfg.algorithm.gamma,
                               videos=self.cfg.train.eval_videos, video_dir=self.run_dir / "videos", tag=f"iter_{self.iteration:08d}",
                               max_envs=self.cfg.train.get("eval_max_envs"))

    def _eval_packet(self):
        """The weights :meth:`evaluate` uses: the newest synced packet."""
        return self._last_packet

    def _eval_due(self, final: bool) -> bool:
        """Whether this iteration ends with an evaluation: every ``train.eval_every`` and the last."""
        ev = self.cfg.train.eval_every
        return bool(ev) and (self.iteration % ev == 0 or final)

    def _wall(self) -> float:
        return self.wall_offset + time.perf_counter() - self._t_start

    def _resolved_config(self) -> dict:
        """The fully resolved config with the placement the run derived: config.yaml, and what the
        experiment trackers record as the run's config."""
        cfg = OmegaConf.to_container(self.cfg, resolve=True)
        cfg["placement"]["derived"] = self._derived()
        return cfg

    def _write_config(self) -> None:
        write_text_atomic(self.run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(self._resolved_config())))

    # ------------------------------------------------------------------ the loop
    def request_stop(self, reason: str = "stop requested") -> None:
        """Ends the run at the next iteration boundary, with a checkpoint (what SIGINT/SIGTERM do)."""
        self._stop_reason = reason

    def run(self, on_iteration=None) -> dict:
        """Trains to the step budget. ``on_iteration(runner, record)`` runs at every iteration
        boundary (after ``_after_iteration`` and the checkpoint): the place to change the run by
        API, e.g. ``runner.scale_env(n)``."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        record_or_check_inputs(self.run_dir, cfg, self.resume)  # a resume on changed data is refused before any work
        self._t_start = time.perf_counter()
        last: dict = {}
        restore_signals = lambda: None  # noqa: E731
        try:
            self._start()
            restore_signals = self._install_signal_handlers()  # after Ray's start, which installs its own
            self._deterministic_kernels()
            if not self.resume:
                np.random.seed(cfg.seed)
                random.seed(cfg.seed)
                torch.manual_seed(cfg.seed)
            self._write_config()
            if self.resume:
                self._restore()
            self._sync_weights()
            if cfg.train.max_restarts and not self.resume:
                self._initial = self._parts()  # a restart before the first checkpoint starts over from here
            self._trackers = self._open_trackers()
            metrics = MetricsWriter(self.run_dir, self._trackers)
            trace = Trace(self.run_dir)
            progress = Progress(self._budget()[1], enabled=cfg.run.progress, unit=self._budget().unit, labels=self._progress_labels)
            try:
                while self._more() and self._stop_reason is None:
                    try:  # a process may also die while the checkpoint gathers its state
                        last = self._iteration(metrics, trace, progress)
                        self._after_iteration(last)
                        ce = cfg.train.checkpoint_every
                        if ce and self.iteration % ce == 0:
                            self._save()
                    except WorkerError as e:
                        if not e.process_died or self.restarts >= cfg.train.max_restarts:
                            if e.process_died and cfg.train.max_restarts:
                                print(f"[rlweave] {e.short}; no restarts left (train.max_restarts={cfg.train.max_restarts})")
                            raise
                        metrics.close()
                        self._recover(e)
                        self._trackers.rewind(self._tracker_step())  # W&B and MLflow skip the re-run steps
                        metrics = MetricsWriter(self.run_dir, self._trackers)
                        continue
                    if on_iteration is not None:
                        on_iteration(self, last)
            finally:
                progress.close()
                metrics.close()
                trace.write()
            ckpts = list_checkpoints(self.run_dir)
            if not ckpts or ckpts[-1].name != f"iter_{self.iteration:08d}":
                self._save()
            self._after_run()
            self._log_curves()
            stopped = self._stop_reason is not None and self._more()
            self._close_trackers("stopped" if stopped else "finished")
            if stopped:
                print(f"[rlweave] {self._stop_reason}: stopped at iteration {self.iteration} with a checkpoint; "
                      f"continue with: rlweave resume {self.run_dir}")
        finally:
            self._close_trackers("failed")  # only those still open: the run raised
            restore_signals()
            self.shutdown()
        return last

    def _deterministic_kernels(self) -> None:
        if self.cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)  # the driver evaluates
            for g in self.groups:
                g.use_deterministic_algorithms()

    def _recover(self, error: WorkerError) -> None:
        """Rebuilds every worker group and channel (a dead process took its state, and its peers'
        calls, with it) and continues from the newest good checkpoint, or the run's start."""
        self.restarts += 1
        self._stop_groups()
        self._start()
        self._deterministic_kernels()
        path = latest_checkpoint(self.run_dir)
        where = path.name if path is not None else "the start of the run"
        print(f"[rlweave] {error.short}; restart {self.restarts}/{self.cfg.train.max_restarts}: "
              f"worker groups rebuilt, continuing from {where}")
        self._restore_state(load_checkpoint(path, verify=False) if path is not None else self._initial)
        self._sync_weights()

    def _install_signal_handlers(self):
        """SIGINT/SIGTERM: the first asks for a stop at the next iteration boundary (with a
        checkpoint, exit status 0); a second one interrupts at once. Returns the undo function.
        Only the main thread can own signals; elsewhere (a test's thread) nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self._stop_reason is not None:
                raise KeyboardInterrupt(f"second signal ({name})")
            self.request_stop(name)
            print(f"\n[rlweave] {name}: finishing this iteration, then a checkpoint and exit (send it again to stop at once)",
                  flush=True)

        for sig in previous:
            signal.signal(sig, handler)

        def undo() -> None:
            for sig, h in previous.items():
                signal.signal(sig, h)

        return undo

    def _on_shutdown(self) -> None:
        return None

    def shutdown(self) -> None:
        self._stop_groups()
        if self.cluster is not None and self._owns_cluster:
            self.cluster.shutdown()

    def _stop_groups(self) -> None:
        self._on_shutdown()
        for g in reversed(self.groups):
            g.shutdown()  # a group living in another group's processes leaves them to their owner
        self.groups = []
        for ch in self.channels:
            try:
                ch.close()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self.channels = []
