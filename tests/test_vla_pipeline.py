"""The VLA path end to end on MetaWorld pixels (tiny sizes): scripted demonstrations through
``rlweave collect``, supervised fine-tuning (runner policy_sft), then PPO starting from that run
(dict observations through env, rollout and actor workers; per-task success rates)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("metaworld")
pytest.importorskip("transformers")

from tests.helpers import QUIET, read_metrics, run_cli, train  # noqa: E402

TASKS = ["reach-v3", "drawer-close-v3", "button-press-topdown-v3"]
SMALL = ["env.pixels.width=32", "env.pixels.height=32", "env.max_episode_steps=12", "policy.kwargs.image_size=32",
         "policy.kwargs.vision_hidden=32", "policy.kwargs.vision_layers=1", "policy.kwargs.vision_heads=2",
         "policy.kwargs.vision_intermediate=64", "policy.kwargs.lm_hidden=32", "policy.kwargs.lm_layers=1",
         "policy.kwargs.lm_heads=2", "policy.kwargs.lm_kv_heads=1", "policy.kwargs.lm_intermediate=64",
         "env.num_envs=3", "train.eval_episodes=3", "placement.groups.actor.threads=1"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("vla") / "demos"
    rc, text = run_cli("collect", "sft-vla-mt3", *SMALL[:3], "--expert", "rlweave.envs.metaworld_suite:expert",
                       "--episodes", "3", "-o", str(out))
    assert rc == 0, text
    assert '"success_rate"' in text
    return out


@pytest.fixture(scope="module")
def sft_run(ray_session, demos, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vla") / "sft"
    rc, out = train("sft-vla-mt3", f"data.path={demos}", *SMALL, "train.total_updates=4", "train.updates_per_iteration=2",
                    "train.eval_every=2", "algorithm.minibatch_size=8", f"run.dir={run_dir}", *QUIET)
    assert rc == 0, out
    return run_dir, out


def test_demonstrations_cover_every_task(demos):
    from rlweave.data.demos import load_demonstrations
    from rlweave.envs.manipulation import decode_instruction
    from rlweave.envs.metaworld_suite import instruction_for

    d = load_demonstrations(demos, chunk=4)
    assert d.episodes == 3 and d.actions.shape[1:] == (4, 4)
    assert d.obs["image"].shape[1:] == (32, 32, 3) and d.obs["image"].dtype.name == "uint8"
    texts = {decode_instruction(row) for row in d.obs["instruction"]}
    assert texts == {instruction_for(t) for t in TASKS}
    last = [i for i in range(len(d) - 1) if d.episode[i] != d.episode[i + 1]][0]
    assert (d.actions[last, 1:] == d.actions[last, 0]).all()  # past an episode's end: its last action repeats


def test_sft_trains_the_vla_and_reports_success_per_task(sft_run):
    run_dir, out = sft_run
    assert "demonstrations" in out and "3 episodes" in out
    rows = read_metrics(run_dir)
    assert [r["samples/updates"] for r in rows] == [2, 2]
    assert all(math.isfinite(r["train/loss_l1"]) for r in rows)
    assert {f"eval/success_rate/{t}" for t in TASKS} <= set(rows[-1])


def test_ppo_starts_from_the_sft_run_and_warms_up_its_new_value_head_alone(sft_run, tmp_path):
    """PPO from the SFT run: during ``algorithm.critic_warmup_iterations`` only the value head (new
    to the SFT policy) learns; everything it shares with the action head stays as SFT left it."""
    import torch

    from rlweave.utils.checkpoint import latest_checkpoint, load_checkpoint

    sft_dir, _ = sft_run
    rc, out = train("ppo-vla-mt3", f"init.checkpoint={sft_dir}", *SMALL, "train.rollout_steps=3", "train.total_env_steps=72",
                    "algorithm.epochs=1", "algorithm.minibatch_size=9", "placement.groups.rollout.threads=1", "train.eval_every=0",
                    "algorithm.critic_warmup_iterations=1", "train.checkpoint_every=1", f"run.dir={tmp_path / 'ppo'}", *QUIET)
    assert rc == 0, out
    assert f"policy starts from {sft_dir}" in out and "start fresh (value_head" in out
    rows = read_metrics(tmp_path / "ppo")
    assert rows[-1]["env_steps"] == 72 and [r["train/critic_warmup"] for r in rows] == [1.0, 0.0]
    assert math.isfinite(rows[-1]["train/loss_policy"] if "train/loss_policy" in rows[-1] else rows[-1]["train/approx_kl"])
    sft = load_checkpoint(latest_checkpoint(sft_dir))["actor"]["policy"]
    w1, w2 = (load_checkpoint(tmp_path / "ppo" / "checkpoints" / f"iter_{i:08d}")["actor"]["policy"] for i in (1, 2))
    shared = [k for k in sft if sft[k].is_floating_point()]
    assert shared and not any(k.startswith("value_head.") for k in shared)
    assert all(torch.equal(w1[k], sft[k]) for k in shared)  # the warm-up left the pretrained policy as it was
    assert any(not torch.equal(w2[k], sft[k]) for k in shared)  # then PPO trains it


def test_sft_without_demonstrations_is_refused_in_one_line():
    rc, _ = train("sft-vla-mt3", "data.path=null", *QUIET)
    assert rc == 2


def test_ppo_runs_its_warm_up_first_with_the_runs_policy_and_env(ray_session, demos, tmp_path):
    """init.sft_recipe (the recipe's default): the SFT sub-run takes this run's policy.* and env
    settings and the data.path it sets, then RL starts from it."""
    from omegaconf import OmegaConf

    run_dir = tmp_path / "chain"
    rc, out = train("ppo-vla-mt3", f"data.path={demos}", *SMALL, "train.rollout_steps=3", "train.total_env_steps=36",
                    "algorithm.epochs=1", "algorithm.minibatch_size=9", "placement.groups.rollout.threads=1",
                    "init.sft_overrides=['train.total_updates=2','train.updates_per_iteration=2','algorithm.minibatch_size=8',"
                    "'train.eval_episodes=3']", f"run.dir={run_dir}", *QUIET)
    assert rc == 0, out
    assert "supervised warm-up 'sft-vla-mt3'" in out and "warm-up done" in out
    sub = OmegaConf.load(run_dir / "sft" / "config.yaml")
    assert (sub.env.pixels.width, sub.policy.kwargs.lm_hidden, sub.data.path) == (32, 32, str(demos))
    assert (run_dir / "sft" / "warmup-done.json").is_file()
    assert f"policy starts from {run_dir / 'sft'}" in out


def test_a_warm_up_that_cannot_take_the_runs_settings_is_refused_before_it_starts(tmp_path):
    rc, _ = train("ppo-vla-mt3", f"data.path={tmp_path / 'none'}", f"run.dir={tmp_path / 'r'}", *QUIET)
    assert rc == 2
    assert not (tmp_path / "r").exists()


def test_grpo_groups_are_one_task_from_one_start(sft_run, tmp_path):
    sft_dir, _ = sft_run
    small = [o for o in SMALL if not o.startswith("env.num_envs")]
    rc, out = train("grpo-vla-mt3", f"init.checkpoint={sft_dir}", *small, "env.num_envs=6", "algorithm.group_size=2",
                    "env.kwargs.task_block=2", "train.rollout_steps=3", "train.total_env_steps=60", "algorithm.epochs=1",
                    "algorithm.minibatch_size=6", "placement.groups.rollout.threads=1", "train.eval_every=0",
                    f"run.dir={tmp_path / 'grpo'}", *QUIET)
    assert rc == 0, out
    rows = read_metrics(tmp_path / "grpo")
    assert rows[-1]["env_steps"] >= 60


def test_metaworld_task_blocks_and_success_reward():
    from rlweave.envs.metaworld_suite import make_env

    names = [make_env("reach-v3,push-v3", slot=s, task_block=2).task_name for s in range(4)]
    assert names == ["reach-v3", "reach-v3", "push-v3", "push-v3"]
    env = make_env("reach-v3", reward="success")
    env.reset(seed=0)
    assert env.step(env.action_space.sample() * 0)[1] == 0.0
    env = make_env("reach-v3", reward="step_cost")
    env.reset(seed=0)
    assert env.step(env.action_space.sample() * 0)[1] == -1.0
    with pytest.raises(ValueError, match="env.kwargs.reward"):
        make_env("reach-v3", reward="sparse")


@pytest.mark.parametrize("head", ["discrete", "flow"])
def test_ppo_trains_the_other_heads(ray_session, head, tmp_path):
    """The discrete head (action tokens) and the flow head (its stored denoising chain, executed
    through env_action) go through the same on-policy workers."""
    small = [o for o in SMALL if not o.startswith("env.num_envs")]
    rc, out = train("ppo-vla-mt3", "init.sft_recipe=null", f"policy.kwargs.head={head}", "policy.kwargs.flow_steps=2",
                    "policy.kwargs.bins=16", *small, "env.num_envs=2", "train.rollout_steps=2", "train.total_env_steps=16",
                    "algorithm.epochs=1", "algorithm.minibatch_size=4", "placement.groups.rollout.threads=1",
                    "train.eval_every=0", f"run.dir={tmp_path / head}", *QUIET)
    assert rc == 0, out
    rows = read_metrics(tmp_path / head)
    assert rows[-1]["env_steps"] == 16 and math.isfinite(rows[-1]["train/approx_kl"])


def test_a_stopped_warm_up_is_continued_not_taken_as_finished(ray_session, demos, tmp_path, monkeypatch):
    from rlweave.runners.policy_sft import PolicySFTRunner

    args = ["ppo-vla-mt3", f"data.path={demos}", *SMALL, "train.rollout_steps=3", "train.total_env_steps=36",
            "algorithm.epochs=1", "algorithm.minibatch_size=9", "placement.groups.rollout.threads=1",
            "init.sft_overrides=['train.total_updates=4','train.updates_per_iteration=2','algorithm.minibatch_size=8',"
            "'train.eval_every=0','train.checkpoint_every=1']", f"run.dir={tmp_path / 'r'}", *QUIET]
    monkeypatch.setattr(PolicySFTRunner, "_after_iteration", lambda self, record: self.request_stop("Ctrl-C (test)"))
    rc, _ = train(*args)
    assert rc == 130  # interrupted: RL did not start from a half-trained warm-up
    assert not (tmp_path / "r" / "sft" / "warmup-done.json").exists()
    monkeypatch.undo()
    rc, out = train(*args)
    assert rc == 0, out
    assert "(continuing it)" in out and (tmp_path / "r" / "sft" / "warmup-done.json").is_file()

