"""The agent side of a language-model rollout worker: its tools and loop, built from the run's
``agent`` section, producing the worker's generation outputs from multi-turn episodes.

Why separate from :mod:`rlweave.workers.lm_rollout`: the worker stays one small role (weights,
locking, scoring) whichever way responses are produced; everything multi-turn lives here and in
:mod:`rlweave.agents.loop`.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlweave.agents.chat import initial_conversation
from rlweave.agents.loop import AgentLoop, agent_stats
from rlweave.envs.text_tasks import Prompt

__all__ = ["AgentRollout", "agent_enabled", "tool_entries", "tool_specs", "chat_corpus", "prompt_tokens"]


def agent_enabled(agent_cfg: dict | None) -> bool:
    """Whether a run's ``agent`` section asks for multi-turn tool use (``agent.tools`` non-empty)."""
    return bool(agent_cfg and agent_cfg.get("tools"))


def tool_entries(agent_cfg: dict, task=None) -> list[Any]:
    """``agent.tools`` with ``agent.tool_timeout_s`` as the timeout of entries that set none. The
    entry ``task`` stands for the task's own tools (an agent task's ``tool_entries()``, e.g.
    multihop's search over ``task.corpus``): recipes name them without repeating the task's settings."""
    out = []
    for entry in agent_cfg.get("tools") or []:
        if entry == "task":
            if not hasattr(task, "tool_entries"):
                from rlweave.agents.tools import ToolConfigError

                raise ToolConfigError(f"agent.tools: 'task' names the task's own tools; task "
                                      f"{getattr(task, 'name', '?')!r} has none (name the tools instead)")
            out += tool_entries({**agent_cfg, "tools": task.tool_entries()})
            continue
        if isinstance(entry, str):
            entry = {"name": entry}
        if isinstance(entry, dict) and "timeout_s" not in entry:
            entry = {**entry, "timeout_s": agent_cfg.get("tool_timeout_s", 10.0)}
        out.append(entry)
    return out


def tool_specs(agent_cfg: dict, task=None) -> list[dict]:
    """The tools' specs in OpenAI function form (what the chat template shows the model), from a
    tool box built and closed here."""
    from rlweave.agents.tools import make_toolbox

    box = make_toolbox(tool_entries(agent_cfg, task))
    try:
        return box.specs()
    finally:
        box.close()


def chat_corpus(task, agent_cfg: dict, prompts: Sequence[Prompt]) -> list[str]:
    """Text a tokenizer trained here learns its merges from in an agent run: each prompt's episode
    rendered by the chat template with the tools, as the scripted expert of an agent task plays it
    (its real tool calls and results), else the question and the gold answer."""
    from rlweave.agents.tools import make_toolbox
    from rlweave.models.chat_template import render_text

    box = make_toolbox(tool_entries(agent_cfg, task))
    specs = box.specs()
    out = []
    try:
        for p in prompts:
            messages = None
            if hasattr(task, "expert_trace"):
                try:
                    messages = task.expert_trace(p, box)
                except Exception:  # noqa: BLE001 - an expert miss only leaves this prompt's trace out of the corpus
                    messages = None
            if messages is None:
                messages = initial_conversation(p) + [{"role": "assistant", "content": p.answer}]
            out.append(render_text(messages, specs))
    finally:
        box.close()
    return out


def prompt_tokens(tokenizer, prompt: Prompt, specs: list[dict]) -> tuple[int, int]:
    """(rendered prompt tokens, of which the question's own): how long an episode's first context is."""
    from rlweave.agents.chat import prompt_ids

    return (len(prompt_ids(tokenizer, initial_conversation(prompt), specs)),
            len(tokenizer(prompt.text, add_special_tokens=False)["input_ids"]))


class AgentRollout:
    """Multi-turn episodes for a rollout worker: ``generate`` (sampled, n per prompt) and
    ``evaluate`` (greedy), each returning what the worker's single-turn path returns plus the
    trajectories' loss masks and per-trajectory agent counts."""

    def __init__(self, generator, tokenizer, agent_cfg: dict, max_turn_tokens: int, task=None):
        from rlweave.agents.tools import make_toolbox

        self.toolbox = make_toolbox(tool_entries(agent_cfg, task))
        self.loop = AgentLoop(generator, tokenizer, self.toolbox, max_turns=agent_cfg.get("max_turns", 4),
                              max_tokens=agent_cfg.get("max_tokens", 256), max_turn_tokens=max_turn_tokens)

    def generate(self, prompts: Sequence[Prompt], n: int, seed: int, greedy: bool = False) -> tuple[dict, list[str]]:
        """Token lists, behaviour log-probs, loss masks and agent counts of ``n`` episodes per
        prompt, and each episode's final answer text (what the reward reads)."""
        trajs = self.loop.run([initial_conversation(p) for p in prompts], n=n, seed=seed, greedy=greedy)
        out = {"prompt_ids": [t.prompt_ids for t in trajs], "response_ids": [t.response_ids for t in trajs],
               "logprobs": [t.logprobs for t in trajs], "finished": [t.finished for t in trajs],
               "group": [i // n for i in range(len(trajs))], "loss_mask": [t.loss_mask for t in trajs],
               "agent": [agent_stats([t]) for t in trajs], "version": self.loop.generator.version}
        return out, [t.final_text for t in trajs]

    def close(self) -> None:
        self.toolbox.close()
