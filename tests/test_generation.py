"""Hugging Face generation backend: weight sync verified by checksum, seeded sampling, behaviour
log-probs that the trainer reproduces (the train-inference gap)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from rlweave.envs.text_tasks import ArithmeticTask  # noqa: E402
from rlweave.models import flat_params_checksum  # noqa: E402
from rlweave.models.causal_lm import CausalLMPolicy, build_causal_lm, pack_sequences, train_tokenizer  # noqa: E402
from rlweave.workers.generation import HFGenerator  # noqa: E402
from rlweave.workers.weights import pack_state  # noqa: E402

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
    ids, attn, resp = pack_sequences(out.prompt_ids, out.response_ids, tok.pad_token_id)
    with torch.no_grad():
        lp = CausalLMPolicy(actor)(ids, attn, with_entropy=False, temperature=temperature)["logprobs"]
    trainer = lp[resp[:, 1:]]
    behaviour = torch.tensor([x for row in out.logprobs for x in row])
    assert trainer.shape == behaviour.shape
    assert (trainer - behaviour).abs().max().item() < 1e-4  # the gap the workflow logs: ~0 for HF in float32
