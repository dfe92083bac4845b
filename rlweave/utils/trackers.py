"""Experiment trackers beside ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

``metrics.jsonl`` is the run's own record; a tracker is a view of it where users already look.
``run.loggers`` names the trackers of a run; each is one class behind :class:`Tracker`, found by
name in :data:`TRACKERS`, and :class:`Trackers` fans every record out to the live ones. Three
rules live in the fan-out, once for every tracker:

* **One step axis.** A record's step is its ``env_steps`` (embodied runs) or its ``iteration``
  (language-model and offline runs, whose env-step count does not grow every iteration): the
  runner names the key, every tracker gets the same number.
* **No duplicate steps.** A resume rewinds to a checkpoint and re-runs the iterations after it;
  ``metrics.jsonl`` is truncated to match, but W&B and MLflow histories can only be appended to.
  So a resumed run continues the *same* tracker run (its id is kept in the checkpoint and in
  ``trackers.json``) and an append-only tracker gets only records whose step is beyond the last one
  it took (``trackers.json`` is rewritten after every record, so a hard kill between checkpoints
  loses no bookkeeping). TensorBoard can rewrite: it reopens with ``purge_step`` and takes the
  re-run records, so its curves equal ``metrics.jsonl``.
* **Never stop training.** A tracker whose package is missing, whose server cannot be reached or
  whose client raises is dropped with one warning line; the run goes on with the others.

Packages are imported only when their tracker starts: importing rlweave never needs them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

__all__ = ["RunInfo", "Tracker", "TrackerUnavailable", "TRACKERS", "Trackers", "resolve_loggers", "STATE_FILE"]

STATE_FILE = "trackers.json"  # run ids and last logged steps, beside metrics.jsonl


class TrackerUnavailable(RuntimeError):
    """A tracker cannot start (package missing, server unreachable, no credentials); the message
    says what to do. The run continues without it."""


@dataclass
class RunInfo:
    """What every tracker is started with."""

    run_dir: Path
    name: str  # the run's display name (run.name, else the run folder's name)
    group: str | None  # W&B group / MLflow tag (run.group, else the recipe)
    tags: list[str]
    project: str | None  # W&B project / MLflow experiment (run.project, else the client's own default)
    config: dict  # the fully resolved config, placement.derived included
    resume_step: int | None = None  # continuing a run: the step its checkpoint ended at
    saved: dict = field(default_factory=dict)  # this tracker's saved state: {"run_id": ...}


class Tracker(ABC):
    """One experiment tracker. Subclasses start their client in ``__init__`` (raising
    :class:`TrackerUnavailable` when they cannot) and may leave media methods as no-ops."""

    name: ClassVar[str]
    extra: ClassVar[str | None] = None  # the rlweave extra that installs its package
    rewinds: ClassVar[bool] = False  # can take steps again after a rewind (else: append-only)
    takes_media: ClassVar[bool] = False  # images, videos, tables are worth preparing for it

    @abstractmethod
    def __init__(self, info: RunInfo) -> None: ...

    @abstractmethod
    def log_scalars(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_image(self, key: str, path: Path, step: int) -> None:
        """An image file (e.g. learning curves) at ``step``."""

    def log_video(self, key: str, path: Path, step: int) -> None:
        """A video file (.mp4 or .gif, e.g. an evaluation episode) at ``step``."""

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        """A small table (e.g. a language model's sample prompts, responses, rewards) at ``step``."""

    def rewind(self, step: int) -> None:
        """The run went back to ``step`` (a restart after a worker failure); only for ``rewinds``."""

    def state(self) -> dict:
        """What a resumed run needs to continue this tracker's run (its id)."""
        return {}

    @abstractmethod
    def close(self, status: str) -> None:
        """``status``: finished, stopped (resumable) or failed."""


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackerUnavailable(f"{module} is not installed (pip install 'rlweave[{extra}]')") from None


def _unreachable(url: str, timeout: float = 3.0) -> str | None:
    """Why ``url``'s server cannot be reached (a TCP connection within ``timeout``), or None.
    Checked once at start so an absent server costs seconds, not a client's minutes of retries."""
    u = urlparse(url)
    if not u.hostname:
        return f"{url} names no host"
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{u.hostname}:{port} cannot be reached ({e.strerror or e})"
    return None


# --------------------------------------------------------------------------- the trackers
class TensorBoardTracker(Tracker):
    """Event files in the run folder (the default). Rewinds: a resumed writer opens with
    ``purge_step``, so TensorBoard hides the first attempt's events from that step on."""

    name = "tensorboard"
    rewinds = True

    def __init__(self, info: RunInfo) -> None:
        self.dir = str(info.run_dir)
        self._open(None if info.resume_step is None else info.resume_step + 1)

    def _open(self, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=self.dir, purge_step=purge_step)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def rewind(self, step: int) -> None:
        self.writer.close()
        self._open(step + 1)

    def close(self, status: str) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """Weights & Biases through its client. Files go under ``RUN/wandb``; ``WANDB_MODE=offline``
    needs no network (``wandb sync RUN/wandb/offline-run-*`` uploads later, into the same run: every
    resume of an rlweave run writes its part under the same run id). The run id is kept by
    rlweave, so a resume continues the run (``resume="allow"``)."""

    name = "wandb"
    extra = "wandb"
    takes_media = True

    def __init__(self, info: RunInfo) -> None:
        wandb = _require("wandb", self.extra)
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE", "online")
        if mode not in ("offline", "dryrun", "disabled"):
            base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
            why = _unreachable(base)
            if why:
                raise TrackerUnavailable(f"W&B server {why} (WANDB_MODE=offline logs locally)")
            if wandb.run is None and not _wandb_logged_in(wandb):
                raise TrackerUnavailable("no W&B credentials (run 'wandb login', or set WANDB_API_KEY or WANDB_MODE=offline)")
        settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False, x_disable_stats=True,
                                  init_timeout=30)
        self.run = wandb.init(dir=str(info.run_dir), id=info.saved.get("run_id"), resume="allow", reinit="create_new",
                              project=info.project or os.environ.get("WANDB_PROJECT") or "rlweave", name=info.name,
                              group=info.group, tags=info.tags or None, settings=settings)
        self.run.config.update(info.config, allow_val_change=True)  # a resume may run with changed settings

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_image(self, key: str, path: Path, step: int) -> None:
        self.run.log({key: self.wandb.Image(str(path))}, step=step)

    def log_video(self, key: str, path: Path, step: int) -> None:
        self.run.log({key: self.wandb.Video(str(path))}, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def state(self) -> dict:
        return {"run_id": self.run.id}

    def close(self, status: str) -> None:
        self.run.finish(exit_code=1 if status == "failed" else 0)


def _wandb_logged_in(wandb: Any) -> bool:
    """Whether W&B has credentials, without the interactive prompt ``wandb.init`` would show
    (which would hold the run until someone answers)."""
    try:
        return bool(wandb.login(prompt=False, verify=False))
    except TypeError:  # a client without ``prompt``: let wandb.init decide
        return True


class MlflowTracker(Tracker):
    """MLflow through its tracking client (``mlflow-skinny`` suffices). The store is
    ``MLFLOW_TRACKING_URI`` when set (a server), else a file store under ``RUN/mlruns``
    (``mlflow ui --backend-store-uri RUN/mlruns`` shows it). The config goes in as parameters
    (flattened, once per run: MLflow refuses changed values) and whole as ``config.yaml``."""

    name = "mlflow"
    extra = "mlflow"
    takes_media = True
    _STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}

    def __init__(self, info: RunInfo) -> None:
        _require("mlflow", self.extra)
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(info.run_dir / 'mlruns').resolve()}"
        if uri.startswith(("http://", "https://")):
            why = _unreachable(uri)
            if why:
                raise TrackerUnavailable(f"MLflow server {why}")
            # a server that goes away mid-run costs one short retry per record, not minutes
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        elif uri.startswith("file:"):
            # MLflow 3 keeps the file store (maintenance mode) behind this switch; it is the one
            # local store the light client can write without a database package
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = self._continue(info.saved.get("run_id"))
        if self.run_id is None:
            experiment = info.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "rlweave"
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            tags = {t: "" for t in info.tags}
            if info.group:
                tags["group"] = info.group
            self.run_id = self.client.create_run(exp_id, run_name=info.name, tags=tags).info.run_id
            self._log_params(info.config)
        import yaml

        self.client.log_text(self.run_id, yaml.safe_dump(info.config, sort_keys=False), "config.yaml")

    def _continue(self, run_id: str | None) -> str | None:
        if not run_id:
            return None
        try:
            self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not in this store (another tracking URI): a new run
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_key(k), float(v), ms, step) for k, v in scalars.items()])

    def log_image(self, key: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path), _mlflow_key(key))

    def log_video(self, key: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path), f"{_mlflow_key(key)}/step_{step:010d}")

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        # the column/data layout of mlflow.log_table, without needing pandas
        text = json.dumps({"columns": columns, "data": rows}, default=str)
        self.client.log_text(self.run_id, text, f"{_mlflow_key(key)}/step_{step:010d}.json")

    def state(self) -> dict:
        return {"run_id": self.run_id}

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=self._STATUS.get(status, "FINISHED"))


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _mlflow_key(key: str) -> str:
    """MLflow names allow letters, digits and ``_-. /``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in key)


TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (TensorBoardTracker, WandbTracker, MlflowTracker)}


def resolve_loggers(loggers: list[str], tensorboard: bool = True) -> list[str]:
    """The trackers a run uses: ``run.loggers`` in order, once each, without TensorBoard when the
    older switch ``run.tensorboard=false`` says so. Raises ValueError (one line naming
    ``run.loggers``) for an unknown name."""
    names: list[str] = []
    for n in loggers:
        if n not in TRACKERS:
            raise ValueError(f"run.loggers: '{n}' is not one of {', '.join(TRACKERS)}")
        if n not in names and (tensorboard or n != "tensorboard"):
            names.append(n)
    return names


# --------------------------------------------------------------------------- the fan-out
class Trackers:
    """The run's live trackers: starts them, keeps their bookkeeping in ``RUN/trackers.json``,
    fans records out (each tracker its new steps only), and drops a failing one with one warning.

    ``saved`` is the checkpoint's tracker state ({name: {"run_id": ...}}) when continuing a run;
    ``info.resume_step`` is set then too."""

    SKIP = ("iteration", "env_steps")  # the step axes, not metrics

    def __init__(self, names: list[str], info: RunInfo, step_key: str, saved: dict | None = None) -> None:
        self.run_dir = Path(info.run_dir)
        self.step_key = step_key
        self.live: dict[str, Tracker] = {}
        self.last: dict[str, int] = {}
        # continuing a run: run ids from the checkpoint (else the file), the later last step of the two
        kept = self._read_state() if info.resume_step is not None else {}
        for name, s in (saved or {}).items():
            both = [x["last_step"] for x in (s, kept.get(name, {})) if "last_step" in x]
            kept[name] = {**kept.get(name, {}), **s, **({"last_step": max(both)} if both else {})}
        self._kept = kept  # entries of trackers not started this time stay in the file
        for name in names:
            mine = kept.get(name, {})
            try:
                tracker = TRACKERS[name](replace(info, saved=mine))
            except Exception as e:  # noqa: BLE001 - a tracker never stops training
                _warn(name, e, starting=True)
                continue
            self.live[name] = tracker
            if not tracker.rewinds and "last_step" in mine and tracker.state().get("run_id") == mine.get("run_id"):
                self.last[name] = int(mine["last_step"])
        self._write_state()

    @property
    def takes_media(self) -> bool:
        return any(t.takes_media for t in self.live.values())

    def step_of(self, record: dict) -> int:
        return int(record.get(self.step_key) or 0)

    def log(self, record: dict) -> None:
        """One metrics record: its numeric fields, at its step."""
        step = self.step_of(record)
        scalars = {k: float(v) for k, v in record.items()
                   if k not in self.SKIP and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._each("log_scalars", step, scalars, new_only=True)
        self._write_state()

    def log_image(self, key: str, path: Path, step: int) -> None:
        self._each("log_image", key, Path(path), step)

    def log_video(self, key: str, path: Path, step: int) -> None:
        self._each("log_video", key, Path(path), step)

    def log_table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self._each("log_table", key, columns, rows, step)

    def _each(self, method: str, *args: Any, new_only: bool = False) -> None:
        """``method(*args)`` on every live tracker; ``args`` end with the step (scalars: start with
        it). Append-only trackers skip records at steps they have; media there go to their newest."""
        step = args[0] if new_only else args[-1]
        for name, t in list(self.live.items()):
            last = self.last.get(name)
            call = args
            if not t.rewinds and last is not None and step <= last:
                if new_only:
                    continue  # this step is in the tracker already (the run was rewound)
                call = (*args[:-1], last)
            try:
                getattr(t, method)(*call)
            except Exception as e:  # noqa: BLE001
                _warn(name, e)
                self._drop(name, "failed")
                continue
            if new_only and not t.rewinds:
                self.last[name] = step if last is None else max(last, step)

    def rewind(self, step: int) -> None:
        """A restart re-runs the iterations after ``step``: rewinding trackers start over there."""
        for name, t in list(self.live.items()):
            if t.rewinds:
                try:
                    t.rewind(step)
                except Exception as e:  # noqa: BLE001
                    _warn(name, e)
                    self._drop(name, "failed")

    def state(self) -> dict:
        """Per live tracker: its run id (if it has one) and, if append-only, the last step it took."""
        out = {}
        for name, t in self.live.items():
            s = dict(t.state())
            if name in self.last:
                s["last_step"] = self.last[name]
            out[name] = s
        return out

    def close(self, status: str = "finished") -> None:
        self._write_state()
        for name in list(self.live):
            self._drop(name, status)

    def _drop(self, name: str, status: str) -> None:
        self._kept[name] = self.state()[name]  # a resume continues its run where it stopped
        t = self.live.pop(name)
        try:
            t.close(status)
        except Exception as e:  # noqa: BLE001 - closing is best effort
            if status != "failed":
                _warn(name, e)

    def _read_state(self) -> dict:
        try:
            return json.loads((self.run_dir / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def _write_state(self) -> None:
        from rlweave.utils.metrics import write_text_atomic

        state = {**self._kept, **self.state()}
        if state:
            write_text_atomic(self.run_dir / STATE_FILE, json.dumps(state, indent=1))


def _warn(name: str, error: BaseException, starting: bool = False) -> None:
    what = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    when = "cannot start" if starting else "failed"
    print(f"[rlweave] warning: run.loggers: {name} {when}: {what}; the run continues without it", file=sys.stderr, flush=True)
