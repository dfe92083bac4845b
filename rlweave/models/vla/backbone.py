"""The VLA backbone: camera images, proprioception and the instruction as one token sequence
through a causal language model.

Sequence layout (one row per env)::

    [ cam_0 patches | cam_1 patches | ... | <pad>... <bos> instruction tokens | state ] [ head's suffix ]

Images come first so that every position, padding included, has at least one valid key to attend
to (a fully masked attention row is NaN in some kernels). The instruction is *left*-padded inside
its segment, so the prefix always ends in a valid token at the same index for every row and a
head can append its own tokens (action tokens, queries) right after it; position ids skip the
padding (``cumsum(mask) - 1``), so a row's positions do not depend on the other rows' lengths.

Images are normalised inside the model (uint8 -> [0, 1] -> (x - mean) / std) and resized with
``F.interpolate`` when the env's size differs from the tower's, so observations travel as uint8
(4x smaller through channels) and every caller gets the same preprocessing.

The tokenizer is a byte-level BPE trained offline on the instruction texts
(:func:`rlweave.models.causal_lm.train_tokenizer`): deterministic for the same set of texts, so
every process that builds the policy from the same list gets the same ids. Without a list it is
trained on :data:`FALLBACK_CORPUS` (MetaWorld/LIBERO-style phrases): byte-level means any text
still encodes, just in more tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..causal_lm import cache_argument, require_transformers, train_tokenizer
from .config import VLAConfig

__all__ = ["FALLBACK_CORPUS", "Prefix", "VLABackbone", "InstructionCache", "build_tokenizer", "as_tensor"]

FALLBACK_CORPUS = (
    "pick up the red block and place it in the bin", "open the drawer", "close the drawer",
    "push the button", "reach the goal", "turn on the stove", "put the bowl on the plate",
    "stack the blocks", "pick up the black bowl and place it on the plate", "open the top drawer of the cabinet",
    "put the cream cheese in the bowl", "turn the faucet", "slide the puck to the goal", "press the handle down",
)

_LM_CONFIGS = {"qwen3": "Qwen3Config", "qwen2": "Qwen2Config", "llama": "LlamaConfig", "gemma": "GemmaConfig"}


def build_tokenizer(instructions: Iterable[str] | None, vocab_size: int = 512):
    """Byte-level BPE on the distinct instruction texts, sorted (so the list's order and repeats do
    not change the result); :data:`FALLBACK_CORPUS` when none are given."""
    texts = sorted({str(t) for t in instructions}) if instructions else sorted(FALLBACK_CORPUS)
    return train_tokenizer(texts, vocab_size=vocab_size)


def as_tensor(x: Any, device: torch.device) -> Tensor:
    """A tensor on ``device`` without changing the dtype (uint8 images stay uint8). Read-only numpy
    arrays (Ray hands those out) are copied rather than wrapped."""
    if isinstance(x, Tensor):
        return x.to(device)
    arr = np.asarray(x)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr).to(device)


class InstructionCache:
    """Instruction bytes -> token ids, computed once per distinct row: a task suite has a handful
    of instructions that repeat on every step of every env, and BPE-encoding 16 strings per step
    would cost more than the embedding lookup. Ids are kept as Python tuples, never tensors: a
    tensor made under ``torch.inference_mode`` (the rollout) cannot be reused for training."""

    def __init__(self, tokenizer, max_tokens: int):
        self.tokenizer = tokenizer
        self.max_tokens = int(max_tokens)
        self.bos = tokenizer.bos_token_id
        self.pad = tokenizer.pad_token_id
        self.ids: dict[bytes, tuple[int, ...]] = {}
        self.misses = 0

    def encode_row(self, row: bytes) -> tuple[int, ...]:
        ids = self.ids.get(row)
        if ids is None:
            self.misses += 1
            text = row.rstrip(b"\0").decode("utf-8", errors="replace")
            body = self.tokenizer(text, add_special_tokens=False)["input_ids"][: self.max_tokens - 1]
            ids = self.ids[row] = (self.bos, *body)  # bos: never an empty segment
        return ids

    def batch(self, instruction: Any, device: torch.device) -> tuple[Tensor, Tensor]:
        """Left-padded ids [B, L] and mask [B, L] for a uint8 [B, bytes] array or tensor."""
        if isinstance(instruction, Tensor):
            instruction = instruction.detach().cpu().numpy()
        arr = np.ascontiguousarray(np.asarray(instruction, dtype=np.uint8))
        rows = [self.encode_row(arr[i].tobytes()) for i in range(arr.shape[0])]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
        return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


@dataclass
class Prefix:
    """The observation part of the sequence: embeddings [B, P, D], mask [B, P] (1 = real token)
    and position ids [B, P]. ``next_position`` [B]: where a suffix starts."""

    embeds: Tensor
    mask: Tensor
    positions: Tensor

    @property
    def length(self) -> int:
        return self.embeds.shape[1]

    @property
    def next_position(self) -> Tensor:
        return self.positions[:, -1] + 1


def _from_dict(data: dict, **changes: Any):
    """A Hugging Face config of ``data["model_type"]``; keys its class does not take (a parent
    model's extras such as PaliGemma's ``projection_dim``) are dropped."""
    import inspect

    transformers = require_transformers()
    data = {**data, **changes}
    cls = transformers.CONFIG_MAPPING[data.pop("model_type")]
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        data = {k: v for k, v in data.items() if k in params}
    return cls(**data)


def _lm_config(cfg: VLAConfig, vocab: int):
    if cfg.lm_config is not None:
        return _from_dict(cfg.lm_config, vocab_size=vocab, tie_word_embeddings=True)
    transformers = require_transformers()
    return getattr(transformers, _LM_CONFIGS[cfg.lm_arch])(
        vocab_size=vocab, hidden_size=cfg.lm_hidden, num_hidden_layers=cfg.lm_layers,
        num_attention_heads=cfg.lm_heads, num_key_value_heads=cfg.lm_kv_heads, head_dim=cfg.lm_hidden // cfg.lm_heads,
        intermediate_size=cfg.lm_intermediate, max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _vision_config(cfg: VLAConfig):
    if cfg.vision_config is not None:
        return _from_dict(cfg.vision_config, vision_use_head=False)
    transformers = require_transformers()
    return transformers.SiglipVisionConfig(
        hidden_size=cfg.vision_hidden, intermediate_size=cfg.vision_intermediate, num_hidden_layers=cfg.vision_layers,
        num_attention_heads=cfg.vision_heads, image_size=cfg.image_size, patch_size=cfg.patch_size,
        vision_use_head=False)


class VLABackbone(nn.Module):
    """SigLIP vision tower -> projector -> image tokens; instruction tokens; a state token; all as
    ``inputs_embeds`` into a Hugging Face causal LM built from a config (random weights).

    ``lm`` is the whole ``*ForCausalLM`` (its tied output embedding scores the discrete head's
    action tokens); ``lm`` and ``vision`` may be wrapped by peft (see :mod:`.lora`), so the inner
    modules are always reached through :meth:`decoder` and :meth:`causal_lm`."""

    def __init__(self, cfg: VLAConfig, tokenizer):
        super().__init__()
        transformers = require_transformers()
        self.cfg = cfg
        self.text_vocab = max(int(cfg.text_vocab), len(tokenizer))  # a checkpoint's vocabulary may exceed its tokenizer
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.vision = transformers.SiglipVisionModel(_vision_config(cfg))
            self.lm = transformers.AutoModelForCausalLM.from_config(_lm_config(cfg, self.text_vocab + cfg.bins))
            D = cfg.lm_hidden
            if cfg.projector == "linear":
                self.projector: nn.Module = nn.Linear(cfg.vision_hidden, D)
            else:
                self.projector = nn.Sequential(nn.Linear(cfg.vision_hidden, D), nn.GELU(), nn.Linear(D, D))
            self.state_proj = nn.Linear(cfg.state_dim, D) if cfg.state_dim > 0 else None
        self.register_buffer("image_mean", torch.tensor(cfg.image_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("image_std", torch.tensor(cfg.image_std).view(1, 3, 1, 1), persistent=False)
        self.instructions = InstructionCache(tokenizer, cfg.max_instruction_tokens)
        self._cache_kw: str | None = None

    # ---- module access (through peft wrappers) ------------------------------------------------
    def causal_lm(self) -> nn.Module:
        return self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm

    def decoder(self) -> nn.Module:
        return self.causal_lm().get_decoder()

    def vision_model(self) -> nn.Module:
        return self.vision.get_base_model() if hasattr(self.vision, "get_base_model") else self.vision

    def token_embeddings(self, ids: Tensor) -> Tensor:
        return self.causal_lm().get_input_embeddings()(ids)

    def output_embeddings(self) -> Tensor:
        """The LM's output projection weight [V, D] (tied to the input embedding)."""
        return self.causal_lm().get_output_embeddings().weight

    @property
    def device(self) -> torch.device:
        return self.image_mean.device

    # ---- the prefix ---------------------------------------------------------------------------
    def pixels(self, frames: Any) -> Tensor:
        """uint8 [B, H, W, 3] -> normalised float [B, 3, S, S] at the tower's size S."""
        size = self.cfg.image_size
        x = as_tensor(frames, self.device).permute(0, 3, 1, 2).to(self.image_mean.dtype)
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=x.shape[-1] > size)
        return (x * (1.0 / 255.0) - self.image_mean) / self.image_std

    def images(self, obs: Mapping[str, Any]) -> Tensor:
        """Every configured camera through the tower in one batch -> projected tokens [B, C*N, D]
        (camera by camera in ``cfg.cameras`` order; cameras may differ in size)."""
        frames = [self.pixels(obs[name]) for name in self.cfg.cameras]
        x = torch.cat(frames, 0) if len(frames) > 1 else frames[0]  # [C*B, 3, S, S], camera-major
        feats = self.vision_model()(pixel_values=x).last_hidden_state  # [C*B, N, Dv]
        tokens = self.projector(feats)
        C, B = len(frames), frames[0].shape[0]
        return tokens.view(C, B, *tokens.shape[1:]).transpose(0, 1).reshape(B, -1, tokens.shape[-1])

    def prefix(self, obs: Mapping[str, Any]) -> Prefix:
        """Embeddings, mask and positions of the observation part of the sequence."""
        img = self.images(obs)
        B, N, _ = img.shape
        ids, tmask = self.instructions.batch(obs["instruction"], self.device)
        parts = [img, self.token_embeddings(ids)]
        masks = [torch.ones(B, N, dtype=tmask.dtype, device=self.device), tmask]
        if self.state_proj is not None:
            state = as_tensor(obs["state"], self.device).to(img.dtype)
            parts.append(self.state_proj(state).unsqueeze(1))
            masks.append(torch.ones(B, 1, dtype=tmask.dtype, device=self.device))
        mask = torch.cat(masks, 1)
        positions = (mask.cumsum(1) - 1).clamp_(min=0)
        return Prefix(torch.cat(parts, 1), mask, positions)

    # ---- the LM pass --------------------------------------------------------------------------
    def run(self, embeds: Tensor, mask: Tensor, positions: Tensor, cache=None, use_cache: bool = False):
        """Decoder hidden states [B, T, D] (final norm applied) and the KV cache. ``mask`` covers
        the cached positions too (the full [B, past + T] mask), as Hugging Face expects."""
        decoder = self.decoder()
        if self._cache_kw is None:
            self._cache_kw = cache_argument(decoder)
        kwargs = {self._cache_kw: cache} if cache is not None else {}
        out = decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=use_cache, **kwargs)
        if not use_cache:
            return out.last_hidden_state, None
        return out.last_hidden_state, out["cache"] if "cache" in out else out["past_key_values"]  # >= 5.24 / older

    def encode(self, obs: Mapping[str, Any], suffix: Tensor | None = None) -> tuple[Prefix, Tensor]:
        """One pass over prefix (+ an optional suffix of embeddings [B, S, D] at the following
        positions): the prefix and the hidden states of the whole sequence."""
        p = self.prefix(obs)
        embeds, mask, positions = p.embeds, p.mask, p.positions
        if suffix is not None:
            S = suffix.shape[1]
            embeds = torch.cat([embeds, suffix.to(embeds.dtype)], 1)
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], S)], 1)
            steps = torch.arange(S, device=positions.device)
            positions = torch.cat([positions, p.next_position.unsqueeze(1) + steps], 1)
        hidden, _ = self.run(embeds, mask, positions)
        return p, hidden

    def pooled(self, prefix: Prefix, hidden: Tensor) -> Tensor:
        """Masked mean of the prefix's hidden states [B, D]: the value head's input."""
        h = hidden[:, : prefix.length]
        m = prefix.mask.to(h.dtype).unsqueeze(-1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)
