"""The OpenAI-compatible endpoint (#26 item 5): agent code using the ``openai`` package runs against
rlweave's policy; its calls are recorded as token-level trajectories whose tokens are the ones the
engine generated and whose log-probs the trainer's forward recomputes to < 1e-4 (float32).

The policy is a tiny Qwen2 built from a config with a tokenizer trained here (rlweave's chat
template), taught by a few seconds of SFT one calculator episode, so that it really calls the tool
and answers over several turns (sampling at a low temperature keeps it on that path)."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
import torch

from examples.openai_agent import TOOLS, calculator_agent
from rlweave.agents.endpoint import PolicyEndpoint
from rlweave.agents.memorised import memorise_episode
from rlweave.agents.openai_rollout import OpenAIAgentRollout
from rlweave.agents.tasks.prompts import final_answer, initial_messages, tool_call_message, tool_message
from rlweave.envs.text_tasks import Prompt
from rlweave.generation.hf_generator import HFGenerator
from rlweave.models.causal_lm import CausalLMPolicy, response_batch

QUESTION = "What is 1234 * 5678?"
PROMPT = Prompt(id="q0", text=QUESTION, answer="7006652", meta={"tools": ["calculator"]})
TEMPERATURE = 0.25


def _expert() -> list[dict]:
    return initial_messages(PROMPT) + [tool_call_message("calculator", {"expression": "1234 * 5678"}, "c0"),
                                       tool_message("calculator", "7006652", "c0"),
                                       {"role": "assistant", "content": final_answer("7006652")}]


@pytest.fixture(scope="module")
def policy():
    """(tokenizer, model) where the model has learnt the expert's calculator episode by heart."""
    tok, model, loss = memorise_episode(_expert(), TOOLS, hidden=64, layers=2, lr=1e-2, max_steps=120)
    assert loss < 0.1, f"the tiny model did not learn the episode (loss {loss:.3f})"
    return tok, model


class Watched:
    """The real engine, with every generate_ids answer kept (what the engine generated)."""

    def __init__(self, engine):
        self.engine, self.outputs = engine, []
        self.model, self.version, self.max_new_tokens = engine.model, engine.version, engine.max_new_tokens

    def generate_ids(self, prompt_ids, **kw):
        gen = self.engine.generate_ids(prompt_ids, **kw)
        self.outputs += [(list(p), list(r)) for p, r in zip(prompt_ids, gen.response_ids)]
        return gen


def _trainer_logprobs(model, segment) -> torch.Tensor:
    """The trainer's recomputation of a trajectory's response log-probs (float32), under the
    sampling temperature, as the actor's update scores rows."""
    batch = response_batch([segment.prompt_ids], [segment.response_ids], pad_id=0)
    with torch.no_grad():
        out = CausalLMPolicy(model).forward_responses(**{k: torch.as_tensor(v) for k, v in batch.items()},
                                                      with_entropy=False, temperature=TEMPERATURE)
    return out["logprobs"][0].float()


def _engine(policy, max_new_tokens=48):
    tok, model = policy
    return HFGenerator(model, tok, max_new_tokens=max_new_tokens, temperature=TEMPERATURE)


def test_openai_agent_with_tools_is_recorded_as_the_generated_tokens(policy):
    tok, model = policy
    engine = Watched(_engine(policy))
    with PolicyEndpoint(engine, tok, seed=3) as endpoint:
        client = openai.OpenAI(base_url=endpoint.base_url("episode-1"), api_key=endpoint.api_key, max_retries=0)
        answer = calculator_agent(client, PROMPT)
        (seg,) = endpoint.recorder.pop("episode-1")
        first = client.chat.completions.create(model="policy", messages=initial_messages(PROMPT), tools=TOOLS)
    assert answer == "The answer is 7006652."
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "1234 * 5678"}
    assert first.usage.completion_tokens > 0 and first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens

    # one trajectory over the whole episode: two model turns with the tool's result between them
    assert len(seg.calls) == 2 and seg.finish_reasons == ["tool_calls", "stop"] and seg.finished
    generated = [r for _, r in engine.outputs[:2]]
    assert [seg.response_ids[a:b] for a, b in seg.calls] == generated  # recorded tokens == generated tokens
    assert [i for i, m in enumerate(seg.mask) if m] == [i for a, b in seg.calls for i in range(a, b)]
    # each call generated from exactly the trajectory's tokens before it
    assert engine.outputs[0][0] == seg.prompt_ids
    assert engine.outputs[1][0] == seg.prompt_ids + seg.response_ids[: seg.calls[1][0]]
    between = tok.decode(seg.response_ids[seg.calls[0][1]: seg.calls[1][0]])
    assert "<tool_response>\n7006652\n</tool_response>" in between and between.endswith("<|im_start|>assistant\n")

    # behaviour log-probs == the trainer's recomputation, float32
    mask = torch.tensor(seg.mask)
    recorded = torch.tensor(seg.logprobs, dtype=torch.float32)
    gap = (recorded[mask] - _trainer_logprobs(model, seg)[mask]).abs().max().item()
    assert gap < 1e-4, gap
    assert (recorded[~mask] == 0).all()


def test_concurrent_episodes_and_history_rewrites(policy):
    tok, model = policy
    engine = Watched(_engine(policy, max_new_tokens=40))
    with PolicyEndpoint(engine, tok, seed=5) as endpoint:
        ready = threading.Barrier(3)

        def run(i):
            client = openai.OpenAI(base_url=endpoint.base_url(f"c{i}"), api_key=endpoint.api_key, max_retries=0)
            ready.wait()  # the three first calls arrive together
            calculator_agent(client, PROMPT)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert endpoint.batcher.batches < endpoint.batcher.requests  # concurrent calls shared decode loops
        for i in range(3):
            (seg,) = endpoint.recorder.pop(f"c{i}")
            mask = torch.tensor(seg.mask)
            gap = (torch.tensor(seg.logprobs)[mask] - _trainer_logprobs(model, seg)[mask]).abs().max().item()
            assert gap < 1e-4 and len(seg.calls) >= 2

        # the episode id from a header; a rewritten history splits the trajectory, an appended turn extends it
        client = openai.OpenAI(base_url=endpoint.base_url(), api_key=endpoint.api_key, max_retries=0,
                               default_headers={"X-Rlweave-Episode": "rewrite"})
        messages = initial_messages(PROMPT)
        reply = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        grown = messages + [reply.model_dump(exclude_none=True), {"role": "user", "content": "Check it."}]
        client.chat.completions.create(model="p", messages=grown, tools=TOOLS, max_tokens=4)
        edited = [messages[0], {"role": "user", "content": "What is 2 + 2?"}]
        client.chat.completions.create(model="p", messages=edited, tools=TOOLS, max_tokens=4)
        a, b = endpoint.recorder.pop("rewrite")
    assert len(a.calls) == 2 and len(b.calls) == 1 and endpoint.recorder.stats["splits"] == 1
    assert a.tokens[: len(a.prompt_ids) + a.calls[0][1]] == engine.outputs[-3][0] + engine.outputs[-3][1]


def test_bad_requests_get_400_and_the_server_keeps_serving(policy):
    tok, _ = policy
    with PolicyEndpoint(_engine(policy, max_new_tokens=4), tok, max_message_bytes=4096) as endpoint:
        url = endpoint.base_url() + "/chat/completions"
        bad = [b"{not json", json.dumps([1, 2]).encode(), json.dumps({"messages": []}).encode(),
               json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(),
               json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode(),
               json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode(),
               json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}).encode()]
        for body in bad:
            r = httpx.post(url, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (body, r.text)
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413
        client = openai.OpenAI(base_url=endpoint.base_url(), api_key=endpoint.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="less than or equal to 1"):
            client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}], n=3)
        ok = client.chat.completions.create(model="p", messages=[{"role": "user", "content": QUESTION}])
        assert ok.choices[0].message.role == "assistant"  # still serving
        assert endpoint.stats["refused"] == len(bad) + 1 and endpoint.security.refusals["oversize"] == 1


def test_context_limit_token_and_models(policy):
    tok, _ = policy
    with PolicyEndpoint(_engine(policy, max_new_tokens=4), tok, token="t" * 24, max_positions=200) as endpoint:
        assert endpoint.security.loopback
        anonymous = openai.OpenAI(base_url=endpoint.base_url(), api_key="wrong-key-wrong-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        client = openai.OpenAI(base_url=endpoint.base_url(), api_key=endpoint.api_key, max_retries=0)
        assert [m.id for m in client.models.list()] == ["rlweave-policy"]
        with pytest.raises(openai.BadRequestError, match="context"):
            client.chat.completions.create(model="p", messages=[{"role": "user", "content": "1234 * 5678 " * 60}])
        ok = client.chat.completions.create(model="p", messages=[{"role": "user", "content": QUESTION}], user="u1")
        assert ok.choices[0].finish_reason in ("stop", "length") and endpoint.recorder.episode("u1")
        assert httpx.get(endpoint.url + "/health").status_code == 200  # no token needed
        endpoint.open = False  # between a training rollout's episodes: nothing generates
        with pytest.raises(openai.InternalServerError, match="not serving"):
            client.chat.completions.create(model="p", messages=[{"role": "user", "content": QUESTION}])
        assert endpoint.wait_idle(timeout_s=5)


def _failing_agent(client, prompt):
    raise RuntimeError("the agent gave up")


def test_openai_rollout_rows(policy, monkeypatch):
    tok, model = policy
    engine = _engine(policy, max_new_tokens=40)
    rollout = OpenAIAgentRollout(engine, tok, {"openai_fn": "examples.openai_agent:calculator_agent",
                                               "episode_timeout_s": 60}, max_turn_tokens=40)
    try:
        out, texts = rollout.generate([PROMPT], n=2, seed=1)
        rollout.agent_fn = _failing_agent
        failed, failed_texts = rollout.generate([PROMPT], n=1, seed=2)
    finally:
        rollout.close()
    assert out["group"] == [0, 0] and texts == ["The answer is 7006652."] * 2
    for ids, mask, lps in zip(out["response_ids"], out["loss_mask"], out["logprobs"]):
        assert len(ids) == len(mask) == len(lps) and 0 < sum(mask) < len(mask)
    assert [a["tool_calls"] for a in out["agent"]] == [1, 1] and all(out["finished"])
    assert failed["response_ids"] == [[]] and failed["agent"][0]["agent_failed"] == 1 and failed_texts == [""]
    assert failed["prompt_ids"][0]  # a context for the empty row


def test_the_openai_agents_rows_equal_the_builtin_agent_loops(policy):
    """The same greedy episode through the openai agent code and through rlweave's own agent loop
    (same tools, same prompt): identical token rows, loss masks and log-probs, so GRPO trains on
    exactly what it would train on with the built-in loop."""
    from rlweave.agents.chat import initial_conversation
    from rlweave.agents.loop import AgentLoop
    from rlweave.agents.tools import make_toolbox

    tok, _ = policy
    box = make_toolbox(["calculator"])
    try:
        (loop,) = AgentLoop(_engine(policy), tok, box, max_turns=3, max_tokens=96, max_turn_tokens=48).run(
            [initial_conversation(PROMPT)], n=1, greedy=True)
    finally:
        box.close()
    rollout = OpenAIAgentRollout(_engine(policy), tok, {"openai_fn": "examples.openai_agent:calculator_agent",
                                                        "max_tokens": 96}, max_turn_tokens=48)
    try:
        out, texts = rollout.generate([PROMPT], n=1, seed=0, greedy=True)
    finally:
        rollout.close()
    assert loop.turns == 2 and texts == [loop.final_text] == ["The answer is 7006652."]
    assert out["prompt_ids"][0] == loop.prompt_ids and out["response_ids"][0] == loop.response_ids
    assert out["loss_mask"][0] == loop.loss_mask
    assert torch.allclose(torch.tensor(out["logprobs"][0]), torch.tensor(loop.logprobs), atol=1e-5)


def test_default_bind_is_loopback_and_a_missing_token_is_refused(policy):
    """The endpoint with no host given listens on loopback alone; with a token, a request without
    one gets 401 and no completion."""
    import socket

    from helpers import other_local_address

    tok, _ = policy
    addr, cleanup = other_local_address()
    try:
        with PolicyEndpoint(_engine(policy, max_new_tokens=4), tok, token="t" * 24) as endpoint:
            port = int(endpoint.url.rsplit(":", 1)[1])
            assert endpoint.url.startswith("http://127.0.0.1:")
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=2).close()
            r = httpx.post(endpoint.url + "/v1/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": QUESTION}]})
            assert r.status_code == 401 and "choices" not in r.text
    finally:
        cleanup()
