"""Agent runs end to end on a tiny Qwen3 (#26): SFT on expert tool-use traces trains only the
assistant tokens; a grpo-calc-style run (the SFT warm-up on the calc task's traces, then GRPO with the
calculator, multi-turn) logs the agent figures and trains on rows whose observations are masked."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from omegaconf import OmegaConf  # noqa: E402

from rlweave.config import ConfigError, load_config  # noqa: E402
from rlweave.runners.llm import LLMRunner  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.vocab_size=600", "run.progress=false", "run.tensorboard=false",
        "task.eval_prompts=4", "cluster.num_cpus=2", "cluster.local=true"]


def test_sft_rows_of_tool_use_traces_target_only_the_assistant_turns(tmp_path):
    from rlweave.agents.traces import write_traces
    from rlweave.data.sft_data import SFTData, read_sft_jsonl
    from rlweave.envs.text_tasks import make_task
    from rlweave.models.causal_lm import train_tokenizer
    from rlweave.models.chat_template import add_chat_template, render_text

    stats = write_traces(make_task({"name": "calc"}), 6, tmp_path / "traces.jsonl")
    assert stats["written"] == 6
    plain = read_sft_jsonl(tmp_path / "traces.jsonl")
    assert all(e.multi_turn and e.tools for e in plain)
    tok = add_chat_template(train_tokenizer([render_text(e.messages, e.tools) for e in plain], vocab_size=400))
    data = SFTData(tok, read_sft_jsonl(tmp_path / "traces.jsonl", tokenizer=tok), max_tokens=512)
    batch = data.batch(6, seed=0)
    for ids, target in zip(batch["input_ids"], batch["target_mask"]):
        learnt = tok.decode(ids[target])
        assert learnt.startswith('<tool_call>{"name": "calculator", "arguments": {"expression": "')
        assert learnt.count("<|im_end|>") == 2 and "The answer is" in learnt
        assert "<tool_response>" in tok.decode(ids) and "<tool_response>" not in learnt  # observations: context only
    whole = SFTData(tok, read_sft_jsonl(tmp_path / "traces.jsonl", tokenizer=tok), max_tokens=512, loss_on="all").batch(6, seed=0)
    assert (whole["input_ids"] == batch["input_ids"]).all()  # the same rows; every real token is a target
    assert (whole["target_mask"] == (whole["input_ids"] != tok.pad_token_id)).all()
    with pytest.raises(ValueError, match="data.loss_on"):
        SFTData(tok, read_sft_jsonl(tmp_path / "traces.jsonl", tokenizer=tok), loss_on="observations")


def test_agent_tools_are_checked_before_start(tmp_path):
    with pytest.raises(ConfigError, match=r"agent.tools\[0\]: unknown tool 'abacus'"):
        LLMRunner(load_config("grpo-calc", [*TINY, "agent.tools=[abacus]", "init.sft_recipe=null"]), tmp_path / "never")
    with pytest.raises(ConfigError, match=r"task.max_prompt_tokens \+ agent.max_tokens"):
        LLMRunner(load_config("grpo-calc", [*TINY, "model.max_positions=128", "init.sft_recipe=null"]), tmp_path / "never")


def test_grpo_calc_style_run_warms_up_on_traces_then_trains_multi_turn(tmp_path, capsys):
    overrides = [*TINY, "init.sft_overrides=['train.total_updates=4','train.updates_per_iteration=2','algorithm.minibatch_size=8',"
                 "'train.stop_at_eval=null','agent.sft_traces=32']",
                 "rollout.prompts_per_iteration=2", "algorithm.group_size=4", "rollout.max_new_tokens=24", "agent.max_tokens=64",
                 "train.total_iterations=2", "train.eval_every=2", "train.checkpoint_every=0"]
    runner = LLMRunner(load_config("grpo-calc", overrides), tmp_path / "run")
    runner.run()
    sft = read_metrics(tmp_path / "run" / "sft")
    assert (tmp_path / "run" / "sft" / "traces.jsonl").is_file() and sft[-1]["updates"] == 4
    assert sft[-1]["train/loss_sft"] < sft[1]["train/loss_sft"] or len(sft) == 2
    assert "eval/format_valid" in sft[-1]  # the warm-up is evaluated multi-turn
    records = read_metrics(tmp_path / "run")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    first = records[1]
    for key in ("train/tool_calls_per_trajectory", "train/turns_per_trajectory", "train/format_valid", "train/finished",
                "train/tool_errors/invalid_json", "train/tool_errors/timeout", "eval/tool_calls_per_trajectory", "train/loss_policy",
                "train/tool_latency_s"):
        assert key in first or key in records[2], key
    assert 1.0 <= first["train/turns_per_trajectory"] <= 3.0
    assert all(np.isfinite(r["train/loss_policy"]) for r in records[1:])
    # trainer and engine score the same model tokens with the same weights, observations or not
    assert first["rollout/logprob_gap"] < 1e-4
    assert runner.tokenizer.chat_template and (tmp_path / "run" / "model" / "config.json").is_file()
    assert Path(tmp_path / "run" / "sft" / "model" / "tokenizer_config.json").is_file()
    # `rlweave eval` on the finished run scores its model on the run's own held-out prompts as the run did
    from rlweave.cli import main

    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run")]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["prompts"] == 4
    for key in ("eval/accuracy", "eval/tool_calls_per_trajectory", "eval/response_length"):
        assert scored[key] == pytest.approx(records[2][key]), key
    assert main(["eval", str(tmp_path / "run"), "--all"]) == 2  # calc draws its prompts: no whole split
    assert "--all: task calc" in capsys.readouterr().err


def test_a_curriculum_over_question_kinds_is_logged_checkpointed_and_resumed_exactly(tmp_path, capsys):
    """grpo-search with ``task.curriculum=kind`` (tiny, from random weights): every iteration logs
    each kind's share of the next draw; a run stopped after iteration 1 and resumed draws and
    scores iteration 2 as the uninterrupted run does (the kinds' success rates are in the checkpoint).
    The reward is the prompt's kind (a random model answers nothing), so the kinds' rates differ."""
    overrides = [*TINY, f"task.corpus={tmp_path / 'corpus'}", "task.entities=60", "task.curriculum=kind",
                 "init.sft_recipe=null", "rollout.prompts_per_iteration=8", "algorithm.group_size=2",
                 "algorithm.minibatch_size=16", "algorithm.micro_batch_size=16", "rollout.max_new_tokens=8",
                 "agent.max_tokens=48", "agent.max_turns=2", "rollout.temperature=1.0", "run.deterministic=true",
                 "train.total_iterations=2", "train.eval_every=0", "train.checkpoint_every=1",
                 "task.reward_fn=tests.test_agent_runs:reward_by_kind", "task.reward_on_error=raise"]
    LLMRunner(load_config("grpo-search", overrides), tmp_path / "whole").run()
    whole = read_metrics(tmp_path / "whole")
    shares = [{k: v for k, v in r.items() if k.startswith("curriculum/")} for r in whole]
    assert len(shares) == 2 and all(len(s) > 3 and sum(s.values()) == pytest.approx(1.0) for s in shares)
    assert len(set(shares[0].values())) > 1  # the person questions (reward 1) are drawn less from iteration 2 on
    stopped = LLMRunner(load_config("grpo-search", overrides), tmp_path / "part")
    stopped.run(on_iteration=lambda r, rec: r.request_stop() if r.iteration == 1 else None)
    resumed = LLMRunner(load_config("grpo-search", overrides), tmp_path / "part", resume=True)
    resumed.run()
    keep = lambda r: {k: v for k, v in r.items() if k.startswith(("curriculum/", "train/reward", "env_steps"))}  # noqa: E731
    assert [keep(r) for r in read_metrics(tmp_path / "part")] == [keep(r) for r in whole]
    # the whole test split, by kind of question: every held-out question is asked once
    from rlweave.cli import main
    from rlweave.envs.text_tasks import make_task

    capsys.readouterr()
    assert main(["eval", str(tmp_path / "whole"), "--all"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pool = make_task({"name": "multihop", "corpus": str(tmp_path / "corpus"), "entities": 60, "search_k": 1}).pool("test")
    kinds = Counter(p.meta["kind"] for p in pool)
    assert scored["prompts"] + scored["dropped"] == len(pool) and scored["dropped"] == 0
    assert {k: n for k, (_, n) in scored["by_kind"].items()} == dict(kinds)
    assert scored["eval/accuracy"] == sum(c for c, _ in scored["by_kind"].values()) / len(pool)
    # without model/ (a run interrupted or still running) the newest checkpoint is scored: here the
    # final iteration's, the same weights (checked by checksum), so the same answers
    from rlweave.models.causal_lm import load_causal_lm, load_tokenizer, merged_state_dict
    from rlweave.runners.llm_eval import _checkpoint_packet
    from rlweave.sync.weights import pack_state

    cfg = load_config("grpo-search", overrides)
    final = tmp_path / "whole" / "model"
    tokenizer = load_tokenizer(str(final))
    spec = {**OmegaConf.to_container(cfg.model), "path": None}
    packet, _ = _checkpoint_packet(tmp_path / "whole", cfg, spec, tokenizer)
    saved = merged_state_dict(load_causal_lm({**spec, "path": str(final)}, len(tokenizer)))
    assert packet.checksum == pack_state(saved, 0).checksum
    final.rename(tmp_path / "whole" / "model.kept")
    assert main(["eval", str(tmp_path / "whole"), "--all"]) == 0
    from_checkpoint = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert from_checkpoint.pop("model") == "iter_00000002" and scored.pop("model").endswith("model")
    assert from_checkpoint == scored
    # a model/ folder older than the newest checkpoint (a stopped run, resumed) is passed over
    from rlweave.runners.llm_checks import MODEL_RECORD

    (tmp_path / "whole" / "model.kept").rename(final)
    assert json.loads((final / MODEL_RECORD).read_text()) == {"iteration": 2}
    (final / MODEL_RECORD).write_text(json.dumps({"iteration": 1}))
    assert main(["eval", str(tmp_path / "whole"), "--episodes", "4"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["model"] == "iter_00000002"


def reward_by_kind(prompt, response: str) -> float:
    """task.reward_fn of the curriculum test: 1 for questions about a person, whatever the answer."""
    return float(prompt.meta["kind"].startswith("person"))
