"""``VLAConfig``: every size and choice of a vision-language-action policy, saved as JSON.

One flat dataclass rather than nested vision/LM/head sections: a run's ``policy.*`` settings and
the registry builder's keywords map onto its fields one to one, and ``config.json`` in a saved
folder is readable at a glance. The defaults are the small CPU model this project measures with
(SigLIP 128 wide x 2 layers on 64x64 images, Qwen3 192 wide x 4 layers, ~2.9 M parameters).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["VLAConfig", "HEADS", "PROJECTORS"]

HEADS = ("discrete", "chunk", "flow")
PROJECTORS = ("linear", "mlp")
LM_ARCHS = ("qwen3", "qwen2", "llama", "gemma")


@dataclass
class VLAConfig:
    """Sizes and choices of one VLA policy. ``text_vocab`` is filled in from the tokenizer when the
    policy is built (the LM's vocabulary is ``text_vocab + bins``: the discrete head's action
    tokens follow the text tokens, OpenVLA's layout)."""

    # -- action side
    head: str = "chunk"                 # discrete (OpenVLA) | chunk (OpenVLA-OFT) | flow (pi0)
    chunk: int = 1                      # H: actions per decision
    action_dim: int = 4                 # A
    action_low: list[float] = field(default_factory=lambda: [-1.0] * 4)
    action_high: list[float] = field(default_factory=lambda: [1.0] * 4)
    bins: int = 256                     # discrete head: bins per action dimension
    log_std_init: float = -1.0          # chunk head's Gaussian; std 0.37 suits actions in [-1, 1]
    flow_steps: int = 10                # flow head: Euler steps
    flow_sampler: str = "flow_sde"      # act's stochastic sampler: flow_sde | flow_noise (deterministic=True: ODE)
    flow_noise_level: float = 0.5       # flow_sde: level of piRL's sigma schedule
    flow_noise_std: float = 0.1         # flow_noise: initial learned per-step std
    flow_time_sampling: str = "beta"    # BC loss's t distribution: beta (pi0) | uniform
    flow_store_chain: bool = True       # act returns the chain [B, K+1, H, A] (PPO needs it); False: [B, H, A]
    expert_hidden: int = 64             # flow head's action expert
    expert_layers: int = 2
    expert_heads: int = 4
    value_head: bool = True
    # -- observation side
    cameras: list[str] = field(default_factory=lambda: ["image"])
    state_dim: int = 0                  # 0: no proprioception token
    instruction_bytes: int = 64
    max_instruction_tokens: int = 32
    # -- vision tower (SigLIP)
    image_size: int = 64
    patch_size: int = 8
    vision_hidden: int = 128
    vision_layers: int = 2
    vision_heads: int = 4
    vision_intermediate: int = 512
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    projector: str = "mlp"              # linear | mlp (GELU between two linears, as in Prismatic)
    # -- language model
    lm_arch: str = "qwen3"
    lm_hidden: int = 192
    lm_layers: int = 4
    lm_heads: int = 4
    lm_kv_heads: int = 2
    lm_intermediate: int = 768
    max_positions: int = 1024
    text_vocab: int = 0                 # set from the tokenizer
    tokenizer_vocab: int = 512          # BPE target size when training the tokenizer
    # full Hugging Face config dicts (with model_type) used verbatim instead of the sizes above when
    # set: how a checkpoint's exact architecture (norm eps, rope, head_dim, ...) is kept; see checkpoints.py
    lm_config: Optional[dict] = None
    vision_config: Optional[dict] = None
    # -- LoRA (peft)
    lora_rank: int = 0                  # 0: full fine-tuning
    lora_alpha: int = 16
    lora_vision: bool = False           # adapters on the vision tower too (else it is frozen under LoRA)
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """One-line errors for choices that cannot build, raised before any model is made."""
        if self.head not in HEADS:
            raise ValueError(f"vla: head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.flow_time_sampling not in ("beta", "uniform"):
            raise ValueError(f"vla: flow_time_sampling must be beta or uniform, got {self.flow_time_sampling!r}")
        if self.projector not in PROJECTORS:
            raise ValueError(f"vla: projector must be one of {', '.join(PROJECTORS)}, got {self.projector!r}")
        if self.lm_arch not in LM_ARCHS:
            raise ValueError(f"vla: lm_arch must be one of {', '.join(LM_ARCHS)}, got {self.lm_arch!r}")
        for name in ("chunk", "action_dim", "bins", "flow_steps", "image_size", "patch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"vla: {name} must be >= 1, got {getattr(self, name)!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"vla: image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
        if self.lm_hidden % self.lm_heads or self.lm_heads % self.lm_kv_heads:
            raise ValueError(f"vla: lm_hidden ({self.lm_hidden}) must split into lm_heads ({self.lm_heads}), "
                             f"and lm_heads into lm_kv_heads ({self.lm_kv_heads})")
        if self.vision_hidden % self.vision_heads or self.expert_hidden % self.expert_heads:
            raise ValueError("vla: vision_hidden / expert_hidden must be multiples of their head counts")
        if len(self.action_low) != self.action_dim or len(self.action_high) != self.action_dim:
            raise ValueError(f"vla: action_low/high need {self.action_dim} entries")
        if not self.cameras:
            raise ValueError("vla: cameras must name at least one image key")

    @property
    def image_tokens(self) -> int:
        """Tokens one camera contributes (one per patch)."""
        return (self.image_size // self.patch_size) ** 2

    def replace(self, **changes: Any) -> "VLAConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VLAConfig":
        """Refuses unknown keys with one line (a typo would otherwise silently fall back to a default)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"vla: unknown config keys {', '.join(unknown)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "VLAConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
