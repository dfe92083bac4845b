"""Multi-agent (#26 item 4): the solver_verifier workflow, two roles of one tiny Qwen3 trained
jointly. Rows of both roles with their masks and GRPO groups, the verifier's reward rule, the
workflow registry's one-line refusal, and a 2-iteration chain (SFT warm-up on both roles' expert
traces, then GRPO) whose per-role metrics reach metrics.jsonl."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from rlweave.agents.solver_verifier import near_miss, shown_answer, verifier_reward, write_traces  # noqa: E402
from rlweave.agents.tasks.prompts import parse_verdict, verdict_line  # noqa: E402
from rlweave.agents.workflows import check_workflow, get_workflow, workflow_name  # noqa: E402
from rlweave.config import ConfigError, load_config  # noqa: E402
from rlweave.envs.text_tasks import make_task  # noqa: E402
from rlweave.runners.llm import LLMRunner  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.vocab_size=600", "run.progress=false", "run.tensorboard=false",
        "task.eval_prompts=4", "cluster.num_cpus=2", "cluster.local=true"]


def test_verifier_reward_is_its_verdict_against_the_truth_never_the_team_outcome():
    assert verifier_reward(True, True) == 1.0 and verifier_reward(False, False) == 1.0
    assert verifier_reward(True, False) == 0.0 and verifier_reward(False, True) == 0.0
    assert verifier_reward(None, True) == 0.0 and verifier_reward(None, False) == 0.0  # no verdict line earns nothing
    assert parse_verdict(verdict_line(True)) is True and parse_verdict(verdict_line(False)) is False
    assert parse_verdict("I think so. The answer is 42.") is None and parse_verdict("") is None
    assert shown_answer("<tool_call>x</tool_call> The answer is 1234.") == "1234" and shown_answer("hmm") == "none"
    import random

    p = make_task({"name": "calc"}).prompts("train", 1, 0)[0]
    rng = random.Random(0)
    assert all(near_miss(p, rng) != p.answer for _ in range(50))


def test_registry_picks_the_producer_and_refuses_an_unknown_name_on_one_line():
    assert workflow_name({"tools": ["calculator"]}) == "tools"
    assert workflow_name({"tools": ["calculator"], "openai_fn": "m:f"}) == "openai"  # the keys that chose it before
    assert workflow_name({}) is None and check_workflow({}) is None
    assert get_workflow("solver_verifier").roles == ("solver", "verifier")
    with pytest.raises(ValueError) as e:
        get_workflow("debate")
    assert str(e.value) == "agent.workflow: unknown workflow 'debate'; known: openai, solver_verifier, tools"
    with pytest.raises(ValueError, match=r"^agent.role_weights: judge not a role"):
        check_workflow({"workflow": "solver_verifier", "tools": ["calculator"], "role_weights": {"judge": 2.0}})
    with pytest.raises(ConfigError) as e:
        LLMRunner(load_config("grpo-solver-verifier", [*TINY, "agent.workflow=debate", "init.sft_recipe=null"]), "/nonexistent")
    assert "\n" not in str(e.value) and "agent.workflow: unknown workflow 'debate'" in str(e.value)


def test_expert_traces_of_both_roles_with_right_and_wrong_answers(tmp_path):
    stats = write_traces(make_task({"name": "calc"}), 40, tmp_path / "t.jsonl", seed=0)
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert stats["written"] == len(lines) == 80 and 8 <= stats["accepts"] <= 32  # about half the proposals are gold
    verifier = [r["messages"] for r in lines if "Proposed answer" in r["messages"][1]["content"]]
    assert len(verifier) == 40
    for m in verifier:  # recomputes with the calculator, then a verdict that compares
        assert m[2]["tool_calls"][0]["function"]["name"] == "calculator" and m[3]["role"] == "tool"
        proposed = m[1]["content"].rsplit(": ", 1)[1]
        assert parse_verdict(m[-1]["content"]) is (proposed == m[3]["content"])


def test_rows_of_both_roles_masks_groups_and_per_role_metrics_in_a_two_iteration_run(tmp_path):
    overrides = [*TINY, "init.sft_overrides=['train.total_updates=4','train.updates_per_iteration=2','algorithm.minibatch_size=8',"
                 "'train.stop_at_eval=null','agent.sft_traces=16']",
                 "rollout.prompts_per_iteration=2", "algorithm.group_size=3", "rollout.max_new_tokens=24", "agent.max_tokens=64",
                 "train.total_iterations=2", "train.eval_every=2", "train.checkpoint_every=0",
                 "agent.role_weights={solver: 1.0, verifier: 0.5}"]
    runner = LLMRunner(load_config("grpo-solver-verifier", overrides), tmp_path / "run")
    seen: list[dict] = []
    prompts = runner.task.prompts("train", 2, 5)

    def one_generation(r, record):  # one generation as the runner's iteration sees it, while the workers live
        if not seen:
            seen.extend(r.rollout.generate(prompts, 3, 11).wait())

    runner.run(on_iteration=one_generation)
    traces = (tmp_path / "run" / "sft" / "traces.jsonl").read_text().splitlines()
    assert sum("Proposed answer" in t for t in traces) == len(traces) // 2  # the warm-up saw both roles

    from rlweave.runners.llm_batches import assemble, groups_of

    (gen,) = seen  # prompt-major: 3 solver rows, then the 3 verifier rows judging them
    assert gen["role"] == ["solver"] * 3 + ["verifier"] * 3 + ["solver"] * 3 + ["verifier"] * 3
    tok = runner.tokenizer
    for i, role in enumerate(gen["role"]):
        head = tok.decode(gen["prompt_ids"][i])
        assert ("Proposed answer" in head) == (role == "verifier") and head.count(prompts[i // 6].text) == 1
        m, resp = np.array(gen["loss_mask"][i]), gen["response_ids"][i]
        assert len(m) == len(resp) == len(gen["logprobs"][i]) and m[0] == 1  # the model speaks first
        obs = tok.decode([t for t, k in zip(resp, m) if k == 0])  # the tool results: context, never trained on
        assert obs == "" or "<tool_response>" in obs
        assert np.all(np.array(gen["logprobs"][i])[m == 0] == 0)
    for g in range(2):  # each verifier row judges the solver row at the same place in its prompt's groups
        for j in range(3):
            s, v = 6 * g + j, 6 * g + 3 + j
            shown = tok.decode(gen["prompt_ids"][v]).split("Proposed answer: ")[1].split("<|im_end|>")[0].strip()
            assert shown == "none" or shown in tok.decode(gen["response_ids"][s], skip_special_tokens=True)
            st = gen["role_stats"][v]
            assert gen["rewards"][v] in (0.0, 1.0) and (st["verifier/verdict_rate"][0] or gen["rewards"][v] == 0.0)
            if st["verifier/verdict_rate"][0]:
                assert gen["rewards"][v] == verifier_reward(bool(st["verifier/accept_rate"][0]), gen["rewards"][s] > 0)
    batch = assemble(groups_of(gen, 3), tok.pad_token_id)
    assert batch["group"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # solver group, verifier group, per prompt
    assert list(batch["role"]) == gen["role"] and batch["role_stats"]["reward/verifier"][1] == 6
    assert not batch["mask"][np.array(batch["loss_mask"]) == 0].any()

    records = read_metrics(tmp_path / "run")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for key in ("eval/reward/solver", "eval/reward/verifier", "eval/verifier/accept_rate", "eval/verifier/probe_accuracy",
                "eval/team/accuracy"):
        assert key in records[0] and key in records[2], key
    for key in ("train/reward/solver", "train/reward/verifier", "train/verifier/accept_rate", "train/team/accuracy",
                "train/loss_policy"):
        assert key in records[1] and key in records[2], key
    assert all(0.0 <= records[i][k] <= 1.0 for i in (1, 2) for k in ("train/reward/solver", "train/reward/verifier"))
    assert records[2]["eval/accuracy"] == records[2]["eval/reward/solver"]  # the solver's answers are the task's accuracy
    assert records[1]["rollout/logprob_gap"] < 1e-4  # both roles' tokens scored alike by engine and trainer

