"""Concurrent chat calls generated together: :class:`GenerationBatcher`.

Why: the OpenAI-compatible endpoint is called by many agent episodes at once (a GRPO batch is
prompts x group size episodes, each in its own thread), one request per model turn. Generating
them one by one would cost one decode loop per request; the engine's ``generate_ids`` decodes a
batch of left-padded prompts in one loop with a budget per row. The batcher's thread takes every
request waiting when the engine is free (up to ``max_batch``), after a short ``wait_s`` for
requests that arrive together, and answers each through its own future. Requests that arrive while
a batch decodes form the next one, so the batch size follows the concurrency without tuning.

Each batch samples with its own seed (``seed`` plus the batch's number): the draws are
reproducible for a given arrival order, which thread timing decides.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ContextManager, Sequence

__all__ = ["GenerationBatcher", "Generated"]


@dataclass
class Generated:
    """One request's answer: its generated token ids, their behaviour log-probs, whether it ended
    at a stop token, and the policy version that sampled it."""

    response_ids: list[int]
    logprobs: list[float]
    finished: bool
    version: int


@dataclass
class _Request:
    prompt_ids: list[int]
    budget: int
    future: Future


class GenerationBatcher:
    """Queues ``(prompt_ids, budget)`` requests and answers them with batched ``generate_ids``
    calls of ``engine`` (an :class:`~rlweave.generation.hf_generator.HFGenerator` or
    :class:`~rlweave.generation.vllm_generator.VLLMGenerator`), each batch under ``lock`` when
    given (the rollout worker's, so a weight load never lands mid-generation)."""

    def __init__(self, engine: Any, stop_ids: Sequence[int], max_batch: int = 64, wait_s: float = 0.005,
                 seed: int = 0, lock: ContextManager | None = None):
        self.engine, self.stop_ids = engine, list(stop_ids)
        self.max_batch, self.wait_s, self.seed = int(max_batch), float(wait_s), int(seed)
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.greedy = False  # evaluation: the most likely token at each step
        self.batches = self.requests = 0
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="rlweave-generation-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], budget: int) -> Future:
        """A future of the request's :class:`Generated`."""
        fut: Future = Future()
        self._queue.put(_Request(list(prompt_ids), int(budget), fut))
        return fut

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(nxt)
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            with self.lock:
                gen = self.engine.generate_ids([r.prompt_ids for r in live], n=1, seed=self.seed + self.batches,
                                               greedy=self.greedy, stop_ids=self.stop_ids, max_new_tokens=[r.budget for r in live])
            self.batches += 1
            self.requests += len(live)
        except BaseException as e:  # noqa: BLE001 - every waiting request learns of it
            for r in live:
                r.future.set_exception(e)
            return
        for i, r in enumerate(live):
            r.future.set_result(Generated(list(gen.response_ids[i]), [float(x) for x in gen.logprobs[i]],
                                          bool(gen.finished[i]), int(gen.version)))

    def close(self) -> None:
        """Stops the thread once the queued requests are answered."""
        self._queue.put(None)
        self._thread.join(timeout=30)
