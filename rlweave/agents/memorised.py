"""A tiny chat model that has learnt one tool-using episode by heart.

Checks and benchmarks of the agent loop need trajectories that really call a tool and answer
over several turns, from a real tokenizer and model, without a training run: a few seconds of SFT
on one expert conversation give exactly that (sampling at a low temperature stays on its path).
One recipe for all of them, so that they exercise the same kind of policy."""

from __future__ import annotations

import json

import torch

from rlweave.models.causal_lm import CausalLMPolicy, build_causal_lm, train_tokenizer
from rlweave.models.chat_template import add_chat_template, encode_conversation

__all__ = ["memorise_episode"]


def memorise_episode(messages: list[dict], tools: list[dict], *, hidden: int = 64, layers: int = 2,
                     arch: str | None = None, lr: float = 1e-2, max_steps: int = 120, vocab_size: int = 700,
                     target_loss: float = 0.02, seed: int = 0):
    """(tokenizer with rlweave's chat template, model in eval mode, final loss): the model trained on
    the assistant tokens of ``messages`` (with ``tools``' specs in the prompt) until its mean
    negative log-likelihood is below ``target_loss`` or ``max_steps`` Adam steps have run."""
    torch.manual_seed(seed)
    corpus = [json.dumps(tools)] + [json.dumps(m) for m in messages]
    tok = add_chat_template(train_tokenizer(corpus * 2, vocab_size=vocab_size))
    ids, mask = encode_conversation(tok, messages, tools)
    kwargs = {"arch": arch} if arch else {}
    model = build_causal_lm(len(tok), hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                            intermediate_size=2 * hidden, max_positions=512, seed=seed, **kwargs)
    trainer, opt = CausalLMPolicy(model), torch.optim.Adam(model.parameters(), lr=lr)
    x, targets = torch.tensor([ids]), torch.tensor([mask[1:]])
    loss = torch.tensor(float("inf"))
    for _ in range(max_steps):
        loss = -trainer(x, torch.ones_like(x), with_entropy=False)["logprobs"][targets].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < target_loss:
            break
    return tok, model.eval(), loss.item()
