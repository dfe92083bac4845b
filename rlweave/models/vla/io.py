"""Saving and loading VLA policies: ``config.json`` + ``model.safetensors`` + ``tokenizer/``.

``save_vla(policy, folder)`` writes the three atomically (a temporary folder, then a rename, as
every rlweave checkpoint); ``load_vla(folder)`` rebuilds the policy from the config with the saved
tokenizer (never re-trained, so the ids are the ones the weights learned) and loads the weights
strictly. ``safetensors.torch.save_model`` is used rather than ``save_file`` because the LM's
input and output embeddings are one tied tensor.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..causal_lm import load_tokenizer
from .config import VLAConfig
from .policy import VLAPolicy

__all__ = ["save_vla", "load_vla"]


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError:
        raise ImportError("saving VLA policies needs safetensors: pip install 'rlweave[llm]'") from None
    return st


def save_vla(policy: VLAPolicy, folder: str | os.PathLike) -> Path:
    """Writes ``folder/{config.json, model.safetensors, tokenizer/}``; replaces an existing folder."""
    st = _safetensors()
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        policy.cfg.save(tmp / "config.json")
        st.save_model(policy, str(tmp / "model.safetensors"))
        policy.tokenizer.save_pretrained(str(tmp / "tokenizer"))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_vla(folder: str | os.PathLike, device: str | torch.device = "cpu", **head_settings) -> VLAPolicy:
    """The policy :func:`save_vla` wrote (identical outputs), or one built from a PaliGemma-style
    Hugging Face folder (``config.json`` with ``model_type: paligemma``; see :mod:`.checkpoints`),
    whose new action head ``head_settings`` describe (``head``, ``chunk``, ``action_dim``, ...)."""
    folder = Path(folder)
    from .checkpoints import is_paligemma_folder, load_paligemma
    if is_paligemma_folder(folder):
        return load_paligemma(folder, **head_settings).to(device)
    if head_settings:
        raise TypeError("load_vla: head settings are only for PaliGemma folders (a saved policy has its own)")
    if not (folder / "model.safetensors").exists() or not (folder / "tokenizer").is_dir():
        raise FileNotFoundError(f"{folder} is not a saved VLA policy (needs config.json, model.safetensors, tokenizer/)")
    cfg = VLAConfig.load(folder / "config.json")
    policy = VLAPolicy(cfg, tokenizer=load_tokenizer(folder / "tokenizer"))
    _safetensors().load_model(policy, str(folder / "model.safetensors"), strict=True)
    return policy.to(device)
