"""The Hugging Face generation engine: :class:`HFGenerator`, sampling from a ``transformers`` causal LM
with its own decode loop (see :mod:`rlweave.generation` for the interface every engine shares)."""

from __future__ import annotations

import math

import torch

from rlweave.generation.result import Generation
from rlweave.models import flat_params_checksum
from rlweave.models.causal_lm import cache_argument, prefill_prompts
from rlweave.models.fused_decoder import DecodeCache, FusedDecoder, prompt_bias, rope_tables
from rlweave.sync.weights import WeightPacket, resolve_buckets, unpack_into

__all__ = ["HFGenerator"]


class HFGenerator:
    """Sampling from a Hugging Face causal LM with a decode loop made for RL's n samples per prompt.

    Each prompt is encoded once (the prefill runs on the distinct prompts, then its keys and
    values are copied to the n rows sampling from it) into a preallocated static KV cache, so a
    decode step appends in place instead of re-concatenating the cache; sampling draws by
    inverse CDF from one seeded generator. ``temperature``, ``top_p`` (nucleus) and
    ``min_new_tokens`` (end-of-sequence suppressed until then) shape the sampling distribution,
    and ``logprobs`` are taken from that processed distribution, so they are the behaviour
    policy's (for ``top_p < 1``, the truncated one). The model is the plain ``transformers``
    module; it decodes through :class:`~rlweave.models.fused_decoder.FusedDecoder` when that
    covers it (``kernels="auto"``), the trainer's forward too, which keeps the train-inference
    gap at float rounding."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0,
                 top_p: float = 1.0, min_new_tokens: int = 0, kernels: str = "auto"):
        if temperature <= 0:
            raise ValueError(f"rollout.temperature: must be > 0 (greedy decoding is an evaluation setting), got {temperature}")
        self.model = model.eval()
        self.fused = FusedDecoder.build(model, kernels)  # None: the transformers forward decodes
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

    def share_weights(self, source: torch.nn.Module) -> None:
        """Makes this engine's parameters views of ``source``'s (a trainer's model of the same
        architecture, in this process): its in-place optimizer steps are then the weight sync, and
        no bytes move. The engine keeps its own module, so its attention kernel and eval mode are
        its own."""
        theirs = dict(source.named_parameters())
        mine = dict(self.model.named_parameters())
        missing = [n for n in mine if n not in theirs or theirs[n].shape != mine[n].shape or theirs[n].dtype != mine[n].dtype]
        if missing:
            raise ValueError(f"share_weights: the trainer's model does not match the engine's at {missing[:3]}")
        for name, p in mine.items():
            p.data = theirs[name].data
        self._shared = theirs

    def shares_weights(self) -> bool:
        """Whether every parameter still shares storage with the trainer's (a trainer that
        re-homed its parameters would silently stop updating this engine)."""
        theirs = getattr(self, "_shared", None)
        return theirs is not None and all(p.data_ptr() == theirs[n].data_ptr() for n, p in self.model.named_parameters())

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int = 1, seed: int = 0, greedy: bool = False) -> Generation:
        enc = self.tokenizer(prompts, add_special_tokens=False)
        return self.generate_ids(enc["input_ids"], n=n, seed=seed, greedy=greedy)

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], n: int = 1, seed: int = 0, greedy: bool = False,
                     stop_ids: list[int] | None = None, max_new_tokens: int | list[int] | None = None) -> Generation:
        """:meth:`generate` from token ids (what a multi-turn agent continues from: its context is
        the tokens already generated and observed, never re-tokenized text). A row ends at the first
        of ``stop_ids`` (default: eos; kept in the response, ``finished`` True) or after
        ``max_new_tokens`` (default: the engine's; one per prompt gives each its own budget)."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        stops = torch.tensor(list(stop_ids) if stop_ids else [eos], dtype=torch.long)
        budgets = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        budgets = torch.as_tensor([budgets] * len(prompt_ids) if isinstance(budgets, int) else list(budgets), dtype=torch.long)
        U, P = len(prompt_ids), max(len(p) for p in prompt_ids)
        ids = torch.full((U, P), pad, dtype=torch.long)
        mask = torch.zeros((U, P), dtype=torch.long)
        for i, p in enumerate(prompt_ids):  # left-padded, as the prefill expects
            ids[i, P - len(p):], mask[i, P - len(p):] = torch.as_tensor(p, dtype=torch.long), 1
        B, T = U * n, max(1, int(budgets.max()))
        rows = torch.arange(U).repeat_interleave(n)
        limit = budgets[rows]
        start = self._fused_decoder if self.fused is not None else self._hf_decoder
        logits, step = start(ids, mask, rows, T)  # the n rows of a prompt share its prefill
        rng = torch.Generator().manual_seed(int(seed))
        tokens = torch.full((B, T), pad, dtype=torch.long)
        logprobs = torch.zeros(B, T)
        done = limit <= 0
        stopped = torch.zeros(B, dtype=torch.bool)
        steps = 0
        for t in range(T):
            logp = self._processed_logprobs(logits, t, greedy, stops)
            if greedy:
                token = logp.argmax(-1, keepdim=True)
            else:
                cdf = logp.exp().cumsum(-1)
                u = torch.rand(B, 1, generator=rng) * cdf[:, -1:]
                token = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
            token = torch.where(done[:, None], torch.full_like(token, pad), token)
            tokens[:, t:t + 1], logprobs[:, t] = token, logp.gather(1, token).squeeze(1)
            hit = ~done & torch.isin(token.squeeze(1), stops)
            stopped |= hit
            done |= hit | (t + 1 >= limit)
            steps = t + 1
            if bool(done.all()) or t == T - 1:
                break
            logits = step(token, t)
        responses, lps, finished = [], [], []
        stop_set = set(stops.tolist())
        for i, row in enumerate(tokens[:, :steps].tolist()):
            end = min(int(limit[i]), steps)
            hits = [j for j, tk in enumerate(row[:end]) if tk in stop_set]
            end = hits[0] + 1 if bool(stopped[i]) and hits else end
            responses.append(row[:end])
            lps.append(logprobs[i, :end].tolist())
            finished.append(bool(stopped[i]))
        prompts = [list(p) for p in prompt_ids]
        return Generation(prompt_ids=[p for p in prompts for _ in range(n)], response_ids=responses, logprobs=lps,
                          finished=finished, group=rows.tolist(), version=self.version)

    def _hf_decoder(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, T: int):
        """The prompts' prefill through the ``transformers`` forward into a ``StaticCache``: the
        first token's logits per row, and the decode step (token [B, 1], step t) -> logits."""
        from transformers import StaticCache

        P = ids.shape[1]
        cache, kw = StaticCache(config=self.model.config, max_cache_len=P + T), cache_argument(self.model)
        out, pos = prefill_prompts(self.model, ids, mask, rows, cache)
        attn = torch.cat([mask[rows], mask.new_ones(len(rows), T)], 1)
        next_pos = pos[rows, -1:] + 1

        def step(token: torch.Tensor, t: int) -> torch.Tensor:
            return self.model(input_ids=token, attention_mask=attn[:, :P + t + 1], position_ids=next_pos + t,
                              **{kw: cache}, cache_position=torch.tensor([P + t]), use_cache=True).logits[:, -1]

        return out.logits[:, -1][rows], step

    def _fused_decoder(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, T: int):
        """The same through :class:`~rlweave.models.fused_decoder.FusedDecoder`: the prompts' keys
        and values stay once per prompt, and each step's n samples of a prompt attend to them
        together (:class:`~rlweave.models.fused_decoder.DecodeCache`); the fused projections are
        built once per generation."""
        dec, (U, P) = self.fused, ids.shape
        weights = dec.weights(decoding=True)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden, kvs = dec.forward(ids, pos, prompt_bias(mask), weights=weights)
        cache = DecodeCache.from_prefill(kvs, mask, len(rows) // U, T)
        next_pos = pos[rows, -1:] + 1 + torch.arange(T)  # every decode step's position, and its rotary tables
        cos, sin = rope_tables(dec.model.model.rotary_emb.inv_freq, next_pos, hidden.dtype)

        def step(token: torch.Tensor, t: int) -> torch.Tensor:
            h, _ = dec.forward(token, next_pos[:, t:t + 1], None, cache=cache, weights=weights,
                               rope=(cos[:, t:t + 1], sin[:, t:t + 1]))
            cache.length += 1
            return dec.logits(h[:, -1])

        return dec.logits(hidden[:, -1])[rows], step

    def _processed_logprobs(self, logits: torch.Tensor, step: int, greedy: bool, stops: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probs of the distribution token ``step`` is drawn from: the stop tokens masked
        before ``min_new_tokens``, then (sampling) temperature and nucleus truncation."""
        logits = logits.float()
        if step < self.min_new_tokens:
            logits = logits.clone()
            logits[:, self.tokenizer.eos_token_id if stops is None else stops] = -math.inf
        if greedy:
            return torch.log_softmax(logits, -1)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_p < 1.0:
            ranked, order = logits.sort(-1, descending=True)
            probs = torch.softmax(ranked, -1)
            outside = probs.cumsum(-1) - probs > self.top_p  # the mass before this token already exceeds top_p
            logits = torch.empty_like(logits).scatter_(-1, order, ranked.masked_fill(outside, -math.inf))
        return torch.log_softmax(logits, -1)

    def decode(self, generation: Generation) -> list[str]:
        return self.tokenizer.batch_decode(generation.response_ids, skip_special_tokens=True)
