"""The multi-turn agent loop (#26): chat formatting through the tokenizer's own template, tool-call
parsing, the token layout of episodes with a real calculator, malformed calls as counted error
observations, turn and token limits, the loss mask (observation tokens carry no loss, ratio, KL or
entropy; single-turn results unchanged), SFT on multi-turn traces, and a GRPO run with tools end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlweave.agents.chat import observation_ids, parse_tool_calls  # noqa: E402
from rlweave.agents.loop import AgentLoop, agent_stats  # noqa: E402
from rlweave.agents.tools import make_toolbox  # noqa: E402
from rlweave.generation.result import Generation  # noqa: E402
from rlweave.models.causal_lm import build_causal_lm, train_tokenizer  # noqa: E402
from rlweave.models.chat_template import add_chat_template, encode_conversation, render  # noqa: E402

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    corpus = ["What is 1234 * 5678? The answer is 7006652. calculator expression arguments name"] * 20
    return add_chat_template(train_tokenizer(corpus, vocab_size=300))


@pytest.fixture()
def box():
    b = make_toolbox(["calculator"])
    yield b
    b.close()


class Scripted:
    """A stand-in policy replaying fixed assistant turns (canonical tokens + the stop token), so the
    layout the loop builds can be compared token for token with the template's rendering. Every
    other part (tools, template, parser, masks) is the real one."""

    version = 0

    def __init__(self, tok, turns: list[str], close: bool = True):
        self.tok, self.turns, self.close, self.k = tok, turns, close, 0

    def generate_ids(self, prompt_ids, n=1, seed=0, greedy=False, stop_ids=None, max_new_tokens=None):
        text = self.turns[min(self.k, len(self.turns) - 1)]
        self.k += 1
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + ([stop_ids[0]] if self.close else [])
        rows = [p for p in prompt_ids for _ in range(n)]
        return Generation(rows, [list(ids) for _ in rows], [[-0.25] * len(ids) for _ in rows], [self.close] * len(rows),
                          [i // n for i in range(len(rows))])


QUESTION = [{"role": "user", "content": "What is 1234 * 5678?"}]


# --------------------------------------------------------------------------- chat formatting
def test_tool_calls_parse_and_malformed_ones_carry_an_error():
    good, args_str = parse_tool_calls("x " + CALL % "1+1" + ' <tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>')
    assert (good.name, good.arguments, good.parse_error) == ("calculator", {"expression": "1+1"}, None)
    assert (args_str.name, args_str.arguments) == ("search", {"q": 1})
    assert parse_tool_calls("The answer is 4.") == []
    (bad,) = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {</tool_call>')
    assert bad.parse_error and bad.arguments is None
    (nameless,) = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert "name" in nameless.parse_error
    (unclosed,) = parse_tool_calls('<tool_call>{"name": "calculator"')
    assert "never closed" in unclosed.parse_error


def test_conversation_mask_from_prefixes_equals_the_templates_generation_markers(tok, box):
    messages = QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1234 * 5678"}}}]},
        {"role": "tool", "name": "calculator", "content": "7006652"},
        {"role": "assistant", "content": "The answer is 7006652."}]
    ids, mask = encode_conversation(tok, messages, box.specs())
    full = render(tok, messages, box.specs())
    assert ids == tok(full, add_special_tokens=False)["input_ids"]
    marked = tok.apply_chat_template(messages, tools=box.specs(), return_dict=True, return_assistant_tokens_mask=True)
    assert marked["input_ids"] == ids and marked["assistant_masks"] == [int(m) for m in mask]
    learnt = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learnt == CALL % "1234 * 5678" + "<|im_end|>The answer is 7006652.<|im_end|>"


# --------------------------------------------------------------------------- the loop
def test_episode_with_the_calculator_has_the_templates_token_layout(tok, box):
    policy = Scripted(tok, [CALL % "1234 * 5678", "The answer is 7006652."])
    (t,) = AgentLoop(policy, tok, box, max_turns=4, max_tokens=400).run([QUESTION])
    assert (t.turns, t.finished, t.stop, t.final_text) == (2, True, "answer", "The answer is 7006652.")
    assert [(c["name"], c["arguments"], c["error"]) for c in t.tool_calls] == [("calculator", {"expression": "1234 * 5678"}, None)]
    # the rendered conversation's tokens are exactly prompt + response
    full = tok(render(tok, t.messages, box.specs()), add_special_tokens=False)["input_ids"]
    assert full[: len(t.prompt_ids) + len(t.response_ids)] == t.prompt_ids + t.response_ids
    assert tok.decode(full[len(t.prompt_ids) + len(t.response_ids):]) == "\n"  # the template's text after the last turn
    # model tokens are in the loss with their log-probs; the observation is context only
    obs = [i for i, m in zip(t.response_ids, t.loss_mask) if not m]
    assert tok.decode(obs) == "\n<|im_start|>user\n<tool_response>\n7006652\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert all((lp == 0.0) != bool(m) for lp, m in zip(t.logprobs, t.loss_mask))
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs)


def test_malformed_and_unknown_calls_become_error_observations_and_are_counted(tok, box):
    policy = Scripted(tok, ['<tool_call>{"name": "calculator", "arguments": {</tool_call>',
                            '<tool_call>{"name": "wolfram", "arguments": {}}</tool_call>', "The answer is 1."])
    (t,) = AgentLoop(policy, tok, box, max_turns=5, max_tokens=400).run([QUESTION])
    assert t.finished and t.turns == 3
    assert [c["error"] for c in t.tool_calls] == ["invalid_json", "unknown_tool"]
    errors = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert all(e.startswith("error:") for e in errors) and "wolfram" in errors[1]
    stats = agent_stats([t])
    assert (stats["errors_invalid_json"], stats["errors_unknown_tool"], stats["tool_calls"]) == (1, 1, 2)
    assert (stats["turns"], stats["parsed_turns"]) == (3, 2)  # the invalid JSON turn does not parse
    assert stats["tool_latency_s"] == pytest.approx(sum(c["latency_s"] for c in t.tool_calls))
    assert box.counts["invalid_json"] == 1 and box.counts["unknown_tool"] == 1


def test_turn_and_token_limits_hold(tok, box):
    (t,) = AgentLoop(Scripted(tok, [CALL % "1+1"]), tok, box, max_turns=3, max_tokens=1000).run([QUESTION])
    assert (t.turns, t.finished, t.stop, len(t.tool_calls)) == (3, False, "max_turns", 2)  # the last turn's call is not run
    # a random model: each turn within max_turn_tokens, each episode within max_tokens, n per question
    model = build_causal_lm(len(tok), "qwen3", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                            intermediate_size=64, max_positions=512, seed=0)
    from rlweave.generation.hf_generator import HFGenerator

    loop = AgentLoop(HFGenerator(model, tok, max_new_tokens=8), tok, box, max_turns=3, max_tokens=20, max_turn_tokens=8)
    trajs = loop.run([QUESTION, [{"role": "user", "content": "What is 2 * 3?"}]], n=3, seed=1)
    assert len(trajs) == 6 and trajs[0].prompt_ids == trajs[2].prompt_ids != trajs[3].prompt_ids
    for t in trajs:
        assert len(t.response_ids) <= 20 and 1 <= t.turns <= 3
        assert sum(t.loss_mask) <= 8 * t.turns
        assert t.stop in ("answer", "max_turns", "max_tokens", "turn_truncated")


def test_observation_suffix_refuses_a_template_that_rewrites_history(tok, box):
    messages = QUESTION + [{"role": "assistant", "content": CALL % "1+1"}]
    obs = [{"role": "tool", "name": "calculator", "content": "2"}]
    assert tok.decode(observation_ids(tok, messages, obs, box.specs())).startswith("\n<|im_start|>user\n<tool_response>")

    class Rewriting:  # renders the first user turn differently once tool results follow
        def __init__(self, inner):
            self.inner = inner
            self.chat_template = inner.chat_template

        def apply_chat_template(self, msgs, **kw):
            text = self.inner.apply_chat_template(msgs, **kw)
            return text.replace("1234", "4321") if any(m["role"] == "tool" for m in msgs) else text

        def get_vocab(self):
            return self.inner.get_vocab()

        eos_token = property(lambda self: self.inner.eos_token)

    with pytest.raises(RuntimeError, match="rewrites history"):
        observation_ids(Rewriting(tok), messages, obs, box.specs())


class ScriptedThenModel(Scripted):
    """The first turn scripted (a tool call), every later one sampled by a real engine from the
    episode's token ids: the engine's tokens then follow an observation inside the response."""

    def __init__(self, tok, first: str, engine):
        super().__init__(tok, [first])
        self.engine, self.version = engine, engine.version

    def generate_ids(self, prompt_ids, **kw):
        if self.k == 0:
            return super().generate_ids(prompt_ids, **kw)
        return self.engine.generate_ids(prompt_ids, **kw)


def _tiny_model(tok, seed=0):
    return build_causal_lm(len(tok), "qwen3", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                           intermediate_size=64, max_positions=512, seed=seed)


@pytest.mark.parametrize("kernels", ["auto", "hf"])
def test_trainer_scores_model_tokens_after_an_observation_as_the_engine_sampled_them(tok, box, kernels):
    from rlweave.generation.hf_generator import HFGenerator
    from rlweave.models.causal_lm import CausalLMPolicy, response_batch

    model = _tiny_model(tok)
    engine = HFGenerator(model, tok, max_new_tokens=6, temperature=0.7, kernels=kernels)
    policy = ScriptedThenModel(tok, CALL % "1234 * 5678", engine)
    trajs = AgentLoop(policy, tok, box, max_turns=2, max_tokens=200).run([QUESTION], n=3, seed=3)
    b = response_batch([t.prompt_ids for t in trajs], [t.response_ids for t in trajs], tok.pad_token_id)
    with torch.no_grad():
        scored = CausalLMPolicy(model, kernels=kernels).eval().forward_responses(**{k: torch.as_tensor(v) for k, v in b.items()},
                                                                 with_entropy=False, temperature=0.7)["logprobs"]
    for i, t in enumerate(trajs):
        first = t.loss_mask.index(0)  # the first observation token
        second = first + t.loss_mask[first:].index(1)  # the engine's turn, after the observation
        assert second > first and t.turns == 2 and t.tool_calls[0]["error"] is None
        got = scored[i, second: len(t.response_ids)]
        torch.testing.assert_close(got, torch.tensor(t.logprobs[second:]), atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- masks in training
def _actor(tmp_path, tok, algo_overrides=()):
    from omegaconf import OmegaConf

    from rlweave.cluster.worker import WorkerContext, _bind
    from rlweave.config import load_config
    from rlweave.workers.lm_actor import LMActorWorker

    cfg = load_config("grpo-arith", ["model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64",
                                     "algorithm.epochs=1", "algorithm.minibatch_size=8", *algo_overrides])
    tok.save_pretrained(tmp_path / "tok")
    ctx = WorkerContext(group="actor_mask_test", rank=0, world_size=1, slot=None, slot_kind="cpu", num_threads=1, local=True)
    return _bind(LMActorWorker, ctx, (OmegaConf.to_container(cfg.model), str(tmp_path / "tok"),
                                      OmegaConf.to_container(cfg.algorithm), 0, 1.0, {"attention": "eager"}), {})


def _rows(tok, holes: bool, seed=0):
    from rlweave.models.causal_lm import response_batch

    g = torch.Generator().manual_seed(seed)
    prompts = [[5, 6, 7, 8], [9, 10, 11]] * 4
    lengths = [12, 9, 7, 12, 10, 8, 12, 11]
    responses = [torch.randint(20, 250, (n,), generator=g).tolist() for n in lengths]
    b = response_batch(prompts, responses, tok.pad_token_id)
    B, R = b["response_ids"].shape
    valid = np.arange(R)[None, :] < b["resp_len"][:, None]
    loss_mask = valid.astype(np.int8)
    if holes:
        loss_mask[:, 3:6] = 0  # an observation in the middle of every response
    b.update(loss_mask=loss_mask, advantages=torch.randn(B, R, generator=g).numpy() * (valid & loss_mask.astype(bool)),
             rollout_logprobs=np.zeros((B, R), np.float32))
    return b


def _params(worker):
    return {k: v.detach().clone() for k, v in worker.policy.state_dict().items()}


def test_single_turn_rows_with_an_all_ones_loss_mask_train_identically(tmp_path, tok):
    a, b = _actor(tmp_path, tok), _actor(tmp_path, tok)
    rows = _rows(tok, holes=False)
    plain = {k: v for k, v in rows.items() if k != "loss_mask"}
    out_a, out_b = a.update(plain), b.update(rows)
    assert {k: v for k, v in out_a.items() if not k.startswith(("time/", "peak"))} == \
           {k: v for k, v in out_b.items() if not k.startswith(("time/", "peak"))}
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_observation_tokens_carry_no_loss_ratio_kl_or_entropy(tmp_path, tok):
    """Two actors take the same update, one with everything at observation positions perturbed
    (advantages, anchor and reference log-probs): the same loss terms and the same new weights."""
    algo = ["algorithm.kl_coef=0.1", "algorithm.ent_coef=0.01", "algorithm.epochs=2"]
    a, b = _actor(tmp_path, tok, algo), _actor(tmp_path, tok, algo)
    rows = _rows(tok, holes=True)
    scored = a.score(rows)
    assert "ref_logprobs" in scored
    obs = ~rows["loss_mask"].astype(bool)
    noisy = {**rows, **scored}
    noisy = {k: (v + 0.7 * obs if k in ("advantages", "logprobs", "ref_logprobs", "rollout_logprobs") else v) for k, v in noisy.items()}
    clean = {**rows, "old_logprobs": scored["logprobs"], "ref_logprobs": scored["ref_logprobs"]}
    noisy = {**noisy, "old_logprobs": noisy.pop("logprobs")}
    out_a, out_b = a.update(clean), b.update(noisy)
    for k in ("loss_policy", "loss_kl", "loss_entropy", "entropy", "kl", "clip_fraction", "tokens"):
        assert out_a[k] == out_b[k], k
    assert out_a["tokens"] == int((rows["loss_mask"].astype(bool) & (np.arange(rows["response_ids"].shape[1]) < rows["resp_len"][:, None])).sum())
    pa, pb = _params(a), _params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def _steady_adam(*actors):
    """Adam divides by the gradient's own size: where a gradient is ~0, summation-order rounding
    can flip an element's whole step. A large eps keeps the comparison to what was accumulated."""
    for w in actors:
        w._ready()
        for g in w.optimizer.param_groups:
            g["eps"] = 1e-3


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_give_the_update_of_the_whole_minibatch(tmp_path, tok, agg):
    """``algorithm.micro_batch_size`` (gradient accumulation, uneven parts: 3 rows of 8) changes
    the memory an update needs, not the update: the same loss terms and weights, for the RL update
    over multi-turn rows and for a supervised step."""
    algo = ["algorithm.kl_coef=0.1", "algorithm.ent_coef=0.01", "algorithm.epochs=2", f"algorithm.loss_agg={agg}"]
    a, b = _actor(tmp_path, tok, algo), _actor(tmp_path, tok, [*algo, "algorithm.micro_batch_size=3"])
    _steady_adam(a, b)
    rows = _rows(tok, holes=True)
    scored = a.score(rows)
    batch = {**rows, "old_logprobs": scored["logprobs"], "ref_logprobs": scored["ref_logprobs"]}
    out_a, out_b = a.update(batch), b.update(batch)
    for k in ("loss_policy", "loss_kl", "loss_entropy", "entropy", "grad_norm"):
        assert out_b[k] == pytest.approx(out_a[k], rel=1e-4, abs=1e-6), k
    pa, pb = _params(a), _params(b)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-6)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(20, 250, (5, 12), generator=g).numpy()
    target = np.zeros((5, 12), bool)
    target[:, 6:] = True
    target[1, 9:] = False  # rows of unequal target length
    sft = {"input_ids": ids, "attention_mask": np.ones((5, 12), np.int64), "target_mask": target}
    a = _actor(tmp_path, tok, ["algorithm.name=sft", f"algorithm.loss_agg={agg}"])
    b = _actor(tmp_path, tok, ["algorithm.name=sft", f"algorithm.loss_agg={agg}", "algorithm.micro_batch_size=2"])
    _steady_adam(a, b)
    sa, sb = a.sft_update(sft), b.sft_update(sft)
    assert sb["loss_sft"] == pytest.approx(sa["loss_sft"], rel=1e-5)
    pa, pb = _params(a), _params(b)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "gae", "reinforce_pp", "reinforce_pp_baseline"])
def test_token_estimators_skip_observation_tokens(estimator):
    """A row with an observation in the middle gets, on its model tokens, exactly the advantages
    (and returns) of the same row without it; 0 on the observation."""
    from rlweave.algorithms.llm import token_advantages

    g = torch.Generator().manual_seed(0)
    lengths = [5, 3, 6, 4]
    scores, groups = torch.tensor([1.0, 0.0, 0.5, 0.0]), torch.tensor([0, 0, 1, 1])
    plain = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    values, kl = torch.randn(4, 6, generator=g) * plain, torch.rand(4, 6, generator=g) * plain
    holed = torch.zeros(4, 9, dtype=torch.bool)
    cols = [[0, 1] + [c + 3 for c in range(2, n)] for n in lengths]  # 3 observation tokens after 2 model tokens
    v2, k2 = torch.zeros(4, 9), torch.zeros(4, 9)
    for i, c in enumerate(cols):
        holed[i, c], v2[i, c], k2[i, c] = True, values[i, : len(c)], kl[i, : len(c)]
    kw = dict(kl_coef=0.1, gamma=0.9, lam=0.8)
    a1, r1 = token_advantages(estimator, scores, plain, groups, values=values, kl=kl, **kw)
    a2, r2 = token_advantages(estimator, scores, holed, groups, values=v2, kl=k2, **kw)
    for i, c in enumerate(cols):
        torch.testing.assert_close(a2[i, c], a1[i, : len(c)])
        if r1 is not None:
            torch.testing.assert_close(r2[i, c], r1[i, : len(c)])
    assert float(a2[~holed].abs().sum()) == 0.0


def test_generation_from_token_ids_stops_at_any_stop_token_within_each_rows_budget(tok):
    from rlweave.generation.hf_generator import HFGenerator

    gen = HFGenerator(_tiny_model(tok, seed=1), tok, max_new_tokens=10)
    texts = ["What is 1234 * 5678?", "What is 2?"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    a, b = gen.generate(texts, n=2, seed=5), gen.generate_ids(ids, n=2, seed=5)
    assert (a.response_ids, a.logprobs, a.prompt_ids) == (b.response_ids, b.logprobs, b.prompt_ids)
    common = {}  # the two most frequent first tokens become stop tokens: rows must end at them
    for r in gen.generate_ids(ids, n=8, seed=0, max_new_tokens=[10, 3]).response_ids:
        common[r[0]] = common.get(r[0], 0) + 1
    stops = sorted(common, key=common.get)[-2:]
    out = gen.generate_ids(ids, n=8, seed=0, stop_ids=stops, max_new_tokens=[10, 3])
    for row, (r, done) in enumerate(zip(out.response_ids, out.finished)):
        assert len(r) <= (10 if row < 8 else 3)
        hits = [i for i, t in enumerate(r) if t in stops]
        assert done == bool(hits) and (not hits or hits[0] == len(r) - 1)
    assert any(out.finished)


def test_agent_tools_entry_task_names_the_tasks_own_tools():
    from rlweave.agents.rollout import tool_entries
    from rlweave.agents.tools import ToolConfigError
    from rlweave.envs.text_tasks import make_task

    cfg = {"tools": ["task", {"name": "python", "timeout_s": 3}], "tool_timeout_s": 7.0}
    assert tool_entries(cfg, make_task({"name": "calc"})) == [{"name": "calculator", "timeout_s": 7.0},
                                                              {"name": "python", "timeout_s": 3}]
    with pytest.raises(ToolConfigError, match="task 'arithmetic' has none"):
        tool_entries(cfg, make_task({"name": "arithmetic"}))


def test_observations_follow_a_template_that_rewrites_only_the_last_assistant_turn(tok, box):
    """Qwen3's template prefixes the *last* assistant message with an empty think block, so the turn
    renders differently once observations follow; the observation suffix is found after the turn's
    end marker, not by comparing the two renderings' prefixes."""
    from rlweave.models.chat_template import CHAT_TEMPLATE

    qwen3_like = CHAT_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' }}{%- generation %}",
                                       "{{- '<|im_start|>assistant\\n' }}{%- if loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}"
                                       "{%- endif %}{%- generation %}")
    assert qwen3_like != CHAT_TEMPLATE
    messages = QUESTION + [{"role": "assistant", "content": CALL % "1+1"}]
    obs = [{"role": "tool", "name": "calculator", "content": "2"}]
    plain = observation_ids(tok, messages, obs, box.specs())
    tok.chat_template = qwen3_like
    try:
        assert "<think>" in render(tok, messages, box.specs())
        assert observation_ids(tok, messages, obs, box.specs()) == plain
    finally:
        tok.chat_template = CHAT_TEMPLATE
