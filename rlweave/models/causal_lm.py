"""Causal language models for RL post-training: Hugging Face architectures, built from a config
with random weights (nothing can be downloaded on the machines rlweave is developed on) or loaded
from a local checkpoint folder with ``from_pretrained`` (the path users take with real models).

* :func:`train_tokenizer`: a byte-level BPE trained offline on a corpus in about a second
  (``tokenizers``), wrapped as a ``transformers`` fast tokenizer with pad/eos tokens.
* :func:`build_causal_lm`: a Qwen2/Qwen3/Llama model of a given size with random weights.
* :class:`CausalLMPolicy`: the training-side wrapper: per-token log-probabilities of the response
  tokens, their entropy, and an optional value head (PPO's token-level critic).
  ``forward_responses`` scores a batch of responses with every distinct prompt encoded once
  (GRPO's n responses per prompt share one prompt pass; see :func:`response_batch`).
* :func:`apply_lora` / :func:`merge_lora`: LoRA adapters through ``peft``.

``transformers`` (and ``peft`` for LoRA) are the ``llm`` extra; importing rlweave never needs them.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["require_transformers", "train_tokenizer", "load_tokenizer", "build_causal_lm", "load_causal_lm",
           "CausalLMPolicy", "token_logprobs", "cache_argument", "prefill_prompts", "response_batch", "select_rows", "apply_lora", "merge_lora", "merged_state_dict",
           "save_pretrained"]

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>")


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("language models need Hugging Face transformers: pip install 'rlweave[llm]'") from None
    return transformers


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, min_frequency: int = 1, split_digits: bool = True):
    """A byte-level BPE tokenizer trained on ``texts``, as a ``PreTrainedTokenizerFast`` whose
    ``<pad>``, ``<eos>`` and ``<bos>`` are ids 0, 1, 2. Byte-level: every string encodes, none
    maps to an unknown token. ``split_digits``: every digit is its own token (as in Qwen's and
    Llama's vocabularies), so numbers are never merged into arbitrary multi-digit pieces, which
    makes arithmetic far harder to learn."""
    transformers = require_transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


_ARCHS = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig"}


def build_causal_lm(vocab_size: int, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    num_kv_heads: int = 2, intermediate_size: int = 128, max_positions: int = 256, seed: int = 0,
                    pad_token_id: int = 0, eos_token_id: int = 1, bos_token_id: int = 2, tie_embeddings: bool = True):
    """A ``transformers`` causal LM of architecture ``arch`` with random weights (seeded)."""
    transformers = require_transformers()
    if arch not in _ARCHS:
        raise ValueError(f"model.arch: unknown architecture {arch!r}; known: {', '.join(_ARCHS)}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"model: hidden_size ({hidden_size}) must split into num_heads ({num_heads}), "
                         f"and num_heads into num_kv_heads ({num_kv_heads})")
    config = getattr(transformers, _ARCHS[arch])(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size, max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings, pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model


def load_tokenizer(path: str | Path):
    """A tokenizer saved in a local folder (``save_pretrained`` layout); a pad token is added
    from eos when it has none (batched generation and training pad)."""
    transformers = require_transformers()
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_causal_lm(spec: dict, vocab_size: int, seed: int = 0, tokenizer=None):
    """The model a run's ``model`` config section describes: ``from_pretrained(spec["path"])``
    when a local folder is given (what users do with real models), else the architecture built
    from the section's sizes with random weights, seeded. ``lora_rank`` > 0 wraps it with LoRA."""
    transformers = require_transformers()
    dtype = _DTYPES[spec.get("dtype", "float32")]
    if spec.get("path"):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(spec["path"]), dtype=dtype)
    else:
        ids = {} if tokenizer is None else {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
                                            "bos_token_id": tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id}
        model = build_causal_lm(vocab_size, arch=spec["arch"], hidden_size=spec["hidden_size"], num_layers=spec["num_layers"],
                                num_heads=spec["num_heads"], num_kv_heads=spec["num_kv_heads"],
                                intermediate_size=spec["intermediate_size"], max_positions=spec["max_positions"], seed=seed,
                                **ids).to(dtype)
    if spec.get("lora_rank", 0):
        model = apply_lora(model, r=spec["lora_rank"], alpha=spec.get("lora_alpha", 16))
    return model


EAGER_MAX_TOKENS = 256  # auto attention: eager up to this sequence length on CPU


def train_attention(choice: str, device_type: str, max_tokens: int) -> str | None:
    """The attention implementation for training passes (``actor.attention``); ``None`` keeps the
    model's own. ``auto``: eager on CPU when no sequence exceeds ``EAGER_MAX_TOKENS`` -- at these
    sizes the score matrices are tiny and the fused CPU kernel's fixed cost per call dominates
    (measured on a 4-layer Qwen3, 64 responses of 16 tokens: 0.22 s against 0.25 s per update) --
    the fused kernel (sdpa) otherwise. Callers pass ``max_tokens=0`` for SFT, whose packed rows
    carry a 4-D block mask that only the fused kernel reads as intended."""
    if choice != "auto":
        return choice
    return "eager" if device_type == "cpu" and 0 < max_tokens <= EAGER_MAX_TOKENS else None


def set_attention(model: nn.Module, implementation: str | None) -> None:
    """Switches a (possibly LoRA-wrapped) Hugging Face model's attention implementation."""
    if implementation is not None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.set_attn_implementation(implementation)


def cache_argument(model: nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: ``cache`` from transformers 5.24,
    ``past_key_values`` before (the vLLM extra pins an older transformers)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_keyword(type(base))


@functools.lru_cache(maxsize=None)
def _cache_keyword(cls: type) -> str:  # once per model class: it is asked on every forward
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def prefill_prompts(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, rows: Tensor, cache,
                    output_hidden_states: bool = False):
    """Runs the distinct (left-padded) prompts through ``model`` once and writes prompt ``rows[i]``'s
    keys and values into row i of ``cache`` (a ``DynamicCache`` or a ``StaticCache``): the one
    prefill shared by every response to a prompt, in training and in generation. Returns the
    prompt pass's output (last position only) and the prompts' position ids."""
    from transformers import DynamicCache

    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    prefill = DynamicCache()
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=pos, **{cache_argument(model): prefill},
                use_cache=True, logits_to_keep=1, output_hidden_states=output_hidden_states)
    slots = {"cache_position": torch.arange(prompt_ids.shape[1], device=prompt_ids.device)}
    for layer_idx, layer in enumerate(prefill.layers):
        cache.update(layer.keys[rows], layer.values[rows], layer_idx, slots)
    return out, pos


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """``log softmax(logits)[..., token]``: ``logits`` [B, T, V], ``tokens`` [B, T] -> [B, T], in
    float32 whatever the logits' dtype (log-prob differences of bf16 logits are too coarse)."""
    logits = logits.float()
    return torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


class CausalLMPolicy(nn.Module):
    """A causal LM as an RL policy over response tokens.

    ``forward(input_ids, attention_mask)`` returns, for every position t >= 1, the log-probability
    of token t given tokens < t (``logprobs`` [B, T-1]), the entropy of that next-token
    distribution (``entropy`` [B, T-1]) and, with ``value_head``, a value per position (``values``
    [B, T-1], the value of the state *before* token t). Losses mask them with the response mask
    (shifted the same way). Position ids follow the attention mask, so a left-padded batch scores
    each sequence as it would alone."""

    def __init__(self, model: nn.Module, value_head: bool = False, kernels: str = "auto"):
        """``kernels`` (``model.kernels``): ``auto`` scores responses with
        :class:`~rlweave.models.fused_decoder.FusedDecoder` when it covers the model, ``hf``
        always with the ``transformers`` forward."""
        super().__init__()
        from rlweave.models.fused_decoder import FusedDecoder

        self.model = model
        self.fused = FusedDecoder.build(model, kernels)
        hidden = model.config.hidden_size
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool = True,
                temperature: float = 1.0, position_ids: Tensor | None = None) -> dict[str, Tensor]:
        """``temperature``: score under the sampling distribution the rollout used (logits / T).
        ``position_ids`` and a 4-D ``attention_mask`` (1 where a query may attend a key) let a
        packed row hold several independent sequences."""
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         output_hidden_states=self.value_head is not None, use_cache=False)
        logits = out.logits[:, :-1]
        if temperature != 1.0:
            logits = logits / temperature
        result = {"logprobs": token_logprobs(logits, input_ids[:, 1:])}
        if with_entropy:
            logp = torch.log_softmax(logits.float(), -1)
            result["entropy"] = -(logp.exp() * logp).sum(-1)
        if self.value_head is not None:
            result["values"] = self.value_head(out.hidden_states[-1][:, :-1]).squeeze(-1)
        return result

    def forward_responses(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor, response_ids: Tensor,
                          resp_len: Tensor, with_entropy: bool = True, entropy_grad: bool = True,
                          temperature: float = 1.0) -> dict[str, Tensor]:
        """Response-aligned ``logprobs``, ``entropy`` and ``values`` [B, R] (column j: response
        token j; 0 past a row's end) of a :func:`response_batch`.

        The distinct prompts go through the model once; their keys and values are then gathered
        per row and the responses attend to them, so a group of n responses costs one prompt pass
        plus n response passes (the same numbers as n full rows, up to float rounding, and the
        gradient reaches the prompt positions through the gathered keys and values). Only
        response positions reach the LM head. ``entropy_grad=False`` computes the entropy for
        logging only (no graph through the softmax when no entropy bonus is trained)."""
        B, R = response_ids.shape
        hidden_wanted = self.value_head is not None
        if self.fused is not None:
            logits, hidden = self._fused_responses(prompt_ids, prompt_mask, prompt_index, response_ids)
        else:
            logits, hidden = self._hf_responses(prompt_ids, prompt_mask, prompt_index, response_ids, hidden_wanted)
        if temperature != 1.0:
            logits = logits / temperature
        valid = torch.arange(R, device=resp_len.device)[None, :] < resp_len[:, None]
        zero = torch.zeros((), device=logits.device)
        result = {"logprobs": torch.where(valid, token_logprobs(logits, response_ids), zero)}
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                logp = torch.log_softmax((logits if entropy_grad else logits.detach()).float(), -1)
                result["entropy"] = torch.where(valid, -(logp.exp() * logp).sum(-1), zero)
        if hidden_wanted:
            result["values"] = torch.where(valid, self.value_head(hidden).squeeze(-1), zero)
        return result

    def _fused_responses(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor, response_ids: Tensor
                         ) -> tuple[Tensor, Tensor]:
        """Logits and final hidden states [B, R, ...] of the response positions, through the fused
        decoder: the prompts' pass, then the responses attending to their prompt's keys/values."""
        from rlweave.models.fused_decoder import extension_bias, prompt_bias

        B, R = response_ids.shape
        pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        dec = self.fused
        prompt_hidden, kvs = dec.forward(prompt_ids, pos, prompt_bias(prompt_mask))
        hidden = prompt_hidden[:, -1:][prompt_index]  # predicts response token 0
        if R > 1:
            keys = torch.cat([prompt_mask[prompt_index], prompt_mask.new_ones(B, R - 1)], 1)
            rpos = pos[prompt_index, -1:] + torch.arange(1, R, device=pos.device)
            past = [(k[prompt_index], v[prompt_index]) for k, v in kvs]
            rest, _ = dec.forward(response_ids[:, :-1], rpos, extension_bias(keys, R - 1), past=past)
            hidden = torch.cat([hidden, rest], 1)
        return dec.logits(hidden), hidden

    def _hf_responses(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor, response_ids: Tensor,
                      hidden_wanted: bool) -> tuple[Tensor, Tensor | None]:
        """The same through the ``transformers`` forward and its cache objects."""
        from transformers import DynamicCache

        B, R = response_ids.shape
        rows = DynamicCache()  # each row's prompt keys/values, gathered from the one prompt pass
        first, pos = prefill_prompts(self.model, prompt_ids, prompt_mask, prompt_index, rows, output_hidden_states=hidden_wanted)
        logits = first.logits[:, -1:][prompt_index]  # predicts response token 0
        hidden = first.hidden_states[-1][:, -1:][prompt_index] if hidden_wanted else None
        if R > 1:  # response tokens 0..R-2 predict tokens 1..R-1, attending to their prompt's cache
            mask = torch.cat([prompt_mask[prompt_index], prompt_mask.new_ones(B, R - 1)], 1)
            rpos = pos[prompt_index, -1:] + torch.arange(1, R, device=pos.device)
            rest = self.model(input_ids=response_ids[:, :-1], attention_mask=mask, position_ids=rpos,
                              **{cache_argument(self.model): rows}, use_cache=True, output_hidden_states=hidden_wanted)
            logits = torch.cat([logits, rest.logits], 1)
            if hidden_wanted:
                hidden = torch.cat([hidden, rest.hidden_states[-1]], 1)
        return logits, hidden


def response_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int
                   ) -> dict[str, np.ndarray]:
    """Responses and their prompts as arrays, each distinct prompt stored once.

    Returns ``prompt_ids`` / ``prompt_mask`` [U, P] (the U distinct prompts, left-padded),
    ``prompt_index`` [B] (row -> its prompt), ``response_ids`` [B, R] (right-padded) and
    ``resp_len`` [B]. With n responses per prompt the prompt tokens are scored once per prompt,
    not once per response (:meth:`CausalLMPolicy.forward_responses`)."""
    index: dict[tuple, int] = {}
    prompt_index = np.array([index.setdefault(tuple(p), len(index)) for p in prompt_ids], dtype=np.int64)
    prompts = list(index)
    P = max(1, max(len(p) for p in prompts))
    R = max(1, max(len(r) for r in response_ids))
    ids = np.full((len(prompts), P), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), P), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = p, 1
    resp = np.full((len(response_ids), R), pad_id, dtype=np.int64)
    for i, r in enumerate(response_ids):
        resp[i, : len(r)] = r
    return {"prompt_ids": ids, "prompt_mask": mask, "prompt_index": prompt_index, "response_ids": resp,
            "resp_len": np.array([len(r) for r in response_ids], dtype=np.int64)}


def select_rows(batch: dict, rows) -> dict:
    """The rows ``rows`` of a :func:`response_batch` (numpy arrays or tensors) with only the
    prompts they use, re-indexed. Row-aligned entries ([B, ...]) other than the response batch's
    own are selected too."""
    lib = torch if isinstance(batch["prompt_index"], Tensor) else np
    B = len(batch["prompt_index"])
    used, inverse = lib.unique(batch["prompt_index"][rows], return_inverse=True)
    out = {k: v[rows] for k, v in batch.items() if k not in ("prompt_ids", "prompt_mask") and hasattr(v, "shape")
           and len(v.shape) and v.shape[0] == B}
    out.update(prompt_ids=batch["prompt_ids"][used], prompt_mask=batch["prompt_mask"][used], prompt_index=inverse)
    return out


# the row-aligned entries an actor rank's score / update reads (the rest of a batch stays with the driver)
RESPONSE_ROW_KEYS = ("prompt_ids", "prompt_mask", "prompt_index", "response_ids", "resp_len", "loss_mask", "rollout_logprobs",
                     "advantages", "old_logprobs", "ref_logprobs", "old_values", "returns")


def response_row_shards(batch: dict, parts: int) -> list[dict]:
    """A response batch in ``parts`` contiguous shares of rows, each with only the prompts it
    uses: how an LM actor group splits the rows it scores and trains on."""
    from rlweave.cluster.dispatch import row_slices

    rows = {k: batch[k] for k in RESPONSE_ROW_KEYS if k in batch}
    return [select_rows(rows, s) for s in row_slices(len(batch["resp_len"]), parts)]


def apply_lora(model: nn.Module, r: int = 8, alpha: int = 16, dropout: float = 0.0,
               target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj")):
    """Wraps ``model`` with LoRA adapters (``peft``); only the adapters train."""
    try:
        import peft
    except ImportError:
        raise ImportError("LoRA needs peft: pip install 'rlweave[llm]'") from None
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                             task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def merge_lora(model: nn.Module) -> nn.Module:
    """The base model with the adapters folded into its weights (what a rollout engine loads)."""
    return model.merge_and_unload()


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The plain model's state dict, with LoRA adapters (if any) folded into the base weights and
    the adapter tensors left out: what a rollout engine holding the plain architecture loads.
    The model itself is left unmerged (training continues on the adapters)."""
    if not hasattr(model, "merge_adapter"):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.merge_adapter()
    try:
        base = model.get_base_model()
        out = {}
        for k, v in base.state_dict().items():
            if "lora_" in k:
                continue
            out[k.replace(".base_layer.", ".")] = v.detach().clone()
        return out
    finally:
        model.unmerge_adapter()


def save_pretrained(model: nn.Module, tokenizer, path: str | Path) -> Path:
    """Model and tokenizer in the Hugging Face folder layout, loadable with ``from_pretrained``."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
