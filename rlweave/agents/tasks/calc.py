"""Task ``calc``: products of 4-5 digit numbers, easy with the calculator tool, hard without.

Why this task: a small model cannot multiply 4-5 digit numbers token by token, but it can learn to
write one ``calculator`` call and copy the result into its answer. The gap between the two is the
measure of whether tool use was learnt. It is :class:`~rlweave.envs.text_tasks.ArithmeticTask` with
other defaults (``*``, 4..5 digits), a question without the ``Answer:`` cue, and the tools in
``Prompt.meta``; so the held-out test split is the same fixed hash of the problem (never trained
on, whatever the seed) and the reward the same exact match on the extracted final answer.

Config: ``task.name: calc``, optional ``task.ops`` (default ``[*]``), ``task.min_digits`` /
``task.max_digits`` (default 4 / 5), ``task.test_fraction``, ``task.template``.
"""

from __future__ import annotations

from typing import Sequence

from rlweave.agents.tasks.base import AgentTask, ExpertCall
from rlweave.envs.text_tasks import ArithmeticTask, Prompt

__all__ = ["CalcTask", "build"]


class CalcTask(AgentTask, ArithmeticTask):
    """``What is A op B?`` with 4-5 digit operands; the expert calls ``calculator`` once."""

    name = "calc"
    tools = ("calculator",)

    def __init__(self, ops: Sequence[str] = ("*",), min_digits: int = 4, max_digits: int = 5,
                 test_fraction: float = 0.1, template: str = "What is {a} {op} {b}?"):
        super().__init__(ops=ops, min_digits=min_digits, max_digits=max_digits, test_fraction=test_fraction,
                         template=template)

    def _make(self, a: int, op: str, b: int) -> Prompt:
        p = super()._make(a, op, b)
        return Prompt(id=p.id, text=p.text, answer=p.answer, meta={**p.meta, "tools": list(self.tools)})

    def expert_calls(self, prompt: Prompt) -> list[ExpertCall]:
        m = prompt.meta
        return [ExpertCall("calculator", {"expression": f"{m['a']} {m['op']} {m['b']}"}, expect=prompt.answer)]


def build(cfg: dict) -> CalcTask:
    """The task registry's builder (``task.name: calc``)."""
    kw = {"template": cfg["template"]} if cfg.get("template") else {}
    return CalcTask(ops=tuple(cfg.get("ops") or ("*",)), min_digits=cfg.get("min_digits") or 4,
                    max_digits=cfg.get("max_digits") or 5, test_fraction=cfg.get("test_fraction", 0.1), **kw)
