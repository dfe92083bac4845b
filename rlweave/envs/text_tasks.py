"""Tasks with verifiable rewards for language models: prompt -> response -> reward.

A :class:`TextTask` hands out prompts of a split (``train`` / ``test``) and scores a response
against the prompt's known answer. Two tasks are built in:

* :class:`ArithmeticTask`: integer arithmetic with configurable operations and digit counts. The
  held-out test split is a fixed, disjoint part of the problem space (chosen by a hash of the
  problem), so no test problem is ever trained on, whatever the seed.
* :class:`JsonlQATask`: any local JSONL file of ``{question, answer}`` records (GSM8K and MATH
  style: a gold answer may end in ``#### 42`` or hold a ``\\boxed{42}``).

Answers are compared after extraction (:func:`extract_answer`: the last ``\\boxed{...}``, else a
``#### x`` line, else "the answer is x", else the last number) and normalisation; numbers compare by
value (``1/2`` equals ``0.5``; ``1,000`` equals ``1000``).

:func:`make_task` builds the task ``task.name`` names from the registry :data:`TASKS`
(:func:`register_task` adds one; the agent tasks ``calc`` and ``multihop`` live in
:mod:`rlweave.agents.tasks` and are registered by import path).

User reward functions (``module:function`` taking ``(prompt, response)``) run through
:class:`RewardRunner`, which bounds each call by a timeout in a separate process and turns an
exception or a hang into a counted failure with the function's name, instead of a stuck run.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

from rlweave.utils.plugins import import_object
from rlweave.utils import jsonl as utils_jsonl

__all__ = [
    "Prompt",
    "TextTask",
    "ArithmeticTask",
    "JsonlQATask",
    "TaskDataError",
    "extract_answer",
    "answers_match",
    "RewardRunner",
    "RewardError",
    "make_task",
    "register_task",
    "known_tasks",
    "TASKS",
    "read_jsonl",
    "score_responses",
]


@dataclass(frozen=True)
class Prompt:
    """One problem: the text the model sees, the gold answer, and where it came from."""

    id: str
    text: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class TextTask:
    """Prompt source and verifier. Subclasses implement :meth:`_pool` (or override
    :meth:`prompts`); scoring by :func:`answers_match` is shared."""

    name = "task"
    splits = ("train", "test")

    def prompts(self, split: str, n: int, seed: int) -> list[Prompt]:
        """``n`` prompts of ``split``, drawn with ``seed`` (with replacement when the split is
        smaller than ``n``)."""
        pool = self._pool(split)
        rng = random.Random(seed)
        if n <= len(pool):
            return rng.sample(pool, n)
        return [rng.choice(pool) for _ in range(n)]

    def pool(self, split: str) -> list[Prompt]:
        """Every prompt of ``split`` (``NotImplementedError`` for tasks that generate prompts as
        they are drawn, such as arithmetic)."""
        return self._pool(split)

    def _pool(self, split: str) -> list[Prompt]:
        raise NotImplementedError

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(f"task {self.name}: unknown split {split!r}; known: {', '.join(self.splits)}")

    def reward(self, prompt: Prompt, response: str) -> float:
        """1.0 when the answer extracted from ``response`` matches the prompt's, else 0.0."""
        got = extract_answer(response)
        return 1.0 if got is not None and answers_match(got, prompt.answer) else 0.0


class TaskDataError(ValueError):
    """A task data file that cannot be used; the message names the file and line."""


# --------------------------------------------------------------------------- arithmetic
_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(TextTask):
    """``What is A op B?`` with A and B of ``min_digits``..``max_digits`` digits.

    A problem is in the test split when a hash of its text falls below ``test_fraction``: the
    split is a fixed function of the problem, so it never moves with the seed, the number of
    prompts drawn or the order of drawing."""

    name = "arithmetic"

    def __init__(self, ops: Sequence[str] = ("+", "-"), min_digits: int = 1, max_digits: int = 2,
                 test_fraction: float = 0.1, template: str = "What is {a} {op} {b}? Answer: "):
        unknown = [o for o in ops if o not in _OPS]
        if not ops or unknown:
            raise ValueError(f"task.ops: {unknown or 'none given'}; choose from {', '.join(_OPS)}")
        if not 1 <= min_digits <= max_digits <= 9:
            raise ValueError(f"task.min_digits/max_digits: need 1 <= min <= max <= 9, got {min_digits}, {max_digits}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"task.test_fraction: must be in (0, 1), got {test_fraction}")
        self.ops, self.min_digits, self.max_digits = tuple(ops), int(min_digits), int(max_digits)
        self.test_fraction, self.template = float(test_fraction), template

    def split_of(self, a: int, op: str, b: int) -> str:
        h = int.from_bytes(hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest(), "big")
        return "test" if h / 2**64 < self.test_fraction else "train"

    def _make(self, a: int, op: str, b: int) -> Prompt:
        return Prompt(id=f"{a}{op}{b}", text=self.template.format(a=a, op=op, b=b), answer=str(_OPS[op](a, b)),
                      meta={"a": a, "b": b, "op": op})

    def prompts(self, split: str, n: int, seed: int) -> list[Prompt]:
        self._check_split(split)
        rng = random.Random(seed)
        lo, hi = 10 ** (self.min_digits - 1) if self.min_digits > 1 else 0, 10**self.max_digits - 1
        out: list[Prompt] = []
        while len(out) < n:  # rejection sampling: the other split's problems are skipped
            a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(self.ops)
            if self.split_of(a, op, b) == split:
                out.append(self._make(a, op, b))
        return out


# --------------------------------------------------------------------------- JSONL question answering
class JsonlQATask(TextTask):
    """Questions and gold answers from local JSONL files: one file per split (``train``/``test``
    paths), or one file whose last ``test_fraction`` of records is the test split."""

    name = "jsonl_qa"

    def __init__(self, train: str | Path, test: str | Path | None = None, test_fraction: float = 0.1,
                 question_key: str = "question", answer_key: str = "answer", template: str = "{question}\n"):
        self.question_key, self.answer_key, self.template = question_key, answer_key, template
        records = self._read(Path(train))
        if test is not None:
            self._splits = {"train": records, "test": self._read(Path(test))}
        else:
            cut = max(1, int(round(len(records) * (1.0 - test_fraction))))
            if cut >= len(records):
                raise TaskDataError(f"{train}: {len(records)} records leave none for the test split (test_fraction={test_fraction})")
            self._splits = {"train": records[:cut], "test": records[cut:]}

    def _read(self, path: Path) -> list[Prompt]:
        out = []
        for lineno, rec in read_jsonl(path):
            missing = [k for k in (self.question_key, self.answer_key) if k not in rec]
            if missing:
                raise TaskDataError(f"{path}:{lineno}: missing key(s) {', '.join(missing)}")
            gold = extract_answer(str(rec[self.answer_key])) or str(rec[self.answer_key]).strip()
            out.append(Prompt(id=f"{path.name}:{lineno}", text=self.template.format(question=rec[self.question_key]),
                              answer=gold, meta={"line": lineno}))
        return out

    def _pool(self, split: str) -> list[Prompt]:
        self._check_split(split)
        return self._splits[split]


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line of a JSONL file of objects;
    :class:`TaskDataError` names the file and line of the first that is not one, and a file
    without records."""
    return utils_jsonl.read_jsonl(path, TaskDataError)


# --------------------------------------------------------------------------- answers
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None  # unbalanced: no answer


def extract_answer(text: str) -> str | None:
    """The answer a response gives: the last ``\\boxed{...}``, else the text after the last
    ``####``, else after "answer is"/"Answer:", else the last number; None when there is none."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    for marker in ("####", "answer is", "Answer:"):
        k = text.rfind(marker)
        if k >= 0:
            tail = text[k + len(marker):].strip()
            m = _NUMBER.search(tail)
            if m:
                return m.group(0)
            if tail:
                return tail.splitlines()[0].strip().rstrip(".")
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def _as_number(s: str) -> Fraction | None:
    s = s.strip().strip("$").rstrip(".").replace(",", "").replace(" ", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(got: str, gold: str) -> bool:
    """Numbers by value; anything else as whitespace- and case-insensitive text."""
    a, b = _as_number(got), _as_number(gold)
    if a is not None and b is not None:
        return a == b
    norm = lambda s: re.sub(r"\s+", "", s).lower().rstrip(".")  # noqa: E731
    return norm(got) == norm(gold)


# --------------------------------------------------------------------------- user reward functions
class RewardError(RuntimeError):
    """A reward function that failed when failures are not tolerated; names the function."""


def _load(spec: str) -> Callable:
    if ":" not in spec or spec.startswith(":") or spec.endswith(":"):
        raise ValueError(f"reward.fn: expected 'module:function', got {spec!r}")
    try:
        fn = import_object(spec)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward.fn: cannot load {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward.fn: {spec!r} is not callable")
    return fn


def _call(spec: str, prompt: Prompt, response: str) -> float:
    return float(_load(spec)(prompt, response))


class RewardRunner:
    """Calls the reward function ``spec`` (``module:function``, ``(prompt, response) -> float``)
    in a separate process, one call at a time, each bounded by ``timeout_s``.

    A call that raises or exceeds the timeout scores ``error_reward`` and is counted
    (``errors``, ``timeouts``); a hung process is killed and replaced. With ``on_error="raise"``
    the first failure raises :class:`RewardError` naming the function and the prompt instead.
    The function is loaded once here first, so a wrong name fails before any work."""

    def __init__(self, spec: str, timeout_s: float = 10.0, on_error: str = "zero", error_reward: float = 0.0):
        if on_error not in ("zero", "raise"):
            raise ValueError(f"reward.on_error: 'zero' or 'raise', got {on_error!r}")
        _load(spec)
        self.spec, self.timeout_s, self.on_error, self.error_reward = spec, float(timeout_s), on_error, float(error_reward)
        self.errors = self.timeouts = 0
        self._ctx = mp.get_context("spawn")  # no fork of a threaded (Ray, torch) process
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            self._pool = self._ctx.Pool(1)
        return self._pool

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        out = []
        for prompt, response in zip(prompts, responses):
            pending = self._get_pool().apply_async(_call, (self.spec, prompt, response))
            try:
                out.append(pending.get(timeout=self.timeout_s))
                continue
            except mp.TimeoutError:
                self.timeouts += 1
                self._pool.terminate()  # the hung call cannot be interrupted; its process can
                self._pool = None
                what = f"timed out after {self.timeout_s:g} s"
            except Exception as e:  # noqa: BLE001 - the user's function raised
                self.errors += 1
                what = f"raised {type(e).__name__}: {e}"
            if self.on_error == "raise":
                raise RewardError(f"reward function {self.spec} {what} on prompt {prompt.id}")
            out.append(self.error_reward)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


# --------------------------------------------------------------------------- task registry
TaskBuilder = Callable[[dict], TextTask]
# name -> builder ``f(task config as a plain dict) -> TextTask``, or "module:function" of one: tasks of
# higher layers (the agent tasks) are registered by import path, as simulator suites are, so this
# module never imports them and their dependencies load only when the task is asked for
TASKS: dict[str, "TaskBuilder | str"] = {
    "calc": "rlweave.agents.tasks.calc:build",
    "multihop": "rlweave.agents.tasks.multihop:build",
}


def register_task(name: str, builder: "TaskBuilder | str | None" = None):
    """Registers ``builder`` (a function or its ``"module:function"`` path) under ``name``, replacing
    any previous one. Without ``builder``, returns a decorator: ``@register_task("mine")``."""
    if builder is None:
        def deco(fn: TaskBuilder) -> TaskBuilder:
            TASKS[name] = fn
            return fn
        return deco
    TASKS[name] = builder
    return builder


def known_tasks() -> list[str]:
    return sorted(TASKS)


def make_task(cfg: dict) -> TextTask:
    """The task a run's ``task`` config section describes (``task.name`` in :data:`TASKS`)."""
    name = cfg.get("name") or "arithmetic"
    builder = TASKS.get(name)
    if builder is None:
        raise ValueError(f"task.name: unknown task {name!r}; known: {', '.join(known_tasks())}")
    if isinstance(builder, str):
        builder = import_object(builder)
    return builder(cfg)


def _template(cfg: dict) -> dict:
    return {"template": cfg["template"]} if cfg.get("template") else {}


@register_task("arithmetic")
def _build_arithmetic(cfg: dict) -> ArithmeticTask:
    return ArithmeticTask(ops=tuple(cfg.get("ops") or ("+",)), min_digits=cfg.get("min_digits") or 1,
                          max_digits=cfg.get("max_digits") or 2, test_fraction=cfg.get("test_fraction", 0.1), **_template(cfg))


@register_task("jsonl_qa")
def _build_jsonl_qa(cfg: dict) -> JsonlQATask:
    if not cfg.get("train_file"):
        raise TaskDataError("task.train_file: jsonl_qa needs a JSONL file of {question, answer} records")
    return JsonlQATask(cfg["train_file"], cfg.get("test_file"), test_fraction=cfg.get("test_fraction", 0.1),
                       question_key=cfg.get("question_key", "question"), answer_key=cfg.get("answer_key", "answer"),
                       **_template(cfg))


def score_responses(task: TextTask, prompts: Sequence[Prompt], responses: Sequence[str],
                    reward_fn: "RewardRunner | None" = None) -> list[float]:
    """Rewards of ``responses``: the user's reward function when one is configured, else the
    task's answer checker."""
    if reward_fn is not None:
        return reward_fn(prompts, responses)
    return [task.reward(p, r) for p, r in zip(prompts, responses)]
