"""What an agent sees around a task's question, in ONE place: the system prompt, the answer format
and the chat-message shapes of tool calls.

Why one module: RL rollouts (the agent loop starts from :func:`initial_messages`) and the SFT
warm-up traces (:mod:`rlweave.agents.traces`) must show the model the same instructions and ask for
the same final line, or the warm-up teaches a format the RL reward does not read. The final line
``The answer is X.`` is what :func:`rlweave.envs.text_tasks.extract_answer` reads ("answer is"
marker), so rewards need no agent-specific parser.

Messages follow the OpenAI chat form that Hugging Face chat templates take: an assistant turn that
calls tools has ``tool_calls`` with ``arguments`` as a dict (templates render it themselves), and
each result is a ``role: tool`` message naming the tool.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlweave.envs.text_tasks import Prompt

__all__ = ["SYSTEM_PROMPT", "ANSWER_FORMAT", "system_prompt", "final_answer", "initial_messages",
           "tool_call_message", "tool_message"]

# short on purpose: every prompt token is context that a small model's few positions pay for
SYSTEM_PROMPT = ("Use the tools ({tools}) to look up facts and compute; do not guess. "
                 "Finish with one line: The answer is <answer>.")
ANSWER_FORMAT = "The answer is {answer}."


def system_prompt(tools: Sequence[str]) -> str:
    """The system message for an episode that may call ``tools`` (names)."""
    return SYSTEM_PROMPT.format(tools=", ".join(tools) if tools else "none")


def final_answer(answer: str) -> str:
    """The final assistant line that the task's reward reads."""
    return ANSWER_FORMAT.format(answer=answer)


def initial_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The conversation an episode starts from: system prompt (naming the tools the prompt's
    ``meta["tools"]`` lists) and the question."""
    return [{"role": "system", "content": system_prompt(prompt.meta.get("tools", ()))},
            {"role": "user", "content": prompt.text}]


def tool_call_message(name: str, arguments: dict[str, Any], call_id: str, content: str = "") -> dict[str, Any]:
    """An assistant turn calling one tool."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": dict(arguments)}}]}


def tool_message(name: str, content: str, call_id: str) -> dict[str, Any]:
    """A tool's result, read back by the model as an observation."""
    return {"role": "tool", "name": name, "tool_call_id": call_id, "content": content}
