"""The language-model workflow: RL with verifiable rewards (GRPO, DAPO, REINFORCE++, PPO, async
PPO) and supervised fine-tuning, on Hugging Face causal LMs.

Logical workflow, the same under every placement::

    driver --prompts--> rollout workers (generate n responses per prompt, score them)
    driver --rows--> actor ranks: score (trainer / reference log-probs, values)
    driver: advantages (the registry's estimator: group, token GAE, REINFORCE++)
    driver --rows + advantages--> actor ranks: update (FSDP2 across ranks)
    actor --weights (bucketed, versioned, checksummed)--> rollout workers

Collocated (identical slots) the rollout engine lives in the actor's processes and the two take
turns; disaggregated they run in their own processes, which is what lets async PPO generate the
next batch while this one trains. The driver reads as a one-process program: each line is a call
on a whole worker group. Prompts, seeds and splits are chosen here, so a run is reproducible
whatever the number of workers.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from rlweave.algorithms.llm import kl_penalty, overlong_penalty, token_advantages
from rlweave.cluster import Cluster, WorkerGroup, make_plan
from rlweave.config import ConfigError
from rlweave.envs.prompt_curriculum import PromptCurriculum
from rlweave.envs.text_tasks import Prompt, make_task
from rlweave.runners.common import Budget, RunnerBase
from rlweave.runners.layouts import llm_layout_candidates
from rlweave.runners.llm_batches import assemble, eval_record, fresh_groups, groups_of, rl_metrics
from rlweave.runners.llm_checks import MODEL_RECORD, check_llm, sft_config, start_weights, tokenizer_folder
from rlweave.runners.llm_prompts import EVAL_SEED, check_prompt_fit, fit_prompts, prompt_overhead
from rlweave.runners.records import StageClock
from rlweave.sync.weights import verify_sync
from rlweave.utils.metrics import MetricsWriter, Progress, Trace

__all__ = ["LLMRunner", "check_llm", "sft_config"]

START_ACCURACY_FLOOR = 0.02  # below this at the start of RL, a run is warned that it will see few rewards


class LLMRunner(RunnerBase):
    _score_metric = "eval/accuracy"
    _progress_keys = ("train/reward", "eval/accuracy")
    _progress_labels = ("reward", "accuracy")

    def _check(self) -> None:
        self.spec = check_llm(self.cfg)
        self.sft = self.spec.kind == "sft"
        self.task = make_task(OmegaConf.to_container(self.cfg.task))
        t = self.cfg.task  # a curriculum over kinds of train prompts (rlweave/envs/prompt_curriculum.py)
        self.curriculum = PromptCurriculum(self.task, t.curriculum, t.curriculum_floor) if t.curriculum and not self.sft else None
        self.updates = 0
        self.version = 0
        self._pending = None  # async PPO: the next batch's generation, in flight
        self._pending_sync = None
        self._generation_calls = 0
        self._logged_initial_eval = False
        self._best_eval: float | None = None  # the best evaluation's accuracy so far (the SFT stop rule's approach)
        self.agent_cfg = OmegaConf.to_container(self.cfg.agent)
        from rlweave.agents.workflows import check_workflow

        self.workflow = check_workflow(self.agent_cfg)  # how episodes are produced (rlweave/agents/workflows.py)
        self.agent = self.workflow is not None  # multi-turn tool use (rlweave/agents)
        self._tool_specs: list | None = None

    def _layout_candidates(self, cluster: Cluster) -> list:
        return llm_layout_candidates(cluster, self.cfg.placement.oversubscribe)

    def _configured_plan(self, cluster: Cluster):
        explicit = {k: OmegaConf.to_container(v) for k, v in self.cfg.placement.groups.items()}
        workers = {"rollout": self.cfg.rollout.num_workers, "actor": self.cfg.actor.num_workers}
        return make_plan(cluster, workers, self.cfg.placement.mode, explicit, self.cfg.placement.oversubscribe)

    def _budget(self) -> Budget:
        if self.sft:
            return Budget(self.updates, self.cfg.train.total_updates, "updates")
        return Budget(self.iteration, self.cfg.train.total_iterations, "iters")

    # ------------------------------------------------------------------ start
    def _start(self) -> None:
        cfg = self.cfg
        self._start_cluster()
        self.model_spec = OmegaConf.to_container(cfg.model)
        init = self._init_weights()
        if init is not None:
            self.model_spec["path"] = str(init)
        self.tokenizer_path = self._tokenizer(self.model_spec.get("path"))
        from rlweave.models.causal_lm import load_tokenizer
        from rlweave.workers.lm_actor import LMActorWorker
        from rlweave.workers.lm_rollout import LMRolloutWorker

        self.tokenizer = load_tokenizer(self.tokenizer_path)
        algo = OmegaConf.to_container(cfg.algorithm)
        plan = self.plan
        self.actor = WorkerGroup(LMActorWorker, plan.groups["actor"], self.cluster,
                                 args=(self.model_spec, self.tokenizer_path, algo, cfg.seed, cfg.rollout.temperature,
                                       {**OmegaConf.to_container(cfg.actor), **self._strategy_override(),
                                        "max_tokens": cfg.task.max_prompt_tokens + self._response_tokens()}),
                                 init_dist=True, wait=False)  # a rollout group of its own starts beside it
        self.groups = [self.actor]
        fused = plan.groups["rollout"].slots == plan.groups["actor"].slots
        self.rollout = WorkerGroup(LMRolloutWorker, plan.groups["rollout"], self.cluster,
                                   args=(self.model_spec, self.tokenizer_path, OmegaConf.to_container(cfg.rollout),
                                         OmegaConf.to_container(cfg.task), self.agent_cfg),
                                   colocate_with=self.actor if fused else None, wait=False)
        self.groups.append(self.rollout)
        self.check_prompts(self.tokenizer)  # driver work (and the expert traces below) while the groups build
        self.eval_prompts = self._fit_prompts(self.task.prompts("test", cfg.task.eval_prompts, EVAL_SEED))[0]
        if self.sft:
            from rlweave.data.sft_data import SFTData, read_sft_jsonl

            d = cfg.data
            path = d.path or (self.agent and self.workflow.sft_trace_file(self.task, self.run_dir, cfg.agent.sft_traces,
                                                                          cfg.seed, self.agent_cfg))
            examples = read_sft_jsonl(path, d.prompt_key, d.response_key, self.tokenizer) if path else None
            self.data = SFTData(self.tokenizer, examples, None if examples else self.task, d.max_tokens, d.packing,
                                d.loss_on)
        # collocated rank by rank, the engines can generate with their actor rank's own parameters:
        # the weight sync then moves no bytes (not for async PPO, whose next batch is generated
        # while this one trains, with the previous weights)
        self.actor.prepare()
        self.shared_weights = (fused and not self.spec.asynchronous and self.rollout.world_size == self.actor.world_size
                               and all(self.rollout.share_actor_weights(self.actor.name)))

    def _init_weights(self) -> Path | None:
        """Where the weights start (:func:`start_weights`); a chained SFT warm-up is trained first
        (into ``sft/``, unless a previous attempt of this run finished it)."""
        cfg = self.cfg
        start = start_weights(cfg, self.run_dir, chained=not self.sft)
        if cfg.init.checkpoint or self.sft or not cfg.init.sft_recipe:
            return start
        from rlweave.runners.warmup import run_warmup

        def check_before_training(sub: "LLMRunner") -> None:
            # the checks that need the tokenizer, for the warm-up's settings and this run's, before any training
            from rlweave.models.causal_lm import load_tokenizer

            sub_start = start_weights(sub.cfg, sub.run_dir, chained=False)
            tokenizer = load_tokenizer(sub._tokenizer(str(sub_start) if sub_start else None))  # the one the warm-up will load
            sub.check_prompts(tokenizer)
            self.check_prompts(tokenizer)

        done = run_warmup(self, LLMRunner, sft_config(cfg), "eval/accuracy", "accuracy", check_before_training) / "model"
        assert done == start, (done, start)
        return start

    def check_prompts(self, tokenizer) -> None:
        """Refuses, before any work, prompts that do not fit (:func:`check_prompt_fit`)."""
        check_prompt_fit(self.task, self.cfg, lambda prompts: self._fit_prompts(prompts, tokenizer), EVAL_SEED)

    def _tokenizer(self, model_path: str | None) -> str:
        """The tokenizer folder every worker loads: the configured one, the model's, or one
        trained here on the task's text (saved in the run folder, so a resume reuses it)."""
        m = self.cfg.model
        path = tokenizer_folder(self.cfg, self.run_dir, model_path)
        if m.tokenizer or model_path:
            return str(path)
        if not (path / "tokenizer_config.json").is_file():
            from rlweave.models.causal_lm import train_tokenizer

            from rlweave.models.chat_template import add_chat_template, render_text

            corpus = [p.text + p.answer for p in self.task.prompts("train", 2000, seed=self.cfg.seed)]
            chat = self.agent  # agent runs and SFT on multi-turn traces need the chat template and its tokens
            if self.agent:
                corpus += self.workflow.corpus(self.task, self.agent_cfg, self.task.prompts("train", 500, seed=self.cfg.seed))
            if self.sft and self.cfg.data.path:
                from rlweave.data.sft_data import read_sft_jsonl

                for e in read_sft_jsonl(self.cfg.data.path, self.cfg.data.prompt_key, self.cfg.data.response_key):
                    chat |= e.multi_turn
                    corpus.append(render_text(e.messages, e.tools) if e.multi_turn else e.prompt + e.response)
            tmp = path.with_name("tokenizer.tmp")
            path.parent.mkdir(parents=True, exist_ok=True)
            tok = train_tokenizer(corpus, vocab_size=m.vocab_size)
            (add_chat_template(tok) if chat else tok).save_pretrained(tmp)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        return str(path)

    def _sync_weights(self) -> float:
        """Every actor rank takes part (a sharded model is gathered); rank 0's packet goes to every
        rollout engine, accepted only when each engine's checksum equals the actor's. Engines that
        share their actor rank's parameters only take its version, after checking they still do."""
        t0 = time.perf_counter()
        if self.shared_weights:
            follows = self.rollout.follow_actor()
            if not all(ok for ok, _ in follows) or len({v for _, v in follows}) != 1:
                raise RuntimeError(f"weight sync: a rollout engine no longer shares its actor rank's parameters ({follows})")
            return time.perf_counter() - t0
        return super()._sync_weights()

    # ------------------------------------------------------------------ prompts
    def _fit_prompts(self, prompts: list[Prompt], tokenizer=None) -> tuple[list[Prompt], int, int]:
        """``task.max_prompt_tokens`` per ``task.prompt_overflow`` (:func:`fit_prompts`)."""
        tokenizer = tokenizer or self.tokenizer
        if self.agent and self._tool_specs is None:
            from rlweave.agents.rollout import tool_specs

            self._tool_specs = tool_specs(self.agent_cfg, self.task)
        return fit_prompts(prompts, tokenizer, self.cfg.task.max_prompt_tokens, self.cfg.task.prompt_overflow,
                           prompt_overhead(tokenizer, self.workflow if self.agent else None, self._tool_specs))

    def _response_tokens(self) -> int:
        """The longest response a row can hold: an agent episode's ``agent.max_tokens`` (turns and
        observations), else ``rollout.max_new_tokens``."""
        return self.cfg.agent.max_tokens if self.agent else self.cfg.rollout.max_new_tokens

    def _issue_generation(self, it: int, rounds: int = 0):
        """Draws this iteration's prompts (seeded by run, iteration and round) and sends each
        rollout worker its share; returns (prompts, handle, dropped, truncated)."""
        cfg = self.cfg
        seed = (cfg.seed * 1_000_003 + it) * 16 + rounds
        n = cfg.rollout.prompts_per_iteration
        drawn = self.curriculum.draw(n, seed) if self.curriculum else self.task.prompts("train", n, seed)
        prompts, dropped, truncated = self._fit_prompts(drawn)
        if not prompts:
            raise ValueError(f"task.max_prompt_tokens: all {dropped} prompts drawn were longer than "
                             f"{cfg.task.max_prompt_tokens} tokens and dropped (raise it, or task.prompt_overflow=truncate)")
        self._generation_calls += 1  # per rollout worker: every call goes to every worker
        handle = self.rollout.generate(prompts, cfg.algorithm.group_size, seed * 131)  # rank r samples with seed * 131 + r
        return prompts, handle, dropped, truncated

    # ------------------------------------------------------------------ iterations
    def _iteration(self, metrics: MetricsWriter, trace: Trace, progress: Progress) -> dict:
        if self.iteration == 0 and not self._logged_initial_eval and self.cfg.train.eval_every:
            self._logged_initial_eval = True  # the curve starts where training starts
            t0 = time.perf_counter()
            record = {"iteration": 0, "env_steps": 0, **self.evaluate(), "time/eval": time.perf_counter() - t0,
                      "wall_time": self._wall()}
            metrics.log(record)
            print(f"[rlweave] before training: held-out accuracy {record['eval/accuracy']:.3f}")
            self._warn_if_hopeless(record["eval/accuracy"])
        if self.sft:
            return self._sft_iteration(metrics, trace, progress)
        return self._rl_iteration(metrics, trace, progress)

    def _warn_if_hopeless(self, accuracy: float) -> None:
        """RL on a verifiable task learns only from responses that earn a reward: a start model that
        almost never answers correctly is a mistake to name before the run spends its budget."""
        if self.sft or self.cfg.task.reward_fn or accuracy >= START_ACCURACY_FLOOR:
            return
        start = (f"the warm-up's model (its task: {self.run_dir / 'sft' / 'config.yaml'})" if self.cfg.init.sft_recipe
                 and not self.cfg.init.checkpoint else f"the start model ({self.cfg.init.checkpoint or self.cfg.model.path or 'random weights'})")
        print(f"[rlweave] warning: held-out accuracy {accuracy:.3f} at the start of RL is below {START_ACCURACY_FLOOR}: "
              f"few responses will earn a reward; likely {start} was not trained on this task")

    def _sft_iteration(self, metrics, trace, progress) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        steps = min(self._updates_this_iteration(), cfg.train.total_updates - self.updates)
        losses, tokens = [], 0
        for _ in range(steps):
            self.updates += 1
            batch = self.data.batch(cfg.algorithm.minibatch_size * self.actor.world_size, seed=cfg.seed * 1_000_003 + self.updates)
            outs = self.actor.sft_update(batch)
            losses.append(float(np.mean([o["loss_sft"] for o in outs])))
            tokens += sum(o["tokens"] for o in outs)
        self.iteration += 1
        dt = time.perf_counter() - t0
        record = {"iteration": self.iteration, "env_steps": self.env_steps, "updates": self.updates,
                  "train/loss_sft": float(np.mean(losses)), "train/tokens": tokens, "time/update": dt,
                  "throughput/train_tokens_per_s": tokens / max(dt, 1e-9), "train/truncated_examples": self.data.truncated}
        final = not self._more()
        if self._eval_due(final):
            self._sync_weights()
        return self._finish_record(record, metrics, trace, progress, final)

    def _near_eval_target(self) -> bool:
        """An evaluation has come within half of ``train.stop_at_eval`` (the best so far: a noisy
        evaluation just below half does not send the run back to long iterations)."""
        target = self.cfg.train.stop_at_eval
        return target is not None and self._best_eval is not None and self._best_eval >= 0.5 * target

    def _updates_this_iteration(self) -> int:
        """``train.updates_per_iteration``; near the target, ``train.stop_approach_updates``, each
        iteration evaluated: the run stops close to ``train.stop_at_eval`` instead of wherever a
        coarse evaluation happens to fall (one run went 0.29 -> 0.535 between two evaluations 25
        updates apart)."""
        t = self.cfg.train
        return min(t.updates_per_iteration, t.stop_approach_updates) if self._near_eval_target() else t.updates_per_iteration

    def _eval_due(self, final: bool) -> bool:
        return super()._eval_due(final) or (self.sft and bool(self.cfg.train.eval_every) and self._near_eval_target())

    def _rl_iteration(self, metrics, trace, progress) -> dict:
        """One iteration of the workflow: rollout workers generate and score responses; the actor
        ranks score them (old / reference log-probs, values) unless the update's own forward pass
        can serve; the driver computes advantages; the ranks update on their rows; the weights go
        to the rollout engines (for async PPO, after the next generation has started)."""
        a, it = self.cfg.algorithm, self.iteration + 1
        clock = StageClock(trace)
        with clock.stage("generate"):
            gens, dropped, truncated, rounds, stale = (self._async_generations if self.spec.asynchronous else self._generations)(it)
        with clock.stage("score"):
            batch = assemble(gens, self.tokenizer.pad_token_id)
            scored = {} if self._single_pass(len(batch["rewards"])) else self.actor.score(batch)
        self.note_samples([r for g in gens for r in g["rows"]], self.tokenizer)  # for the trackers' samples table
        with clock.stage("advantages"):
            update, scores, kl = self._advantages(batch, scored)
        lr_scale = 1.0 - self.iteration / max(1, self.cfg.train.total_iterations) if a.lr_anneal else 1.0
        with clock.stage("update"):
            outs = self.actor.update({**batch, **update}, lr_scale, self.spec.asynchronous)
        self.iteration, self.version, self.env_steps = it, self.version + 1, self.env_steps + len(batch["rewards"])
        with clock.stage("sync"):
            self._sync_after_update()
        record = {"iteration": it, "env_steps": self.env_steps, **clock.record(),
                  "train/prompts_dropped": dropped, "train/prompts_truncated": truncated, "train/sampling_rounds": rounds,
                  "train/stale_groups_dropped": stale, **(self.curriculum.metrics() if self.curriculum else {}),
                  **rl_metrics(batch, scored, scores, kl, outs, clock.times, a.epochs, self.version)}
        if self._layouts is not None:
            record["plan/layout"] = self._layouts.index
        return self._finish_record(record, metrics, trace, progress, final=not self._more())

    def _single_pass(self, rows: int) -> bool:
        """One epoch of one minibatch per rank and nothing else to score: the update's own forward
        is the anchor of its ratio (one pass fewer); otherwise the ranks score the rows first."""
        a = self.cfg.algorithm
        return a.epochs == 1 and a.minibatch_size * self.actor.world_size >= rows and not self.spec.uses_critic and a.kl_coef == 0

    def _advantages(self, batch: dict, scored: dict) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
        """The update's inputs beside the rows: advantages by the algorithm's estimator (with DAPO's
        overlong penalty and a KL-in-reward term where configured), the anchor log-probs, returns
        and old values. Returns them with the scores and the KL (for the metrics)."""
        a = self.cfg.algorithm
        mask = torch.as_tensor(batch["mask"])
        scores = torch.as_tensor(batch["rewards"], dtype=torch.float32)
        if a.overlong_buffer:
            scores = scores + overlong_penalty(torch.as_tensor(batch["resp_len"]), self._response_tokens(),
                                               a.overlong_buffer, a.overlong_penalty)
        ref = torch.as_tensor(scored["ref_logprobs"]) if "ref_logprobs" in scored else None
        old = torch.as_tensor(scored["logprobs"]) if scored else None
        kl = kl_penalty(old, ref, a.kl_estimator) if ref is not None else None
        adv, ret = token_advantages(
            self.spec.advantage, scores, mask, torch.as_tensor(batch["group"]),
            values=torch.as_tensor(scored["values"]) if "values" in scored else None,
            kl=kl if a.kl_mode == "reward" else None, kl_coef=a.kl_coef if a.kl_mode == "reward" else 0.0,
            gamma=a.gamma, lam=a.gae_lambda, norm=a.norm_adv,
        )
        weights = self.agent_cfg.get("role_weights")
        if weights and "role" in batch:  # agent.role_weights: a role's share of the update (multi-role workflows)
            adv = adv * torch.tensor([float(weights.get(r, 1.0)) for r in batch["role"]])[:, None]
        update = {"advantages": adv.numpy(), "rollout_logprobs": batch["behaviour_logprobs"]}
        if old is not None:
            update["old_logprobs"] = scored["logprobs"]
        if ref is not None:
            update["ref_logprobs"] = scored["ref_logprobs"]
        if ret is not None:
            update["returns"], update["old_values"] = ret.numpy(), scored["values"]
        return update, scores, kl

    def _sync_after_update(self) -> None:
        """The new weights to the rollout engines; async PPO's land after the generation already
        in flight (staleness stays 1) and are checked when the next batch is taken."""
        if self.spec.asynchronous:
            packet = self.actor.export_weights()
            self._pending_sync = (packet, self.rollout.load_weights.submit(packet, self._generation_calls))
        else:
            self._sync_weights()

    def _generations(self, it: int):
        """This iteration's scored responses. DAPO's dynamic sampling keeps only groups whose
        rewards differ and samples more prompts (up to ``algorithm.max_sampling_rounds`` rounds)
        until ``rollout.prompts_per_iteration`` groups are kept."""
        a = self.cfg.algorithm
        want = self.cfg.rollout.prompts_per_iteration
        kept: list[dict] = []
        last: list[dict] = []
        dropped = truncated = rounds = 0
        while rounds < (a.max_sampling_rounds if a.dynamic_sampling else 1):
            prompts, handle, d, t = self._issue_generation(it, rounds)
            rounds += 1
            dropped, truncated = dropped + d, truncated + t
            last = [grp for g in handle.wait() for grp in groups_of(g, a.group_size)]
            self._observe(prompts, last)
            kept.extend(grp for grp in last if not a.dynamic_sampling or grp["informative"])
            if not a.dynamic_sampling or len(kept) >= want:
                break
        if not kept:  # not one informative group in every round: train on the last (its advantages are 0)
            kept = last
        return kept[:want], dropped, truncated, rounds, 0

    def _async_generations(self, it: int):
        """Async PPO: take the batch generated while the previous update ran, then start the next
        one at once (with the weights the rollout holds); groups older than ``train.max_staleness``
        versions are dropped and counted (:func:`~rlweave.runners.llm_batches.fresh_groups`)."""
        if self._pending is None:
            self._pending = self._issue_generation(it)
        prompts, handle, dropped, truncated = self._pending
        groups = [grp for g in handle.wait() for grp in groups_of(g, self.cfg.algorithm.group_size)]
        self._observe(prompts, groups)
        if self._pending_sync is not None:
            packet, h = self._pending_sync
            verify_sync(packet, h.wait())
            self._pending_sync = None
        groups, stale = fresh_groups(groups, self.version, self.cfg.train.max_staleness)
        if it < self.cfg.train.total_iterations:
            self._pending = self._issue_generation(it + 1)
        else:
            self._pending = None
        return groups, dropped, truncated, 1, stale

    # ------------------------------------------------------------------ evaluation, checkpoints
    def _observe(self, prompts: list[Prompt], groups: list[dict]) -> None:
        """Feeds the curriculum one round's training rewards (one group per prompt, in order)."""
        if self.curriculum is not None and len(groups) == len(prompts):
            self.curriculum.observe(prompts, ([r["reward"] for r in g["rows"]] for g in groups))

    def evaluate(self) -> dict:
        """Greedy answers of the rollout engines (holding the latest weights) to the held-out prompts."""
        return eval_record(self.rollout.evaluate(self.eval_prompts))

    def _finish_record(self, record, metrics, trace, progress, final):
        if self._pending_sync is not None and self._eval_due(final):
            packet, h = self._pending_sync  # evaluate the newest weights, as a synchronous run does
            verify_sync(packet, h.wait())
            self._pending_sync = None
        record = super()._finish_record(record, metrics, trace, progress, final)
        if "eval/accuracy" in record:
            self._best_eval = max(record["eval/accuracy"], self._best_eval or 0.0)
        return record

    # ------------------------------------------------------------------ placement.mode=auto
    def _after_iteration(self, record: dict) -> None:
        """``placement.mode=auto``: every candidate layout runs two iterations (the first carries
        its start-up), the second is timed; then the run moves to the fastest measured and stays.
        The actor's state moves with each switch, so every batch is still generated by the
        current weights (:class:`~rlweave.runners.layouts.LayoutTrials`)."""
        self._try_layouts(record.get("time/iteration"))

    def _strategy_override(self) -> dict:
        """Under auto, several ranks replicate: the state moves between layouts as one full copy."""
        return {"strategy": "ddp"} if self._layouts is not None and self.cfg.actor.strategy == "auto" else {}

    def _switch_layout(self, k: int) -> None:
        self._generation_calls = 0  # the new rollout workers count their generations from 0
        super()._switch_layout(k)

    def _parts(self) -> dict:
        state = self._driver_state()
        state.update(updates=self.updates, version=self.version, best_eval=self._best_eval,
                     curriculum=self.curriculum.state_dict() if self.curriculum else None)
        return {"runner": state, "actor": self.actor.state_dict()}

    def _restore_parts(self, state: dict, remap_ranks: bool = False) -> None:
        shards = state["actor"]
        n = self.actor.world_size
        remap_ranks = remap_ranks or self._layouts is not None  # auto: a checkpoint may come from another layout
        if len(shards) != n and not remap_ranks:
            raise ConfigError(f"actor.num_workers: the checkpoint has {len(shards)} actor ranks, this run {n}")
        if len(shards) != n:  # rank 0 holds the full state; the others take their counters where they had some
            counters = {k: v for k, v in shards[0].items() if k not in ("policy", "optimizer")}
            shards = [shards[0]] + [shards[r] if r < len(shards) else dict(counters) for r in range(1, n)]
        self.actor.load_state_dict(shards)
        self.updates, self.version = state["runner"]["updates"], state["runner"]["version"]
        self._best_eval = state["runner"].get("best_eval")
        if self.curriculum is not None and state["runner"].get("curriculum"):
            self.curriculum.load_state_dict(state["runner"]["curriculum"])
        self._pending = self._pending_sync = None
        self._logged_initial_eval = True

    def _after_run(self) -> None:
        """A finished (or stopped) run leaves its model as a Hugging Face folder, ``RUN/model``,
        with the iteration it holds (:data:`MODEL_RECORD`): a resumed run's checkpoints are newer
        than it until the run ends again, and ``rlweave eval`` scores the newer of the two."""
        final = self.run_dir / "model"
        tmp = self.run_dir / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.actor.save_pretrained(str(tmp))
        (tmp / MODEL_RECORD).write_text(json.dumps({"iteration": self.iteration}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)

