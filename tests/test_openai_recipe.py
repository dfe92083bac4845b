"""Recipe grpo-openai-calc end to end on a tiny Qwen3: user agent code (examples/openai_agent.py, the
``openai`` package) runs against the rollout worker's endpoint, its recorded trajectories are the
rows GRPO trains on (the update's own forward agrees with the recorded log-probs), the reward
function reads each episode's conversation, and a wrong
``agent.openai_fn`` is refused on one line before anything starts."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("openai")

from rlweave.config import ConfigError, load_config  # noqa: E402
from rlweave.runners.llm import LLMRunner  # noqa: E402
from rlweave.utils.metrics import read_metrics  # noqa: E402

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "run.progress=false", "run.tensorboard=false", "cluster.num_cpus=2",
        "cluster.local=true", "init.sft_recipe=null", "rollout.prompts_per_iteration=2", "algorithm.group_size=2",
        "rollout.max_new_tokens=8", "agent.max_tokens=24", "train.total_iterations=1", "train.eval_every=0",
        "train.checkpoint_every=0"]


def test_wrong_agent_function_is_refused_before_start(tmp_path):
    with pytest.raises(ConfigError) as e:
        LLMRunner(load_config("grpo-openai-calc", TINY + ["agent.openai_fn=no_such_module:agent"]), tmp_path / "never")
    assert str(e.value).startswith("agent.openai_fn: cannot load 'no_such_module:agent'") and "\n" not in str(e.value)
    assert not (tmp_path / "never").exists()


def test_grpo_trains_on_the_openai_agents_recorded_trajectories(tmp_path):
    overrides = TINY + ["task.reward_fn=openai_rewards:conversation_length", "task.reward_on_error=raise"]
    LLMRunner(load_config("grpo-openai-calc", overrides), tmp_path / "run").run()
    (record,) = read_metrics(tmp_path / "run")
    assert record["train/turns_per_trajectory"] >= 1  # every episode called the endpoint
    assert record["train/reward"] >= 3  # the reward function read each episode's conversation (system, user, reply, ...)
    assert record["rollout/logprob_gap_max"] < 1e-4  # recorded behaviour log-probs == the update's forward
    assert record["train/response_length"] > 0 and record["time/update"] > 0
    assert (tmp_path / "run" / "model" / "config.json").is_file()
