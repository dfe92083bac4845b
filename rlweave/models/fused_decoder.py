"""A leaner forward pass for Llama-family decoders (Qwen2, Qwen3, Llama) on CPU.

Why it exists: RL post-training runs the same small decoder thousands of times, and on a CPU
the ``transformers`` forward spends much of a pass outside arithmetic. A decode step of the
4-layer Qwen3 of the GRPO benchmark (64 rows) takes about 6.5 ms in the Hugging Face module and
4.3 ms here: its Python layers (mask builders, output capturing, cache objects, per-module
dispatch) cost about as much as the matmuls. In a training pass the cost is memory traffic
instead: Qwen3's per-head RMSNorm and the rotary embedding run over the query/key tensors (the
widest of the pass) as a dozen separate elementwise kernels, and autograd adds as many again.
Here they are one autograd function with a hand-derived backward (:class:`QKNormRope`, about
half the passes over those tensors), q/k and gate/up projections are single matmuls, and
attention reads grouped key/value heads without repeating them.

What it is not: a second model. It reads the Hugging Face module's own parameters at every
call (optimizer steps, weight loads and shared weights are seen at once; ``save_pretrained``,
LoRA and everything else stay the library's), computes the same function (tested against the
module's forward: log-probs and gradients), and declines any model it does not cover
(:func:`unsupported_reason`), which then runs through ``transformers`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FusedDecoder", "QKNormRope", "queries_and_keys", "SiluGate", "silu_gate", "DecodeCache", "unsupported_reason", "prompt_bias", "extension_bias"]

_ARCHITECTURES = {"qwen2", "qwen3", "llama"}


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`FusedDecoder` cannot run ``model`` (None: it can)."""
    if hasattr(model, "peft_config") or hasattr(model, "get_base_model"):
        return "LoRA adapters (peft) wrap its layers"
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in _ARCHITECTURES:
        return f"architecture {kind!r} (covered: {', '.join(sorted(_ARCHITECTURES))})"
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers") or not hasattr(model, "lm_head"):
        return "not a *ForCausalLM module with .model.layers and .lm_head"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp"
    rope = getattr(base, "rotary_emb", None)
    if rope is None or getattr(rope, "rope_type", "default") != "default" or getattr(rope, "attention_scaling", 1.0) != 1.0:
        return "a rotary embedding other than the default"
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return "sliding-window attention"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "sharded parameters (FSDP)"
    return None


# --------------------------------------------------------------------------- q/k norm + rotary
def _rotate_add_(out: Tensor, y: Tensor, sin: Tensor) -> Tensor:
    """``out += rotate_half(y) * sin`` in place, by halves (``sin`` sign-folded: its first half
    negated, so no negated copy of ``y`` is made)."""
    half = y.shape[-1] // 2
    out[..., :half].addcmul_(y[..., half:], sin[..., :half])
    out[..., half:].addcmul_(y[..., :half], sin[..., half:])
    return out


def _rotate_add_transposed_(out: Tensor, g: Tensor, sin: Tensor) -> Tensor:
    """The adjoint of :func:`_rotate_add_`: ``out += rotate_half^T(g * sin)``."""
    half = g.shape[-1] // 2
    out[..., :half].addcmul_(g[..., half:], sin[..., half:])
    out[..., half:].addcmul_(g[..., :half], sin[..., :half])
    return out


def _queries_and_keys(x: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float, kv_heads: int
                      ) -> tuple[Tensor, Tensor, Tensor | None]:
    """:class:`QKNormRope`'s forward arithmetic; also returns the norm's reciprocal scale r."""
    B, T, N, D = x.shape
    r = None
    y = x
    if weight is not None:
        r = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(D).add_(eps))
        y = (x * r).mul_(weight)
    H = N - kv_heads
    G = H // kv_heads
    q = x.new_empty(B, kv_heads, G, T, D)
    k = x.new_empty(B, kv_heads, T, D)
    q_rows, k_rows = q.permute(0, 3, 1, 2, 4), k.transpose(1, 2)  # the outputs seen as [B, T, heads, D]
    y_q = y[:, :, :H].unflatten(2, (kv_heads, G))
    cos5, sin5 = cos[:, :, None], sin[:, :, None]
    _rotate_add_(torch.mul(y_q, cos5, out=q_rows), y_q, sin5)
    _rotate_add_(torch.mul(y[:, :, H:], cos, out=k_rows), y[:, :, H:], sin)
    return q.view(B, kv_heads, G * T, D), k, r


def queries_and_keys(x: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float, kv_heads: int
                     ) -> tuple[Tensor, Tensor]:
    """:class:`QKNormRope` where a gradient is wanted; the bare arithmetic otherwise (decoding:
    no autograd node to build, ~90 us a call)."""
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return QKNormRope.apply(x, weight, cos, sin, eps, kv_heads)
    return _queries_and_keys(x, weight, cos, sin, eps, kv_heads)[:2]


class QKNormRope(torch.autograd.Function):
    """Queries and keys for attention, as one autograd node: ``rope(rms_norm(x) * weight)`` over
    the last dimension (``rope(x)`` when ``weight`` is None: Qwen2 and Llama have no q/k norm),
    written straight into the layouts the attention matmuls read.

    ``x`` [B, T, H + KV, D] (the q|k projection, query heads first), ``weight`` [H + KV, D],
    ``cos``/``sin`` [B, T, 1, D] with ``sin`` sign-folded (see :func:`rope_tables`). Returns
    queries [B, KV, G * T, D] (the G = H / KV query heads that share a key/value head stacked
    along the rows) and keys [B, KV, T, D]. The backward is derived by hand: for
    y = x * r * w with r = (mean(x^2) + eps)^-1/2, dx = r * gw - x * r^3 * <gw, x> / D where
    gw = dL/dy * w."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float, kv_heads: int
                ) -> tuple[Tensor, Tensor]:
        q, k, r = _queries_and_keys(x, weight, cos, sin, eps, kv_heads)
        ctx.save_for_backward(cos, sin, *(() if weight is None else (x, weight, r)))
        ctx.kv_heads = kv_heads
        return q, k

    @staticmethod
    def backward(ctx, g_q: Tensor, g_k: Tensor):
        cos, sin, *saved = ctx.saved_tensors
        KV = ctx.kv_heads
        B, _, GT, D = g_q.shape
        T = g_k.shape[2]
        G = GT // T
        H = KV * G
        gy = g_q.new_empty(B, T, H + KV, D)
        g_q_rows = g_q.reshape(B, KV, G, T, D).permute(0, 3, 1, 2, 4)
        gy_q = gy[:, :, :H].unflatten(2, (KV, G))
        cos5, sin5 = cos[:, :, None], sin[:, :, None]
        _rotate_add_transposed_(torch.mul(g_q_rows, cos5, out=gy_q), g_q_rows, sin5)
        g_k_rows = g_k.transpose(1, 2)
        _rotate_add_transposed_(torch.mul(g_k_rows, cos, out=gy[:, :, H:]), g_k_rows, sin)
        if not saved:
            return gy, None, None, None, None, None
        x, weight, r = saved
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (gy * x).mul_(r).sum(tuple(range(x.dim() - weight.dim())))
        gw = gy.mul_(weight)
        dot = torch.linalg.vecdot(gw, x).unsqueeze(-1)
        dx = gw.mul_(r).addcmul_(x, dot.mul_(r.pow(3)).div_(-D))
        return dx, dw, None, None, None, None


class SiluGate(torch.autograd.Function):
    """``silu(gate) * up`` of the fused gate|up projection [..., 2I], as one autograd node whose
    backward writes both halves of the gradient into one tensor (autograd's slices would each
    zero-fill a full-width gradient and add them)."""

    @staticmethod
    def forward(ctx, gate_up: Tensor) -> Tensor:
        gate, up = gate_up.chunk(2, -1)
        activated = F.silu(gate)
        ctx.save_for_backward(gate, up, activated)
        return activated * up

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        gate, up, activated = ctx.saved_tensors
        grad = g.new_empty(*g.shape[:-1], 2 * g.shape[-1])
        d_gate, d_up = grad.chunk(2, -1)
        torch.ops.aten.silu_backward.grad_input(torch.mul(g, up), gate, grad_input=d_gate)
        torch.mul(g, activated, out=d_up)
        return grad


def silu_gate(gate_up: Tensor) -> Tensor:
    """:class:`SiluGate` where a gradient is wanted, the bare arithmetic otherwise."""
    if torch.is_grad_enabled() and gate_up.requires_grad:
        return SiluGate.apply(gate_up)
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate).mul_(up)


def rope_tables(inv_freq: Tensor, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``cos`` and sign-folded ``sin`` [B, T, 1, D] for ``positions`` [B, T] (the default rotary
    embedding, as ``transformers`` computes it: in float32, then cast)."""
    freqs = positions[..., None].float() * inv_freq.float()
    emb = torch.cat([freqs, freqs], -1)
    half = freqs.shape[-1]
    sin = emb.sin()
    sin[..., :half].neg_()
    return emb.cos().to(dtype)[:, :, None], sin.to(dtype)[:, :, None]


# --------------------------------------------------------------------------- masks and caches
def prompt_bias(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Additive attention bias [U, P, P] of left-padded prompts: causal, padding keys masked. A
    padding query attends to itself only (its output is never read; an all-masked row would make
    NaNs that reach the gradients through 0 * NaN)."""
    P = mask.shape[1]
    valid = mask.bool()
    allowed = torch.ones(P, P, dtype=torch.bool, device=mask.device).tril() & valid[:, None, :]
    allowed |= torch.eye(P, dtype=torch.bool, device=mask.device) & ~valid[:, :, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(~allowed, float("-inf"))


def extension_bias(key_mask: Tensor, T: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Additive bias [B, T, L] of T new tokens attending to ``key_mask`` [B, L] (the last T keys
    are their own, causal)."""
    B, L = key_mask.shape
    allowed = key_mask.bool()[:, None, :].expand(B, T, L).clone()
    allowed[:, :, L - T:] &= torch.ones(T, T, dtype=torch.bool, device=key_mask.device).tril()
    return torch.zeros(allowed.shape, dtype=dtype, device=key_mask.device).masked_fill_(~allowed, float("-inf"))


@dataclass
class DecodeCache:
    """Keys and values for decoding ``n`` samples per prompt, one new token per step.

    Why this layout: in RL every prompt is sampled ``n`` times, and a decode step of a small model
    is bound by reading keys and values, not by arithmetic. The prompts' keys/values stay as the
    prefill made them, once per prompt [U, kv_heads, P, D], and the samples of one prompt attend to
    them together (one matmul of n x group queries per prompt and head, instead of n copies of the
    prompt read one row at a time); only the generated tokens' keys/values are per row, in a
    preallocated [B, kv_heads, capacity, D] buffer a step writes its column into. Rows are grouped
    by prompt (row b samples prompt b // n), as :meth:`HFGenerator.generate_ids` lays them out.
    The softmax runs over the prompt's and the row's keys together, so the result is the same
    attention as over one concatenated cache, up to float summation order."""

    prefix: list[tuple[Tensor, Tensor]]  # per layer: the prompts' keys, values [U, kv_heads, P, D]
    prefix_bias: Tensor  # [U, 1, 1, 1, P] additive: 0 for prompt tokens, -inf for left padding
    keys: list[Tensor]  # per layer: generated tokens' keys [B, kv_heads, capacity, D]
    values: list[Tensor]
    n: int  # rows per prompt
    length: int = 0  # generated positions filled

    @classmethod
    def from_prefill(cls, kvs: list[tuple[Tensor, Tensor]], mask: Tensor, n: int, capacity: int) -> "DecodeCache":
        """The cache after a prefill of left-padded prompts (``mask`` [U, P]), for ``n`` rows each."""
        U, KV, _, D = kvs[0][0].shape
        k0 = kvs[0][0]
        bias = torch.zeros(mask.shape, dtype=k0.dtype, device=k0.device).masked_fill_(~mask.bool(), float("-inf"))
        shape = (U * n, KV, capacity, D)
        return cls([(k.contiguous(), v.contiguous()) for k, v in kvs], bias[:, None, None, None],
                   [torch.empty(shape, dtype=k0.dtype, device=k0.device) for _ in kvs],
                   [torch.empty(shape, dtype=k0.dtype, device=k0.device) for _ in kvs], int(n))

    def attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        """Layer ``i``'s attention for one new token per row: ``q`` [B, kv_heads, G, D], this
        token's ``k``, ``v`` [B, kv_heads, 1, D] (written at ``length``; the caller advances it).
        Returns the attention output [B, kv_heads, G, D]."""
        B, KV, G, D = q.shape
        n, end = self.n, self.length + 1
        U = B // n
        self.keys[i][:, :, self.length:end] = k
        self.values[i][:, :, self.length:end] = v
        pk, pv = self.prefix[i]
        P = pk.shape[2]
        by_prompt = q.view(U, n, KV, G, D).transpose(1, 2).reshape(U, KV, n * G, D)  # the n samples' queries together
        s_prompt = torch.matmul(by_prompt, pk.transpose(-1, -2)).view(U, KV, n, G, P)
        s_prompt = torch.add(self.prefix_bias, s_prompt, alpha=scale).transpose(1, 2).reshape(B, KV, G, P)
        s_own = torch.matmul(q, self.keys[i][:, :, :end].transpose(-1, -2)) * scale  # [B, KV, G, end]
        probs = torch.softmax(torch.cat([s_prompt, s_own], -1), -1, dtype=torch.float32).to(q.dtype)
        p_prompt = probs[..., :P].reshape(U, n, KV, G, P).transpose(1, 2).reshape(U, KV, n * G, P)
        o = torch.matmul(p_prompt, pv).view(U, KV, n, G, D).transpose(1, 2).reshape(B, KV, G, D)
        return o.add_(torch.matmul(probs[..., P:], self.values[i][:, :, :end]))


# --------------------------------------------------------------------------- the decoder
class FusedDecoder:
    """The forward pass of a Hugging Face Llama-family causal LM, leaner (see the module doc).

    ``forward`` returns the final-normed hidden states (what the LM head and a value head read)
    and each layer's keys/values, so callers can score responses against a prompt encoded once
    (training) or decode through a :class:`DecodeCache` (generation)."""

    def __init__(self, model: nn.Module):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder: unsupported model: {reason}")
        self.model = model
        cfg = model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps

    @classmethod
    def build(cls, model: nn.Module, choice: str = "auto") -> "FusedDecoder | None":
        """The fused forward when ``choice`` (``model.kernels``) allows it and the model is covered
        and on CPU; None otherwise (the caller keeps the ``transformers`` forward)."""
        if choice == "hf" or unsupported_reason(model) is not None:
            return None
        if next(model.parameters()).device.type != "cpu":
            return None  # on GPUs the library's fused attention kernels are the better path
        return cls(model)

    @property
    def layers(self):
        return self.model.model.layers

    def weights(self, decoding: bool = False) -> list[dict]:
        """Each layer's projections as the fused pass uses them (q|k and gate|up concatenated;
        ``decoding``: q|k|v too). Built from the live parameters, so they carry gradients; a
        generation builds them once under ``no_grad`` and reuses them for every decode step."""
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        out = []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            q_norm = getattr(a, "q_norm", None)
            out.append({
                "n1": layer.input_layernorm.weight, "n2": layer.post_attention_layernorm.weight,
                "o": a.o_proj.weight, "o_bias": a.o_proj.bias,
                "qk_norm": None if q_norm is None else torch.cat([q_norm.weight.expand(H, D), a.k_norm.weight.expand(KV, D)]),
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), "down": mlp.down_proj.weight,
            })
            biased = a.q_proj.bias is not None
            if decoding:
                out[-1]["qkv"] = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                out[-1]["qkv_bias"] = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if biased else None
            else:
                out[-1]["qk"] = torch.cat([a.q_proj.weight, a.k_proj.weight])
                out[-1]["qk_bias"] = torch.cat([a.q_proj.bias, a.k_proj.bias]) if biased else None
                out[-1].update(v=a.v_proj.weight, v_bias=a.v_proj.bias)
        return out

    def forward(self, ids: Tensor, positions: Tensor, bias: Tensor | None, past: list[tuple[Tensor, Tensor]] | None = None,
                cache: DecodeCache | None = None, weights: list[dict] | None = None,
                rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Hidden states [B, T, hidden] after the final norm, and this pass's keys/values per layer
        [B, kv_heads, T, D].

        ``bias`` [B, T, L]: additive attention bias over the L keys (``past``'s, then these T
        tokens; None with ``cache``). ``past``: keys/values to prepend per layer (training:
        differentiable). ``cache``: decoding one token per row (:class:`DecodeCache`); its keys and
        values are written at ``cache.length`` (the caller advances it). ``rope``: :func:`rope_tables` of
        ``positions``, when the caller has them (a generation computes all its steps' at once)."""
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        G = H // KV
        B, T = ids.shape
        base = self.model.model
        emb = base.embed_tokens
        x = F.embedding(ids, emb.weight, emb.padding_idx)
        cos, sin = rope or rope_tables(base.rotary_emb.inv_freq, positions, x.dtype)
        if cache is None:
            bias = bias.to(x.dtype)[:, None, None]  # [B, 1, 1, T, L]: broadcast over kv heads and groups
        elif T != 1:
            raise ValueError(f"FusedDecoder.forward: a DecodeCache takes one token per row, got {T}")
        scale = D ** -0.5
        kvs = []
        for i, w in enumerate(weights or self.weights()):
            h = F.rms_norm(x, (x.shape[-1],), w["n1"], self.eps)
            if "qkv" in w:  # decoding: one matmul; no gradient has to flow back through the slices
                qkv = F.linear(h, w["qkv"], w["qkv_bias"])
                qk, v = qkv[..., :(H + KV) * D].view(B, T, H + KV, D), qkv[..., (H + KV) * D:]
            else:
                qk = F.linear(h, w["qk"], w["qk_bias"]).view(B, T, H + KV, D)
                v = F.linear(h, w["v"], w["v_bias"])
            q, k = queries_and_keys(qk, w["qk_norm"], cos, sin, self.eps, KV)  # [B, KV, G*T, D], [B, KV, T, D]
            v = v.view(B, T, KV, D).transpose(1, 2)
            kvs.append((k, v))
            if cache is not None:  # decoding: one token, the cache's prompt-shared attention
                o = cache.attend(i, q, k, v, scale).view(B, KV, G, T, D).permute(0, 3, 1, 2, 4)
            else:
                if past is not None:
                    k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
                scores = torch.add(bias, torch.matmul(q, k.transpose(-1, -2)).view(B, KV, G, T, -1), alpha=scale)
                probs = torch.softmax(scores, -1, dtype=torch.float32).to(x.dtype)
                o = torch.matmul(probs.view(B, KV, G * T, -1), v).view(B, KV, G, T, D).permute(0, 3, 1, 2, 4)
            x = x + F.linear(o.reshape(B, T, H * D), w["o"], w["o_bias"])
            h = F.rms_norm(x, (x.shape[-1],), w["n2"], self.eps)
            x = x + F.linear(silu_gate(F.linear(h, w["gate_up"])), w["down"])
        return F.rms_norm(x, (x.shape[-1],), base.norm.weight, self.eps), kvs

    def logits(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden)
