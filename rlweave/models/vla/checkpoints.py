"""Which published VLA checkpoints this backbone can hold, and a loader for the one family whose
parts are all stock ``transformers`` modules: PaliGemma (SigLIP + linear projector + Gemma).

Nothing can be downloaded on the machines rlweave is developed on, so no published weights have
been loaded; the statements below come from the models' published layouts and are checked only
against folders built locally from configs (``tests/test_vla.py``).

* **PaliGemma / PaliGemma 2** (Google; the VLM inside pi0 and pi0-FAST): SigLIP-So400m vision tower,
  one linear projector, Gemma (2B) / Gemma 2. The Hugging Face folder layout
  (``PaliGemmaForConditionalGeneration``: ``config.json`` with ``model_type: paligemma``,
  safetensors shards, the Gemma tokenizer) loads here with :func:`load_paligemma`: vision tower,
  projector and LM weights are copied, the action head is new. Two deliberate differences: the LM
  attends causally over the prefix (PaliGemma's image+prompt block is bidirectional), and image
  tokens come first without PaliGemma's prompt template. Gemma 2 needs ``lm_arch``/``lm_config``
  of ``gemma2`` (its config class is stock too) and is untested.
* **pi0 / pi0-FAST (openpi)**: the PaliGemma part loads as above (openpi's PyTorch port stores it
  under its own key prefix: those keys need renaming first); pi0's action expert is a second Gemma
  (300M) whose layers share attention with the VLM's layer by layer. That mixture is openpi's own
  code: its weights do not map onto this module's cross-attention expert, so pi0's expert would be
  re-trained (its flow-matching convention is the mirror image, see ``flow_matching.py``).
* **OpenVLA** (7B): Prismatic's fused DINOv2 + SigLIP vision backbone (two towers, patch features
  concatenated), an MLP projector and Llama-2 7B; it ships as ``trust_remote_code`` classes. The
  LM is a stock ``LlamaForCausalLM`` (``lm_arch='llama'``) and its action tokens are the last 256 of
  the vocabulary, not appended ones; the fused two-tower vision backbone has no ``transformers``
  class and would need its own module (the SigLIP half alone loads into ``SiglipVisionModel``).
* **OpenVLA-OFT**: OpenVLA's backbone plus an MLP action head, a proprio projector and FiLM; the
  backbone caveats above hold, and the heads are this package's ``chunk`` head in spirit but not in
  weight layout.
* **SmolVLA** (LeRobot): SmolVLM (SigLIP + pixel shuffle + SmolLM2) with an interleaved action
  expert; SmolVLM's parts are ``transformers`` classes (``Idefics3``), its expert and layer skipping
  are LeRobot code.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..causal_lm import load_tokenizer
from .config import VLAConfig
from .policy import VLAPolicy

__all__ = ["is_paligemma_folder", "load_paligemma", "paligemma_state_dict"]

# key prefixes of PaliGemma folders -> this package's. Published folders (transformers 4) nest the
# tower as ``vision_tower.vision_model.``; transformers 5 writes ``vision_tower.`` and keeps the rest.
_PREFIXES = (
    ("vision_tower.vision_model.", "backbone.vision."),
    ("model.vision_tower.vision_model.", "backbone.vision."),
    ("vision_tower.", "backbone.vision."),
    ("model.vision_tower.", "backbone.vision."),
    ("multi_modal_projector.linear.", "backbone.projector."),
    ("model.multi_modal_projector.linear.", "backbone.projector."),
    ("language_model.model.", "backbone.lm.model."),
    ("model.language_model.", "backbone.lm.model."),
)
_SKIP = ("lm_head.", "language_model.lm_head.", "vision_tower.head.", "vision_tower.vision_model.head.",
         "model.vision_tower.head.", "model.vision_tower.vision_model.head.")


def is_paligemma_folder(folder: str | Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == "paligemma"
    except json.JSONDecodeError:
        return False


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for shard in shards:
        out.update(load_file(str(folder / shard)))
    return out


def paligemma_state_dict(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PaliGemma keys renamed to this package's (the tied LM head and the vision tower's unused
    pooling head dropped). Raises on a key it does not know, so a layout change is loud."""
    out = {}
    for key, value in weights.items():
        if key.startswith(_SKIP):
            continue
        for old, new in _PREFIXES:
            if key.startswith(old):
                out[new + key[len(old):]] = value
                break
        else:
            raise ValueError(f"PaliGemma checkpoint: unexpected weight {key!r}")
    return out


def load_paligemma(folder: str | Path, head: str = "flow", chunk: int = 4, action_dim: int = 7, **settings: Any
                   ) -> VLAPolicy:
    """A VLA policy whose vision tower, projector and LM come from a PaliGemma-style folder and
    whose action head (and state projection, value head) are new. ``settings``: other
    :class:`VLAConfig` fields (``state_dim``, ``cameras``, ``lora_rank``, ...). The folder's
    tokenizer is used (a Gemma tokenizer for published folders)."""
    folder = Path(folder)
    meta = json.loads((folder / "config.json").read_text())
    text, vision = dict(meta["text_config"]), dict(meta["vision_config"])
    text["use_bidirectional_attention"] = False  # decoded causally here (module docstring)
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype"):
        text.pop(key, None)
        vision.pop(key, None)
    try:
        tokenizer = load_tokenizer(folder)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{folder}: no tokenizer next to the PaliGemma weights ({e})") from None
    D = int(text["hidden_size"])
    cfg = VLAConfig(
        head=head, chunk=chunk, action_dim=action_dim,
        action_low=settings.pop("action_low", [-1.0] * action_dim), action_high=settings.pop("action_high", [1.0] * action_dim),
        lm_arch="gemma", lm_hidden=D, lm_layers=int(text["num_hidden_layers"]), lm_heads=int(text["num_attention_heads"]),
        lm_kv_heads=int(text["num_key_value_heads"]), lm_intermediate=int(text["intermediate_size"]),
        vision_hidden=int(vision["hidden_size"]), vision_layers=int(vision["num_hidden_layers"]),
        vision_heads=int(vision["num_attention_heads"]), vision_intermediate=int(vision["intermediate_size"]),
        image_size=int(vision["image_size"]), patch_size=int(vision["patch_size"]), projector="linear",
        text_vocab=int(text["vocab_size"]), lm_config=text, vision_config=vision, **settings)
    lora = cfg.lora_rank
    policy = VLAPolicy(cfg.replace(lora_rank=0), tokenizer=tokenizer)
    state = paligemma_state_dict(_read_weights(folder))
    emb_key = "backbone.lm.model.embed_tokens.weight"
    own = policy.state_dict()
    if emb_key in state:  # the checkpoint's rows; the appended action-token rows keep their init
        rows = state.pop(emb_key)
        own[emb_key][: rows.shape[0]] = rows
        state[emb_key] = own[emb_key]
    missing, unexpected = policy.load_state_dict(state, strict=False)
    wrong = [k for k in missing if k.startswith(("backbone.vision.", "backbone.projector.", "backbone.lm."))
             and not k.endswith("lm_head.weight")]
    if unexpected or wrong:
        raise ValueError(f"PaliGemma checkpoint does not fit: missing {wrong[:5]}, unexpected {list(unexpected)[:5]}")
    if lora:
        from .lora import apply_vla_lora
        policy.cfg = policy.cfg.replace(lora_rank=lora)
        apply_vla_lora(policy)
    return policy
