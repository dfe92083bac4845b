"""Fitting prompts to ``task.max_prompt_tokens``: one rule for training, evaluation and the
checks made before a run starts, so a prompt is kept, cut or dropped the same way everywhere."""

from __future__ import annotations

from typing import Callable

from rlweave.config import ConfigError
from rlweave.envs.text_tasks import Prompt

__all__ = ["EVAL_SEED", "check_prompt_fit", "fit_prompts", "prompt_overhead"]

EVAL_SEED = 2_147_483_647  # the held-out prompts every evaluation of every run uses (the first draw of this seed)


def fit_prompts(prompts: list[Prompt], tokenizer, limit: int, mode: str,
                overhead: Callable[[Prompt, int], int]) -> tuple[list[Prompt], int, int]:
    """Prompts longer than ``limit`` tokens (their text plus ``overhead(prompt, text_tokens)``: the
    system prompt, tools and chat markers an agent episode adds) are dropped (``mode`` "drop", or
    when the overhead alone fills the limit) or cut to their last tokens, where the question and the
    answer cue are. Returns the kept prompts and the (dropped, truncated) counts."""
    kept, dropped, truncated = [], 0, 0
    for p in prompts:
        ids = tokenizer(p.text, add_special_tokens=False)["input_ids"]
        extra = overhead(p, len(ids))
        if len(ids) + extra <= limit:
            kept.append(p)
        elif mode == "drop" or extra >= limit:
            dropped += 1
        else:
            truncated += 1
            kept.append(Prompt(p.id, tokenizer.decode(ids[-(limit - extra):]), p.answer, p.meta))
    return kept, dropped, truncated


def prompt_overhead(tokenizer, workflow=None, tool_specs: list[dict] | None = None) -> Callable[[Prompt, int], int]:
    """``fit_prompts``'s ``overhead``: the tokens an agent episode's first context adds around the
    question (system prompt, tools, chat markers), the longest over the workflow's roles; 0 without
    a workflow (single-turn runs, whose prompt is the question's text)."""
    if workflow is None:
        return lambda prompt, question_tokens: 0
    from rlweave.agents.chat import prompt_ids

    return lambda prompt, question_tokens: (max(len(prompt_ids(tokenizer, c, tool_specs)) for c in workflow.openings(prompt))
                                            - question_tokens)


def check_prompt_fit(task, cfg, fit: Callable[[list[Prompt]], tuple[list[Prompt], int, int]], eval_seed: int) -> None:
    """Refuses, before any work, a task whose prompts do not fit ``task.max_prompt_tokens`` under
    ``fit``: every held-out prompt (evaluation would be empty), or every train prompt of a sample
    (RL would have nothing to generate from). Warns when over a tenth of the held-out prompts are
    dropped: the score would then describe the short prompts only, and nothing else says so."""
    limit = cfg.task.max_prompt_tokens
    if cfg.train.eval_every:
        kept, dropped, _ = fit(task.prompts("test", cfg.task.eval_prompts, eval_seed))
        if not kept:
            raise ConfigError(f"task.max_prompt_tokens: every held-out prompt is longer than {limit} tokens and would be "
                              "dropped (raise it, or task.prompt_overflow=truncate)")
        if dropped > 0.1 * (len(kept) + dropped):
            print(f"[rlweave] warning: task.max_prompt_tokens={limit} drops {dropped} of {len(kept) + dropped} held-out "
                  "prompts (the longer ones); evaluation and training see the rest only", flush=True)
    if not fit(task.prompts("train", 64, cfg.seed))[0]:
        raise ConfigError(f"task.max_prompt_tokens: all 64 train prompts sampled are longer than {limit} tokens "
                          "and would be dropped (raise it, or task.prompt_overflow=truncate)")
