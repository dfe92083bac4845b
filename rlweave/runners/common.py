"""What every runner shares before its workers start: the cross-field config checks, the
placement of the env / rollout / actor groups, and the policy's constructor arguments."""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms import ALGORITHMS, AlgorithmSpec, algorithm_loss, get_algorithm, has_concurrent_parts
from rlweave.cluster import Cluster, PlacementError, WorkerError, make_plan
from rlweave.config import ConfigError
from rlweave.envs import space_info
from rlweave.models import build_policy
from rlweave.models.run_policy import policy_kwargs
from rlweave.runners.layouts import LayoutTrials
from rlweave.sync.weights import verify_sync
from rlweave.utils.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from rlweave.utils.metrics import MetricsWriter, Progress, Trace, read_metrics, truncate_metrics, write_text_atomic
from rlweave.utils.trackers import RunInfo, Trackers, resolve_loggers

def algorithm_for_runner(cfg: DictConfig):
    """The config's algorithm spec, refused on one line when unknown or not made for ``cfg.runner``."""
    try:
        spec = get_algorithm(cfg.algorithm.name)
    except KeyError as e:
        raise ConfigError(f"algorithm.name: {e.args[0]}") from None
    if cfg.runner not in spec.runners:
        raise ConfigError(
            f"algorithm.name: '{spec.name}' is an {spec.kind.replace('_', '-')} algorithm; it runs with "
            f"runner={' or '.join(spec.runners)} (this config has runner={cfg.runner})"
        )
    return spec


def check_compatible(cfg: DictConfig):
    """Checks what the schema cannot (cross-field rules, env and policy fit) before any worker
    starts. Returns the env's (observation_space, action_space)."""
    obs_space, act_space, _ = check_compatible_policy(cfg)
    return obs_space, act_space


def check_compatible_policy(cfg: DictConfig):
    """:func:`check_compatible`, also returning the policy it builds to check the fit (initialised
    from torch's current random state): ``(observation_space, action_space, policy)``."""
    spec = algorithm_for_runner(cfg)
    if spec.kind in ("off_policy", "imitation", "offline"):
        _check_off_policy(cfg)
    if cfg.run.deterministic and cfg.placement.mode == "auto":
        raise ConfigError(
            "run.deterministic: placement.mode=auto re-plans from timings, and a layout change ends running episodes; "
            "choose the slots (placement.mode collocated, disaggregated or hybrid)"
        )
    if cfg.actor.strategy == "fsdp":
        raise ConfigError("actor.strategy: fsdp shards language models; this workflow's actor replicates its policy "
                          "on every rank (ddp or auto)")
    if cfg.actor.precision != "float32" and spec.kind not in ("off_policy", "imitation", "offline"):
        raise ConfigError(f"actor.precision: {cfg.actor.precision} applies to the off-policy learner; "
                          f"{spec.name}'s actor trains in float32")
    check_update_threads(cfg, spec)
    if spec.kind == "offline" and cfg.train.total_updates < 1:
        raise ConfigError(f"train.total_updates: {spec.name} learns from a dataset alone; give the number of gradient updates (> 0)")
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
        policy = build_policy(observation_space=obs_space, action_space=act_space, chunk=cfg.env.chunk, **policy_kwargs(cfg))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy.name: {str(e).splitlines()[0]}") from None
    if spec.needs_dataset and not cfg.replay.offline_dataset:
        raise ConfigError(
            f"replay.offline_dataset: {spec.name} learns from a dataset{'' if spec.kind == 'offline' else ' beside online data'}; "
            "make one with 'rlweave collect RUN_DIR --episodes N -o FOLDER' and pass its folder"
        )
    if spec.kind == "imitation":
        from rlweave.data.experts import ExpertError, load_expert

        if not cfg.imitation.expert:
            raise ConfigError(f"imitation.expert: {spec.name} needs an expert: a run folder or module:function")
        try:
            load_expert(cfg.imitation.expert, obs_space, act_space)
        except ExpertError as e:
            raise ConfigError(f"imitation.expert: {e}") from None
    if spec.kind in ("off_policy", "offline") and cfg.replay.offline_dataset:
        from rlweave.data.datasets import DatasetError, check_spaces

        try:
            check_spaces(cfg.replay.offline_dataset, obs_space, act_space)
        except (DatasetError, ImportError) as e:
            raise ConfigError(f"replay.offline_dataset: {e}") from None
    return obs_space, act_space, policy


def plan_placement(cfg: DictConfig, cluster: Cluster):
    """The placement plan of the env/rollout/actor groups on ``cluster`` (PlacementError if bad).
    Under ``placement.mode=auto`` this is the starting layout: the planner's first profiling plan
    for env and rollout, the actor on the first slots (it trains between collections)."""
    explicit = {k: OmegaConf.to_container(v) for k, v in cfg.placement.groups.items()}
    workers = {"env": cfg.env.num_workers, "rollout": cfg.rollout.num_workers, "actor": cfg.actor.num_workers}
    mode = cfg.placement.mode
    if mode == "auto":
        if set(explicit) & {"env", "rollout"}:
            raise PlacementError("placement.groups: env and rollout slots are the planner's to choose under placement.mode=auto")
        workers["env"] = workers["rollout"] = 1
        explicit.setdefault("actor", {"slots": f"0-{min(cluster.num_slots, cfg.actor.num_workers) - 1}"})
        mode = "collocated"
    plan = make_plan(cluster, workers, mode, explicit, cfg.placement.oversubscribe)
    n_env, n_roll, n_act = (plan.groups[g].num_workers for g in ("env", "rollout", "actor"))
    if n_env % n_act:
        raise PlacementError(f"placement.groups.actor: {n_act} actor ranks must divide {n_env} env workers")
    if n_env % n_roll:
        raise PlacementError(f"placement.groups.rollout: {n_roll} rollout workers must divide {n_env} env workers")
    return plan


def check_update_threads(cfg: DictConfig, spec: AlgorithmSpec) -> None:
    """``actor.update_threads`` > 1 needs an update made of concurrent parts (SAC, RLPD)."""
    if cfg.actor.update_threads > 1 and not has_concurrent_parts(algorithm_loss(spec)):
        splits = ", ".join(sorted(n for n, a in ALGORITHMS.items() if has_concurrent_parts(algorithm_loss(a))))
        raise ConfigError(f"actor.update_threads: {cfg.actor.update_threads} runs the critic's and the actor's parts of an "
                          f"update at the same time; {spec.name}'s update has no such parts ({splits} have)")


def _check_off_policy(cfg: DictConfig) -> None:
    """Rules of the asynchronous off-policy runner that the schema cannot state."""
    t = cfg.train
    if cfg.actor.num_workers != 1:
        raise ConfigError(f"actor.num_workers: the off-policy learner runs on one rank, got {cfg.actor.num_workers}")
    if t.max_staleness == 0 and t.sync_every != 1:
        raise ConfigError(
            f"train.sync_every: {t.sync_every} cannot meet train.max_staleness=0 (collect-then-train needs fresh weights every iteration)"
        )
    if t.max_staleness > 0 and t.sync_every > t.max_staleness:
        raise ConfigError(
            f"train.max_staleness: {t.max_staleness} can never be met with train.sync_every={t.sync_every}: "
            f"the learner trains while env workers collect, so transitions reach it up to {t.sync_every} versions old"
        )
    if cfg.policy.name != "squashed_mlp":
        raise ConfigError(
            f"policy.name: {cfg.algorithm.name} learns a tanh-squashed Gaussian actor; set policy.name=squashed_mlp (got '{cfg.policy.name}')"
        )
    if len(cfg.algorithm.adam_betas) != 2:
        raise ConfigError(f"algorithm.adam_betas: needs two values, got {list(cfg.algorithm.adam_betas)}")


class RunnerBase:
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
        self.obs_space, self.act_space = check_compatible(self.cfg)

    def _plan_placement(self, cluster: Cluster):
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
        done, total = self._budget()
        return done < total and not self._reached_eval_target()

    def _reached_eval_target(self) -> bool:
        target = self.cfg.train.stop_at_eval
        return target is not None and self._score is not None and self._score >= target

    def _budget(self) -> tuple[int, int]:
        """(done, total) of what the run counts towards its end: env steps, by default."""
        return self.env_steps, self.cfg.train.total_env_steps

    _budget_unit = "steps"
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

    # ------------------------------------------------------------------ experiment trackers
    @property
    def _step_key(self) -> str:
        """The trackers' step: env steps where the run counts them, else the iteration (language
        models, offline and SFT runs, whose env-step count does not grow with every record)."""
        return "env_steps" if self._budget_unit == "steps" else "iteration"

    def _tracker_step(self) -> int:
        return self.env_steps if self._step_key == "env_steps" else self.iteration

    def _open_trackers(self) -> Trackers:
        """Starts ``run.loggers`` (a resumed run continues its tracker runs: ids from the checkpoint)."""
        r = self.cfg.run
        info = RunInfo(run_dir=self.run_dir, name=r.name or self.run_dir.resolve().name, group=r.group or self.cfg.recipe or None,
                       tags=list(r.tags), project=r.project, config=self._resolved_config(),
                       resume_step=self._tracker_step() if self.resume else None)
        return Trackers(self.loggers, info, self._step_key, saved=self._saved_trackers if self.resume else None)

    def note_samples(self, rows: list[dict], tokenizer, n: int = 8) -> None:
        """Language-model runs, once per iteration: keeps ``n`` of its responses (rows with
        ``prompt_ids``, ``response_ids``, ``reward``) for the samples table of this iteration's
        evaluation, if it has one (a W&B table, an MLflow artifact). Decoded with ``tokenizer`` only
        then; nothing is kept when no tracker takes tables."""
        if self._trackers is None or not self._trackers.takes_media or not rows:
            return
        self._samples = (rows[:: max(1, len(rows) // n)][:n], tokenizer)

    def _log_samples(self, record: dict) -> None:
        """After an evaluated record: the samples noted for it, as a table at the record's step."""
        if self._samples is None or self._trackers is None or "time/eval" not in record:
            return
        rows, tok = self._samples
        self._samples = None
        text = lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=True)  # noqa: E731
        table = [[text(r["prompt_ids"]), text(r["response_ids"]), float(r["reward"])] for r in rows]
        self._trackers.log_table("eval/samples", ["prompt", "response", "reward"], table, self._trackers.step_of(record))

    def _log_curves(self) -> None:
        """At the end of a run (or a stop): its learning curves (the progress line's two figures)
        as an image, for trackers that show images. Written to ``RUN/curves.png``."""
        if self._trackers is None or not self._trackers.takes_media:
            return
        from rlweave.utils.plot import plot_runs

        records = read_metrics(self.run_dir)
        keys = [k for k in self._progress_keys if any(r.get(k) is not None for r in records)]
        if not keys:
            return
        try:
            path = plot_runs([str(self.run_dir)], str(self.run_dir / "curves.png"), metrics=keys, x=self._step_key)
        except (ValueError, OSError) as e:  # a figure never stops a run
            print(f"[rlweave] warning: learning curves not drawn: {e}", file=sys.stderr)
            return
        self._trackers.log_image("curves", path, self._tracker_step())

    def _close_trackers(self, status: str) -> None:
        if self._trackers is not None:
            self._trackers.close(status)
            self._trackers = None

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
            progress = Progress(self._budget()[1], enabled=cfg.run.progress, unit=self._budget_unit, labels=self._progress_labels)
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
