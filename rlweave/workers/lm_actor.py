"""Language-model actor worker: scores and trains a causal LM policy.

The driver hands each rank its share of the iteration's batch (a
:func:`~rlweave.models.causal_lm.response_batch`: the distinct prompts once, the responses as
rows) twice: ``score`` returns the trainer's log-probs of the response tokens under the current
weights (the PPO anchor; compared with the rollout's to measure the train-inference mismatch), the
reference model's (for KL) and the critic's values; ``update`` then runs the algorithm's epochs of
minibatch updates with the advantages the driver computed. ``sft_update`` is supervised
fine-tuning on target tokens.

One rank trains in plain PyTorch. Several ranks (gloo on CPU, NCCL on GPU) either replicate the
model (``strategy="ddp"``: DistributedDataParallel, one bucketed gradient all-reduce per step; the
fast choice for models that fit a slot, and on CPU, where a tiny model's per-layer collectives cost
more than they save) or shard it with FSDP2 (``"fsdp"``: ``fully_shard`` on every decoder layer
and the root; each rank holds a slice of the parameters and optimizer state, gradients are
reduce-scattered, and ``export_weights`` gathers the full state dict for the rollout engines).
Either way each rank's loss is weighted by its share of the minibatch's tokens (or responses), so
unequal shards give the gradient of the whole minibatch, not an average of per-rank means.

Every per-token tensor crossing the process boundary is *response-aligned* ``[B, R]``: response
token j of row i at column j, like the rollout's log-probs. Each distinct prompt goes through the
model once per pass, however many responses share it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from rlweave.algorithms import SFTLossInput, TokenLossInput, algorithm_loss, load_algorithm
from rlweave.algorithms.losses import total_loss
from rlweave.cluster import Worker
from rlweave.models.causal_lm import (CausalLMPolicy, load_causal_lm, load_tokenizer, merged_state_dict, require_transformers,
                                      response_row_shards, save_pretrained, select_rows, set_attention, train_attention)
from rlweave.utils.memory import peak_rss_mb
from rlweave.sync.weights import WeightPacket, pack_state, share_packet
from rlweave.cluster.dispatch import group_method

__all__ = ["LMActorWorker", "choose_strategy"]

# training state per trainable parameter: weight, gradient and Adam's two moments in float32
_TRAIN_BYTES_PER_PARAM = 16
# where an update's time goes, inside this rank (the driver logs the slowest rank's)
_TIMING_KEYS = ("time/actor_forward", "time/actor_backward", "time/actor_step")


def choose_strategy(strategy: str, trainable_params: int, ddp_max_gb: float) -> str:
    """``actor.strategy`` resolved: ``auto`` replicates (ddp) while a rank's full training state
    fits under ``ddp_max_gb`` and shards (fsdp) above it."""
    if strategy != "auto":
        return strategy
    return "ddp" if trainable_params * _TRAIN_BYTES_PER_PARAM <= ddp_max_gb * (1 << 30) else "fsdp"


class _TrainForward(torch.nn.Module):
    """The module DistributedDataParallel wraps: DDP's gradient hooks are armed by its own
    ``forward``, so the policy's two training passes (response scoring and full rows) go through
    this one entry."""

    def __init__(self, policy: CausalLMPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, responses: bool, **kw):
        return self.policy.forward_responses(**kw) if responses else self.policy(**kw)


class LMActorWorker(Worker):
    """One rank of a causal language model's training: scores responses (its own, the reference
    model's and the critic's log-probs or values) and trains on them (RL losses or SFT), replicated
    (DDP) or sharded (FSDP2) across ranks. Kept apart from generation so the trainer and the
    engine can be placed and sized on their own."""
    def __init__(self, model_spec: dict, tokenizer_path: str, algo_cfg: dict, seed: int, temperature: float = 1.0,
                 actor_cfg: dict | None = None):
        """``actor_cfg``: the run's ``actor`` section (``strategy``, ``ddp_max_gb``, ``attention``)
        and ``max_tokens``, the longest prompt + response the run can produce."""
        actor_cfg = actor_cfg or {}
        self.cfg = algo_cfg
        self.spec = load_algorithm(algo_cfg)  # imports algorithm.plugins first: user registrations reach this process
        self.loss_fn = algorithm_loss(self.spec, "llm")  # kind token (RL) or sft
        self.tokenizer = load_tokenizer(tokenizer_path)
        torch.manual_seed(seed)  # identical initial weights on every rank
        self.model = load_causal_lm(model_spec, len(self.tokenizer), seed=seed, tokenizer=self.tokenizer)
        # SFT may pack rows under a 4-D block mask, which only the fused kernel reads as intended
        set_attention(self.model, train_attention(actor_cfg.get("attention", "auto"), self.device.type,
                                                  0 if self.spec.kind == "sft" else actor_cfg.get("max_tokens", 0)))
        self.lora = bool(model_spec.get("lora_rank", 0))
        kernels = model_spec.get("kernels", "auto")  # model.kernels: the fused forward or the library's
        self.policy = CausalLMPolicy(self.model, value_head=self.spec.uses_critic, kernels=kernels)
        self.policy.to(self.device)
        self.temperature = float(temperature)  # the rollout's: log-probs are scored under the same distribution
        # the reference model for KL: a frozen copy, or under LoRA the base with its adapters off
        self.use_ref = self.spec.kind != "sft" and algo_cfg.get("kl_coef", 0.0) > 0
        self.ref = None
        if self.use_ref and not self.lora:
            self.ref = CausalLMPolicy(copy.deepcopy(self.model).eval().requires_grad_(False), kernels=kernels)
        self._strategy_cfg = (actor_cfg.get("strategy", "auto"), actor_cfg.get("ddp_max_gb", 2.0))
        self._strategy: str | None = None
        self.ddp: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None  # built after sharding (FSDP2 swaps parameters)
        self._timing = dict.fromkeys(_TIMING_KEYS, 0.0)
        self.version = 0
        self.updates = 0
        self.rng = np.random.default_rng(seed * 7919 + self.rank)

    # ------------------------------------------------------------------ set-up
    @group_method("all")
    def prepare(self) -> str:
        """Builds what training needs (DDP replicas or FSDP shards, the optimizer; a collective
        call: every rank at once) and returns the strategy in use."""
        self._ready()
        return self.strategy

    def _ready(self) -> None:
        if self.optimizer is not None:
            return
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # rank 0's weights are broadcast at construction: every replica starts equal
            self.ddp = DistributedDataParallel(_TrainForward(self.policy), broadcast_buffers=False)
        elif self.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

            for layer in self.model.get_decoder().layers if hasattr(self.model, "get_decoder") else []:
                fully_shard(layer)
            fully_shard(self.policy)
            self.policy.fused = None  # its functional pass would bypass FSDP's all-gather hooks on the layers
            register_fsdp_forward_method(self.policy, "forward_responses")  # the root's hooks run for it too
        params = [p for p in self.policy.parameters() if p.requires_grad]
        critic = [p for n, p in self.policy.named_parameters() if n.startswith("value_head") and p.requires_grad]
        actor = [p for p in params if all(p is not c for c in critic)]
        groups = [{"params": actor, "lr": self.cfg["lr"]}]
        if critic:
            groups.append({"params": critic, "lr": self.cfg.get("critic_lr") or self.cfg["lr"]})
        # fused: one kernel over all tensors (1 ms against 3-4 ms a step for the 1.2M-parameter
        # Qwen3 of the GRPO benchmark on CPU); FSDP's sharded parameters keep the per-tensor loop
        self.optimizer = torch.optim.AdamW(groups, betas=tuple(self.cfg.get("adam_betas", (0.9, 0.999))), weight_decay=0.0,
                                           fused=self.strategy != "fsdp")

    def _full_state(self) -> dict:
        """The plain model's full state dict (gathered from every rank when sharded; LoRA
        adapters merged). Every rank must call it when the model is sharded."""
        self._ready()
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.lora:
                state = _merge_lora_state(state, self.model)
            return state
        return merged_state_dict(self.model)

    @group_method("all", collect="first")
    def export_weights(self) -> WeightPacket | None:
        """The weights rollout engines load (rank 0 returns them; with FSDP every rank must take
        part in the gather, the others return None)."""
        if self.rank != 0 and not self._sharded():
            return None  # a replica: rank 0 holds the same weights
        state = self._full_state()
        if self.rank != 0:
            return None
        return share_packet(pack_state(state, self.version))

    # ------------------------------------------------------------------ batches
    _RESPONSE_KEYS = ("prompt_ids", "prompt_mask", "prompt_index", "response_ids", "resp_len")

    def _tensors(self, batch: dict) -> tuple[dict, torch.Tensor]:
        """The response batch as tensors, and its response mask [B, R]: the response's tokens, less
        those a ``loss_mask`` (multi-turn agent rows) marks 0, the tool observations, which stay in
        the context but out of every loss term, ratio, KL and entropy."""
        rows = {k: _tensor(batch[k], dtype=torch.long, device=self.device) for k in self._RESPONSE_KEYS}
        width = rows["response_ids"].shape[1]
        mask = torch.arange(width, device=self.device)[None, :] < rows["resp_len"][:, None]
        if batch.get("loss_mask") is not None:
            mask &= _tensor(batch["loss_mask"], dtype=torch.bool, device=self.device)
        return rows, mask

    def _forward(self, rows: dict, with_entropy: bool = True, entropy_grad: bool = True, policy=None) -> dict:
        return (policy or self.policy).forward_responses(**rows, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                                         temperature=self.temperature)

    def _train_forward(self, rows: dict, entropy_grad: bool) -> dict:
        """The update's pass over response rows; through DDP when replicated (arms its all-reduce)."""
        if self.ddp is None:
            return self._forward(rows, entropy_grad=entropy_grad)
        return self.ddp(True, **rows, with_entropy=True, entropy_grad=entropy_grad, temperature=self.temperature)

    # ------------------------------------------------------------------ ranks
    @property
    def strategy(self) -> str:
        """``single``, ``ddp`` or ``fsdp``; resolved on first use, once the process group the
        worker group sets up after construction exists."""
        if self._strategy is None:
            choice, max_gb = self._strategy_cfg
            trainable = sum(p.numel() for p in self.policy.parameters() if p.requires_grad)
            self._strategy = choose_strategy(choice, trainable, max_gb) if self._distributed() else "single"
        return self._strategy

    def _distributed(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def _minibatches(self, n: int, minibatch_size: int) -> int:
        """Minibatches per epoch, equal on every rank (each step is a collective: a rank taking one
        step more would wait forever): as many as the smallest shard holds."""
        if self._distributed():
            t = torch.tensor([n], dtype=torch.long)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            n = int(t)
        return max(1, n // max(1, min(n, minibatch_size)))

    def _rank_weight(self, count: torch.Tensor) -> float:
        """This rank's loss weight: world size x its share of the minibatch's ``count`` (tokens or
        responses, what the loss averages over). Ranks' gradients are averaged, so the result is
        the gradient of the whole minibatch's loss even when shards differ in size."""
        if not self._distributed():
            return 1.0
        total = count.detach().double().reshape(1).clone()
        dist.all_reduce(total)
        return float(self.world_size * count.double() / total.clamp_min(1.0))

    @torch.no_grad()
    @group_method("shard", shard=response_row_shards, collect="concat")
    def score(self, batch: dict) -> dict:
        """Trainer log-probs (the update's anchor), reference log-probs and values of this rank's
        rows, response-aligned numpy [B, R]."""
        self._ready()
        self.policy.eval()
        rows, _ = self._tensors(batch)
        out, ref, values = [], [], []
        for s in _chunks(len(rows["resp_len"]), self.cfg.get("minibatch_size", 64)):
            part = select_rows(rows, s)
            o = self._forward(part, with_entropy=False)
            out.append(o["logprobs"])
            if "values" in o:
                values.append(o["values"])
            if self.use_ref:
                ref.append(self._ref_logprobs(part))
        result = {"logprobs": torch.cat(out).float().cpu().numpy()}
        if ref:
            result["ref_logprobs"] = torch.cat(ref).float().cpu().numpy()
        if values:
            result["values"] = torch.cat(values).float().cpu().numpy()
        return result

    def _ref_logprobs(self, rows: dict) -> torch.Tensor:
        if self.ref is not None:
            return self._forward(rows, with_entropy=False, policy=self.ref)["logprobs"]
        with self.model.disable_adapter():  # LoRA: the frozen base is the reference
            return self._forward(rows, with_entropy=False)["logprobs"]

    @group_method("shard", shard=response_row_shards)
    def update(self, batch: dict, lr_scale: float = 1.0, importance_correction: bool = False) -> dict:
        """The algorithm's epochs of minibatch updates on this rank's rows. ``batch`` holds the
        rows and, response-aligned, ``advantages``, ``rollout_logprobs`` (the behaviour policy's,
        from the rollout engine), ``old_logprobs`` (from ``score``) and, as the algorithm needs
        them, ``ref_logprobs``, ``old_values`` and ``returns`` (PPO's critic).

        Without ``old_logprobs`` the update is a single pass (one epoch, one minibatch): the
        anchor is then this forward's own log-probs, detached, which are exactly what ``score``
        would have returned, one forward pass cheaper. ``importance_correction`` (async PPO)
        weights the surrogate by pi_old / pi_behaviour."""
        self._ready()
        t0 = time.perf_counter()
        self._timing = dict.fromkeys(_TIMING_KEYS, 0.0)
        c = self.cfg
        self.policy.train()
        for g in self.optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
            g["lr"] = g["initial_lr"] * lr_scale
        rows, mask = self._tensors(batch)
        width = mask.shape[1]
        tok = {k: _tensor(batch[k], dtype=torch.float32, device=self.device)
               for k in ("advantages", "old_logprobs", "rollout_logprobs", "ref_logprobs", "old_values", "returns")
               if batch.get(k) is not None}
        use_kl = c.get("kl_mode", "loss") == "loss" and c.get("kl_coef", 0.0) > 0 and "ref_logprobs" in tok
        sums: dict[str, list[float]] = {}
        n = mask.shape[0]
        k = self._minibatches(n, c.get("minibatch_size", n))
        mb = n // k
        entropy_grad = c.get("ent_coef", 0.0) > 0  # otherwise the entropy is only logged
        single_pass = "old_logprobs" not in tok
        if single_pass and (c.get("epochs", 1) != 1 or k != 1):
            raise RuntimeError("update without old_logprobs needs one epoch of one minibatch (score the rows first)")
        gaps: list[torch.Tensor] = []
        token_mean = c.get("loss_agg", "token_mean") == "token_mean"
        for _ in range(c.get("epochs", 1)):
            order = self.rng.permutation(n)
            for s in range(0, k * mb, mb):
                idx = torch.as_tensor(order[s : s + mb], device=self.device)
                # what the loss averages over (tokens or responses), for the whole minibatch
                count = mask[idx].sum() if token_mean else torch.tensor(float(len(idx)))
                weight = self._rank_weight(count)
                self.optimizer.zero_grad(set_to_none=True)
                logged: dict[str, float] = {}
                parts = self._micro_batches(len(idx))
                for j, part in enumerate(parts):
                    t_fwd = time.perf_counter()
                    pidx = idx[part]
                    with self._grad_sync(last=j == len(parts) - 1):
                        out = self._train_forward(select_rows(rows, pidx), entropy_grad)
                        m = mask[pidx]
                        old = out["logprobs"].detach() if single_pass else tok["old_logprobs"][pidx]
                        if single_pass and "rollout_logprobs" in tok:  # the train-inference gap, measured here
                            gaps.append((tok["rollout_logprobs"][pidx] - old).abs()[m])
                        terms = self.loss_fn(TokenLossInput(
                            log_prob=out["logprobs"], old_log_prob=old, advantages=tok["advantages"][pidx], mask=m,
                            entropy=out["entropy"], max_len=width, cfg=c, values=out.get("values"),
                            old_values=tok["old_values"][pidx] if "old_values" in tok else None,
                            returns=tok["returns"][pidx] if "returns" in tok else None,
                            ref_log_prob=tok["ref_logprobs"][pidx] if use_kl else None,
                            behaviour_log_prob=tok["rollout_logprobs"][pidx] if importance_correction else None,
                        ))
                        terms.setdefault("entropy", (out["entropy"] * m).sum() / m.sum().clamp_min(1))
                        # this micro-batch's share of the minibatch's loss: its part of ``count``
                        share = float((m.sum() if token_mean else len(pidx)) / count.clamp_min(1))
                        self._timing["time/actor_forward"] += time.perf_counter() - t_fwd
                        self._backward(total_loss(terms) * (weight * share), terms, share, logged)
                self._apply_step(logged, sums)
        self.version += 1
        metrics = {k: float(np.mean(v)) for k, v in sums.items()}
        if gaps:
            gap = torch.cat(gaps)
            metrics["logprob_gap_sum"], metrics["logprob_gap_max"] = float(gap.sum()), float(gap.max()) if gap.numel() else 0.0
        metrics["time/actor_update"] = time.perf_counter() - t0
        metrics.update(self._timing)
        metrics["tokens"] = int(mask.sum())
        metrics["peak_rss_mb"] = peak_rss_mb()
        return metrics

    @group_method("shard")
    def sft_update(self, batch: dict) -> dict:
        """One supervised step: negative log-likelihood of the target tokens of this rank's rows
        (``target_mask`` [B, W], True on the tokens to learn: responses, or every example's
        response in a packed row)."""
        self._ready()
        self.policy.train()
        ids = _tensor(batch["input_ids"], dtype=torch.long, device=self.device)
        packed = np.asarray(batch["attention_mask"]).ndim == 4  # a block-diagonal causal mask: keep it boolean
        attn = _tensor(batch["attention_mask"], dtype=torch.bool if packed else torch.long, device=self.device)
        target = _tensor(batch["target_mask"], dtype=torch.bool, device=self.device)[:, 1:]
        pos = None if batch.get("position_ids") is None else _tensor(batch["position_ids"], device=self.device)
        agg = self.cfg.get("loss_agg", "token_mean")
        count = target.sum() if agg == "token_mean" else torch.tensor(float(len(ids)))
        weight = self._rank_weight(count)
        sums: dict[str, list[float]] = {}
        logged: dict[str, float] = {}
        self._timing = dict.fromkeys(_TIMING_KEYS, 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        parts = self._micro_batches(len(ids))
        for j, part in enumerate(parts):
            with self._grad_sync(last=j == len(parts) - 1):
                kw = dict(input_ids=ids[part], attention_mask=attn[part], with_entropy=False,
                          position_ids=None if pos is None else pos[part])
                out = self.policy(**kw) if self.ddp is None else self.ddp(False, **kw)
                terms = self.loss_fn(SFTLossInput(out["logprobs"], target[part], self.cfg))
                share = float((target[part].sum() if agg == "token_mean" else len(ids[part])) / count.clamp_min(1))
                self._backward(total_loss(terms) * (weight * share), terms, share, logged)
        self._apply_step(logged, sums)
        self.version += 1
        metrics = {k: v[0] for k, v in sums.items()}
        metrics["tokens"] = int(target.sum())
        return metrics

    def _micro_batches(self, rows: int) -> list[slice]:
        """Slices of a minibatch's ``rows`` of at most ``algorithm.micro_batch_size`` rows each
        (gradient accumulation: the same update in a fraction of the activation memory)."""
        return list(_chunks(rows, self.cfg.get("micro_batch_size") or rows))

    def _grad_sync(self, last: bool):
        """DDP's gradient all-reduce on the last micro-batch of a step only."""
        return contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()

    def _backward(self, loss: torch.Tensor, terms: dict, share: float, logged: dict) -> None:
        """Accumulates one micro-batch's gradient and its ``share`` of the logged loss terms."""
        t0 = time.perf_counter()
        loss.backward()  # with DDP, the gradient all-reduce overlaps the end of the last one
        self._timing["time/actor_backward"] += time.perf_counter() - t0
        for k, v in terms.items():
            logged[k] = logged.get(k, 0.0) + float(v.detach().float().mean()) * share

    def _apply_step(self, logged: dict, sums: dict) -> None:
        """Clips the accumulated gradient, steps the optimizer and records the step's terms."""
        t1 = time.perf_counter()
        max_norm = self.cfg.get("max_grad_norm", 1.0) or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.policy.parameters() if p.requires_grad], max_norm)
        self.optimizer.step()
        self._timing["time/actor_step"] += time.perf_counter() - t1
        self.updates += 1
        for k, v in logged.items():
            sums.setdefault(k, []).append(v)
        sums.setdefault("grad_norm", []).append(float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm))

    # ------------------------------------------------------------------ checkpoints
    def _sharded(self) -> bool:
        return self.strategy == "fsdp"

    @group_method("all")
    def state_dict(self) -> dict:
        """Weights, optimizer and counters. Sharded, the full weights and optimizer state are
        gathered onto rank 0; replicated, rank 0 holds them already. The other ranks return only
        their counters and random states, so a checkpoint does not depend on how many ranks
        wrote it."""
        self._ready()
        out = {"version": self.version, "updates": self.updates, "rng": self.rng.bit_generator.state,
               "torch": torch.get_rng_state()}
        if self.strategy == "ddp" and self.rank != 0:
            return out  # a replica of rank 0's weights and optimizer state
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            model, optim = get_state_dict(self.policy, self.optimizer,
                                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.rank == 0:
                out.update(policy=model, optimizer=optim)
            return out
        out.update(policy=self.policy.state_dict(), optimizer=self.optimizer.state_dict())
        return out

    @group_method("per_rank")
    def load_state_dict(self, state: dict) -> None:
        """Every rank calls it with its own part (sharded: rank 0's holds the full state, which is
        broadcast and resharded)."""
        self._ready()
        if self._sharded():
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            # ranks other than 0 pass their own (sharded) entries: set_state_dict takes an empty
            # model dict for "optimizer only" and would skip the broadcast rank 0 is waiting in
            set_state_dict(self.policy, self.optimizer, model_state_dict=state.get("policy") or self.policy.state_dict(),
                           optim_state_dict=state.get("optimizer", {}),
                           options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        else:
            if self.strategy == "ddp":  # rank 0's part holds the (replicated) weights and optimizer state
                box = [{"policy": state["policy"], "optimizer": state["optimizer"]} if self.rank == 0 else None]
                dist.broadcast_object_list(box, src=0)
                state = {**state, **box[0]}
            self.policy.load_state_dict(state["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.updates = state["version"], state["updates"]
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch"])

    @group_method("all")
    def save_pretrained(self, path: str) -> str | None:
        """The plain model (LoRA merged) and tokenizer as a Hugging Face folder, by rank 0."""
        state = self._full_state()
        if self.rank != 0:
            return None
        if not self.lora and not self._sharded():
            save_pretrained(self.model, self.tokenizer, path)
            return path
        config = (self.model.get_base_model() if self.lora else self.model).config
        plain = require_transformers().AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(state)
        save_pretrained(plain.to(next(iter(state.values())).dtype), self.tokenizer, path)
        return path


def _tensor(x, dtype=None, device=None) -> torch.Tensor:
    """A tensor owning a copy of ``x`` (arrays from the object store are read-only)."""
    return torch.tensor(np.asarray(x), dtype=dtype, device=device)


def _chunks(n: int, size: int):
    for s in range(0, n, max(1, size)):
        yield slice(s, min(n, s + size))


def _merge_lora_state(state: dict, model) -> dict:
    """A gathered peft state dict with the adapters folded in: W + B A * alpha / r."""
    scale = {name: m.scaling["default"] for name, m in model.named_modules() if hasattr(m, "scaling") and "default" in getattr(m, "scaling", {})}
    out = {}
    prefix = "base_model.model."
    for k, v in state.items():
        if "lora_" in k:
            continue
        if k.endswith(".base_layer.weight"):
            mod = k[: -len(".base_layer.weight")]
            a, b = state[f"{mod}.lora_A.default.weight"], state[f"{mod}.lora_B.default.weight"]
            v = v + (b.float() @ a.float()).to(v.dtype) * scale[mod]
        key = k.replace(".base_layer.", ".")
        out[key[len(prefix):] if key.startswith(prefix) else key] = v
    return out
