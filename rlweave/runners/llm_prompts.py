"""Fitting prompts to ``task.max_prompt_tokens``: one rule for training, evaluation and the
checks made before a run starts, so a prompt is kept, cut or dropped the same way everywhere."""

from __future__ import annotations

from typing import Callable

from rlweave.envs.text_tasks import Prompt

__all__ = ["fit_prompts"]


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
