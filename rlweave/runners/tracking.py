"""A run's experiment trackers (``run.loggers``), as a mixin of :class:`~rlweave.runners.common.RunnerBase`:
one step convention for every runner, resumed tracker runs, the language models' samples table and
the learning-curve image. The trackers themselves are :mod:`rlweave.utils.trackers`."""

from __future__ import annotations

import sys

from rlweave.utils.metrics import read_metrics
from rlweave.utils.trackers import RunInfo, Trackers

__all__ = ["Tracking"]


class Tracking:
    """What a runner adds to its metrics records' way to the trackers. Expects ``cfg``,
    ``run_dir``, ``resume``, ``loggers``, ``iteration``, ``env_steps``, ``_budget()``,
    ``_progress_keys``, ``_resolved_config()`` and the ``_trackers``, ``_saved_trackers`` and
    ``_samples`` slots of :class:`~rlweave.runners.common.RunnerBase`."""

    @property
    def _step_key(self) -> str:
        """The trackers' step: env steps where the run counts them, else the iteration (language
        models, offline and SFT runs, whose env-step count does not grow with every record)."""
        return "env_steps" if self._budget().unit == "steps" else "iteration"

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
