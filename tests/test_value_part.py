"""PPO's value loss in a helper process (actor.update_threads=2): the same update, bit for bit,
as one process running both losses; refusals where the update cannot be split."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from rlweave.cli import main
from rlweave.cluster.worker import _IN_PROCESS, WorkerContext, _bind
from rlweave.config import load_config
from rlweave.models.run_policy import policy_kwargs
from rlweave.workers.actor_worker import ActorWorker
from tests.helpers import QUIET



def _worker(threads: int, overrides: list[str]) -> ActorWorker:
    cfg = load_config("ppo-halfcheetah", ["algorithm.minibatch_size=64", "algorithm.epochs=2", *overrides])
    env = gym.make("HalfCheetah-v5")
    ctx = WorkerContext(group="actor", rank=0, world_size=1, slot=None, slot_kind="cpu", num_threads=1, local=True)
    try:
        return _bind(ActorWorker, ctx, (OmegaConf.to_container(cfg.algorithm), policy_kwargs(cfg), env.observation_space,
                                        env.action_space, 1, 0, None, 1), {"update_threads": threads})
    finally:
        _IN_PROCESS.pop(("actor", 0), None)


def _batch(rows: int) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    return TensorDict({
        "obs": torch.randn(rows, 17, generator=g), "action": torch.randn(rows, 6, generator=g),
        "log_prob": torch.randn(rows, generator=g) - 8.0, "adv": torch.randn(rows, generator=g),
        "returns": torch.randn(rows, generator=g), "value": torch.randn(rows, generator=g),
    }, batch_size=[rows])


@pytest.mark.parametrize("rows, overrides", [
    ((256, 256), []),  # 4 minibatches an epoch, value losses in the helper
    # then an iteration with fewer rows than a minibatch (one minibatch of all 40, another shape than
    # the helper's slot: its value loss runs here, after the policy loss), clipped values, an entropy bonus
    ((256, 40), ["algorithm.value_clip=0.2", "algorithm.ent_coef=0.01"]),
])
def test_value_loss_in_a_helper_process_gives_the_same_update_as_one_process(rows, overrides):
    one, two = _worker(1, overrides), _worker(2, overrides)
    try:
        assert torch.equal(one.flat.flat, two.flat.flat)
        for n in rows:  # the second update reads the first one's weights through the shared memory
            m1 = one._update(_batch(n), 0.0, True)
            m2 = two._update(_batch(n), 0.0, True)
            assert m1 == m2
            assert torch.equal(one.flat.flat, two.flat.flat)
            assert m1["train/value_mse"] > 0 and m1["train/updates"] == 2 * max(1, n // 64)
        assert two.value_part._helper is not None
        assert not torch.equal(one.flat.flat, _worker(1, overrides).flat.flat)  # the updates moved the weights
    finally:
        two.close()
    assert two.value_part._helper is None


@pytest.mark.parametrize("recipe, overrides, fragment", [
    ("ppo-halfcheetah", ["actor.num_workers=2", "env.num_workers=2"], "actor.update_threads: 2 runs the value loss in a helper "
     "process of the one actor rank; this config has actor.num_workers=2"),
    ("grpo-cartpole", [], "grpo's update has no such parts"),
])
def test_an_update_that_cannot_be_split_is_refused_before_start(capsys, tmp_path, no_cluster_start, recipe, overrides, fragment):
    rc = main(["train", recipe, "actor.update_threads=2", *overrides, f"run.dir={tmp_path / 'r'}", *QUIET])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    assert not (tmp_path / "r").exists()
