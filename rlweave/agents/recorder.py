"""Token-level trajectories of agent code that talks to the policy through the OpenAI chat API.

Why record tokens, not text: the trainer must score exactly the tokens the policy sampled, in
exactly the context it sampled them from. Agent frameworks send the *whole* conversation again on
every call, as JSON messages; re-rendering and re-tokenizing it would not give back the sampled
tokens (a byte-level BPE splits a sampled ``" 12"`` + ``"3"`` into other pieces; a framework
re-serialises tool-call arguments), so a trajectory built from text would train on tokens the
policy never produced. The recorder therefore keeps, per episode, the token ids of the context the
last call generated from plus the tokens it generated, and continues the next call from them:

* A call whose messages are the previous call's messages, then the assistant reply the endpoint
  returned (compared by role, content and tool calls' names and parsed arguments, so a framework
  that re-serialises JSON or drops ids still matches), then new messages (tool results, a user
  turn, ...) **extends** the trajectory: its prompt is the stored tokens followed by the new
  messages' tokens as the tokenizer's chat template renders them
  (:func:`~rlweave.agents.chat.observation_ids`). Those tokens are *observations*: in the
  context, masked out of the loss. A reply that ended without the turn-end token (cut by
  ``max_tokens``) gets it as an observation token, as the template would have closed the turn.
* Any other call **splits**: the agent code rewrote history (dropped or edited earlier messages,
  retried a call, branched, changed the tools), so the stored tokens are not the context it asks
  about. The open trajectory is closed as it is and a new one starts from the template's rendering
  of the messages. Both are trained (each is on-policy in its own context) and share the episode's
  reward. A call made while another call of the same episode is still generating splits too.

One episode (the agent code's run on one task prompt) is thus one trajectory when the agent only
appends to its conversation, which is what chat agents do. Everything here is thread-safe: the
endpoint serves many episodes' calls concurrently.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from rlweave.agents.chat import observation_ids, prompt_ids, turn_end_token

__all__ = ["Segment", "PendingCall", "Recorder", "normalize_message", "message_text"]


@dataclass
class Segment:
    """One token-level trajectory: ``prompt_ids`` (the first call's context), then ``response_ids``,
    every token after it: generated ones (``mask`` True, ``logprobs`` the behaviour policy's) and
    observation ones (``mask`` False, log-prob 0). ``calls`` lists each call's generated span as
    ``(start, end)`` offsets into ``response_ids``."""

    episode: str
    index: int  # 0 for an episode's first trajectory, +1 at each split
    prompt_ids: list[int]
    tools: list[dict] | None
    response_ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: list[tuple[int, int]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # policy version of each call
    replies: list[dict] = field(default_factory=list)  # the assistant message each call returned
    finish_reasons: list[str] = field(default_factory=list)  # OpenAI's: stop, tool_calls, length
    finished: bool = False  # the last generation ended with a stop token (not cut by its budget)
    messages: list[dict] = field(default_factory=list)  # the last call's messages + the reply returned
    reply: dict | None = None  # the last assistant reply returned
    busy: bool = False  # a call is generating

    @property
    def tokens(self) -> list[int]:
        """Every token so far: the context the next extending call continues."""
        return self.prompt_ids + self.response_ids

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)


@dataclass
class PendingCall:
    """A call between :meth:`Recorder.begin` and :meth:`Recorder.finish`: its prompt token ids."""

    segment: Segment
    prompt_ids: list[int]
    messages: list[dict]
    extended: bool  # True: continues the segment's tokens; False: the segment's first call


def message_text(content: Any) -> str:
    """A message's ``content`` as one string: OpenAI's list-of-parts form joined, None as ''."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw


def normalize_message(message: dict) -> tuple:
    """What two messages must share to count as the same turn: role, stripped text and the tool
    calls' names with their *parsed* arguments (ids, names of tool messages and JSON spacing do
    not matter: frameworks rewrite them)."""
    calls = tuple((c.get("function", c).get("name"), json.dumps(_arguments(c.get("function", c).get("arguments")),
                                                                 sort_keys=True))
                  for c in message.get("tool_calls") or ())
    return message.get("role"), message_text(message.get("content")).strip(), calls


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """Messages as chat templates take them: text content (parts joined, None -> '' outside
    assistant turns), tool-call arguments as they came."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") != "assistant" or m.get("content") is not None:
            m["content"] = message_text(m.get("content"))
        out.append(m)
    return out


class Recorder:
    """Episodes' trajectories, built call by call (:meth:`begin`, then :meth:`finish` or
    :meth:`abort`). ``stats`` counts calls, extensions and splits."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids(turn_end_token(tokenizer))
        self._episodes: dict[str, list[Segment]] = {}
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "extended": 0, "splits": 0, "aborted": 0}

    # ------------------------------------------------------------------ calls
    def begin(self, episode: str, messages: Sequence[dict], tools: Sequence[dict] | None) -> PendingCall:
        """The token ids call ``messages`` generates from, in ``episode``: the open trajectory's
        tokens plus the new messages' observation tokens when the call extends it, else the
        template's rendering of ``messages`` in a new trajectory (a split when one was open)."""
        messages = template_messages(messages)
        tools = list(tools) if tools else None
        with self._lock:
            segments = self._episodes.setdefault(episode, [])
            last = segments[-1] if segments else None
            suffix = self._extension(last, messages, tools)
            if suffix is not None:
                last.busy = True
                self.stats["extended"] += 1
            else:
                if last is not None:
                    self.stats["splits"] += 1
                last = Segment(episode=episode, index=len(segments), prompt_ids=[], tools=tools, busy=True)
                segments.append(last)
        try:
            if suffix is None:
                ids = prompt_ids(self.tokenizer, messages, tools)
                last.prompt_ids = list(ids)
                return PendingCall(last, list(ids), messages, extended=False)
            obs = observation_ids(self.tokenizer, messages[:len(last.messages)], suffix, tools)
        except Exception:
            self.abort_segment(last)
            raise
        if last.response_ids and last.response_ids[-1] != self.end_id:
            obs = [self.end_id] + list(obs)  # the reply was cut before its turn end: the template closes it
        with self._lock:
            last.response_ids += obs
            last.mask += [False] * len(obs)
            last.logprobs += [0.0] * len(obs)
        return PendingCall(last, last.tokens, messages, extended=True)

    def _extension(self, last: Segment | None, messages: list[dict], tools: list[dict] | None) -> list[dict] | None:
        """The messages that ``messages`` appends to ``last``'s conversation, or None when it does
        not extend it (or ``last`` is generating, or nothing was appended)."""
        if last is None or last.busy or last.reply is None or tools != last.tools:
            return None
        n = len(last.messages)
        if len(messages) <= n:
            return None
        if [normalize_message(m) for m in messages[:n]] != [normalize_message(m) for m in last.messages]:
            return None
        return messages[n:]

    def finish(self, call: PendingCall, response_ids: Sequence[int], logprobs: Sequence[float], finished: bool,
               version: int, reply: dict, finish_reason: str = "stop") -> Segment:
        """Appends a call's generated tokens and behaviour log-probs; ``reply`` is the assistant
        message returned to the agent (what its next call must repeat to extend)."""
        seg = call.segment
        if len(response_ids) != len(logprobs):
            raise ValueError(f"{len(response_ids)} generated tokens but {len(logprobs)} log-probs")
        with self._lock:
            if seg.tokens != call.prompt_ids:  # the invariant an extension rests on
                raise RuntimeError(f"episode {seg.episode}: the call's prompt does not extend the trajectory's tokens")
            start = len(seg.response_ids)
            seg.response_ids += list(response_ids)
            seg.mask += [True] * len(response_ids)
            seg.logprobs += [float(x) for x in logprobs]
            seg.calls.append((start, len(seg.response_ids)))
            seg.versions.append(int(version))
            seg.replies.append(reply)
            seg.finish_reasons.append(finish_reason)
            seg.finished = bool(finished)
            seg.messages = list(call.messages) + [reply]
            seg.reply = reply
            seg.busy = False
            self.stats["calls"] += 1
        return seg

    def abort(self, call: PendingCall) -> None:
        """A call that generated nothing (refused, failed): an extension's observation tokens are
        taken back; a new trajectory without a generation is dropped."""
        self.abort_segment(call.segment)

    def abort_segment(self, seg: Segment) -> None:
        with self._lock:
            self.stats["aborted"] += 1
            if seg.calls:  # back to the end of its last generation, ready to be extended again
                n = seg.calls[-1][1]
                del seg.response_ids[n:], seg.mask[n:], seg.logprobs[n:]
                seg.busy = False
            else:
                self._drop(seg)

    def _drop(self, seg: Segment) -> None:
        segments = self._episodes.get(seg.episode, [])
        if seg in segments:
            segments.remove(seg)
        if not segments:
            self._episodes.pop(seg.episode, None)

    # ------------------------------------------------------------------ reading
    def episode(self, episode: str) -> list[Segment]:
        """The episode's trajectories so far (the live objects: read them once the agent is done)."""
        with self._lock:
            return list(self._episodes.get(episode, ()))

    def pop(self, episode: str) -> list[Segment]:
        """The episode's trajectories, forgotten here (the rollout driver takes each episode once)."""
        with self._lock:
            return self._episodes.pop(episode, [])

    def episodes(self) -> list[str]:
        with self._lock:
            return list(self._episodes)

    def clear(self) -> None:
        """Forgets every episode (a rollout starts; calls of abandoned episodes are not kept)."""
        with self._lock:
            self._episodes.clear()
