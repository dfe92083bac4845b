"""Chat formatting of causal-LM tokenizers: a Qwen-style chat template (with tools) for the tokenizers
rlweave trains offline, and conversations tokenized with an assistant-token mask through *any*
tokenizer's own template.

Why here (models layer): SFT data (``rlweave.data``) and the agent loop (``rlweave.agents``) both
tokenize conversations, and both must see exactly the token layout a real checkpoint's template
produces, so formatting never bypasses ``tokenizer.apply_chat_template``. A real Qwen3 folder brings
its own template; a tokenizer trained here gets :data:`CHAT_TEMPLATE`, which renders the same shape
(``<|im_start|>role\\n...<|im_end|>\\n``, tools in the system turn inside ``<tools>``, calls as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, observations as ``<tool_response>``
blocks in a user turn), so a recipe moves from the tiny model to a real one unchanged.

The assistant mask is computed by rendering prefixes (:func:`encode_conversation`), not from
``{% generation %}`` markers, because real templates (Qwen3's among them) have none; our template
carries the markers anyway so ``return_assistant_tokens_mask`` works on it too (the tests compare both).
"""

from __future__ import annotations

import functools
from typing import Sequence

__all__ = ["CHAT_TEMPLATE", "CHAT_SPECIAL_TOKENS", "IM_START", "IM_END", "add_chat_template", "has_chat_template",
           "render", "render_text", "turn_end_token", "stop_token_ids", "encode_conversation"]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
CHAT_SPECIAL_TOKENS = (IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)

# Qwen-style layout, written for rlweave's tiny tokenizers (short tool preamble: every prompt token is
# context a 64-position model pays for). Consecutive tool messages share one user turn, as Qwen's do.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def add_chat_template(tokenizer):
    """Gives a tokenizer trained here the chat special tokens (one id each, never split or merged)
    and :data:`CHAT_TEMPLATE`. Returns the tokenizer (changed in place)."""
    missing = [t for t in CHAT_SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        import inspect

        params = inspect.signature(tokenizer.add_special_tokens).parameters  # the keyword's name moved in transformers 5
        keep = {k: False for k in ("replace_extra_special_tokens", "replace_additional_special_tokens") if k in params}
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, **keep)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def render(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None = None,
           add_generation_prompt: bool = False) -> str:
    """The conversation as text, by the tokenizer's own template."""
    if not has_chat_template(tokenizer):
        raise ValueError("the tokenizer has no chat template (a model folder without one, or a tokenizer trained "
                         "without agent.tools): multi-turn chat needs one")
    return tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def turn_end_token(tokenizer) -> str:
    """The text that closes an assistant turn: ``<|im_end|>`` where the vocabulary has it, else eos."""
    return IM_END if IM_END in tokenizer.get_vocab() else tokenizer.eos_token


def stop_token_ids(tokenizer) -> list[int]:
    """Token ids that end an assistant turn in generation: the turn end and eos."""
    ids = [tokenizer.convert_tokens_to_ids(turn_end_token(tokenizer))]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_conversation(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None = None
                        ) -> tuple[list[int], list[bool]]:
    """Token ids of the whole conversation and a mask True on assistant tokens (each assistant
    message's content, tool calls and closing turn-end token: what the model generates).

    Each assistant message's tokens are the difference between rendering the conversation up to it
    (with the generation prompt) and up to its end marker; the pieces are tokenized separately,
    which is the layout the agent loop builds turn by turn. Raises ValueError when the template
    re-renders earlier text as the conversation grows (the prefix property every piece relies on)."""
    end = turn_end_token(tokenizer)
    ids: list[int] = []
    mask: list[bool] = []
    done = ""  # text covered so far
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto = render(tokenizer, messages[: i + 1], tools)
        cut = upto.rfind(end)
        if not before.startswith(done) or not upto.startswith(before) or cut < len(before):
            raise ValueError(f"messages[{i}]: the chat template does not render the conversation as a growing prefix "
                             "(it rewrites earlier turns), so assistant tokens cannot be masked")
        context, turn = before[len(done):], upto[len(before): cut + len(end)]
        for text, target in ((context, False), (turn, True)):
            piece = _ids(tokenizer, text)
            ids += piece
            mask += [target] * len(piece)
        done = upto[: cut + len(end)]
    full = render(tokenizer, messages, tools)
    if not full.startswith(done):
        raise ValueError("the chat template does not render the conversation as a growing prefix")
    rest = _ids(tokenizer, full[len(done):])
    return ids + rest, mask + [False] * len(rest)


def render_text(messages: Sequence[dict], tools: Sequence[dict] | None = None, add_generation_prompt: bool = False) -> str:
    """A conversation rendered by :data:`CHAT_TEMPLATE` before any tokenizer exists: the text a
    tokenizer trained here learns its merges from (the template's text does not depend on the
    vocabulary, so a throwaway byte-level tokenizer renders it)."""
    return render(_renderer(), messages, tools, add_generation_prompt)


@functools.lru_cache(maxsize=1)
def _renderer():
    from rlweave.models.causal_lm import train_tokenizer

    return add_chat_template(train_tokenizer(["."], vocab_size=260))
