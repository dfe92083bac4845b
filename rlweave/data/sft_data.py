"""Supervised fine-tuning data: prompt-response examples, tokenized into training rows.

Sources:

* a local JSONL file of ``{prompt, response}`` records, or of ``{messages: [{role, content}, ...]}``
  chats (the last assistant message is the response; everything before it, rendered with the
  tokenizer's chat template when it has one, is the prompt). A multi-turn chat (``{messages,
  tools}`` of an agent's trace, with tool turns) is tokenized whole by the chat template and
  trained on every assistant turn, the tool observations masked out;
* a task's train split with its gold answers (``sft-arith``: the warm-up before RL).

Rows are built one of two ways. *Padding*: one example per row, left-padded to the batch's
longest. *Packing*: examples laid end to end in rows of ``max_tokens``; each keeps its own
positions (restarting at 0) and a block-diagonal causal attention mask, so it is scored exactly as
it would be alone, with no padding computed.

A malformed JSONL line is refused before training, with its line number and the missing field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlweave.envs.text_tasks import TaskDataError, TextTask, read_jsonl
from rlweave.models.chat_template import encode_conversation, has_chat_template

__all__ = ["SFTExample", "read_sft_jsonl", "SFTData"]


@dataclass(frozen=True)
class SFTExample:
    """A prompt and its response; chat records also keep their ``messages`` (and ``tools``), which a
    multi-turn record (tool specs, tool turns or several assistant turns: an agent's trace) is
    trained on as a whole conversation, every assistant turn a target."""

    prompt: str
    response: str
    messages: tuple | None = field(default=None, compare=False)
    tools: tuple | None = field(default=None, compare=False)

    @property
    def multi_turn(self) -> bool:
        m = self.messages or ()
        return bool(self.tools) or any(x["role"] == "tool" for x in m) or sum(x["role"] == "assistant" for x in m) > 1


def read_sft_jsonl(path: str | Path, prompt_key: str = "prompt", response_key: str = "response",
                   tokenizer=None) -> list[SFTExample]:
    """Every example of a JSONL file; :class:`TaskDataError` names the file, line and field of
    the first bad record."""
    path = Path(path)
    out = []
    for lineno, rec in read_jsonl(path):
        if "messages" in rec:
            tools = rec.get("tools")
            if tools is not None and not isinstance(tools, list):
                raise TaskDataError(f"{path}:{lineno}: 'tools' must be a list of tool specs")
            ex = _chat_example(rec["messages"], f"{path}:{lineno}", tokenizer)
            out.append(SFTExample(ex.prompt, ex.response, tuple(rec["messages"]), tuple(tools) if tools else None))
            continue
        missing = [k for k in (prompt_key, response_key) if k not in rec]
        if missing:
            raise TaskDataError(f"{path}:{lineno}: missing field(s) {', '.join(missing)} "
                                f"(need '{prompt_key}' and '{response_key}', or 'messages')")
        out.append(SFTExample(str(rec[prompt_key]), str(rec[response_key])))
    return out


def _chat_example(messages, where: str, tokenizer) -> SFTExample:
    if not isinstance(messages, list) or not messages:
        raise TaskDataError(f"{where}: 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise TaskDataError(f"{where}: messages[{i}] is missing field 'role' or 'content'")
    if messages[-1]["role"] != "assistant":
        raise TaskDataError(f"{where}: the last message must be the assistant's (the response to learn)")
    history = messages[:-1]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    else:
        prompt = "".join(f"{m['role']}: {m['content']}\n" for m in history) + "assistant: "
    return SFTExample(prompt, str(messages[-1]["content"]))


class SFTData:
    """Batches of tokenized training rows drawn (seeded) from ``examples`` or, when none are
    given, from ``task``'s train split answered with the gold answers."""

    def __init__(self, tokenizer, examples: list[SFTExample] | None = None, task: TextTask | None = None,
                 max_tokens: int = 256, packing: bool = False, loss_on: str = "responses"):
        if examples is None and task is None:
            raise ValueError("data.path: SFT needs a JSONL file or a task to draw examples from")
        self.tok, self.examples, self.task = tokenizer, examples, task
        self.max_tokens, self.packing = int(max_tokens), bool(packing)
        if loss_on not in ("responses", "all"):
            raise ValueError(f"data.loss_on: {loss_on!r}; choose responses or all")
        self.loss_on = loss_on
        self.truncated = 0

    def _draw(self, n: int, seed: int) -> list[SFTExample]:
        if self.examples is not None:
            rng = random.Random(seed)
            return [rng.choice(self.examples) for _ in range(n)]
        return [SFTExample(p.text, p.answer) for p in self.task.prompts("train", n, seed)]

    def _encode(self, ex: SFTExample) -> tuple[list[int], list[bool]]:
        if ex.multi_turn and has_chat_template(self.tok):  # an agent trace: every assistant turn, observations masked
            ids, target = encode_conversation(self.tok, ex.messages, ex.tools)
        else:
            p = self.tok(ex.prompt, add_special_tokens=False)["input_ids"]
            r = self.tok(ex.response, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            ids, target = p + r, [False] * len(p) + [True] * len(r)
        if self.loss_on == "all":  # language modelling on the whole text (observations and prompts too)
            target = [True] * len(ids)
        if len(ids) > self.max_tokens:  # keep the response, cut the prompt's start
            self.truncated += 1
            ids, target = ids[-self.max_tokens:], target[-self.max_tokens:]
        return ids, target

    def batch(self, n: int, seed: int) -> dict:
        """``n`` examples as numpy rows: ``input_ids``, ``attention_mask`` and ``target_mask``
        [B, W]; packed rows also carry ``position_ids`` [B, W] and a 4-D block-diagonal causal
        ``attention_mask`` [B, 1, W, W]."""
        encoded = [self._encode(ex) for ex in self._draw(n, seed)]
        return self._pack(encoded) if self.packing else self._pad(encoded)

    def _pad(self, encoded) -> dict:
        width = max(len(ids) for ids, _ in encoded)
        B = len(encoded)
        ids = np.full((B, width), self.tok.pad_token_id, dtype=np.int64)
        attn = np.zeros((B, width), dtype=np.int64)
        target = np.zeros((B, width), dtype=bool)
        for i, (row, t) in enumerate(encoded):
            ids[i, width - len(row):], attn[i, width - len(row):], target[i, width - len(row):] = row, 1, t
        return {"input_ids": ids, "attention_mask": attn, "target_mask": target}

    def _pack(self, encoded) -> dict:
        rows: list[list[tuple[list[int], list[bool]]]] = []
        for ex in encoded:  # first fit: each example goes into the first row with room
            for row in rows:
                if sum(len(e[0]) for e in row) + len(ex[0]) <= self.max_tokens:
                    row.append(ex)
                    break
            else:
                rows.append([ex])
        width = max(sum(len(e[0]) for e in row) for row in rows)
        B = len(rows)
        ids = np.full((B, width), self.tok.pad_token_id, dtype=np.int64)
        pos = np.zeros((B, width), dtype=np.int64)
        target = np.zeros((B, width), dtype=bool)
        mask = np.zeros((B, 1, width, width), dtype=bool)
        for i, row in enumerate(rows):
            start = 0
            for seq, t in row:
                end = start + len(seq)
                ids[i, start:end], target[i, start:end], pos[i, start:end] = seq, t, np.arange(len(seq))
                mask[i, 0, start:end, start:end] = np.tril(np.ones((len(seq), len(seq)), dtype=bool))
                start = end
            if start < width:  # padding attends to itself only: no NaN rows, never a target
                mask[i, 0, np.arange(start, width), np.arange(start, width)] = True
        return {"input_ids": ids, "attention_mask": mask, "target_mask": target, "position_ids": pos}
