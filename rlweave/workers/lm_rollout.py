"""Language-model rollout worker: generates responses to prompts and scores them.

For language models the task is the environment (prompt -> response -> verifiable reward), so
one worker holds both: a generation backend with a copy of the policy's weights (loaded from the
actor's versioned, checksummed packets) and the task's verifier (or the user's reward function,
run with a timeout in its own process). Only token ids, log-probs and rewards travel back to the
driver, never text or tensors.
"""

from __future__ import annotations

import threading
import time

from rlweave.cluster import Worker, local_worker
from rlweave.envs.text_tasks import Prompt, RewardRunner, make_task, score_responses
from rlweave.models.causal_lm import load_causal_lm, load_tokenizer
from rlweave.sync.weights import WeightPacket
from rlweave.cluster.dispatch import group_method

__all__ = ["LMRolloutWorker", "make_generator"]


def make_generator(backend: str, model, tokenizer, rollout_cfg: dict, kernels: str = "auto"):
    """The generation backend ``rollout.backend`` names, holding ``model``'s architecture
    (``kernels``: ``model.kernels``, the forward the HF backend decodes with)."""
    kw = dict(max_new_tokens=rollout_cfg["max_new_tokens"], temperature=rollout_cfg["temperature"], top_p=rollout_cfg["top_p"])
    if rollout_cfg.get("min_new_tokens"):
        kw["min_new_tokens"] = rollout_cfg["min_new_tokens"]
    if backend == "hf":
        from rlweave.generation.hf_generator import HFGenerator

        return HFGenerator(model, tokenizer, kernels=kernels, **kw)
    if backend == "vllm":
        from rlweave.generation.vllm_generator import VLLMGenerator

        return VLLMGenerator(model, tokenizer, **kw)
    raise ValueError(f"rollout.backend: unknown backend {backend!r}; known: hf, vllm")


class LMRolloutWorker(Worker):
    """Generates responses to prompts with a generation engine (Hugging Face or vLLM) holding a copy
    of the policy's weights, and scores them with the task's verifier or the user's reward function:
    for language models the task is the environment, so one worker holds both."""
    def __init__(self, model_spec: dict, tokenizer_path: str, rollout_cfg: dict, task_cfg: dict, agent_cfg: dict | None = None):
        """``agent_cfg``: the run's ``agent`` section; its workflow (``agent.workflow``, or the one
        ``agent.tools`` / ``agent.openai_fn`` imply: :mod:`rlweave.agents.workflows`) produces the
        episodes; without one, responses are single-turn."""
        self.tokenizer = load_tokenizer(tokenizer_path)
        # the plain architecture: LoRA adapters arrive merged into the weights
        model = load_causal_lm({**model_spec, "lora_rank": 0}, len(self.tokenizer), tokenizer=self.tokenizer)
        self.generator = make_generator(rollout_cfg["backend"], model, self.tokenizer, rollout_cfg,
                                        kernels=model_spec.get("kernels", "auto"))
        self.task = make_task(task_cfg)
        # one call at a time (the host is threaded); a weight load waits for the generations issued before it
        self._lock = threading.Condition()
        self.generations = 0
        self.reward_fn = None
        if task_cfg.get("reward_fn"):
            self.reward_fn = RewardRunner(task_cfg["reward_fn"], timeout_s=task_cfg["reward_timeout_s"],
                                          on_error=task_cfg["reward_on_error"])
        from rlweave.agents.workflows import make_producer  # episode producers by agent.workflow; None: single-turn

        self.agent = make_producer(agent_cfg, self.generator, self.tokenizer, rollout_cfg["max_new_tokens"], self.task,
                                   lambda prompts, texts: score_responses(self.task, prompts, texts, self.reward_fn))

    @property
    def version(self) -> int:
        return self.generator.version

    @group_method("all")
    def load_weights(self, packet: WeightPacket, after: int = 0) -> str:
        """Loads the actor's weights once this worker has finished ``after`` generations (async
        PPO sends new weights while the next batch is still being generated with the old ones);
        returns the checksum of what the engine now holds."""
        with self._lock:
            self._lock.wait_for(lambda: self.generations >= after)
            return self.generator.load_weights(packet)

    @group_method("all")
    def share_actor_weights(self, actor_group: str) -> bool:
        """Collocated with the actor rank of the same rank number in this process: the engine's
        parameters become views of that rank's (replicated, not sharded) trainer model, so a weight
        sync is a version change (:meth:`follow_actor`). Returns False, changing nothing, where that
        cannot hold: another backend, LoRA adapters (the engine holds merged weights) or a sharded
        actor."""
        from rlweave.generation.hf_generator import HFGenerator

        actor = local_worker(actor_group, self.rank)
        if not isinstance(self.generator, HFGenerator) or actor.lora or actor.strategy == "fsdp":
            return False
        with self._lock:
            self.generator.share_weights(actor.model)
            self._actor = actor
        return True

    @group_method("all")
    def follow_actor(self) -> tuple[bool, int]:
        """The weight sync of an engine sharing its actor's parameters: takes the actor's version;
        returns (still sharing, version)."""
        with self._lock:
            self.generator.version = self._actor.version
            return self.generator.shares_weights(), self.generator.version

    @group_method("all")
    def engine_state(self) -> dict:
        """The weights the engine generates with (tests compare them with the actor's)."""
        with self._lock:
            return self.generator.state_dict()

    @group_method("shard", blocking=False)
    def generate(self, prompts: list[Prompt], n: int, seed: int) -> dict:
        """``n`` sampled responses per prompt, scored. Token lists, behaviour log-probs, rewards,
        the policy version that sampled them, and the time each part took. Each rank samples with
        ``seed + rank``, so ranks given the same call never draw the same noise."""
        with self._lock:
            try:
                return self._generate(prompts, n, seed + self.rank)
            finally:
                self.generations += 1
                self._lock.notify_all()

    def _generate(self, prompts: list[Prompt], n: int, seed: int) -> dict:
        if not prompts:  # more workers than prompts this round
            return {"prompt_ids": [], "response_ids": [], "logprobs": [], "finished": [], "group": [], "rewards": [],
                    "version": self.version, "reward_failures": 0, "time/generate": 0.0, "time/reward": 0.0}
        t0 = time.perf_counter()
        out, texts = self._responses(prompts, n, seed)
        t1 = time.perf_counter()
        failed = self._failures()
        # agent code over the OpenAI API gives each episode's prompt with its conversation (meta["messages"])
        scored = out.pop("prompts", None) or [prompts[g] for g in out["group"]]
        rewards = out.pop("rewards", None)  # a workflow that scored its own rows (several roles per prompt)
        if rewards is None:
            rewards = score_responses(self.task, scored, texts, self.reward_fn)
        return {**out, "rewards": rewards, "reward_failures": self._failures() - failed, "time/generate": t1 - t0,
                "time/reward": time.perf_counter() - t1}

    def _responses(self, prompts: list[Prompt], n: int, seed: int, greedy: bool = False) -> tuple[dict, list[str]]:
        """Single-turn responses, or multi-turn episodes with ``agent.tools``; and the text scored."""
        if self.agent is not None:
            return self.agent.generate(prompts, n, seed, greedy)
        gen = self.generator.generate([p.text for p in prompts], n=n, seed=seed, greedy=greedy)
        out = {"prompt_ids": gen.prompt_ids, "response_ids": gen.response_ids, "logprobs": gen.logprobs,
               "finished": gen.finished, "group": gen.group, "version": gen.version}
        return out, self.generator.decode(gen)

    @group_method("shard")
    def evaluate(self, prompts: list[Prompt]) -> dict:
        """Greedy answers to ``prompts`` checked against their gold answers."""
        with self._lock:
            return self._evaluate(prompts)

    def _evaluate(self, prompts: list[Prompt]) -> dict:
        if not prompts:  # more workers than held-out prompts
            return {"correct": 0, "n": 0, "response_tokens": 0}
        if hasattr(self.agent, "evaluate"):  # a workflow with held-out figures of its own (one per role)
            return self.agent.evaluate(prompts)
        out, texts = self._responses(prompts, 1, 0, greedy=True)
        correct = [self.task.reward(p, t) > 0 for p, t in zip(prompts, texts)]
        result = {"correct": int(sum(correct)), "n": len(prompts), "response_tokens": sum(len(r) for r in out["response_ids"])}
        if "agent" in out:
            result["agent"] = {k: sum(a[k] for a in out["agent"]) for k in out["agent"][0]}
        return result

    def _failures(self) -> int:
        return 0 if self.reward_fn is None else self.reward_fn.errors + self.reward_fn.timeouts

    def close(self) -> None:
        if self.reward_fn is not None:
            self.reward_fn.close()
        if self.agent is not None:
            self.agent.close()
