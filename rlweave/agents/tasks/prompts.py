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
           "tool_call_message", "tool_message", "VERIFIER_PROMPT", "VERIFIER_QUESTION", "VERDICTS", "verifier_messages",
           "verdict_line", "parse_verdict"]

# short on purpose: every prompt token is context that a small model's few positions pay for
SYSTEM_PROMPT = ("Use the tools ({tools}) to look up facts and compute; do not guess. "
                 "Finish with one line: The answer is <answer>.")
ANSWER_FORMAT = "The answer is {answer}."
# the verifier role of the solver_verifier workflow (rlweave/agents/solver_verifier.py): the same policy as the
# solver, told its role by this system prompt; its verdict is the same final line with a word for the answer
VERIFIER_PROMPT = ("Check the proposed answer. Use the tools ({tools}) to recompute; do not guess. "
                   "Finish with one line: The answer is correct. or The answer is incorrect.")
VERIFIER_QUESTION = "{question}\nProposed answer: {answer}"
VERDICTS = {"correct": True, "incorrect": False}  # verdict word -> accepts the proposed answer


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


def verifier_messages(prompt: Prompt, proposed: str) -> list[dict[str, Any]]:
    """The conversation a verifier episode starts from: the verifier's system prompt (naming the
    prompt's tools) and the question with the answer proposed for it."""
    return [{"role": "system", "content": VERIFIER_PROMPT.format(tools=", ".join(prompt.meta.get("tools", ())) or "none")},
            {"role": "user", "content": VERIFIER_QUESTION.format(question=prompt.text, answer=proposed)}]


def verdict_line(accept: bool) -> str:
    """The verifier's final line: ``The answer is correct.`` or ``The answer is incorrect.``."""
    return final_answer("correct" if accept else "incorrect")


def parse_verdict(text: str) -> bool | None:
    """What a verifier's final text decides: True (accepts), False (rejects), None (no verdict:
    any other final line). Read by the same "answer is" marker as every answer."""
    from rlweave.envs.text_tasks import extract_answer

    got = extract_answer(text)
    return VERDICTS.get(got.strip().rstrip(".").lower()) if got is not None else None
