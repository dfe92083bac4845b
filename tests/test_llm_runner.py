"""The language-model workflow end to end on a tiny Qwen3: config checks before start, SFT (padded
and packed), GRPO / DAPO / REINFORCE++ / PPO / async PPO iterations on real Ray workers, weight
sync equality, the SFT warm-up sub-run, the exported Hugging Face folder, and resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlweave.config import ConfigError, load_config  # noqa: E402
from rlweave.runners.llm import LLMRunner  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.vocab_size=300", "run.progress=false", "run.tensorboard=false",
        "task.eval_prompts=16", "cluster.num_cpus=2"]
LOCAL = ["cluster.local=true"]  # workers in this process (no Ray start): for tests of the workflow's logic
RL = TINY + ["init.sft_recipe=null", "rollout.prompts_per_iteration=4", "algorithm.group_size=4", "rollout.max_new_tokens=4",
             "train.total_iterations=2", "train.eval_every=1", "train.checkpoint_every=1"]


def _cfg(recipe: str, *overrides: str):
    return load_config(recipe, list(overrides))


def _run(tmp_path: Path, recipe: str, *overrides: str, name: str = "run") -> tuple[LLMRunner, list[dict]]:
    runner = LLMRunner(_cfg(recipe, *overrides), tmp_path / name)
    runner.run()
    return runner, read_metrics(tmp_path / name)


# --------------------------------------------------------------------------- refused before start
@pytest.mark.parametrize("overrides, fragment", [
    (["algorithm.name=sac"], "algorithm.name: 'sac' is an off-policy algorithm; it runs with runner=offpolicy"),
    (["algorithm.group_size=1"], "algorithm.group_size: grpo compares responses to the same prompt; needs >= 2, got 1"),
    (["algorithm.overlong_buffer=9"], "algorithm.overlong_buffer: 9 exceeds rollout.max_new_tokens (4)"),
    (["train.total_iterations=0"], "train.total_iterations: give the number of RL iterations (> 0)"),
    (["algorithm.name=reinforce_pp", "algorithm.dynamic_sampling=true"], "algorithm.dynamic_sampling: needs group-relative advantages"),
    (["algorithm.name=async_ppo", "train.max_staleness=0"], "train.max_staleness: async PPO"),
    (["algorithm.name=async_ppo", "algorithm.dynamic_sampling=true"], "algorithm.dynamic_sampling: async_ppo trains on the batch"),
    (["init.checkpoint=/nonexistent"], "init.checkpoint: /nonexistent is neither a Hugging Face model folder"),
    (["model.max_positions=8"], "model.max_positions: 8 is shorter than task.max_prompt_tokens + rollout.max_new_tokens (36)"),
    (["task.reward_fn=nonexistent_module:f"], "task.reward_fn: cannot load 'nonexistent_module:f'"),
    (["task.ops=[/]"], "task.ops"),
    (["placement.mode=auto", "run.deterministic=true"], "run.deterministic: placement.mode=auto chooses the layout"),
    (["actor.precision=bfloat16"], "actor.precision: language models choose their dtype with model.dtype"),
])
def test_bad_llm_config_is_refused_on_one_line_before_start(tmp_path, overrides, fragment):
    with pytest.raises(ConfigError) as e:
        LLMRunner(_cfg("grpo-arith", *RL, *overrides), tmp_path / "never")
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "never").exists()


def test_eager_attention_with_packed_sft_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        LLMRunner(_cfg("sft-arith", *TINY, "data.packing=true", "actor.attention=eager"), tmp_path / "never")
    assert str(e.value).startswith("actor.attention: eager attention would add a packed batch's boolean block mask")
    assert not (tmp_path / "never").exists()


def test_sft_data_line_without_field_names_the_line(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c"}\n')
    with pytest.raises(ConfigError, match=r"data.path: .*sft.jsonl:3: missing field\(s\) response"):
        LLMRunner(_cfg("sft-arith", *TINY, f"data.path={data}"), tmp_path / "never")


def test_the_vllm_backend_names_its_extra_when_missing(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(ConfigError, match=r"rollout.backend: vllm is not installed: pip install 'rlweave\[vllm\]'"):
        LLMRunner(_cfg("grpo-arith-vllm", *RL), tmp_path / "never")


# --------------------------------------------------------------------------- SFT
def test_sft_lowers_the_loss_logs_eval_first_and_exports_a_loadable_model(tmp_path):
    runner, records = _run(tmp_path, "sft-arith", *TINY, *LOCAL, "train.total_updates=40", "train.updates_per_iteration=20",
                           "train.eval_every=1", "algorithm.minibatch_size=32")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert set(records[0]) >= {"eval/accuracy", "eval/response_length"} and "train/loss_sft" not in records[0]
    assert records[2]["train/loss_sft"] < records[1]["train/loss_sft"]
    assert records[2]["updates"] == 40
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "run" / "model")
    assert model.config.hidden_size == 32 and len(tok) <= 300


def test_packed_sft_on_jsonl_learns_like_padded_sft(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"What is {a} + {b}? Answer: ", "response": str(a + b)})
                              for a in range(10, 40) for b in range(10, 14)) + "\n")
    common = [*TINY, *LOCAL, f"data.path={data}", "train.total_updates=30", "train.updates_per_iteration=15",
              "algorithm.minibatch_size=16", "train.eval_every=0", "algorithm.lr=0.003"]
    _, padded = _run(tmp_path, "sft-arith", *common, name="padded")
    _, packed = _run(tmp_path, "sft-arith", *common, "data.packing=true", "data.max_tokens=64", name="packed")
    assert [r["iteration"] for r in packed] == [1, 2]  # no evaluation record: eval_every=0
    # the same examples in the same order, so the same tokens and (up to float summation order) the same losses
    assert [r["train/tokens"] for r in packed] == [r["train/tokens"] for r in padded]
    for a, b in zip(padded, packed):
        assert b["train/loss_sft"] == pytest.approx(a["train/loss_sft"], rel=1e-3)
    assert packed[1]["train/loss_sft"] < packed[0]["train/loss_sft"]


def test_stop_at_eval_ends_the_run_at_the_first_evaluation_reaching_it(tmp_path):
    _, records = _run(tmp_path, "sft-arith", *TINY, *LOCAL, "train.total_updates=100", "train.updates_per_iteration=5",
                      "train.eval_every=2", "algorithm.minibatch_size=8", "train.stop_at_eval=0.0")
    assert [r["iteration"] for r in records] == [0, 1, 2]  # iteration 2's evaluation (>= 0.0) ends it
    assert records[-1]["updates"] == 10 and (tmp_path / "run" / "model" / "config.json").is_file()


def test_packed_sft_rows_score_like_padded_ones():
    from rlweave.models.causal_lm import CausalLMPolicy, build_causal_lm, train_tokenizer
    from rlweave.data.sft_data import SFTData, SFTExample

    tok = train_tokenizer(["What is 12 + 34? Answer: 46", "hello world"] * 20, vocab_size=280)
    policy = CausalLMPolicy(build_causal_lm(len(tok), arch="qwen3", hidden_size=32, num_layers=2, intermediate_size=64)).eval()
    examples = [SFTExample("What is 1 + 2? Answer: ", "3"), SFTExample("hello ", "world world"), SFTExample("What is 12 + 34? Answer: ", "46")]
    data = SFTData(tok, examples=examples, max_tokens=64)
    encoded = [data._encode(e) for e in examples]
    padded, packed = data._pad(encoded), data._pack(encoded)
    assert packed["input_ids"].shape[0] == 1 and padded["input_ids"].shape[0] == 3  # all three share one row
    with torch.no_grad():
        a = policy(torch.tensor(padded["input_ids"]), torch.tensor(padded["attention_mask"]), with_entropy=False)["logprobs"]
        b = policy(torch.tensor(packed["input_ids"]), torch.tensor(packed["attention_mask"]), with_entropy=False,
                   position_ids=torch.tensor(packed["position_ids"]))["logprobs"]
    ta, tb = torch.tensor(padded["target_mask"])[:, 1:], torch.tensor(packed["target_mask"])[:, 1:]
    targets = [sum(t) for _, t in encoded]  # response tokens plus the end-of-sequence token
    assert min(targets) >= 2 and int(ta.sum()) == int(tb.sum()) == sum(targets)
    torch.testing.assert_close(a[ta], b[tb], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- RL
def test_grpo_iterations_log_what_the_issue_names(tmp_path):
    runner, records = _run(tmp_path, "grpo-arith", *RL)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    first = records[1]
    for key in ("train/reward", "eval/accuracy", "train/response_length", "train/entropy", "train/clip_fraction",
                "rollout/logprob_gap", "throughput/generate_tokens_per_s", "throughput/train_tokens_per_s",
                "train/reward_error_rate", "train/policy_lag"):
        assert key in first, key
    assert first["env_steps"] == 16 and records[2]["env_steps"] == 32  # 4 prompts x 4 responses per iteration
    assert first["train/policy_lag"] == 0.0  # synchronous: sampled by the weights being trained
    # the rollout engine and the trainer score the same tokens with the same weights
    assert first["rollout/logprob_gap"] < 1e-4
    assert runner.version == 2
    assert (tmp_path / "run" / "model" / "config.json").is_file()


@pytest.mark.parametrize("algo, extra", [
    ("dapo", ["algorithm.dynamic_sampling=true", "algorithm.clip_eps_high=0.28", "algorithm.overlong_buffer=2"]),
    ("reinforce_pp", ["algorithm.kl_coef=0.01", "algorithm.kl_mode=reward"]),
    ("reinforce_pp_baseline", []),
    ("ppo", ["algorithm.kl_coef=0.01", "algorithm.kl_mode=reward", "algorithm.critic_lr=0.001"]),
    ("async_ppo", ["placement.mode=disaggregated", "~placement.groups.actor", "~placement.groups.rollout"]),
])
def test_every_llm_algorithm_trains(tmp_path, algo, extra):
    runner, records = _run(tmp_path, "grpo-arith", *RL, *LOCAL, f"algorithm.name={algo}", *extra)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(np.isfinite(r["train/loss_policy"]) for r in records[1:])
    if algo == "ppo":
        assert "train/loss_value" in records[1]
    if algo in ("reinforce_pp", "ppo"):
        assert records[1]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # the first batch: policy == reference
    if algo == "dapo":
        assert records[1]["train/sampling_rounds"] >= 1
    if algo == "async_ppo":
        # the first batch was sampled by the initial weights, the second while the first trained
        assert [r["train/policy_lag"] for r in records[1:]] == [0.0, 1.0]
        assert records[2]["train/is_weight_mean"] > 0


def test_weights_in_the_rollout_engine_equal_the_actors_after_sync(ray_session, tmp_path):
    """Two processes (disaggregated): the actor's trained weights, sent bucketed, land bit-equal."""
    runner = LLMRunner(_cfg("grpo-arith", *RL, "placement.mode=disaggregated", "~placement.groups.actor",
                            "~placement.groups.rollout", "cluster.num_cpus=null"), tmp_path / "run")
    runner.cluster = None
    from rlweave.cluster import Cluster

    runner.cluster = Cluster.start(address="auto")
    runner.plan = runner._plan_placement(runner.cluster)
    runner._owns_cluster = False
    runner.run_dir.mkdir(parents=True)
    try:
        runner._start()
        assert runner.actor.host_info("pid") != runner.rollout.host_info("pid")
        runner._sync_weights()
        actor_state = runner.actor.run("_full_state")[0]
        engine_state = runner.rollout.run("engine_state")[0]
        assert actor_state.keys() == engine_state.keys()
        for k in actor_state:
            assert torch.equal(actor_state[k], engine_state[k]), k
    finally:
        runner._stop_groups()


def test_stopped_and_resumed_llm_run_matches_the_uninterrupted_one(tmp_path):
    overrides = [*RL, "train.total_iterations=3", "run.deterministic=true"]
    _, whole = _run(tmp_path, "grpo-arith", *overrides, name="whole")
    stopped = LLMRunner(_cfg("grpo-arith", *overrides), tmp_path / "part")
    stopped.run(on_iteration=lambda r, rec: r.request_stop() if r.iteration == 2 else None)
    resumed = LLMRunner(_cfg("grpo-arith", *overrides, f"run.dir={tmp_path / 'part'}"), tmp_path / "part", resume=True)
    resumed.run()
    part = read_metrics(tmp_path / "part")
    skip = ("time/", "throughput/", "wall_time", "peak_rss")
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith(skip)}  # noqa: E731
    assert [strip(r) for r in part] == [strip(r) for r in whole]


def test_grpo_without_init_runs_the_sft_warm_up_into_a_sub_folder(tmp_path):
    runner, records = _run(tmp_path, "grpo-arith", *TINY, *LOCAL, "rollout.prompts_per_iteration=4", "algorithm.group_size=4",
                           "rollout.max_new_tokens=4", "train.total_iterations=1", "train.eval_every=1",
                           "init.sft_overrides=[" + ",".join(f"'{o}'" for o in (
                               "train.total_updates=10", "train.updates_per_iteration=10", "algorithm.minibatch_size=8",
                               "model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64", "model.vocab_size=300",
                               "task.eval_prompts=16")) + "]")
    sft = read_metrics(tmp_path / "run" / "sft")
    assert [r["iteration"] for r in sft] == [0, 1] and "train/loss_sft" in sft[1]
    assert (tmp_path / "run" / "sft" / "model" / "config.json").is_file()
    # the RL run's own log starts with its evaluation of the warm-up's weights, then RL only
    assert [r["iteration"] for r in records] == [0, 1] and "train/loss_sft" not in json.dumps(records)
    assert records[0]["eval/accuracy"] == pytest.approx(sft[-1]["eval/accuracy"])


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_actor_ranks_sync_full_weights_checkpoint_on_rank_0_and_resume(tmp_path, strategy):
    """Two actor ranks over gloo, sharded (FSDP2) or replicated (DDP): the full weights reach the
    rollout engine (checksum-verified every iteration), checkpoints hold the full state (rank 0)
    whatever the rank count, and a stopped run resumes on two ranks to the same values as an
    uninterrupted one (sharded only: the replicated checkpoint is the same gathered state, and
    CI's time is short)."""
    two = [*RL, "actor.num_workers=2", "placement.groups.actor.slots=0-1", "placement.groups.actor.threads=1",
           "placement.groups.rollout.threads=1", "placement.mode=hybrid", "run.deterministic=true",
           f"actor.strategy={strategy}"]
    _, whole = _run(tmp_path, "grpo-arith", *two, name="whole")
    assert [r["iteration"] for r in whole] == [0, 1, 2]
    assert all(np.isfinite(r["train/loss_policy"]) for r in whole[1:])
    ckpt = sorted((tmp_path / "whole" / "checkpoints").glob("iter_*"))[-1]
    state = torch.load(ckpt / "actor.pt", weights_only=False)
    assert len(state) == 2 and "policy" in state[0] and "policy" not in state[1]  # gathered on rank 0
    import transformers

    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "whole" / "model").state_dict()
    for k, v in exported.items():  # the export and the checkpoint hold the same full weights
        torch.testing.assert_close(state[0]["policy"][f"model.{k}"], v, rtol=0, atol=0)
    if strategy != "fsdp":
        return
    stopped = LLMRunner(_cfg("grpo-arith", *two), tmp_path / "part")
    stopped.run(on_iteration=lambda r, rec: r.request_stop() if r.iteration == 1 else None)
    LLMRunner(_cfg("grpo-arith", *two), tmp_path / "part", resume=True).run()
    skip = ("time/", "throughput/", "wall_time", "peak_rss")
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "part")) == strip(whole)


def test_two_replicated_ranks_take_the_same_step_as_one_rank_on_unequal_shards(tmp_path):
    """9 responses split 5 / 4 over two DDP ranks, of different lengths: each rank's loss is
    weighted by its share of the batch's tokens, so the step equals one rank's on all 9 (the
    plain average of the two ranks' token means would not)."""
    common = [*RL, "rollout.prompts_per_iteration=3", "algorithm.group_size=3", "train.total_iterations=1",
              "train.eval_every=0", "train.checkpoint_every=0", "placement.groups.rollout.threads=1",
              "placement.groups.actor.threads=1", "run.deterministic=true",
              "algorithm.ent_coef=0.1"]  # a gradient even where every reward is 0 (a random model's)
    _run(tmp_path, "grpo-arith", *common, name="one")
    runner, two = _run(tmp_path, "grpo-arith", *common, "actor.num_workers=2", "actor.strategy=ddp", "placement.mode=hybrid",
                       "placement.groups.actor.slots=0-1", name="two")
    assert runner.actor.world_size == 2 and two[-1]["env_steps"] == 9
    assert two[-1]["train/grad_norm"] > 0
    import transformers

    one_w = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "model").state_dict()
    two_w = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "model").state_dict()
    gap = max(float((one_w[k] - two_w[k]).abs().max()) for k in one_w)
    assert gap < 1e-6, gap


def test_collocated_rollout_engines_generate_with_their_actor_ranks_parameters(tmp_path):
    """Actor and rollout in one process: the engine's parameters are the actor's tensors (a sync
    moves nothing and only takes the version), so after training they are bit-equal by
    construction; LoRA (merged weights) and async PPO (generation overlaps the update) keep
    checksummed packets."""
    runner, records = _run(tmp_path, "grpo-arith", *RL, *LOCAL, name="shared")
    assert runner.shared_weights and runner._last_packet is None  # no packet was ever built
    from rlweave.cluster import local_worker

    actor, engine = local_worker("actor", 0), local_worker("rollout", 0)
    assert engine.generator.version == actor.version == 2
    mine = dict(engine.generator.model.named_parameters())
    assert all(mine[n].data_ptr() == p.data_ptr() for n, p in actor.model.named_parameters())
    assert engine.generator.model.config._attn_implementation == "sdpa"  # the engine keeps its own kernel
    assert actor.model.config._attn_implementation == "eager"  # actor.attention=auto on CPU, short sequences
    runner, _ = _run(tmp_path, "grpo-arith", *RL, *LOCAL, "algorithm.name=async_ppo", name="async")
    assert not runner.shared_weights


def test_auto_placement_measures_each_layout_then_keeps_the_fastest_without_losing_an_update(tmp_path):
    """placement.mode=auto on 2 CPU slots: one process, 2 replicated ranks, disaggregated; two
    iterations each (the second timed), then the fastest measured. The training state moves with
    every switch: one update per iteration, every batch generated by the current weights."""
    runner, records = _run(tmp_path, "grpo-arith", *RL, "placement.mode=auto", "train.total_iterations=8",
                           "train.eval_every=0", "train.checkpoint_every=0")
    rl = records  # no evaluation before training: eval_every=0
    assert [r["iteration"] for r in rl] == list(range(1, 9))
    assert [r["plan/layout"] for r in rl[:6]] == [0, 0, 1, 1, 2, 2]
    timed = [rl[1]["time/iteration"], rl[3]["time/iteration"], rl[5]["time/iteration"]]
    best = int(np.argmin(timed))
    assert [r["plan/layout"] for r in rl[6:]] == [best, best]
    assert runner._layouts.labels == ["one process", "2 replicated ranks", "disaggregated"]
    assert runner.version == 8 and [r["env_steps"] for r in rl] == [16 * i for i in range(1, 9)]
    assert all(r["train/policy_lag"] == 0.0 for r in rl)  # generated by the weights of the previous update
    assert runner.plan is runner._layouts.candidates[best][1]
    # a resumed auto run starts measuring again from one process, whatever layout wrote the checkpoint
    ckpt_ranks = len(torch.load(sorted((tmp_path / "run" / "checkpoints").glob("iter_*"))[-1] / "actor.pt", weights_only=False))
    assert ckpt_ranks == (2 if best == 1 else 1)
    more = LLMRunner(_cfg("grpo-arith", *RL, "placement.mode=auto", "train.total_iterations=9", "train.eval_every=0",
                          "train.checkpoint_every=0"), tmp_path / "run", resume=True)
    more.run()
    assert more.version == 9 and read_metrics(tmp_path / "run")[-1]["plan/layout"] == 0


def test_a_reward_function_that_raises_scores_zero_is_counted_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the rollout worker's reward process imports it too
    _, records = _run(tmp_path, "grpo-arith", *RL, *LOCAL, "task.reward_fn=llm_rewards:fails_on_odd", "train.total_iterations=1")
    r = records[1]
    assert 0.0 < r["train/reward_error_rate"] < 1.0
    # every response of a problem with an even first operand scores 1, the others 0
    assert r["train/reward"] == pytest.approx(1.0 - r["train/reward_error_rate"])


def test_lora_sft_then_grpo_with_a_kl_loss_against_the_adapter_free_base(tmp_path):
    runner, sft = _run(tmp_path, "sft-arith", *TINY, *LOCAL, "model.lora_rank=4", "train.total_updates=10",
                       "train.updates_per_iteration=10", "algorithm.minibatch_size=16", "algorithm.lr=0.01", name="sft")
    import transformers

    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "model")
    assert not any("lora" in k for k in merged.state_dict())  # exported with the adapters folded in
    runner, rl = _run(tmp_path, "grpo-arith", *RL, *LOCAL, f"init.checkpoint={tmp_path / 'sft'}", "model.lora_rank=4",
                      "algorithm.kl_coef=0.1", "algorithm.kl_mode=loss", name="rl")
    assert not runner.shared_weights  # the engine holds merged weights: checksummed packets
    assert rl[1]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # adapters start at zero: policy == base
    assert "train/loss_kl" in rl[1] and np.isfinite(rl[2]["train/loss_policy"])


def test_jsonl_task_with_long_prompts_drops_or_truncates_them_and_counts(tmp_path):
    data = tmp_path / "qa.jsonl"
    lines = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(20)]
    lines += [{"question": "Long question " + "word " * 40 + f"{i}?", "answer": f"\\boxed{{{i}}}"} for i in range(20)]
    lines = [lines[i // 2] if i % 2 == 0 else lines[20 + i // 2] for i in range(40)]  # short and long alternate
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    common = [*RL, *LOCAL, "task.name=jsonl_qa", f"task.train_file={data}", "task.test_fraction=0.2", "task.max_prompt_tokens=24",
              "rollout.prompts_per_iteration=8", "train.total_iterations=1"]
    _, dropped = _run(tmp_path, "grpo-arith", *common, "task.prompt_overflow=drop", name="drop")
    _, cut = _run(tmp_path, "grpo-arith", *common, "task.prompt_overflow=truncate", name="cut")
    d, c = dropped[1], cut[1]
    assert d["train/prompts_dropped"] > 0 and d["train/prompts_truncated"] == 0
    assert c["train/prompts_truncated"] == d["train/prompts_dropped"] and c["train/prompts_dropped"] == 0
    # dropped prompts are not replaced: fewer responses that iteration; truncated ones all generate
    assert d["env_steps"] == (8 - d["train/prompts_dropped"]) * 4 and c["env_steps"] == 8 * 4


def test_a_resume_on_changed_data_is_refused_before_any_work(tmp_path):
    from rlweave.config import ConfigError

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n" for i in range(20)))
    common = [*RL, *LOCAL, "task.name=jsonl_qa", f"task.train_file={data}", "task.test_fraction=0.2", "train.total_iterations=1"]
    runner, _ = _run(tmp_path, "grpo-arith", *common)
    inputs = json.loads((tmp_path / "run" / "inputs.json").read_text())
    assert inputs["task.train_file"]["path"] == str(data) and len(inputs["task.train_file"]["sha256"]) == 64
    metrics_before = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    data.write_text(data.read_text().replace("What is 3 plus", "What is 3 and"))  # regenerated under the same name
    with pytest.raises(ConfigError) as e:
        LLMRunner(_cfg("grpo-arith", *common, "train.total_iterations=2"), tmp_path / "run", resume=True).run()
    assert str(e.value).startswith(f"task.train_file: {data} changed since the run started") and "\n" not in str(e.value)
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == metrics_before  # nothing written


def test_sft_jsonl_reads_prompt_response_and_chat_records_and_names_bad_lines(tmp_path):
    from rlweave.envs.text_tasks import TaskDataError
    from rlweave.data.sft_data import SFTExample, read_sft_jsonl

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "Q: 1+1?\n", "response": "2"}) + "\n" + json.dumps(
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2?"},
                      {"role": "assistant", "content": "3"}]}) + "\n")
    assert read_sft_jsonl(good) == [SFTExample("Q: 1+1?\n", "2"), SFTExample("system: be brief\nuser: 1+2?\nassistant: ", "3")]
    for line, fragment in ((json.dumps({"messages": [{"role": "user", "content": "x"}]}), "the last message must be the assistant's"),
                           (json.dumps({"messages": [{"content": "x"}, {"role": "assistant", "content": "y"}]}), r"messages\[0\] is missing field .role."),
                           ("[1, 2]", "expected an object, got list"),
                           ("{not json", "not JSON")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n" + line + "\n")
        with pytest.raises(TaskDataError, match=rf"bad.jsonl:2: .*{fragment}"):
            read_sft_jsonl(bad)
