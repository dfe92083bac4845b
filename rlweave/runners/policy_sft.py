"""Supervised fine-tuning of an embodied policy on demonstrations (``runner: policy_sft``,
``algorithm.name: sft``): the first half of the SFT -> RL recipes of vision-language-action and
flow policies.

Logical workflow::

    demonstrations (data.path, a Minari dataset) --rows sampled by each rank--> actor ranks
    actor rank 0 --weights--> driver's evaluation policy (env episodes, success rates)

An iteration is ``train.updates_per_iteration`` gradient steps of the algorithm's ``policy_sft``
loss (by default the policy's own ``bc_loss``: action-token cross-entropy, L1 on a chunk, flow
matching) on minibatches of ``algorithm.minibatch_size`` rows; the run ends after
``train.total_updates`` updates or when an evaluation reaches ``train.stop_at_eval`` (scored by
``eval/success_rate`` where the env reports success, else the return). The trainer is the
on-policy ActorWorker, so the weights, their checkpoint state and the export the RL phase loads
are the same objects.
"""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlweave.cluster import WorkerGroup
from rlweave.models import build_policy
from rlweave.models.run_policy import policy_kwargs
from rlweave.runners.common import Budget, RunnerBase
from rlweave.runners.records import update_only_record
from rlweave.utils.metrics import MetricsWriter, Progress, Trace
from rlweave.workers.actor_worker import ActorWorker

__all__ = ["PolicySFTRunner"]


class PolicySFTRunner(RunnerBase):
    _score_metric = "eval/success_rate"
    _progress_keys = ("train/loss", "eval/success_rate")
    _progress_labels = ("loss", "success")

    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False):
        super().__init__(cfg, run_dir, resume)
        self.updates = 0
        self.demo_info: dict | None = None

    def _budget(self) -> Budget:
        return Budget(self.updates, self.cfg.train.total_updates, "updates")

    def _start(self) -> None:
        cfg = self.cfg
        self._start_cluster()
        self.pkw = policy_kwargs(cfg)
        self.actor = WorkerGroup(
            ActorWorker, self.plan.groups["actor"], self.cluster,
            args=(OmegaConf.to_container(cfg.algorithm), self.pkw, self.obs_space, self.act_space, cfg.env.chunk,
                  cfg.seed, None, 1, "policy_sft"),
            init_dist=True,
        )
        self.groups.append(self.actor)
        self.demo_info = self.actor.load_demonstrations(cfg.data.path, self.obs_space, self.act_space)[0]
        d = self.demo_info
        rate = "" if d["success_rate"] is None else f", success in {d['success_rate']:.0%} of them"
        print(f"[rlweave] demonstrations {cfg.data.path}: {d['episodes']} episodes, {d['steps']} steps{rate}")
        found = {k: v for k, v in d.items() if "/" in k}  # what the loss computed on them (RECAP: its labels)
        if found:
            print("[rlweave] " + ", ".join(f"{k} {v:.4g}" for k, v in found.items()))
        self.eval_policy = build_policy(observation_space=self.obs_space, action_space=self.act_space, chunk=cfg.env.chunk,
                                        **self.pkw)

    def _sync_weights(self) -> float:
        """No rollout group: the newest weights are only exported for evaluation."""
        t0 = time.perf_counter()
        self._last_packet = self.actor.export_weights()
        return time.perf_counter() - t0

    def _iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        t = self.cfg.train
        due = min(t.updates_per_iteration, t.total_updates - self.updates)
        t0 = time.perf_counter()
        out = self.actor.imitate(due, self.updates / max(1, t.total_updates))
        self.updates += due
        self.iteration += 1
        self._sync_weights()
        t_iter = time.perf_counter() - t0
        record = update_only_record(self.iteration, out, due, t_iter)
        record["train/loss"] = float(sum(v for k, v in out.items() if k.startswith("train/loss_")))
        trace.span("actor[0]", "imitate", t0, t_iter)
        return self._finish_record(record, metrics, trace, progress, final=self.updates >= t.total_updates)

    def evaluate(self) -> dict:
        out = super().evaluate()
        if "eval/success_rate" not in out:  # envs without success flags: score by return
            out["eval/success_rate"] = None
        return out

    def _parts(self) -> dict:
        return {"actor": self.actor.state_dict(), "runner": {**self._driver_state(), "updates": self.updates}}

    def _restore_parts(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.updates = state["runner"].get("updates", 0)
