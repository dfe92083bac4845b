"""LoRA for VLA policies through ``peft``: adapters on the language model (and optionally the
vision tower); projector, state projection, action and value heads stay fully trainable.

Why this split: the heads, projector and state token are new, randomly initialised and small, so
they must learn in full (OpenVLA-OFT trains its action head and projector fully beside LoRA);
the LM and vision tower are the large pre-trained parts whose base weights LoRA keeps frozen.
Under LoRA without ``lora_vision`` the tower is frozen outright. The discrete head's action-token
embeddings live in the LM's (tied) embedding matrix and stay frozen with it, as in OpenVLA, which
re-uses existing vocabulary rows; the adapters move the hidden states toward them instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from .policy import VLAPolicy

__all__ = ["LM_TARGETS", "VISION_TARGETS", "apply_vla_lora", "merge_vla_lora"]

LM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VISION_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("LoRA needs peft: pip install 'rlweave[llm]'") from None
    return peft


def apply_vla_lora(policy: "VLAPolicy") -> None:
    """Wraps the LM (and the vision tower if ``cfg.lora_vision``) with adapters of rank
    ``cfg.lora_rank``; freezes their base weights (and the tower when it gets no adapters)."""
    peft = _peft()
    cfg = policy.cfg
    bb = policy.backbone
    lm_cfg = peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                             target_modules=list(LM_TARGETS), task_type="CAUSAL_LM")
    bb.lm = peft.get_peft_model(bb.lm, lm_cfg)
    if cfg.lora_vision:
        v_cfg = peft.LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                target_modules=list(VISION_TARGETS))
        bb.vision = peft.get_peft_model(bb.vision, v_cfg)
    else:
        bb.vision.requires_grad_(False)


def _unwrap(module: nn.Module) -> nn.Module:
    return module.merge_and_unload() if hasattr(module, "merge_and_unload") else module


def merge_vla_lora(policy: "VLAPolicy") -> "VLAPolicy":
    """Adapters folded into the base weights, wrappers removed, every parameter trainable again;
    ``cfg.lora_rank`` set to 0 so the saved folder describes the plain model."""
    bb = policy.backbone
    bb.lm = _unwrap(bb.lm)
    bb.vision = _unwrap(bb.vision)
    policy.requires_grad_(True)
    policy.cfg = policy.cfg.replace(lora_rank=0, lora_vision=False)
    return policy
