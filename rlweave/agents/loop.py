"""The multi-turn agent loop: a batch of conversations, each alternating model turns and tool
observations until it answers, runs out of turns or runs out of tokens.

Each round generates the next assistant turn of every active trajectory in ONE batched call of the
generation engine (from token ids: a trajectory's context is exactly the tokens it generated and
observed, never re-tokenized text), parses the turns' tool calls, runs all trajectories' calls
concurrently through the :class:`~rlweave.agents.tools.ToolBox` (asyncio; a failing call is an
error observation), and appends each observation's tokens as the chat template renders them
(:func:`~rlweave.agents.chat.observation_ids`).

A trajectory is one training row: ``prompt_ids`` (the rendered question) and ``response_ids``
(everything after: model turns and observations), with ``loss_mask`` 1 on model tokens and 0 on
observation tokens, and the behaviour log-probs (0 on observations). The trainer keeps the
observations in the context and leaves them out of every loss term (DESIGN.md, *Agents*).

Limits: ``max_turns`` model turns; ``max_tokens`` response tokens (model and observation tokens
together: the row's width the trainer pays for); ``max_turn_tokens`` per model turn. A trajectory
ending on a limit, or on a turn cut before its turn-end token, is not ``finished``; the calls of a
turn that cannot be followed by another (``max_turns`` or ``max_tokens`` reached) are not run. A
turn ended by eos (a base model's end of text) ends the trajectory as an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from rlweave.agents.chat import observation_ids, parse_tool_calls, prompt_ids, tool_messages
from rlweave.agents.tools.base import ERROR_KINDS, ToolBox, ToolCall
from rlweave.models.chat_template import stop_token_ids, turn_end_token

__all__ = ["Trajectory", "AgentLoop", "agent_stats"]


@dataclass
class Trajectory:
    """One conversation's tokens and what happened in it."""

    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments, latency_s, error
    turns: int = 0
    parsed_turns: int = 0  # turns closed by the turn-end token whose tool calls all parsed
    finished: bool = False  # ended with an answer (a turn without tool calls)
    final_text: str = ""  # the last assistant turn's text, special tokens removed: what the reward reads
    stop: str = ""  # why it ended: answer, max_turns, max_tokens, turn_truncated

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


class AgentLoop:
    """Runs conversations with ``generator`` (an engine with ``generate_ids``), ``tokenizer`` (with a
    chat template) and ``toolbox``."""

    def __init__(self, generator, tokenizer, toolbox: ToolBox, max_turns: int = 4, max_tokens: int = 256,
                 max_turn_tokens: int | None = None):
        if max_turns < 1 or max_tokens < 1:
            raise ValueError(f"agent.max_turns and agent.max_tokens must be >= 1, got {max_turns}, {max_tokens}")
        self.generator, self.tokenizer, self.toolbox = generator, tokenizer, toolbox
        self.max_turns, self.max_tokens = int(max_turns), int(max_tokens)
        self.max_turn_tokens = int(max_turn_tokens or max_tokens)
        self.stop_ids = stop_token_ids(tokenizer)
        self.turn_end_id = tokenizer.convert_tokens_to_ids(turn_end_token(tokenizer))

    def run(self, conversations: Sequence[list[dict]], n: int = 1, seed: int = 0, greedy: bool = False) -> list[Trajectory]:
        """``n`` trajectories per conversation, conversation-major (as a generation's rows)."""
        tools = self.toolbox.specs()
        prompts = [prompt_ids(self.tokenizer, c, tools) for c in conversations]
        trajs = [Trajectory(prompt_ids=p, messages=[dict(m) for m in c]) for p, c in zip(prompts, conversations) for _ in range(n)]
        active = list(range(len(trajs)))
        for turn in range(self.max_turns):
            if not active:
                break
            budgets = [min(self.max_turn_tokens, self.max_tokens - len(trajs[i].response_ids)) for i in active]
            if turn == 0:  # the n samples of a question share its prefill
                gen = self.generator.generate_ids(prompts, n=n, seed=seed, greedy=greedy, stop_ids=self.stop_ids,
                                                  max_new_tokens=budgets[::n])
            else:
                gen = self.generator.generate_ids([trajs[i].prompt_ids + trajs[i].response_ids for i in active], n=1,
                                                  seed=seed + 7919 * turn, greedy=greedy, stop_ids=self.stop_ids,
                                                  max_new_tokens=budgets)
            calling: dict[int, list[ToolCall]] = {}
            for i, ids, lps, closed in zip(active, gen.response_ids, gen.logprobs, gen.finished):
                calls = self._take_turn(trajs[i], ids, lps, closed)
                if calls:
                    calling[i] = calls
            active = self._observe(trajs, calling, tools)
        for i in active:  # generated its last allowed turn with tool calls
            trajs[i].stop = "max_turns"
        return trajs

    def _take_turn(self, t: Trajectory, ids: list[int], lps: list[float], closed: bool) -> list[ToolCall]:
        """Appends a generated turn; returns its tool calls when the trajectory goes on to run them."""
        t.extend(ids, lps)
        t.turns += 1
        body = ids[:-1] if closed else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        t.final_text = self.tokenizer.decode(body, skip_special_tokens=True)
        t.messages.append({"role": "assistant", "content": text})
        calls = parse_tool_calls(text)
        t.parsed_turns += int(closed and all(c.parse_error is None for c in calls))
        if not closed:
            t.stop = "turn_truncated" if len(t.response_ids) < self.max_tokens else "max_tokens"
            return []
        if not calls or ids[-1] != self.turn_end_id:
            t.finished, t.stop = True, "answer"
            return []
        if t.turns >= self.max_turns or len(t.response_ids) >= self.max_tokens:
            t.stop = "max_turns" if t.turns >= self.max_turns else "max_tokens"
            return []
        return calls

    def _observe(self, trajs: list[Trajectory], calling: dict[int, list[ToolCall]], tools: list[dict]) -> list[int]:
        """Runs every trajectory's calls at once and appends the observations; returns the
        trajectories that go on to another turn."""
        flat = [(i, c) for i, calls in calling.items() for c in calls]
        results = self.toolbox.execute_sync([c for _, c in flat]) if flat else []
        by_traj: dict[int, list] = {i: [] for i in calling}
        for (i, _), r in zip(flat, results):
            by_traj[i].append(r)
            trajs[i].tool_calls.append({"name": r.call.name, "arguments": r.call.arguments, "latency_s": r.latency_s,
                                        "error": r.error})
        going = []
        for i, rs in by_traj.items():
            t = trajs[i]
            obs = tool_messages(rs)
            ids = observation_ids(self.tokenizer, t.messages, obs, tools)
            if len(t.response_ids) + len(ids) >= self.max_tokens:  # no room for the observation and a reply
                t.stop = "max_tokens"
                continue
            t.messages += obs
            t.extend(ids, None)
            going.append(i)
        return going


def agent_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Sums over trajectories that the runner turns into per-iteration metrics: trajectories, turns,
    parsed turns, tool calls, calls failed by kind, finished trajectories."""
    out: dict[str, float] = {"trajectories": len(trajs), "turns": 0, "parsed_turns": 0, "tool_calls": 0, "finished": 0,
                             "tool_latency_s": 0.0}
    out.update({f"errors_{k}": 0 for k in ERROR_KINDS})
    for t in trajs:
        out["turns"] += t.turns
        out["parsed_turns"] += t.parsed_turns
        out["tool_calls"] += len(t.tool_calls)
        out["finished"] += int(t.finished)
        for c in t.tool_calls:
            out["tool_latency_s"] += c["latency_s"]
            if c["error"] is not None:
                out[f"errors_{c['error']}"] += 1
    return out
