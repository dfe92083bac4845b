"""``rlweave eval`` for language-model runs: greedy held-out accuracy of a run's model (``model/``
of a finished run, else its newest verified checkpoint) on as many test prompts as asked, or on
the whole test split, with a breakdown by question kind.

Why: a run's own evaluation uses ``task.eval_prompts`` fixed test prompts (200 for the agent
recipes), enough to steer and plot a run but a noisy estimate of the split (grpo-search's +0.21 on
its 200 questions was +0.177 on all 2,319). This scores the same way as the run (the rollout
worker's greedy episodes, prompts fitted to ``task.max_prompt_tokens`` by the same rule), in the
driver's process, without Ray or an actor.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from rlweave.config import ConfigError
from rlweave.envs.text_tasks import Prompt, make_task
from rlweave.runners.llm_batches import eval_record
from rlweave.runners.llm_checks import MODEL_RECORD, start_weights, tokenizer_folder
from rlweave.runners.llm_prompts import EVAL_SEED, fit_prompts, prompt_overhead

__all__ = ["evaluate_lm_run", "held_out_prompts"]

KIND_KEY = "kind"  # a prompt's meta key that names its kind of question (multihop, word problems)


def held_out_prompts(task, count: int | None) -> list[Prompt]:
    """``count`` test prompts drawn as a run's evaluation draws them (the run's own set when
    ``count`` is its ``task.eval_prompts``), or every test prompt when ``count`` is None."""
    if count is None:
        try:
            return list(task.pool("test"))
        except NotImplementedError:
            raise ConfigError(f"--all: task {task.name} generates its prompts as they are drawn and has no whole "
                              "test split; give --episodes N") from None
    return task.prompts("test", count, EVAL_SEED)


def _model_is_newest(run_dir: Path, final: Path) -> bool:
    """Whether ``RUN/model`` holds the run's newest weights: it exists and no checkpoint is of a
    later iteration (a stopped run that was resumed has newer checkpoints until it ends again).
    A model folder without the run's record (written before it existed) is compared by time."""
    from rlweave.utils.checkpoint import latest_checkpoint

    if not (final / "config.json").is_file():
        return False
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return True
    record = final / MODEL_RECORD
    if record.is_file():
        return json.loads(record.read_text())["iteration"] >= int(ckpt.name.split("_")[1])
    return (final / "config.json").stat().st_mtime >= ckpt.stat().st_mtime


def _checkpoint_packet(run_dir: Path, cfg, model_spec: dict, tokenizer):
    """The newest verified checkpoint's policy as the packet a rollout engine loads (LoRA adapters
    merged, a value head left out), and the checkpoint's name."""
    from rlweave.models.causal_lm import CausalLMPolicy, load_causal_lm, merged_state_dict
    from rlweave.sync.weights import pack_state
    from rlweave.utils.checkpoint import latest_checkpoint, load_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(f"{run_dir}: no model/ folder (written when a language-model run finishes) and no checkpoint")
    actor = load_checkpoint(ckpt)["actor"]
    state = (actor[0] if isinstance(actor, list) else actor)["policy"]
    model = load_causal_lm(model_spec, len(tokenizer), tokenizer=tokenizer)
    policy = CausalLMPolicy(model, value_head=any(k.startswith("value_head.") for k in state))
    policy.load_state_dict(state)
    return pack_state(merged_state_dict(model), 0), ckpt.name


def evaluate_lm_run(run_dir: str | Path, cfg, count: int | None) -> dict:
    """Scores a run's model on held-out prompts: accuracy, response length, the agent figures of
    multi-turn runs, and ``by_kind`` (correct, asked) when the task's prompts name their kind. The
    model is ``run_dir/model`` when it holds the run's newest weights, else the newest verified
    checkpoint's policy (an interrupted, running or resumed run)."""
    from rlweave.agents.workflows import check_workflow
    from rlweave.models.causal_lm import load_tokenizer
    from rlweave.workers.lm_rollout import LMRolloutWorker

    run_dir = Path(run_dir)
    final = run_dir / "model"
    finished = _model_is_newest(run_dir, final)
    origin = final if finished else start_weights(cfg, run_dir)
    start = str(origin) if origin else None
    model_spec = {**OmegaConf.to_container(cfg.model), "path": start}
    tokenizer_path = str(tokenizer_folder(cfg, run_dir, start))
    tokenizer = load_tokenizer(tokenizer_path)
    packet, source = (None, str(final)) if finished else _checkpoint_packet(run_dir, cfg, model_spec, tokenizer)
    task_cfg, agent_cfg = OmegaConf.to_container(cfg.task), OmegaConf.to_container(cfg.agent)
    task, workflow = make_task(task_cfg), check_workflow(agent_cfg)
    specs = None
    if workflow is not None:
        from rlweave.agents.rollout import tool_specs

        specs = tool_specs(agent_cfg, task)
    prompts, dropped, truncated = fit_prompts(held_out_prompts(task, count), tokenizer, cfg.task.max_prompt_tokens,
                                              cfg.task.prompt_overflow, prompt_overhead(tokenizer, workflow, specs))
    worker = LMRolloutWorker({**model_spec, "lora_rank": 0}, tokenizer_path, OmegaConf.to_container(cfg.rollout), task_cfg,
                             agent_cfg)
    try:
        if packet is not None:
            worker.load_weights(packet)
        by_kind: dict[str, list[Prompt]] = {}
        for p in prompts:
            by_kind.setdefault(str(p.meta.get(KIND_KEY, "")), []).append(p)
        outs = {kind: worker.evaluate(group) for kind, group in sorted(by_kind.items())}
    finally:
        worker.close()
    result = {"model": source, "prompts": sum(o["n"] for o in outs.values()), "dropped": dropped,
              "truncated": truncated, **eval_record(list(outs.values()))}
    if len(outs) > 1 or "" not in outs:
        result["by_kind"] = {kind: [o["correct"], o["n"]] for kind, o in outs.items()}
    return result
