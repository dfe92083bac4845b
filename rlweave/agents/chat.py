"""Chat formatting of agent turns: tool calls parsed from the model's text, tool results rendered
back as observation tokens, through the tokenizer's OWN chat template.

Why the template renders observations (and not hand-written strings): the same code must drive a
tiny tokenizer trained here (which gets :data:`~rlweave.models.chat_template.CHAT_TEMPLATE`) and a
real Qwen3 checkpoint folder, whose template decides how tool results are wrapped
(``<|im_start|>user\\n<tool_response>...</tool_response><|im_end|>``). The loop keeps the tokens the
model generated as they are and asks the template only for the *new suffix* after the assistant's
turn-end marker (:func:`observation_ids`), checking that rendering the longer conversation left the
earlier text unchanged.

Calls are Qwen-style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` inside an assistant
turn. A call whose JSON does not parse (or lacks a name, or is never closed) becomes a
:class:`~rlweave.agents.tools.ToolCall` with ``parse_error`` set: the tool box answers it with an
error observation, so the model reads its mistake instead of the episode crashing.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from rlweave.agents.tools.base import ToolCall, ToolResult
from rlweave.envs.text_tasks import Prompt
from rlweave.models.chat_template import (TOOL_CALL, TOOL_CALL_END, add_chat_template, encode_conversation, render,
                                          stop_token_ids, turn_end_token)

__all__ = ["parse_tool_calls", "tool_messages", "observation_ids", "prompt_ids", "initial_conversation",
           "add_chat_template", "encode_conversation", "render", "stop_token_ids", "turn_end_token"]

_CALL = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` of an assistant turn, in order. The body must be a JSON
    object with a string ``name`` and optional ``arguments`` (an object, or a JSON string of one, as
    the OpenAI wire form has it); anything else is a call with ``parse_error`` set. An opening tag
    never closed is one more such call (the model tried to call a tool)."""
    calls = [_parse_one(m.group(1)) for m in _CALL.finditer(text)]
    tail = text[text.rfind(TOOL_CALL_END) + len(TOOL_CALL_END):] if TOOL_CALL_END in text else text
    if TOOL_CALL in tail:
        raw = tail[tail.index(TOOL_CALL) + len(TOOL_CALL):]
        calls.append(ToolCall(name="", arguments=None, raw=raw, parse_error=f"{TOOL_CALL} is never closed by {TOOL_CALL_END}"))
    return calls


def _parse_one(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(name="", arguments=None, raw=body, parse_error=f"{e.msg} at char {e.pos}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(name="", arguments=None, raw=body, parse_error='expected {"name": "...", "arguments": {...}}')
    args: Any = obj.get("arguments", {})
    if isinstance(args, str):  # the OpenAI wire form: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name=obj["name"], arguments=None, raw=body, parse_error=f"arguments: {e.msg} at char {e.pos}")
    return ToolCall(name=obj["name"], arguments=args, raw=body)


def tool_messages(results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The observations of one turn's calls, as chat messages (``role: tool``)."""
    return [{"role": "tool", "name": r.call.name or "invalid", "content": r.content} for r in results]


def initial_conversation(prompt: Prompt) -> list[dict[str, Any]]:
    """The messages an episode starts from: the agent task's system prompt and question where the
    prompt names its tools (``meta["tools"]``, :mod:`rlweave.agents.tasks.prompts`), else the
    question alone as the user's turn."""
    if prompt.meta.get("tools"):
        from rlweave.agents.tasks.prompts import initial_messages

        return initial_messages(prompt)
    return [{"role": "user", "content": prompt.text}]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
    """The token ids the first assistant turn is generated from."""
    return _ids(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True))


def observation_ids(tokenizer, messages: Sequence[dict], observations: Sequence[dict],
                    tools: Sequence[dict] | None) -> list[int]:
    """Token ids that follow an assistant turn's turn-end token when ``observations`` (tool
    messages) are appended to ``messages`` (which end with that assistant turn), up to and including
    the next assistant turn's generation prompt: the turn's trailing text, the tool turn, and the
    header the model continues from.

    Found by rendering the conversation with and without the observations: the assistant turn ends
    at the k-th turn-end marker, k counted in the rendering without them (the model's own text holds
    none: generation stops at the first). Raises RuntimeError when rendering the longer conversation
    changes the text before the assistant turn (a template that rewrites history would make the
    trainer see another context than the one the model generated from)."""
    end = turn_end_token(tokenizer)
    history = render(tokenizer, messages[:-1], tools, add_generation_prompt=True)
    before = render(tokenizer, messages, tools)
    after = render(tokenizer, list(messages) + list(observations), tools, add_generation_prompt=True)
    if not (before.startswith(history) and after.startswith(history)):
        raise RuntimeError("the chat template rendered the conversation before the last assistant turn differently once "
                           "the turn and its tool results were appended (it rewrites history)")
    k = before.count(end)
    pos = -len(end)
    for _ in range(k):
        pos = after.find(end, pos + len(end))
        if pos < 0:
            raise RuntimeError(f"the chat template's rendering with tool results has fewer than {k} '{end}' markers")
    return _ids(tokenizer, after[pos + len(end):])
