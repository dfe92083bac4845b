"""A curriculum over kinds of training prompts: each kind (the value of one ``Prompt.meta`` key,
e.g. the multihop task's question ``kind``) is drawn in proportion to how often the policy has
recently failed it in training.

Why: group-relative algorithms learn only from groups whose rewards differ. A kind the policy has
forgotten outright (every response of every group wrong) sends no signal back, and under uniform
draws it stays rare in the batch, so nothing brings it back while the common kinds pull the shared
weights their way (seen in grpo-search: "In which year was the founder of X born?" fell from 27 of
36 right to 1 of 36 as the city questions improved). Weighting kinds by failure puts more groups
where some response may still be right. Only training rewards steer it; held-out prompts never do.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Iterable, Sequence

from rlweave.config import ConfigError
from rlweave.envs.text_tasks import Prompt, TextTask

__all__ = ["PromptCurriculum"]


class PromptCurriculum:
    """Draws training prompts kind by kind with weight ``max(floor, 1 - success)``, where
    ``success`` is an exponential moving average (``decay`` per observation) of the kind's mean
    training reward (rewards in [0, 1]); a kind not yet seen has weight 1."""

    def __init__(self, task: TextTask, key: str, floor: float = 0.05, decay: float = 0.8, split: str = "train"):
        try:
            pool = task.pool(split)
        except NotImplementedError:
            raise ConfigError(f"task.curriculum: task {task.name} draws prompts without a fixed pool; "
                              "a curriculum needs one (multihop, jsonl_qa)") from None
        missing = [p.id for p in pool if key not in p.meta]
        if missing:
            raise ConfigError(f"task.curriculum: prompt {missing[0]} of task {task.name} has no meta key {key!r} "
                              f"(it has: {', '.join(sorted(pool[0].meta)) or 'none'})")
        self.key, self.floor, self.decay = key, floor, decay
        self.by_kind: dict[str, list[Prompt]] = {}
        for p in pool:
            self.by_kind.setdefault(str(p.meta[key]), []).append(p)
        self.success: dict[str, float] = {}

    def weights(self) -> dict[str, float]:
        """Each kind's draw weight (not normalised)."""
        return {k: max(self.floor, 1.0 - self.success[k]) if k in self.success else 1.0 for k in sorted(self.by_kind)}

    def draw(self, n: int, seed: int) -> list[Prompt]:
        """``n`` prompts: kinds by weight, then prompts of each kind without replacement (with
        replacement once a kind's prompts are used up)."""
        rng = random.Random(seed)
        w = self.weights()
        kinds = list(w)
        counts = Counter(rng.choices(kinds, weights=[w[k] for k in kinds], k=n))
        out: list[Prompt] = []
        for kind in kinds:  # a fixed order, so the same seed draws the same prompts
            pool, c = self.by_kind[kind], counts.get(kind, 0)
            out += rng.sample(pool, c) if c <= len(pool) else [rng.choice(pool) for _ in range(c)]
        rng.shuffle(out)
        return out

    def observe(self, prompts: Sequence[Prompt], group_rewards: Iterable[Sequence[float]]) -> None:
        """Updates each kind's success from one iteration's groups (``prompts[i]``'s rewards)."""
        seen: dict[str, list[float]] = {}
        for p, rewards in zip(prompts, group_rewards):
            seen.setdefault(str(p.meta[self.key]), []).extend(float(r) for r in rewards)
        for kind, rs in seen.items():
            mean = sum(rs) / len(rs)
            old = self.success.get(kind)
            self.success[kind] = mean if old is None else self.decay * old + (1 - self.decay) * mean

    def metrics(self) -> dict[str, float]:
        """Each kind's share of the next draw, as ``curriculum/<kind>``."""
        w = self.weights()
        total = sum(w.values())
        return {f"curriculum/{k}": v / total for k, v in w.items()}

    def state_dict(self) -> dict:
        return {"success": dict(self.success)}

    def load_state_dict(self, state: dict) -> None:
        self.success = dict(state["success"])
