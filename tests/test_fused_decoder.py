"""The fused forward of Llama-family decoders computes what the transformers forward computes:
its q/k norm + rotary node against autograd, response scoring and gradients against the Hugging
Face module, sampling token for token, and it declines the models it does not cover."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rlweave.envs.text_tasks import ArithmeticTask  # noqa: E402
from rlweave.models.causal_lm import CausalLMPolicy, apply_lora, build_causal_lm, response_batch, train_tokenizer  # noqa: E402
from rlweave.models.fused_decoder import FusedDecoder, QKNormRope, SiluGate, rope_tables, unsupported_reason  # noqa: E402
from rlweave.generation.hf_generator import HFGenerator  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([p.text + p.answer for p in ArithmeticTask().prompts("train", 1000, seed=0)], vocab_size=300)


def _reference_qk(x, weight, cos, sin, eps):
    """transformers' own pieces: the RMSNorm module's math, then apply_rotary_pos_emb."""
    from transformers.models.qwen3.modeling_qwen3 import rotate_half

    if weight is not None:
        x = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    return x * cos + rotate_half(x) * sin


@pytest.mark.parametrize("normed", [True, False])
def test_qk_norm_rope_matches_the_library_and_its_gradient_is_exact(normed):
    g = torch.Generator().manual_seed(0)
    H, KV = 4, 2  # two query heads share each key/value head
    x = torch.randn(2, 3, H + KV, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(H + KV, 8, dtype=torch.float64, generator=g, requires_grad=True) if normed else None
    positions = torch.tensor([[0, 1, 2], [4, 5, 9]])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    cos, signed_sin = rope_tables(inv_freq, positions, torch.float64)
    emb = torch.cat([positions[..., None] * inv_freq] * 2, -1)
    expected = _reference_qk(x, weight, emb.cos()[:, :, None], emb.sin()[:, :, None], 1e-6)  # [B, T, heads, D]
    q, k = QKNormRope.apply(x, weight, cos, signed_sin, 1e-6, KV)
    assert q.shape == (2, KV, 2 * 3, 8) and k.shape == (2, KV, 3, 8)
    # query head h = kv * G + g sits in rows g * T .. g * T + T - 1 of key/value head kv
    assert torch.allclose(q.view(2, KV, 2, 3, 8).permute(0, 3, 1, 2, 4).reshape(2, 3, H, 8), expected[:, :, :H], atol=1e-12)
    assert torch.allclose(k.transpose(1, 2), expected[:, :, H:], atol=1e-12)
    inputs = (x, weight) if normed else (x,)
    assert torch.autograd.gradcheck(lambda *a: QKNormRope.apply(a[0], a[1] if normed else None, cos, signed_sin, 1e-6, KV), inputs)


def test_silu_gate_matches_autograd_and_its_gradient_is_exact():
    gate_up = torch.randn(3, 4, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    gate, up = gate_up.chunk(2, -1)
    assert torch.allclose(SiluGate.apply(gate_up), torch.nn.functional.silu(gate) * up, atol=1e-12)
    assert torch.autograd.gradcheck(SiluGate.apply, (gate_up,))


def _batch(tok, seed=1):
    prompts = [tok(p.text, add_special_tokens=False)["input_ids"] for p in ArithmeticTask(max_digits=3).prompts("train", 3, seed=seed)]
    g = torch.Generator().manual_seed(seed)
    rows_p = [prompts[i // 3] for i in range(9)]  # prompts of different lengths: left padding is exercised
    rows_r = [torch.randint(5, len(tok), (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist() for _ in range(9)]
    return {k: torch.as_tensor(v) for k, v in response_batch(rows_p, rows_r, tok.pad_token_id).items()}


@pytest.mark.parametrize("arch,extra", [("qwen3", {}), ("qwen2", {}), ("llama", {"attention_bias": True})])
def test_fused_response_scoring_equals_the_transformers_forward(tok, arch, extra):
    model = build_causal_lm(len(tok), arch=arch, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=2)
    for key, value in extra.items():  # llama's attention_bias puts biases on all four projections
        setattr(model.config, key, value)
        if key == "attention_bias":
            torch.manual_seed(2)
            model = type(model)(model.config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:  # norms start at 1 and biases at 0: move them so they matter
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    fused = CausalLMPolicy(model, value_head=True)
    plain = CausalLMPolicy(model, kernels="hf", value_head=True)
    plain.value_head = fused.value_head
    torch.nn.init.normal_(fused.value_head.weight, generator=g)
    assert fused.fused is not None and plain.fused is None
    batch = _batch(tok)
    weights = torch.arange(1.0, 10.0)[:, None]
    results = []
    for policy in (fused, plain):
        out = policy.forward_responses(**batch, temperature=0.8)
        ((out["logprobs"] + out["entropy"] + out["values"]) * weights).sum().backward()
        results.append((out, {n: p.grad.clone() for n, p in policy.named_parameters()}))
        policy.zero_grad()
    (a, grad_a), (b, grad_b) = results
    for key in ("logprobs", "entropy", "values"):
        assert torch.allclose(a[key], b[key], atol=1e-5), key
    assert grad_a.keys() == grad_b.keys()
    for name in grad_a:
        assert (grad_a[name] - grad_b[name]).norm() <= 1e-5 * grad_b[name].norm() + 1e-8, name


def test_fused_sampling_draws_the_tokens_the_transformers_forward_draws(tok):
    model = build_causal_lm(len(tok), arch="qwen3", hidden_size=32, intermediate_size=64, seed=4)
    prompts = [p.text for p in ArithmeticTask(max_digits=3).prompts("train", 3, seed=2)]
    fused = HFGenerator(copy.deepcopy(model), tok, max_new_tokens=9, min_new_tokens=2, top_p=0.9)
    plain = HFGenerator(copy.deepcopy(model), tok, max_new_tokens=9, min_new_tokens=2, top_p=0.9, kernels="hf")
    assert fused.fused is not None and plain.fused is None
    a, b = fused.generate(prompts, n=4, seed=7), plain.generate(prompts, n=4, seed=7)
    assert a.response_ids == b.response_ids and a.finished == b.finished
    assert max(abs(x - y) for p, q in zip(a.logprobs, b.logprobs) for x, y in zip(p, q)) < 1e-5
    greedy_a, greedy_b = fused.generate(prompts, greedy=True), plain.generate(prompts, greedy=True)
    assert greedy_a.response_ids == greedy_b.response_ids
    half = HFGenerator(copy.deepcopy(model).to(torch.bfloat16), tok, max_new_tokens=5)  # bf16 runs the same path
    assert half.fused is not None
    out = half.generate(prompts, n=2, seed=1)
    assert all(torch.isfinite(torch.tensor(lp)).all() for lp in out.logprobs)


def test_models_it_does_not_cover_keep_the_transformers_forward(tok):
    qwen3 = build_causal_lm(len(tok), arch="qwen3", hidden_size=32, intermediate_size=64)
    assert unsupported_reason(qwen3) is None
    assert "LoRA" in unsupported_reason(apply_lora(copy.deepcopy(qwen3), r=2))
    scaled = copy.deepcopy(qwen3.config)
    scaled.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert "rotary" in unsupported_reason(transformers.Qwen3ForCausalLM(scaled))
    windowed = copy.deepcopy(qwen3.config)
    windowed.use_sliding_window, windowed.sliding_window = True, 4
    assert "sliding" in unsupported_reason(transformers.Qwen3ForCausalLM(windowed))
    assert "architecture 'gpt2'" in unsupported_reason(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)))
    with pytest.raises(ValueError, match="FusedDecoder: unsupported model: LoRA"):
        FusedDecoder(apply_lora(copy.deepcopy(qwen3), r=2))
    assert FusedDecoder.build(qwen3, "hf") is None and FusedDecoder.build(qwen3) is not None
    lora = HFGenerator(apply_lora(copy.deepcopy(qwen3), r=2), tok, max_new_tokens=4)
    assert lora.fused is None and len(lora.generate(["What is 1 + 2? "], n=2).response_ids) == 2
