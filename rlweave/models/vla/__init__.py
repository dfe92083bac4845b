"""Vision-language-action policies: a SigLIP vision tower and a Hugging Face causal LM (Qwen3 by
default) as one backbone, with OpenVLA's discrete action tokens, OpenVLA-OFT's parallel chunk head
or pi0's flow-matching action expert on top; LoRA through peft; save/load as safetensors.

Needs the ``llm`` extra (transformers, tokenizers, peft, safetensors); ``rlweave.models`` does not
import this package, the registry's ``vla`` builder does on first use.
"""
from .backbone import FALLBACK_CORPUS, VLABackbone, build_tokenizer
from .config import HEADS as HEAD_NAMES, VLAConfig
from .heads import HEADS, ActionHead, register_head
from .io import load_vla, save_vla
from .policy import VLAPolicy
from .space import build_vla_policy

__all__ = ["ActionHead", "FALLBACK_CORPUS", "HEADS", "HEAD_NAMES", "VLABackbone", "VLAConfig", "VLAPolicy",
           "build_tokenizer", "build_vla_policy", "load_vla", "register_head", "save_vla"]
