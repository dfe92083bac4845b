"""A run that chains a sub-run (the SFT warm-up before RL): the user's task, model and data settings
reach the warm-up, what it cannot take is refused on one line before any work, a warm-up or an RL
start that cannot lead anywhere is called out, and the warm-up's stop rule lands near its target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers")

from rlweave.config import ConfigError, load_config  # noqa: E402
from rlweave.config.chain import carried_values  # noqa: E402
from rlweave.runners.llm import LLMRunner, sft_config  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.vocab_size=300", "run.progress=false", "run.tensorboard=false",
        "task.eval_prompts=16", "cluster.num_cpus=2", "cluster.local=true"]
SHORT_RL = ["rollout.prompts_per_iteration=4", "algorithm.group_size=4", "train.total_iterations=1", "train.eval_every=1"]
SHORT_SFT = "init.sft_overrides=['train.total_updates=4','train.updates_per_iteration=2','algorithm.minibatch_size=8']"


def test_task_model_and_data_overrides_reach_the_warm_up_config():
    cfg = load_config("grpo-arith", ["task.ops=[-]", "model.hidden_size=96", "data.packing=true", "rollout.max_new_tokens=5",
                                     "init.sft_overrides=['algorithm.lr=0.001']"])
    sub = sft_config(cfg)
    assert list(sub.cfg.task.ops) == ["-"] and sub.cfg.model.hidden_size == 96 and sub.cfg.data.packing
    assert sub.cfg.rollout.max_new_tokens == 5
    assert sub.cfg.algorithm.lr == 0.001 and sub.cfg.algorithm.name == "sft"  # the warm-up's own settings stay its own
    assert sub.cfg.data.max_tokens == 48  # a data key the run does not set keeps the warm-up recipe's value
    line = sub.describe()
    assert "task.ops=['-']" in line and "model.hidden_size=96" in line and "data.packing=True" in line
    assert "task.min_digits" not in line  # same in both recipes: not news


def test_an_explicit_warm_up_override_wins_over_what_the_run_carries():
    cfg = load_config("grpo-arith", ["task.ops=[-]", "init.sft_overrides=['task.ops=[+,-]']"])
    sub = sft_config(cfg)
    assert list(sub.cfg.task.ops) == ["+", "-"] and "task.ops" not in sub.describe()


def test_only_data_keys_the_run_sets_are_carried():
    carried = carried_values(load_config("grpo-arith", []))
    assert not any(k.startswith("data.") for k in carried)
    assert carried_values(load_config("grpo-arith", ["data.path=x.jsonl"]))["data.path"] == "x.jsonl"


def test_a_warm_up_that_cannot_take_the_runs_settings_is_refused_on_one_line(tmp_path):
    # enough positions for RL's prompt + answer (32 + 6), too few for the warm-up's 48-token examples
    with pytest.raises(ConfigError) as e:
        LLMRunner(load_config("grpo-arith", ["model.max_positions=40"]), tmp_path / "never")
    msg = str(e.value)
    assert msg.startswith("init.sft_recipe: 'sft-arith' cannot run with model.max_positions")
    assert "data.max_tokens: 48 exceeds model.max_positions (40)" in msg and "\n" not in msg
    assert not (tmp_path / "never").exists()


def _qa_file(path: Path, n: int, words: int) -> Path:
    lines = [json.dumps({"question": " ".join(["word"] * words) + f" what is {i} plus 1?", "answer": f"#### {i + 1}"})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prompts_too_long_for_the_run_are_refused_before_the_warm_up_trains(tmp_path, capsys):
    train = _qa_file(tmp_path / "train.jsonl", 40, 60)
    test = _qa_file(tmp_path / "test.jsonl", 10, 60)
    cfg = load_config("grpo-arith", [*TINY, *SHORT_RL, SHORT_SFT, "task.name=jsonl_qa", f"task.train_file={train}",
                                     f"task.test_file={test}", "task.max_prompt_tokens=16", "model.max_positions=64"])
    with pytest.raises(ConfigError) as e:
        LLMRunner(cfg, tmp_path / "run").run()
    assert str(e.value).startswith("task.max_prompt_tokens: every held-out prompt is longer than 16 tokens")
    assert not (tmp_path / "run" / "sft" / "metrics.jsonl").exists()  # no warm-up step was taken
    out = capsys.readouterr().out
    assert "task.name=jsonl_qa" in out  # the one line naming what the warm-up takes from the run


def test_the_warm_up_runs_on_the_users_task_and_a_hopeless_start_is_called_out(tmp_path, capsys):
    LLMRunner(load_config("grpo-arith", [*TINY, *SHORT_RL, "task.ops=[-]", "rollout.max_new_tokens=4",
                                         "init.sft_overrides=['train.total_updates=2','train.updates_per_iteration=2',"
                                         "'algorithm.minibatch_size=8','train.stop_at_eval=0.9']"]), tmp_path / "run").run()
    saved = yaml.safe_load((tmp_path / "run" / "sft" / "config.yaml").read_text())
    assert saved["task"]["ops"] == ["-"] and saved["model"]["hidden_size"] == 32 and saved["rollout"]["max_new_tokens"] == 4
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "warning" in line]
    assert any("the warm-up ended at held-out accuracy" in w and "train.stop_at_eval=0.9" in w for w in warnings)
    assert any("at the start of RL is below 0.02" in w and "sft/config.yaml" in w for w in warnings)
    assert len(warnings) == 2


def test_near_its_target_the_warm_up_evaluates_every_few_updates(tmp_path):
    runner = LLMRunner(load_config("sft-arith", [*TINY, "algorithm.minibatch_size=8", "train.total_updates=40",
                                                 "train.updates_per_iteration=10", "train.stop_approach_updates=3",
                                                 "train.stop_at_eval=2.0", "train.eval_every=2"]), tmp_path / "run")
    runner._near_eval_target = lambda: runner.updates >= 10  # noqa: SLF001 - as if an evaluation came within half
    runner.run()
    updates = [r["updates"] for r in read_metrics(tmp_path / "run") if "updates" in r]
    evaluated = [r["updates"] for r in read_metrics(tmp_path / "run") if "updates" in r and "eval/accuracy" in r]
    assert updates[:4] == [10, 13, 16, 19] and evaluated[:4] == [10, 13, 16, 19]  # eval_every=2 alone: 13 (iteration 2) only


def test_run_wide_settings_reach_the_warm_up_as_values_not_override_text():
    cfg = load_config("grpo-arith", ["run.tags=['lr=3e-4',b]", "run.group='exp(1)'", "run.loggers=[tensorboard]"])
    sub = sft_config(cfg)
    assert list(sub.cfg.run.tags) == ["lr=3e-4", "b"] and sub.cfg.run.group == "exp(1)" and sub.cfg.seed == cfg.seed


def test_a_held_out_split_mostly_dropped_for_length_is_named_before_work(tmp_path, capsys):
    from rlweave.envs.text_tasks import JsonlQATask
    from rlweave.runners.llm_prompts import check_prompt_fit

    lines = [json.dumps({"question": " ".join(["word"] * (30 if i % 2 else 3)) + f" what is {i}?", "answer": f"#### {i}"})
             for i in range(20)]
    (tmp_path / "qa.jsonl").write_text("\n".join(lines) + "\n")
    task = JsonlQATask(tmp_path / "qa.jsonl", test_fraction=0.5)
    cfg = load_config("grpo-arith", ["task.max_prompt_tokens=16", "task.eval_prompts=10"])

    def fit(prompts):  # a word is a token here: the rule under test is the check's, not the tokenizer's
        kept = [p for p in prompts if len(p.text.split()) <= 16]
        return kept, len(prompts) - len(kept), 0

    check_prompt_fit(task, cfg, fit, eval_seed=0)
    assert "warning: task.max_prompt_tokens=16 drops 5 of 10 held-out prompts" in capsys.readouterr().out
    cfg = load_config("grpo-arith", ["task.max_prompt_tokens=64", "task.eval_prompts=10"])
    check_prompt_fit(task, cfg, lambda ps: (ps, 0, 0), eval_seed=0)
    assert "warning" not in capsys.readouterr().out
