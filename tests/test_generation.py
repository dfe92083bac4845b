"""Hugging Face generation backend: weight sync verified by checksum, seeded sampling, behaviour
log-probs that the trainer reproduces (the train-inference gap)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from rlweave.envs.text_tasks import ArithmeticTask  # noqa: E402
from rlweave.models import flat_params_checksum  # noqa: E402
from rlweave.models.causal_lm import CausalLMPolicy, build_causal_lm, response_batch, train_tokenizer  # noqa: E402
from rlweave.generation.hf_generator import HFGenerator  # noqa: E402
from rlweave.sync.weights import pack_state  # noqa: E402

TASK = ArithmeticTask()


@pytest.fixture(scope="module")
def setup():
    tok = train_tokenizer([p.text + p.answer for p in TASK.prompts("train", 500, seed=0)], vocab_size=300)
    actor = build_causal_lm(len(tok), hidden_size=32, intermediate_size=64, seed=1)
    rollout_model = build_causal_lm(len(tok), hidden_size=32, intermediate_size=64, seed=2)  # other weights until synced
    return tok, actor, rollout_model


def test_weights_after_sync_equal_the_actors(setup):
    tok, actor, rollout_model = setup
    gen = HFGenerator(copy.deepcopy(rollout_model), tok)
    assert flat_params_checksum(gen.model) != flat_params_checksum(actor)
    packet = pack_state(actor, version=7, bucket_bytes=4096)  # small buckets: many of them
    assert len(packet.buckets) > 3
    assert gen.load_weights(packet) == packet.checksum == flat_params_checksum(actor)
    assert gen.version == 7
    for (na, a), (nb, b) in zip(actor.state_dict().items(), gen.model.state_dict().items()):
        assert na == nb and torch.equal(a, b)


def test_bfloat16_weights_travel_bit_exactly(setup):
    tok, actor, _ = setup
    bf = copy.deepcopy(actor).to(torch.bfloat16)
    gen = HFGenerator(build_causal_lm(len(tok), hidden_size=32, intermediate_size=64, seed=5).to(torch.bfloat16), tok)
    assert gen.load_weights(pack_state(bf, version=1)) == flat_params_checksum(bf)


def test_sampling_is_seeded_and_grouped(setup):
    tok, actor, _ = setup
    gen = HFGenerator(copy.deepcopy(actor), tok, max_new_tokens=6, temperature=1.0)
    prompts = [p.text for p in TASK.prompts("train", 3, seed=1)]
    a, b, c = gen.generate(prompts, n=4, seed=5), gen.generate(prompts, n=4, seed=5), gen.generate(prompts, n=4, seed=6)
    assert a.response_ids == b.response_ids and a.response_ids != c.response_ids
    assert a.group == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2] and len(a.prompt_ids) == 12
    assert a.prompt_ids[0] == tok(prompts[0], add_special_tokens=False)["input_ids"]
    for r, lp, fin in zip(a.response_ids, a.logprobs, a.finished):
        assert len(r) == len(lp) and 1 <= len(r) <= 6
        assert fin == (r[-1] == tok.eos_token_id)
    with pytest.raises(ValueError, match="rollout.temperature"):
        HFGenerator(actor, tok, temperature=0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_reproduces_the_behaviour_logprobs(setup, temperature):
    tok, actor, _ = setup
    gen = HFGenerator(copy.deepcopy(actor), tok, max_new_tokens=8, temperature=temperature)
    out = gen.generate([p.text for p in TASK.prompts("train", 4, seed=2)], n=2, seed=0)
    b = {k: torch.as_tensor(v) for k, v in response_batch(out.prompt_ids, out.response_ids, tok.pad_token_id).items()}
    assert b["prompt_ids"].shape[0] == 4 and b["prompt_index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    with torch.no_grad():
        lp = CausalLMPolicy(actor).forward_responses(**b, with_entropy=False, temperature=temperature)["logprobs"]
    trainer = lp[torch.arange(lp.shape[1])[None, :] < b["resp_len"][:, None]]
    behaviour = torch.tensor([x for row in out.logprobs for x in row])
    assert trainer.shape == behaviour.shape
    assert (trainer - behaviour).abs().max().item() < 1e-4  # the gap the workflow logs: ~0 for HF in float32


def test_greedy_decoding_matches_hugging_face_generate(setup):
    tok, actor, _ = setup
    gen = HFGenerator(copy.deepcopy(actor), tok, max_new_tokens=7)
    prompts = [p.text for p in TASK.prompts("train", 5, seed=3)]  # prompts of several lengths: left padding
    out = gen.generate(prompts, n=2, greedy=True)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        ref = actor.generate(**enc, do_sample=False, max_new_tokens=7, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[:, enc["input_ids"].shape[1]:].tolist()
    expected = [r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in ref]
    assert out.response_ids == [r for r in expected for _ in range(2)]


def test_nucleus_and_min_length_shape_the_distribution_the_logprobs_come_from(setup):
    tok, actor, _ = setup
    gen = HFGenerator(copy.deepcopy(actor), tok, top_p=0.7, min_new_tokens=2)
    logits = torch.full((1, len(tok)), -30.0)
    logits[0, 10:14] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    logits[0, tok.eos_token_id] = 5.0  # most likely, but suppressed for the first two tokens
    p = gen._processed_logprobs(logits, step=0, greedy=False).exp()[0]
    assert p[10:14].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-6) and p.sum().item() == pytest.approx(1.0)
    p = gen._processed_logprobs(logits, step=2, greedy=False).exp()[0]
    assert p[tok.eos_token_id].item() == pytest.approx(1.0, abs=1e-3)  # allowed again: all of the nucleus
    out = HFGenerator(copy.deepcopy(actor), tok, max_new_tokens=5, min_new_tokens=5).generate(["What is 1 + 1? "], n=8)
    assert all(len(r) == 5 and tok.eos_token_id not in r[:4] for r in out.response_ids)
