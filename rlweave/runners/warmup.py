"""Running a chained warm-up (an SFT sub-run before RL) inside the run that needs it.

Why one function: every runner that chains a warm-up (language models, embodied policies, and the
agent and VLA chains built on them) must behave the same way to the user: one line saying what the
warm-up runs with, continuing an interrupted warm-up instead of restarting it, refusing to start RL
from a half-trained model, one warning line when the warm-up ended below its target, and a marker
so later attempts of the run skip it. The sub-run's config is built by
:func:`rlweave.config.chain.warmup_config`; this module only runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from rlweave.config.chain import WARMUP_DONE, SubRun

__all__ = ["run_warmup"]


def run_warmup(parent, runner_cls: type, sub_run: SubRun, metric: str, what: str,
               before_run: Callable | None = None) -> Path:
    """Runs ``sub_run`` into ``parent.run_dir / "sft"`` on the parent's cluster (unless an earlier
    attempt of this run finished it) and returns that folder.

    ``metric`` is the held-out score the warm-up's stop rule (``train.stop_at_eval``) reads and
    ``what`` its name in messages (e.g. "accuracy"); ``before_run(sub)`` makes the checks that need
    the sub-run built (the tokenizer's, for language models) before any training.
    """
    sft_dir = parent.run_dir / "sft"
    if (sft_dir / WARMUP_DONE).is_file():
        return sft_dir
    recipe = parent.cfg.init.sft_recipe
    started = (sft_dir / "checkpoints").is_dir() and any((sft_dir / "checkpoints").iterdir())
    print(f"[rlweave] init.checkpoint not given: supervised warm-up '{recipe}' into {sft_dir} with "
          f"{sub_run.describe()}{' (continuing it)' if started else ''} (all its settings: {sft_dir / 'config.yaml'})")
    sub = runner_cls(sub_run.cfg, sft_dir, resume=started)
    sub.cluster, sub.plan, sub._owns_cluster = parent.cluster, sub._plan_placement(parent.cluster), False
    if before_run is not None:
        before_run(sub)
    last = sub.run()
    if sub._stop_reason is not None:  # stopped, not finished: RL must not start from a half-trained model
        raise KeyboardInterrupt(f"the warm-up stopped ({sub._stop_reason}); run the same command again to continue it")
    value = last.get(metric)
    shown = "n/a" if value is None else f"{value:.3f}"
    print(f"[rlweave] warm-up done: held-out {what} {shown}; RL starts")
    target = sub_run.cfg.train.stop_at_eval
    if target is not None and not (value is not None and value >= target):
        print(f"[rlweave] warning: the warm-up ended at held-out {what} {shown}, below its target "
              f"train.stop_at_eval={target}: it ran out of train.total_updates ({sub_run.cfg.train.total_updates}); "
              f"RL may see few rewards (more updates: init.sft_overrides=['train.total_updates=N'])")
    done = {"iteration": sub.iteration, "updates": getattr(sub, "updates", None), metric: value}
    (sft_dir / WARMUP_DONE).write_text(json.dumps(done))
    return sft_dir


def initial_policy_source(runner) -> str | None:
    """The run folder an embodied run's policy starts from: ``init.checkpoint``, else the
    supervised warm-up ``init.sft_recipe`` (run first into ``RUN/sft`` on this run's cluster, with
    this run's policy and env settings; continued if an earlier attempt of this run left it
    unfinished), else None (random weights). One rule for the on-policy and off-policy runners."""
    cfg = runner.cfg
    if cfg.init.checkpoint:
        return cfg.init.checkpoint
    if not cfg.init.sft_recipe:
        return None
    from rlweave.config.chain import warmup_config
    from rlweave.runners.policy_sft import PolicySFTRunner

    return str(run_warmup(runner, PolicySFTRunner, warmup_config(cfg), "eval/success_rate", "success rate"))
