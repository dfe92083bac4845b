"""``task.curriculum``: train prompts drawn per kind in proportion to the kind's recent training
failure rate (rlweave/envs/prompt_curriculum.py), checked before start, logged, checkpointed."""

from __future__ import annotations

from collections import Counter

import pytest

from rlweave.config import ConfigError
from rlweave.envs.prompt_curriculum import PromptCurriculum
from rlweave.envs.text_tasks import Prompt, TextTask, make_task


class KindsTask(TextTask):
    name = "kinds"

    def __init__(self, sizes: dict[str, int]):
        self.prompts_ = [Prompt(f"{k}{i}", f"q {k} {i}", "a", {"kind": k}) for k, n in sizes.items() for i in range(n)]

    def _pool(self, split: str) -> list[Prompt]:
        return self.prompts_


def kinds_of(prompts: list[Prompt]) -> Counter:
    return Counter(p.meta["kind"] for p in prompts)


def test_kinds_are_drawn_by_recent_failure_and_the_same_seed_draws_the_same_prompts():
    cur = PromptCurriculum(KindsTask({"easy": 50, "forgotten": 50, "rare": 5}), "kind", floor=0.05, decay=0.5)
    assert cur.weights() == {"easy": 1.0, "forgotten": 1.0, "rare": 1.0}  # nothing seen yet: every kind alike
    easy, forgotten = cur.by_kind["easy"][:3], cur.by_kind["forgotten"][:3]
    cur.observe(easy + forgotten, [[1.0] * 4] * 3 + [[0.0] * 4] * 3)
    assert cur.weights() == {"easy": 0.05, "forgotten": 1.0, "rare": 1.0}  # floor, failure, unseen
    cur.observe(easy, [[0.0, 0.0, 1.0, 1.0]] * 3)  # easy now half right: EMA 0.5 * 1 + 0.5 * 0.5
    assert cur.weights()["easy"] == pytest.approx(0.25)
    shares = cur.metrics()
    assert sum(shares.values()) == pytest.approx(1.0) and shares["curriculum/forgotten"] == pytest.approx(1 / 2.25)
    a, b = cur.draw(400, seed=7), cur.draw(400, seed=7)
    assert a == b and a != cur.draw(400, seed=8)
    counts = kinds_of(a)
    assert counts["forgotten"] > 3 * counts["easy"] > 0 and counts["rare"] > 100  # rare kinds repeat once used up
    assert len({p.id for p in cur.draw(40, seed=1) if p.meta["kind"] == "forgotten"}) == kinds_of(cur.draw(40, seed=1))["forgotten"]


def test_state_round_trips_and_a_restored_curriculum_draws_alike():
    task = KindsTask({"x": 10, "y": 10})
    cur = PromptCurriculum(task, "kind")
    cur.observe(cur.by_kind["x"][:2], [[1.0, 1.0], [1.0, 0.0]])
    again = PromptCurriculum(task, "kind")
    again.load_state_dict(cur.state_dict())
    assert again.weights() == cur.weights() and again.draw(16, 3) == cur.draw(16, 3)


def test_a_task_without_a_pool_or_the_key_is_refused_on_one_line():
    with pytest.raises(ConfigError, match=r"task.curriculum: task arithmetic draws prompts without a fixed pool"):
        PromptCurriculum(make_task({"name": "arithmetic"}), "kind")
    with pytest.raises(ConfigError, match=r"task.curriculum: prompt x0 of task kinds has no meta key 'hops' \(it has: kind\)"):
        PromptCurriculum(KindsTask({"x": 2}), "hops")
