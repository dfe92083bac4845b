"""Causal LMs built from configs: an offline tokenizer, response log-probs, entropy, value head,
padding invariance, LoRA, and the from_pretrained round trip."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from rlweave.envs.text_tasks import ArithmeticTask  # noqa: E402
from rlweave.models.causal_lm import (  # noqa: E402
    CausalLMPolicy,
    apply_lora,
    build_causal_lm,
    merge_lora,
    response_batch,
    save_pretrained,
    select_rows,
    token_logprobs,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [p.text + p.answer for p in ArithmeticTask(ops=("+", "-", "*")).prompts("train", 2000, seed=0)]
    return train_tokenizer(corpus, vocab_size=384)


def test_tokenizer_is_trained_offline_and_round_trips(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert 259 < len(tokenizer) <= 384  # 256 bytes + 3 special tokens + learned merges
    for text in ("What is 12 + 7? Answer: 19", "unseen words ünïcode ✓"):
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: nothing is unknown
    assert len(tokenizer("What is 12 + 7? Answer: ")["input_ids"]) < len("What is 12 + 7? Answer: ")  # merges learned


def test_model_from_config_and_the_size_it_was_asked_for(tokenizer):
    model = build_causal_lm(len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 32
    same = build_causal_lm(len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))  # seeded
    with pytest.raises(ValueError, match="model.arch: unknown architecture 'gpt9'"):
        build_causal_lm(64, arch="gpt9")
    with pytest.raises(ValueError, match="hidden_size"):
        build_causal_lm(64, hidden_size=30, num_heads=4)


def test_logprobs_entropy_and_values(tokenizer):
    model = build_causal_lm(len(tokenizer), hidden_size=32, intermediate_size=64)
    policy = CausalLMPolicy(model, value_head=True)
    ids = torch.tensor([tokenizer("What is 3 + 4? Answer: 7")["input_ids"]])
    mask = torch.ones_like(ids)
    out = policy(ids, mask)
    logits = model(input_ids=ids).logits[:, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(out["logprobs"], expected, atol=1e-5)
    p = torch.softmax(logits, -1)
    assert torch.allclose(out["entropy"], -(p * p.log()).sum(-1), atol=1e-4)
    assert out["values"].shape == ids[:, 1:].shape and torch.all(out["values"] == 0)  # zero-initialised head
    assert torch.allclose(token_logprobs(logits.bfloat16(), ids[:, 1:]), expected, atol=0.1)  # float32 math on bf16 input


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_shared_prompt_scoring_equals_full_rows_in_values_and_gradients(tokenizer, arch):
    policy = CausalLMPolicy(build_causal_lm(len(tokenizer), arch=arch, hidden_size=32, intermediate_size=64, seed=3),
                            value_head=True)
    torch.nn.init.normal_(policy.value_head.weight)
    prompts = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in ArithmeticTask().prompts("train", 3, seed=1)]
    g = torch.Generator().manual_seed(0)
    rows_p = [prompts[i // 3] for i in range(9)]  # three responses of lengths 1..6 to each of three prompts
    rows_r = [torch.randint(5, len(tokenizer), (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
              for _ in range(9)]
    batch = {k: torch.as_tensor(v) for k, v in response_batch(rows_p, rows_r, tokenizer.pad_token_id).items()}
    assert batch["prompt_ids"].shape[0] == 3 and batch["prompt_index"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert batch["response_ids"].shape == (9, max(len(r) for r in rows_r))
    weights = torch.arange(1.0, 10.0)[:, None]
    out = policy.forward_responses(**batch, temperature=0.7)
    ((out["logprobs"] + out["values"]) * weights).sum().backward()
    shared = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()
    for i, (p, r) in enumerate(zip(rows_p, rows_r)):
        ids = torch.tensor([p + r])
        alone = policy(ids, torch.ones_like(ids), temperature=0.7)
        for key in ("logprobs", "entropy", "values"):
            assert torch.allclose(out[key][i, : len(r)], alone[key][0, -len(r):], atol=1e-5), (key, i)
            assert torch.all(out[key][i, len(r):] == 0)  # past the row's end
        ((alone["logprobs"][0, -len(r):] + alone["values"][0, -len(r):]) * weights[i]).sum().backward()
    for name, param in policy.named_parameters():  # the prompt positions get their gradient through the shared keys
        assert (shared[name] - param.grad).norm() <= 1e-5 * param.grad.norm(), name
    part = select_rows(batch, torch.tensor([7, 1, 2]))  # a minibatch: only its prompts, re-indexed
    assert part["prompt_ids"].shape[0] == 2 and part["prompt_index"].tolist() == [1, 0, 0]
    assert torch.equal(part["response_ids"], batch["response_ids"][[7, 1, 2]])


def test_left_padded_batch_scores_each_sequence_as_alone(tokenizer):
    policy = CausalLMPolicy(build_causal_lm(len(tokenizer), hidden_size=32, intermediate_size=64))
    a = tokenizer("What is 3 + 4? Answer: 7")["input_ids"]
    b = tokenizer("What is 12 * 11? Answer: 132")["input_ids"]
    width = max(len(a), len(b))
    ids = torch.tensor([[0] * (width - len(a)) + a, [0] * (width - len(b)) + b])
    mask = (torch.arange(width)[None] >= torch.tensor([[width - len(a)], [width - len(b)]])).long()
    batch = policy(ids, mask)["logprobs"]
    for row, seq in enumerate((a, b)):
        alone = policy(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))["logprobs"][0]
        assert torch.allclose(batch[row, width - len(seq):], alone, atol=1e-5)


def test_lora_trains_only_adapters_merges_and_round_trips(tokenizer, tmp_path):
    base = build_causal_lm(len(tokenizer), hidden_size=32, intermediate_size=64)
    lora = apply_lora(base, r=4, alpha=8)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)  # adapters start at zero; move them so merging has something to fold in
    ids = torch.tensor([tokenizer("What is 5 - 2? Answer: 3")["input_ids"]])
    with torch.no_grad():
        before = lora(input_ids=ids).logits
        merged = merge_lora(lora)
        after = merged(input_ids=ids).logits
    assert torch.allclose(before, after, atol=1e-5)
    import transformers

    path = save_pretrained(merged, tokenizer, tmp_path / "ckpt")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, after, atol=1e-6)
    assert transformers.AutoTokenizer.from_pretrained(path)("What is")["input_ids"] == tokenizer("What is")["input_ids"]


def test_actor_strategy_and_training_attention_choices():
    from rlweave.models.causal_lm import EAGER_MAX_TOKENS, train_attention
    from rlweave.workers.lm_actor import choose_strategy

    # auto replicates while weight, gradient and two Adam moments (16 bytes a parameter) fit
    assert choose_strategy("auto", 1_000_000, 2.0) == "ddp"
    assert choose_strategy("auto", 2 * (1 << 30) // 16, 2.0) == "ddp"
    assert choose_strategy("auto", 2 * (1 << 30) // 16 + 1, 2.0) == "fsdp"
    assert choose_strategy("fsdp", 10, 2.0) == "fsdp" and choose_strategy("ddp", 10**12, 2.0) == "ddp"
    assert train_attention("auto", "cpu", 22) == "eager"
    assert train_attention("auto", "cpu", EAGER_MAX_TOKENS + 1) is None  # the model's own (sdpa)
    assert train_attention("auto", "cuda", 22) is None
    assert train_attention("sdpa", "cpu", 22) == "sdpa"
