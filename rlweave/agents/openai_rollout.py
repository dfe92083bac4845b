"""Rollouts by user agent code over the OpenAI API: :class:`OpenAIAgentRollout`.

The run's ``agent.openai_fn`` names a function ``fn(client, prompt) -> str | None`` (``module:function``,
or ``path/to/file.py:function``): ordinary agent code that takes an ``openai.OpenAI`` client and a
task prompt (:class:`~rlweave.envs.text_tasks.Prompt`: ``prompt.text`` is the question) and returns
its final answer. For each of a batch's prompts x ``n`` episodes the rollout gives the function a
client whose ``base_url`` points at the policy's :class:`~rlweave.agents.endpoint.PolicyEndpoint`
under the episode's own id, runs the episodes concurrently in threads (their calls are batched by
the endpoint), and turns each episode's recorded trajectory into a training row: ``prompt_ids``,
``response_ids`` with ``loss_mask`` (1 on generated tokens, 0 on observation tokens) and behaviour
log-probs, exactly the rows the built-in agent loop (:mod:`rlweave.agents.loop`) produces, so the
runner and the actor train on them unchanged.

Reward: rlweave's one reward contract, ``task.reward_fn`` = ``module:function(prompt, response)``
(else the task's verifier), where ``response`` is the episode's final answer (the function's
return value, else the last reply's content) and ``prompt`` is the task's prompt (``id``,
``text``, gold ``answer``, ``meta``) with the episode's conversation in ``prompt.meta["messages"]``
(every message of the last call plus the reply it got), so a reward can judge the tool use too.

One row per episode (GRPO's groups are ``n`` rows per prompt): an episode the agent code split by
rewriting its history (:mod:`rlweave.agents.recorder`) trains on its last trajectory, the one that
produced the answer, and its earlier ones are counted (``split_trajectories``), not trained. An
episode that made no call (the function raised first) is a row without response tokens: it takes
its share of the group's reward statistics and trains nothing. An episode still running after
``agent.episode_timeout_s`` is abandoned (its thread cannot be killed; its later calls are refused,
as the endpoint only serves while a rollout is in progress).

Interface: that of :class:`~rlweave.agents.rollout.AgentRollout` (``generate(prompts, n, seed,
greedy) -> (out, texts)``, ``close()``), which is how the rollout worker uses either.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from rlweave.agents.chat import initial_conversation, prompt_ids
from rlweave.agents.endpoint import PolicyEndpoint
from rlweave.agents.recorder import Segment
from rlweave.agents.tools.base import ERROR_KINDS
from rlweave.envs.text_tasks import Prompt

__all__ = ["OpenAIAgentRollout", "load_agent_fn", "episode_row"]


def load_agent_fn(spec: str, key: str = "agent.openai_fn") -> Callable:
    """``module:function`` or ``path/to/file.py:function`` (a relative path from the working
    directory); a wrong spec is a one-line ValueError naming ``key``."""
    target, _, name = str(spec).rpartition(":")
    if not target or not name:
        raise ValueError(f"{key}: expected 'module:function' or 'file.py:function', got {spec!r}")
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            mod_name = f"rlweave_agent_{abs(hash(str(path)))}"
            module = sys.modules.get(mod_name)
            if module is None:
                loader = importlib.util.spec_from_file_location(mod_name, path)
                if loader is None or not path.is_file():
                    raise ImportError(f"no such file: {path}")
                module = importlib.util.module_from_spec(loader)
                sys.modules[mod_name] = module
                loader.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        fn = getattr(module, name)
    except (ImportError, AttributeError, SyntaxError) as e:
        raise ValueError(f"{key}: cannot load {spec!r}: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise ValueError(f"{key}: {spec!r} is not callable")
    return fn


def _stats(seg: Segment | None, splits: int, agent_error: bool) -> dict[str, float]:
    """The per-trajectory counts the runner's agent metrics read (those of
    :func:`~rlweave.agents.loop.agent_stats`; tool errors happen inside the agent code, unseen
    here, so they stay 0), plus ``agent_failed`` and ``split_trajectories``."""
    out: dict[str, float] = {"trajectories": 1, "turns": 0, "parsed_turns": 0, "tool_calls": 0, "finished": 0}
    out.update({f"errors_{k}": 0 for k in ERROR_KINDS})
    out.update(agent_failed=int(agent_error), split_trajectories=splits)
    if seg is not None:
        out["turns"] = len(seg.calls)
        out["tool_calls"] = sum(len(r.get("tool_calls") or ()) for r in seg.replies)
        out["parsed_turns"] = sum(f != "length" and "<tool_call>" not in (r.get("content") or "")
                                  for r, f in zip(seg.replies, seg.finish_reasons))
        out["finished"] = int(seg.finished and not agent_error and seg.finish_reasons[-1] != "tool_calls")
    return out


def episode_row(segments: Sequence[Segment], fallback_prompt: Sequence[int], agent_error: bool) -> dict[str, Any]:
    """One episode as a training row (see the module doc)."""
    seg = segments[-1] if segments else None
    if seg is None:
        return {"prompt_ids": list(fallback_prompt), "response_ids": [], "logprobs": [], "loss_mask": [], "finished": False,
                "agent": _stats(None, 0, agent_error)}
    return {"prompt_ids": list(seg.prompt_ids), "response_ids": list(seg.response_ids), "logprobs": list(seg.logprobs),
            "loss_mask": [int(m) for m in seg.mask], "finished": bool(seg.finished and not agent_error),
            "agent": _stats(seg, len(segments) - 1, agent_error)}


class OpenAIAgentRollout:
    """Episodes of user agent code against the policy's endpoint (see the module doc).

    ``agent_cfg``: the run's ``agent`` section (``openai_fn``, ``episode_timeout_s``,
    ``max_concurrency``, ``max_tokens``: an episode's tokens after its prompt, ``openai_host`` /
    ``openai_port``: where the endpoint listens; off loopback its token is ``$RLWEAVE_TOKEN`` or one
    generated and printed, never a config value); ``max_turn_tokens``: the most tokens one reply
    may have (``rollout.max_new_tokens``)."""

    def __init__(self, generator, tokenizer, agent_cfg: dict, max_turn_tokens: int):
        self.agent_fn = load_agent_fn(agent_cfg["openai_fn"])
        self.tokenizer = tokenizer
        self.timeout_s = float(agent_cfg.get("episode_timeout_s", 120.0))
        self.max_concurrency = int(agent_cfg.get("max_concurrency", 64))
        self.endpoint = PolicyEndpoint(generator, tokenizer, host=agent_cfg.get("openai_host", "127.0.0.1"),
                                       port=int(agent_cfg.get("openai_port", 0)), max_new_tokens=max_turn_tokens,
                                       max_response_tokens=agent_cfg.get("max_tokens"), max_batch=self.max_concurrency).start()
        self.endpoint.open = False
        self.errors: list[str] = []  # the last agent failures (first lines), for logs

    def generate(self, prompts: Sequence[Prompt], n: int, seed: int, greedy: bool = False) -> tuple[dict, list[str]]:
        """``n`` episodes per prompt, prompt-major; returns the rows (with ``group``, ``loss_mask``,
        ``agent`` counts, the policy ``version`` and ``prompts``: each episode's prompt with its
        conversation, what the reward reads) and each episode's final answer text."""
        ep = self.endpoint
        ep.recorder.clear()
        ep.batcher.seed, ep.batcher.greedy = int(seed), bool(greedy)
        episodes = [(f"s{seed}-p{i}-e{j}", p) for i, p in enumerate(prompts) for j in range(n)]
        results: dict[str, tuple[Any, bool]] = {}
        slots = threading.BoundedSemaphore(self.max_concurrency)
        ep.open = True
        try:
            threads = [threading.Thread(target=self._episode, args=(eid, p, results, slots), daemon=True,
                                        name=f"rlweave-agent-{eid}") for eid, p in episodes]
            for t in threads:
                t.start()
            waves = -(-len(episodes) // self.max_concurrency)  # episodes beyond max_concurrency wait for a slot
            deadline = time.monotonic() + self.timeout_s * waves
            for t in threads:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            ep.open = False  # abandoned episodes' next calls are refused; the ones accepted finish now
            ep.wait_idle()
        rows, texts, scored = [], [], []
        for eid, prompt in episodes:
            answer, failed = results.get(eid, (None, True))
            segments = ep.recorder.pop(eid)
            fallback = [] if segments else prompt_ids(self.tokenizer, initial_conversation(prompt), None)
            rows.append(episode_row(segments, fallback, failed))
            if answer is None and segments and segments[-1].replies:
                answer = segments[-1].replies[-1].get("content")
            texts.append(answer if isinstance(answer, str) else "")
            messages = segments[-1].messages if segments else []
            scored.append(Prompt(prompt.id, prompt.text, prompt.answer, {**prompt.meta, "messages": messages}))
        out = {k: [r[k] for r in rows] for k in ("prompt_ids", "response_ids", "logprobs", "loss_mask", "finished", "agent")}
        out.update(group=[i // n for i in range(len(rows))], version=int(getattr(ep.engine, "version", -1)), prompts=scored)
        return out, texts

    def _episode(self, eid: str, prompt: Prompt, results: dict, slots: threading.BoundedSemaphore) -> None:
        import openai

        with slots:
            client = openai.OpenAI(base_url=self.endpoint.base_url(eid), api_key=self.endpoint.api_key, max_retries=0,
                                   timeout=self.timeout_s)
            try:
                results[eid] = (self.agent_fn(client, prompt), False)
            except Exception:  # noqa: BLE001 - the user's agent failed: the episode ends here, the rollout goes on
                results[eid] = (None, True)
                self.errors = (self.errors + [f"{eid}: {traceback.format_exc(limit=1).strip().splitlines()[-1]}"])[-8:]
            finally:
                client.close()

    def close(self) -> None:
        self.endpoint.stop()
