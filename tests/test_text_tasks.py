"""Language-model tasks with verifiable rewards: splits, answer extraction, scoring, and user reward
functions that raise or hang."""

from __future__ import annotations

import json
import time

import pytest

from rlweave.envs.text_tasks import (
    ArithmeticTask,
    JsonlQATask,
    Prompt,
    RewardError,
    RewardRunner,
    TaskDataError,
    answers_match,
    extract_answer,
)


def test_arithmetic_splits_are_disjoint_and_do_not_move_with_the_seed():
    task = ArithmeticTask(ops=("+", "-", "*"), min_digits=1, max_digits=2, test_fraction=0.2)
    train = {p.id for s in range(5) for p in task.prompts("train", 200, seed=s)}
    test = {p.id for s in range(5) for p in task.prompts("test", 200, seed=s)}
    assert train and test and not train & test
    assert all(task.split_of(p.meta["a"], p.meta["op"], p.meta["b"]) == "test" for p in task.prompts("test", 50, 9))
    share = sum(task.split_of(a, "+", b) == "test" for a in range(100) for b in range(100)) / 10_000
    assert 0.17 < share < 0.23  # the requested fraction of the problem space
    assert task.prompts("train", 10, seed=3) == task.prompts("train", 10, seed=3)


def test_arithmetic_prompt_and_answer():
    p = ArithmeticTask(ops=("*",), min_digits=3, max_digits=3).prompts("train", 1, seed=0)[0]
    a, b = p.meta["a"], p.meta["b"]
    assert 100 <= a <= 999 and 100 <= b <= 999
    assert p.text == f"What is {a} * {b}? Answer: " and p.answer == str(a * b)
    task = ArithmeticTask()
    assert task.reward(p, f"{a * b}") == 1.0 and task.reward(p, f"{a * b + 1}") == 0.0 and task.reward(p, "no idea") == 0.0


def test_bad_task_settings_name_the_key():
    with pytest.raises(ValueError, match=r"task.ops: \['/'\]"):
        ArithmeticTask(ops=("/",))
    with pytest.raises(ValueError, match="task.min_digits/max_digits"):
        ArithmeticTask(min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        ArithmeticTask().prompts("valid", 1, 0)


@pytest.mark.parametrize("text, expected", [
    ("so the total is \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
    ("The answer is 1,250.", "1,250"),
    ("Answer: -7", "-7"),
    ("3 apples and 5 pears make 8", "8"),
    ("no digits here", None),
    ("unbalanced \\boxed{12", "12"),
])
def test_answer_extraction(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("got, gold, same", [
    ("1,000", "1000", True), ("0.5", "1/2", True), ("$42", "42", True), ("42.", "42", True), ("41", "42", False),
    ("x^2 + 1", "x^2+1", True), ("Paris", "paris", True), ("Rome", "Paris", False),
])
def test_answers_compare_by_value(got, gold, same):
    assert answers_match(got, gold) is same


def test_jsonl_task_reads_gsm8k_style_gold_and_names_bad_lines(tmp_path):
    data = tmp_path / "qa.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(10)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = JsonlQATask(data, test_fraction=0.2)
    train, test = task._pool("train"), task._pool("test")
    assert len(train) == 8 and len(test) == 2 and test[0].answer == "16"
    assert task.reward(test[0], "I think it is \\boxed{16}") == 1.0
    assert task.reward(test[0], "it is 15") == 0.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(TaskDataError, match=r"bad.jsonl:2: not JSON"):
        JsonlQATask(bad)
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(TaskDataError, match=r"bad.jsonl:1: missing key\(s\) answer"):
        JsonlQATask(bad)


P = [Prompt("p0", "q", "1"), Prompt("p1", "q", "1"), Prompt("p2", "q", "1")]


def test_reward_function_runs_in_its_own_process():
    runner = RewardRunner("reward_fns:length_reward", timeout_s=30)
    try:
        assert runner(P[:2], ["abc", "hello"]) == [3.0, 5.0]
    finally:
        runner.close()


def test_reward_function_that_raises_or_hangs_scores_zero_and_is_counted():
    runner = RewardRunner("reward_fns:hangs", timeout_s=2.0)
    try:
        t0 = time.perf_counter()
        assert runner(P, ["ok", "please hang", "ok"]) == [1.0, 0.0, 1.0]  # the pool was replaced after the hang
        assert runner.timeouts == 1 and time.perf_counter() - t0 < 30
    finally:
        runner.close()
    runner = RewardRunner("reward_fns:raises", timeout_s=30)
    try:
        assert runner(P[:2], ["a", "b"]) == [0.0, 0.0] and runner.errors == 2
    finally:
        runner.close()


def test_reward_failures_can_stop_the_run_naming_function_and_prompt():
    runner = RewardRunner("reward_fns:raises", timeout_s=30, on_error="raise")
    try:
        with pytest.raises(RewardError, match=r"reward function reward_fns:raises raised ValueError: bad response format on prompt p0"):
            runner(P[:1], ["a"])
    finally:
        runner.close()


def test_wrong_reward_function_names_fail_before_any_work():
    with pytest.raises(ValueError, match=r"reward.fn: expected 'module:function'"):
        RewardRunner("nocolon")
    with pytest.raises(ValueError, match=r"reward.fn: cannot load 'reward_fns:nope'"):
        RewardRunner("reward_fns:nope")
    with pytest.raises(ValueError, match=r"reward.fn: 'reward_fns:not_callable' is not callable"):
        RewardRunner("reward_fns:not_callable")
