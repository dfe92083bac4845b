"""What makes a text task an agent task: the tools it expects and a scripted expert.

An agent task is a :class:`~rlweave.envs.text_tasks.TextTask` (prompts, splits, exact-match reward
on the final answer) plus :class:`AgentTask`: the tool entries a :func:`~rlweave.agents.tools.make_toolbox`
needs for it, and :meth:`AgentTask.expert_calls`, the tool calls an expert makes for a prompt.
:meth:`AgentTask.expert_trace` runs those calls through the REAL tools and writes the conversation
in chat form, so SFT traces show exactly what the tools return during RL.

Why the expert checks every observation (:class:`ExpertMiss`): a trace whose search did not find
the fact it needs, or whose calculator result is not the answer, would teach the model to answer
what it never read. Such prompts are skipped (and counted) by the trace writer instead.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rlweave.agents.tasks.prompts import final_answer, initial_messages, tool_call_message, tool_message
from rlweave.envs.text_tasks import Prompt

__all__ = ["AgentTask", "ExpertCall", "ExpertMiss"]


class ExpertMiss(RuntimeError):
    """The scripted expert's tool result lacks what the next step needs (names prompt and call)."""


class ExpertCall(NamedTuple):
    """One scripted call and the text its result must contain for the expert to go on."""

    tool: str
    arguments: dict[str, Any]
    expect: str


class AgentTask:
    """Mixin of agent tasks (use with a TextTask). Subclasses set :attr:`tools` and implement
    :meth:`tool_entries` and :meth:`expert_calls`."""

    tools: tuple[str, ...] = ()

    def tool_entries(self) -> list[Any]:
        """The ``agent.tools`` entries (``make_toolbox`` form) this task's prompts expect."""
        return list(self.tools)

    def make_toolbox(self):
        """A toolbox of this task's tools (the caller closes it)."""
        from rlweave.agents.tools import make_toolbox

        return make_toolbox(self.tool_entries(), key=f"task {getattr(self, 'name', '?')} tools")

    def expert_calls(self, prompt: Prompt) -> list[ExpertCall]:
        raise NotImplementedError

    def expert_trace(self, prompt: Prompt, toolbox=None) -> list[dict[str, Any]]:
        """The conversation of an expert solving ``prompt``: system, question, one assistant tool call
        and its tool result per :meth:`expert_calls` step (run by ``toolbox``, made here when None),
        then the final answer. Raises :class:`ExpertMiss` when a result lacks the expected text."""
        own = toolbox is None
        box = self.make_toolbox() if own else toolbox
        try:
            return [*initial_messages(prompt), *self.expert_steps(prompt, box),
                    {"role": "assistant", "content": final_answer(prompt.answer)}]
        finally:
            if own:
                box.close()

    def expert_steps(self, prompt: Prompt, toolbox) -> list[dict[str, Any]]:
        """The middle of an expert's conversation: one assistant tool call and its result per
        :meth:`expert_calls` step, run by ``toolbox``. Shared by every role whose expert looks the
        same facts up (the solver's trace, and the verifier's, which recomputes before its verdict).
        Raises :class:`ExpertMiss` when a result lacks the expected text."""
        from rlweave.agents.tools import ToolCall

        messages: list[dict[str, Any]] = []
        for i, step in enumerate(self.expert_calls(prompt)):
            call_id = f"call_{i}"
            messages.append(tool_call_message(step.tool, step.arguments, call_id))
            (result,) = toolbox.execute_sync([ToolCall(name=step.tool, arguments=dict(step.arguments))])
            if not result.ok or step.expect.lower() not in result.content.lower():
                raise ExpertMiss(f"prompt {prompt.id}: {step.tool}({step.arguments}) returned no {step.expect!r}"
                                 f" ({result.error or 'not in the result'})")
            messages.append(tool_message(step.tool, result.content, call_id))
        return messages
