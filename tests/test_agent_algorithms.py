"""Every language-model RL algorithm on multi-turn agent trajectories (#26): GRPO, PPO, DAPO,
REINFORCE++ (and its baseline variant) and asynchronous PPO train a tiny Qwen3 on task calc with
the calculator, from one short SFT warm-up on the expert's traces (so episodes do call the tool and
carry observation tokens). What each update receives is recorded from the real run: observation
tokens are out of the mask (loss, ratio, KL, entropy, token counts), carry no advantage and no
behaviour log-prob. Asynchronous PPO: the next batch of trajectories is generated while the update
runs, the staleness logged per batch stays within ``train.max_staleness``, and stale groups are
dropped and counted. Rewards come from ``task.reward_fn`` (the final answer's length), so every
update has a gradient; the tiny model is never expected to multiply."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlweave.config import load_config  # noqa: E402
from rlweave.runners.llm import LLMRunner  # noqa: E402
from rlweave.runners.llm_batches import fresh_groups  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402
from test_agent_loop import _actor, _rows  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.vocab_size=600", "run.progress=false", "run.tensorboard=false",
        "task.eval_prompts=4", "cluster.num_cpus=2", "cluster.local=true", "rollout.max_new_tokens=40", "agent.max_tokens=96"]
# one update an iteration (grpo-calc takes two): the first iteration's logged KL to the reference is then exactly 0
RL = [*TINY, "rollout.prompts_per_iteration=2", "algorithm.group_size=4", "algorithm.epochs=1", "train.eval_every=0",
      "train.checkpoint_every=0", "task.reward_fn=reward_fns:length_reward", "task.reward_timeout_s=30"]
ASYNC = ["algorithm.name=async_ppo", "placement.mode=disaggregated", "~placement.groups.actor", "~placement.groups.rollout"]


@pytest.fixture(scope="module")
def chat_tok():
    """A tiny tokenizer with the chat template, for the actor-level test (as tests/test_agent_loop.py's)."""
    from rlweave.models.causal_lm import train_tokenizer
    from rlweave.models.chat_template import add_chat_template

    return add_chat_template(train_tokenizer(["What is 1234 * 5678? The answer is 7006652. calculator"] * 20, vocab_size=300))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """The calc expert's traces, 30 small SFT steps: enough for sampled episodes to open tool calls
    (most parse badly, which still earns an observation), not to solve the task."""
    run = tmp_path_factory.mktemp("agent_algorithms") / "sft"
    LLMRunner(load_config("sft-calc", [*TINY, "train.total_updates=30", "train.updates_per_iteration=30", "algorithm.lr=0.01",
                                       "algorithm.minibatch_size=4", "agent.sft_traces=64", "train.stop_at_eval=null",
                                       "train.eval_every=0"]), run).run()
    return run / "model"


class RecordingRunner(LLMRunner):
    """The real runner; it keeps what each update is given (rows, mask, advantages, behaviour
    log-probs) and, in local mode, when each generation and update ran inside its worker."""

    def _start(self) -> None:
        super()._start()
        from rlweave.cluster import local_worker

        self.inputs: list[dict] = []
        self.events: list[tuple[str, float, float]] = []
        lock = threading.Lock()
        for group, method in (("rollout", "generate"), ("actor", "update")):
            worker = local_worker(group, 0)
            setattr(worker, method, self._timed(method, getattr(worker, method), lock))

    def _timed(self, name, fn, lock):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            with lock:
                self.events.append((name, t0, time.perf_counter()))
            return out
        return call

    def _advantages(self, batch, scored):
        update, scores, kl = super()._advantages(batch, scored)
        self.inputs.append({**batch, **update})
        return update, scores, kl


def _run(tmp_path, warm, *overrides, iterations=2):
    runner = RecordingRunner(load_config("grpo-calc", [*RL, f"init.checkpoint={warm}", f"train.total_iterations={iterations}",
                                                       *overrides]), tmp_path / "run")
    runner.run()
    return runner, read_metrics(tmp_path / "run")


def _check_observations_masked(runner, records) -> int:
    """Every update's observation tokens: out of the mask, no advantage, no behaviour log-prob; the
    update counted only model tokens. Returns the number of observation tokens seen."""
    seen = 0
    for batch, record in zip(runner.inputs, records):
        R = batch["response_ids"].shape[1]
        valid = np.arange(R)[None, :] < batch["resp_len"][:, None]
        model = valid & batch["loss_mask"].astype(bool)
        obs = valid & ~model
        seen += int(obs.sum())
        assert not batch["mask"][obs].any()
        assert np.all(batch["advantages"][obs] == 0) and np.all(batch["rollout_logprobs"][obs] == 0)
        assert np.all(batch["rollout_logprobs"][model] <= 0) and (batch["rollout_logprobs"][model] < 0).any()
        assert record["train/tokens"] == int(model.sum())  # the actor's loss mask: model tokens only
        if "returns" in batch:
            assert np.all(batch["returns"][obs] == 0)
    return seen


@pytest.mark.parametrize("algo, extra", [
    ("grpo", ["algorithm.kl_coef=0.01"]),  # KL as a loss term: needs reference log-probs
    ("ppo", ["algorithm.kl_coef=0.01", "algorithm.kl_mode=reward", "algorithm.critic_lr=0.001"]),
    ("dapo", ["algorithm.dynamic_sampling=true", "algorithm.clip_eps_high=0.28", "algorithm.overlong_buffer=16"]),
    ("reinforce_pp", ["algorithm.kl_coef=0.01", "algorithm.kl_mode=reward"]),
    ("reinforce_pp_baseline", []),
])
def test_algorithm_trains_on_multi_turn_trajectories(tmp_path, warm, algo, extra):
    runner, records = _run(tmp_path, warm, f"algorithm.name={algo}", *extra)
    assert [r["iteration"] for r in records] == [1, 2]
    for r in records:
        assert np.isfinite(r["train/loss_policy"]) and 0 < r["train/grad_norm"] < float("inf")
        assert r["train/staleness_max"] == 0 and r["train/stale_groups_dropped"] == 0  # synchronous
        assert r["train/turns_per_trajectory"] >= 1.0 and "train/tool_calls_per_trajectory" in r
    assert _check_observations_masked(runner, records) > 0
    if algo in ("ppo", "reinforce_pp", "grpo"):
        assert all("ref_logprobs" in b for b in runner.inputs) and records[0]["train/kl"] == pytest.approx(0.0, abs=1e-6)
    if algo == "ppo":
        assert all(np.isfinite(r["train/loss_value"]) for r in records)
    if algo == "dapo":
        assert all(r["train/informative_groups"] >= 1 for r in records)


def test_async_agent_rollout_overlaps_the_update_within_the_staleness_bound(tmp_path, warm):
    runner, records = _run(tmp_path, warm, *ASYNC, "train.max_staleness=1", iterations=3)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    # the first batch was sampled by the start weights; each later one while the previous update ran
    assert [r["train/staleness_max"] for r in records] == [0, 1, 1]
    assert all(r["train/staleness_max"] <= 1 and r["train/stale_groups_dropped"] == 0 for r in records)
    gens = sorted((t0, t1) for name, t0, t1 in runner.events if name == "generate")
    updates = sorted((t0, t1) for name, t0, t1 in runner.events if name == "update")
    assert len(gens) == 3 and len(updates) == 3
    for i in range(2):  # generation i+2 started before update i+1 ended: they overlapped
        assert gens[i + 1][0] < updates[i][1]
    # the importance correction's behaviour log-probs are the engine's, on model tokens only
    assert _check_observations_masked(runner, records) > 0
    assert all(np.isfinite(r["train/is_weight_mean"]) and r["train/is_weight_mean"] > 0 for r in records)
    assert records[1]["rollout/logprob_gap"] > 0  # stale behaviour: the weights moved under the second batch
    assert {"train/tool_calls_per_trajectory", "train/turns_per_trajectory"} <= records[2].keys()


def test_importance_weights_read_behaviour_log_probs_of_model_tokens_only(tmp_path, chat_tok):
    """Two actors take the same importance-corrected update; one's behaviour log-probs are garbage
    on observation tokens: the same loss, weights' mean and new parameters."""
    a, b = _actor(tmp_path, chat_tok), _actor(tmp_path, chat_tok)
    rows = _rows(chat_tok, holes=True)
    anchor = np.asarray(a.score(rows)["logprobs"])
    obs = ~rows["loss_mask"].astype(bool)
    behaviour = (anchor - 0.2 * np.random.default_rng(0).random(anchor.shape)) * ~obs  # a stale policy's log-probs, 0 on observations
    out_a = a.update({**rows, "rollout_logprobs": behaviour.astype(np.float32)}, importance_correction=True)
    noisy = np.where(obs, -30.0, behaviour).astype(np.float32)
    out_b = b.update({**rows, "rollout_logprobs": noisy}, importance_correction=True)
    assert out_a["is_weight_mean"] != pytest.approx(1.0)  # the correction is at work on model tokens
    for k in ("loss_policy", "is_weight_mean", "clip_fraction", "tokens"):
        assert out_a[k] == out_b[k], k
    pa, pb = a.policy.state_dict(), b.policy.state_dict()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def _group(version: int) -> dict:
    return {"rows": [], "gen_version": version}


def test_stale_groups_are_dropped_and_counted_and_none_fresh_is_one_line():
    kept, stale = fresh_groups([_group(3), _group(1), _group(2)], version=3, max_staleness=1)
    assert [g["gen_version"] for g in kept] == [3, 2] and stale == 1
    assert fresh_groups([_group(2)], version=3, max_staleness=1)[1] == 0
    with pytest.raises(RuntimeError) as e:
        fresh_groups([_group(0), _group(1)], version=4, max_staleness=2)
    assert "train.max_staleness=2" in str(e.value) and "\n" not in str(e.value)
