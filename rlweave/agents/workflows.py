"""How a language-model rollout worker produces its episodes, by name: the registry behind
``agent.workflow``.

A workflow turns a batch of task prompts into training rows. Each one is an *episode producer*
with the interface of :class:`~rlweave.agents.rollout.AgentRollout`: ``generate(prompts, n, seed,
greedy) -> (out, texts)`` and ``close()``; optionally ``evaluate(prompts) -> dict`` (a workflow
with held-out figures of its own, e.g. one per role). ``out`` holds the rows (``prompt_ids``,
``response_ids``, ``logprobs``, ``loss_mask``, ``finished``, ``group``, ``agent`` counts,
``version``) and may hold ``rewards`` (a workflow that scores its own rows: the worker then does
not score ``texts``), ``role`` (each row's role name) and ``role_stats`` (per row, additive
``{name: [numerator, denominator]}`` pairs the runner sums over the rows it keeps and logs as
``train/<name>`` / ``eval/<name>`` ratios).

Why a registry and not the worker's if-chain: the worker stays one small role (weights, locking,
scoring) however episodes are produced, and a new workflow is one entry, not a new branch there.
Entries: ``tools`` (the built-in multi-turn loop, :mod:`rlweave.agents.loop`), ``openai`` (user
agent code over the OpenAI API, :mod:`rlweave.agents.openai_rollout`), ``solver_verifier`` (two
roles of one policy, :mod:`rlweave.agents.solver_verifier`), registered by import path so that
naming one never imports the others' dependencies.

Unset, ``agent.workflow`` follows the keys that chose the producer before it existed:
``agent.openai_fn`` set -> ``openai``; ``agent.tools`` set -> ``tools``; neither -> single-turn.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rlweave.envs.text_tasks import Prompt

__all__ = ["Workflow", "register_workflow", "workflow_name", "get_workflow", "check_workflow", "make_producer",
           "known_workflows", "sum_stats", "ratio_metrics"]


def _opening(prompt: Prompt) -> list[list[dict]]:
    from rlweave.agents.chat import initial_conversation

    return [initial_conversation(prompt)]


def _write_traces(task, n: int, path, seed: int, agent_cfg: dict) -> dict:
    from rlweave.agents.traces import write_traces

    return write_traces(task, n, path, seed=seed)


def _chat_corpus(task, agent_cfg: dict, prompts: Sequence[Prompt]) -> list[str]:
    from rlweave.agents.rollout import chat_corpus

    return chat_corpus(task, agent_cfg, prompts)


@dataclass(frozen=True)
class Workflow:
    """One way of producing episodes, and what the runner needs to know of it beforehand."""

    name: str
    # (generator, tokenizer, agent_cfg, max_turn_tokens, task, scorer) -> producer; scorer(prompts, texts) -> rewards
    build: Callable[..., Any]
    needs: str = "tools"  # the agent key it cannot run without
    roles: tuple[str, ...] = ()  # role names of its rows (agent.role_weights keys); () = one unnamed role
    # the conversations a prompt's episodes start from, one per role: the runner measures prompts by the longest
    openings: Callable[[Prompt], list[list[dict]]] = _opening
    # (task, n, path, seed, agent_cfg) -> {"written", "missed", "path"}: expert SFT traces of every role
    expert_traces: Callable[..., dict] = _write_traces
    # (task, agent_cfg, prompts) -> texts a tokenizer trained here learns from
    corpus: Callable[..., list[str]] = _chat_corpus

    def sft_trace_file(self, task, run_dir, n: int, seed: int, agent_cfg: dict) -> Path | None:
        """SFT on an agent task without ``data.path``: ``n`` traces of the task's scripted expert
        (real tool calls and results), written once to ``RUN/traces.jsonl`` (a resume reuses them);
        None for a task without an expert."""
        if not hasattr(task, "expert_trace"):
            return None
        path = Path(run_dir) / "traces.jsonl"
        if not path.is_file():
            stats = self.expert_traces(task, n, path, seed, agent_cfg)
            print(f"[rlweave] {stats['written']} expert traces written to {path} ({stats['missed']} expert misses skipped)")
        return path


def _build_tools(generator, tokenizer, agent_cfg, max_turn_tokens, task, scorer):
    from rlweave.agents.rollout import AgentRollout

    return AgentRollout(generator, tokenizer, agent_cfg, max_turn_tokens, task)


def _build_openai(generator, tokenizer, agent_cfg, max_turn_tokens, task, scorer):
    from rlweave.agents.openai_rollout import OpenAIAgentRollout

    return OpenAIAgentRollout(generator, tokenizer, agent_cfg, max_turn_tokens)


_WORKFLOWS: dict[str, Workflow | str] = {
    "tools": Workflow("tools", _build_tools),
    "openai": Workflow("openai", _build_openai, needs="openai_fn"),
    "solver_verifier": "rlweave.agents.solver_verifier:WORKFLOW",
}


def register_workflow(name: str, workflow: Workflow | str) -> None:
    """Adds a workflow: a :class:`Workflow` or the ``module:attribute`` path of one (loaded when named)."""
    _WORKFLOWS[name] = workflow


def known_workflows() -> list[str]:
    return sorted(_WORKFLOWS)


def workflow_name(agent_cfg: dict | None) -> str | None:
    """The workflow a run's ``agent`` section asks for (see the module doc); None: single-turn."""
    if not agent_cfg:
        return None
    if agent_cfg.get("workflow"):
        return str(agent_cfg["workflow"])
    if agent_cfg.get("openai_fn"):
        return "openai"
    return "tools" if agent_cfg.get("tools") else None


def get_workflow(name: str) -> Workflow:
    """The workflow registered as ``name``; an unknown name is a one-line ValueError naming
    ``agent.workflow`` and the known ones."""
    entry = _WORKFLOWS.get(name)
    if entry is None:
        raise ValueError(f"agent.workflow: unknown workflow {name!r}; known: {', '.join(known_workflows())}")
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        _WORKFLOWS[name] = entry
    return entry


def check_workflow(agent_cfg: dict) -> Workflow | None:
    """The run's workflow, checked before any work: a known name, the agent key it needs, and
    ``agent.role_weights`` naming only its roles. Raises a one-line ValueError."""
    name = workflow_name(agent_cfg)
    if name is None:
        return None
    wf = get_workflow(name)
    if not agent_cfg.get(wf.needs):
        raise ValueError(f"agent.workflow: {name!r} needs agent.{wf.needs} set")
    extra = sorted(set(agent_cfg.get("role_weights") or {}) - set(wf.roles))
    if extra:
        raise ValueError(f"agent.role_weights: {', '.join(extra)} not a role of workflow {name!r} "
                         f"(roles: {', '.join(wf.roles) or 'none'})")
    return wf


def make_producer(agent_cfg: dict | None, generator, tokenizer, max_turn_tokens: int, task,
                  scorer: Callable[[Sequence[Prompt], Sequence[str]], list[float]]):
    """The episode producer of the run's workflow, or None for single-turn generation."""
    wf = check_workflow(agent_cfg or {})
    return None if wf is None else wf.build(generator, tokenizer, agent_cfg, max_turn_tokens, task, scorer)


def sum_stats(rows: Sequence[dict]) -> dict[str, list[float]]:
    """Element-wise sums of ``{name: [numerator, denominator]}`` dicts (keys may differ per row)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        for k, (num, den) in r.items():
            acc = out.setdefault(k, [0.0, 0.0])
            acc[0] += float(num)
            acc[1] += float(den)
    return out


def ratio_metrics(stats: dict[str, Sequence[float]], prefix: str) -> dict[str, float]:
    """``{prefix}/{name}: numerator / denominator`` for every pair with a non-zero denominator."""
    return {f"{prefix}/{k}": num / den for k, (num, den) in sorted(stats.items()) if den}
