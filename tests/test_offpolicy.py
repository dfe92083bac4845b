"""Off-policy learning: n-step writing, the replay buffer, the SAC/CrossQ models and losses (values
checked against independent formulas), and the asynchronous runner end to end on an embedded Ray
(sample accounting, staleness, reproducibility, resume, bad input)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from rlweave.algorithms import LearnerNets, LossOptions, crossq_loss, get_algorithm, iql_loss, sac_loss, soft_update
from rlweave.cli import main
from rlweave.models import QEnsemble, SquashedGaussianPolicy, build_policy
from rlweave.utils.checkpoint import latest_checkpoint, load_checkpoint
from rlweave.utils.precision import resolve_precision
from rlweave.data.replay import NStepWriter, ReplayBuffer
from tests.helpers import QUIET, read_metrics, run_cli, train

BOX = gym.spaces.Box(low=-2.0, high=2.0, shape=(2,), dtype=np.float32)


# --------------------------------------------------------------------------- n-step writing
def _step(w: NStepWriter, t: int, reward: float, terminated=False, truncated=False, version=0):
    obs = np.array([[float(t)]], dtype=np.float32)
    w.add(obs, np.array([[t * 10.0]], dtype=np.float32), np.array([reward]), obs + 1, np.array([terminated]),
          np.array([terminated or truncated]), version)


def test_one_step_transitions_fold_the_discount():
    w = NStepWriter(1, 0.9, 2)
    w.add(np.zeros((2, 3)), np.zeros((2, 1)), np.array([1.0, 2.0]), np.ones((2, 3)), np.array([False, True]),
          np.array([False, True]), 4)
    out = w.pop()
    assert out["reward"].tolist() == [1.0, 2.0]
    assert out["discount"].tolist() == pytest.approx([0.9, 0.0])
    assert out["policy_version"].tolist() == [4, 4]
    assert w.pop() is None


def test_n_step_returns_and_episode_ends_match_hand_computation():
    g = 0.5
    w = NStepWriter(3, g, 1)
    for t, r in enumerate([1.0, 2.0, 4.0]):
        _step(w, t, r)
    first = w.pop()  # the transition from step 0 has its 3 rewards
    assert first["reward"].tolist() == [1.0 + g * 2.0 + g * g * 4.0]
    assert first["obs"][:, 0].tolist() == [0.0] and first["next_obs"][:, 0].tolist() == [3.0]
    assert first["discount"].tolist() == [g**3]
    _step(w, 3, 8.0, terminated=True)  # ends the episode: steps 1, 2, 3 flush with shorter horizons
    out = w.pop()
    assert out["obs"][:, 0].tolist() == [1.0, 2.0, 3.0]
    assert out["reward"].tolist() == pytest.approx([2 + g * 4 + g * g * 8, 4 + g * 8, 8])
    assert out["discount"].tolist() == [0.0, 0.0, 0.0]  # terminated: nothing to bootstrap
    assert out["next_obs"][:, 0].tolist() == [4.0, 4.0, 4.0]
    _step(w, 10, 1.0)
    _step(w, 11, 1.0, truncated=True)  # truncated: bootstrap from the final observation
    out = w.pop()
    assert out["reward"].tolist() == pytest.approx([1 + g, 1])
    assert out["discount"].tolist() == pytest.approx([g**2, g])
    assert not any(w.pending[0])


def test_n_step_writer_state_round_trip():
    w = NStepWriter(3, 0.9, 1)
    _step(w, 0, 1.0)
    _step(w, 1, 1.0)
    w2 = NStepWriter(3, 0.9, 1)
    w2.load_state_dict(json.loads(json.dumps(w.state_dict(), default=lambda a: a.tolist())))
    for writer in (w, w2):
        _step(writer, 2, 1.0)
    a, b = w.pop(), w2.pop()
    assert a["reward"].tolist() == b["reward"].tolist() == pytest.approx([1 + 0.9 + 0.81])


# --------------------------------------------------------------------------- replay buffer
def _batch(start: int, n: int, marker: float = 0.0) -> dict:
    idx = np.arange(start, start + n, dtype=np.float32)
    return {"obs": idx[:, None], "action": np.full((n, 1), marker, np.float32), "reward": idx, "next_obs": idx[:, None] + 1,
            "discount": np.ones(n, np.float32), "policy_version": np.zeros(n, np.int64)}


def test_replay_ring_keeps_the_newest_and_samples_batches():
    buf = ReplayBuffer(capacity=5, seed=0)
    buf.add(_batch(0, 3))
    buf.add(_batch(3, 4))  # wraps: 0 and 1 are overwritten
    assert buf.size() == 5
    assert sorted(buf.rings["online"].data["reward"].tolist()) == [2, 3, 4, 5, 6]
    s = buf.sample(8, num_batches=3)
    assert s["obs"].shape == (3, 8, 1) and s["reward"].shape == (3, 8)
    assert set(s["reward"].ravel().tolist()) <= {2, 3, 4, 5, 6}
    buf.add(_batch(100, 9))  # more than capacity at once: the newest 5 stay
    assert sorted(buf.rings["online"].data["reward"].tolist()) == [104, 105, 106, 107, 108]


def test_replay_mixes_sources_at_the_given_ratio():
    buf = ReplayBuffer(capacity=100, seed=1, mix={"offline": 0.25, "online": 0.75})
    buf.add(_batch(0, 50, marker=1.0), source="offline")
    with pytest.raises(RuntimeError, match="source 'online' is empty"):
        buf.sample(8)
    buf.add(_batch(0, 50, marker=2.0))
    s = buf.sample(16, num_batches=4)
    per_batch = (s["action"][..., 0] == 1.0).sum(1)
    assert per_batch.tolist() == [4, 4, 4, 4]


def test_replay_state_round_trip_gives_the_same_samples():
    a = ReplayBuffer(capacity=6, seed=3)
    a.add(_batch(0, 4))
    a.add(_batch(4, 4))
    b = ReplayBuffer(capacity=1, seed=99)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.sample(5, 2)["reward"], b.sample(5, 2)["reward"])
    a.add(_batch(50, 1))
    b.add(_batch(50, 1))
    assert np.array_equal(a.rings["online"].data["reward"], b.rings["online"].data["reward"])


# --------------------------------------------------------------------------- models
def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    pol = SquashedGaussianPolicy(3, BOX, hidden=(16,))
    obs = torch.randn(5, 3)
    noise = torch.randn(5, 2)
    action, log_prob = pol.sample(obs, noise=noise)
    mean, log_std = pol.head(pol.body(obs)).chunk(2, dim=-1)
    std = log_std.clamp(-20, 2).exp()
    base = torch.distributions.Normal(mean, std)
    squashed = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform(cache_size=1)])
    y = torch.tanh(mean + noise * std)
    assert torch.allclose(log_prob, squashed.log_prob(y).sum(-1), atol=1e-4)
    assert torch.allclose(action, y * 2.0)  # Box [-2, 2]: scale 2, bias 0
    det, _, value = pol.act(obs, deterministic=True)
    assert det.shape == (5, 1, 2) and torch.allclose(det[:, 0], torch.tanh(mean) * 2.0)
    assert torch.equal(value, torch.zeros(5))
    big, _, _ = pol.act(obs * 1e3, noise=torch.randn(5, 2) * 10)
    assert big.abs().max() <= 2.0


def test_squashed_policy_refuses_unbounded_or_discrete_actions():
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    with pytest.raises(ValueError, match="policy 'squashed_mlp' needs a bounded Box action space, got Discrete"):
        build_policy("squashed_mlp", obs_space, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="bounded Box"):
        build_policy("squashed_mlp", obs_space, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))


def test_q_ensemble_members_are_independent_mlps():
    torch.manual_seed(0)
    q = QEnsemble(3, 2, hidden=(8, 8), num_q=3)
    obs, act = torch.randn(4, 3), torch.randn(4, 2)
    out = q(obs, act)
    assert out.shape == (3, 4)
    x = torch.cat([obs, act], -1)
    for e in range(3):
        h = x
        for i, (w, b) in enumerate(zip(q.weights, q.biases)):
            h = h @ w[e] + b[e, 0]
            if i < 2:
                h = torch.relu(h)
        assert torch.allclose(out[e], h[:, 0], atol=1e-5)


def test_q_ensemble_detach_keeps_the_critic_out_of_the_actor_gradient():
    q = QEnsemble(3, 2, hidden=(8,), num_q=2)
    act = torch.randn(4, 2, requires_grad=True)
    q(torch.randn(4, 3), act, detach=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in q.parameters())


def test_q_ensemble_layer_norm_and_batch_norm():
    torch.manual_seed(1)
    ln = QEnsemble(3, 1, hidden=(8,), num_q=2, norm="layer")
    obs, act = torch.randn(6, 3), torch.randn(6, 1)
    x = torch.cat([obs, act], -1)
    h = torch.relu(F.layer_norm(x @ ln.weights[0][1] + ln.biases[0][1, 0], (8,)))
    assert torch.allclose(ln(obs, act)[1], (h @ ln.weights[1][1] + ln.biases[1][1, 0])[:, 0], atol=1e-5)

    bn = QEnsemble(3, 1, hidden=(8,), num_q=2, norm="batch", bn_momentum=0.1)
    assert bn.running_mean_0.shape == (2, 1, 4) and bn.running_mean_1.shape == (2, 1, 8)
    obs = torch.randn(64, 3) * 5 + 3
    bn(obs, act.repeat(11, 1)[:64])
    x = torch.cat([obs, act.repeat(11, 1)[:64]], -1)
    assert torch.allclose(bn.running_mean_0[0, 0], 0.1 * x.mean(0), atol=1e-5)  # lerp from 0 by momentum
    before = bn.running_mean_0.clone()
    bn(obs, act.repeat(11, 1)[:64], batch_stats=False)  # running statistics: nothing moves
    assert torch.equal(before, bn.running_mean_0)


def test_q_ensemble_batch_norm_forward_matches_the_textbook_formula():
    torch.manual_seed(0)
    q = QEnsemble(3, 1, hidden=(8,), num_q=2, norm="batch")
    obs, act = torch.randn(32, 3) * 3 + 1, torch.randn(32, 1)

    def bn(h, k):
        m, v = h.mean(1, keepdim=True), h.var(1, keepdim=True, unbiased=False)
        return (h - m) / torch.sqrt(v + 1e-3) * q.norm_weight[k] + q.norm_bias[k]

    h = bn(torch.cat([obs, act], -1).unsqueeze(0).expand(2, 32, 4), 0)
    h = torch.relu(bn(torch.baddbmm(q.biases[0], h, q.weights[0]), 1))
    expected = torch.baddbmm(q.biases[1], h, q.weights[1]).squeeze(-1)
    assert torch.allclose(q(obs, act), expected, atol=1e-5)


# --------------------------------------------------------------------------- losses
def _sac_parts(norm=None):
    torch.manual_seed(0)
    actor = SquashedGaussianPolicy(3, BOX, hidden=(16,))
    critic = QEnsemble(3, 2, hidden=(16,), num_q=2, norm=norm)
    target = QEnsemble(3, 2, hidden=(16,), num_q=2).requires_grad_(False)
    log_alpha = torch.nn.Parameter(torch.tensor(math.log(0.5)))
    batch = {"obs": torch.randn(8, 3), "action": torch.rand(8, 2) * 4 - 2, "reward": torch.randn(8),
             "next_obs": torch.randn(8, 3), "discount": torch.full((8,), 0.99)}
    return actor, critic, target, log_alpha, batch


def test_sac_loss_values_against_the_formulas():
    actor, critic, target, log_alpha, batch = _sac_parts()
    torch.manual_seed(5)
    out = sac_loss(batch, LearnerNets(actor, critic, target, log_alpha=log_alpha), LossOptions(target_entropy=-2.0))
    torch.manual_seed(5)  # the same noise: the actor's own first (drawn before the parts), then the next action's
    actor_noise = torch.randn(8, 2)
    with torch.no_grad():
        a2, lp2 = actor.sample(batch["next_obs"])
        y = batch["reward"] + 0.99 * (target(batch["next_obs"], a2).min(0).values - 0.5 * lp2)
        q = critic(batch["obs"], batch["action"])
        a, lp = actor.sample(batch["obs"], noise=actor_noise)
        q_pi = critic(batch["obs"], a).min(0).values
    assert out["loss_qvalue"].item() == pytest.approx((0.5 * ((q[0] - y) ** 2).mean() + 0.5 * ((q[1] - y) ** 2).mean()).item(), rel=1e-5)
    assert out["loss_actor"].item() == pytest.approx((0.5 * lp - q_pi).mean().item(), rel=1e-5)
    assert out["loss_alpha"].item() == pytest.approx((-math.log(0.5) * (lp - 2.0)).mean().item(), rel=1e-5)
    assert out["alpha"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("loss_fn, norm", [(sac_loss, None), (crossq_loss, "batch")])
def test_each_loss_term_trains_only_its_own_parameters(loss_fn, norm):
    actor, critic, target, log_alpha, batch = _sac_parts(norm)
    groups = {"loss_qvalue": list(critic.parameters()), "loss_actor": list(actor.parameters()), "loss_alpha": [log_alpha]}
    for term, own in groups.items():
        for p in [*actor.parameters(), *critic.parameters(), log_alpha]:
            p.grad = None
        nets = LearnerNets(actor, critic, None if loss_fn is crossq_loss else target, log_alpha=log_alpha)
        out = loss_fn(batch, nets, LossOptions(target_entropy=-2.0))
        out[term].backward()
        own_ids = {id(p) for p in own}
        for p in [*actor.parameters(), *critic.parameters(), log_alpha]:
            touched = p.grad is not None and p.grad.abs().sum() > 0
            if id(p) not in own_ids:
                assert not touched, f"{term} reached a parameter it must not train"
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in own), term
    assert all(p.grad is None for p in target.parameters())


def test_bfloat16_autocast_runs_the_hidden_layers_in_bf16_and_keeps_outputs_and_gradients_float32():
    """actor.precision=bfloat16: the learner's losses run under autocast. The hidden layers' matmuls
    take bf16 (their outputs are bf16), Q-values and the policy's means / log-probs stay float32,
    and the losses land within bf16 rounding of the float32 ones (but not on them: bf16 was used)."""
    actor, critic, target, log_alpha, batch = _sac_parts()
    nets = LearnerNets(actor, critic, target, log_alpha=log_alpha)
    hidden_dtypes = []
    hook = actor.body.register_forward_hook(lambda m, i, o: hidden_dtypes.append(o.dtype))

    def losses(autocast: bool):
        for p in [*actor.parameters(), *critic.parameters(), log_alpha]:
            p.grad = None
        torch.manual_seed(5)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = sac_loss(batch, nets, LossOptions(target_entropy=-2.0))
            q = critic(batch["obs"], batch["action"])
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        return out, q, [p.grad.clone() for p in critic.parameters()]

    ref, q32, g32 = losses(False)
    assert hidden_dtypes == [torch.float32] * 2
    hidden_dtypes.clear()
    out, q16, g16 = losses(True)
    hook.remove()
    assert hidden_dtypes == [torch.bfloat16] * 2  # the actor's trunk: next actions, then the actor's own
    assert q16.dtype == torch.float32 and not torch.equal(q16, q32)
    assert torch.allclose(q16, q32, atol=0.05, rtol=0.02)
    for term in ("loss_qvalue", "loss_actor", "loss_alpha"):
        assert out[term].dtype == torch.float32, term
        assert out[term].item() == pytest.approx(ref[term].item(), rel=0.05, abs=0.02), term
    for a, b in zip(g16, g32):
        assert a.dtype == torch.float32
        assert F.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.98
    # CrossQ's batch statistics are taken in float32 from the bf16 layers; the running ones move
    actor, critic, _, log_alpha, batch = _sac_parts("batch")
    before = critic.running_mean_1.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = crossq_loss(batch, LearnerNets(actor, critic, log_alpha=log_alpha), LossOptions(target_entropy=-2.0))
    out["loss_qvalue"].backward()
    assert critic.running_mean_1.dtype == torch.float32 and not torch.equal(critic.running_mean_1, before)
    assert math.isfinite(out["loss_qvalue"].item()) and critic.weights[0].grad.dtype == torch.float32


@pytest.mark.parametrize("avx512_bf16, amx, chosen", [(False, False, None), (True, False, torch.bfloat16), (False, True, torch.bfloat16)])
def test_actor_precision_auto_takes_bfloat16_only_where_the_cpu_multiplies_it_natively(monkeypatch, avx512_bf16, amx, chosen):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    auto = resolve_precision("auto", cpu)
    assert (auto.dtype, auto.native, auto.name) == (chosen, chosen is not None, "bfloat16" if chosen else "float32")
    assert resolve_precision("bfloat16", cpu).dtype is torch.bfloat16  # asked for: kept, emulated or not
    assert resolve_precision("float32", cpu).dtype is None
    line = auto.describe(cpu)
    assert line.startswith(f"actor.precision=auto: {auto.name} on cpu (")
    assert line.endswith("which has no native bfloat16") == (chosen is None)
    # an explicit bfloat16 where it is emulated is called out, with what to use instead
    emulated = resolve_precision("bfloat16", cpu).describe(cpu)
    assert ("has no native bfloat16 and emulates it" in emulated) == (chosen is None)
    assert ("use float32 or auto" in emulated) == (chosen is None)
    with pytest.raises(ValueError, match="actor.precision: 'float16' is not one of float32, bfloat16, auto"):
        resolve_precision("float16", cpu)


def test_sac_parts_on_two_threads_give_the_same_update_as_one_after_the_other():
    """ActorCriticLoss: the critic part and the actor part read the same weights and write disjoint
    gradients, so running the actor's on another thread (actor.update_threads=2) while the critic's
    runs changes nothing, bit for bit; the actor's noise is drawn before either starts."""
    import concurrent.futures as cf

    actor, critic, target, log_alpha, batch = _sac_parts()
    nets = LearnerNets(actor, critic, target, log_alpha=log_alpha)
    params = [*actor.parameters(), *critic.parameters(), log_alpha]
    opts = LossOptions(target_entropy=-2.0)

    def grads_after(run) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        torch.manual_seed(3)
        run()
        return [p.grad.clone() for p in params]

    def backward(terms):
        sum(v for k, v in terms.items() if k.startswith("loss_")).backward()
        return terms

    serial = grads_after(lambda: backward(sac_loss(batch, nets, opts)))
    with cf.ThreadPoolExecutor(1) as pool:
        def threaded():
            b = sac_loss.prepare(batch, nets)
            pending = pool.submit(lambda: backward(sac_loss.actor(b, nets, opts)))
            backward(sac_loss.critic(b, nets, opts))
            return pending.result()
        parallel = grads_after(threaded)
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))
    assert all(g.abs().sum() > 0 for g in serial)
    assert sac_loss.concurrent and not crossq_loss.concurrent  # CrossQ's actor reads the statistics its critic moves


def test_actor_part_in_a_helper_process_writes_the_same_gradients_and_sees_each_optimiser_step():
    """actor.update_helper=process: the helper binds its modules to the learner's flat buffers in
    shared memory. Its gradients equal the one-process update's bit for bit, an optimiser step in
    the learner reaches it without a copy, and its death is reported with its exit code."""
    import copy
    import os
    import signal

    from rlweave.models.flat import FlatParameters
    from rlweave.workers.update_helper import ActorPartProcess

    actor, critic, target, log_alpha, batch = _sac_parts()
    opts = LossOptions(target_entropy=-2.0)
    # the reference: the same modules, unshared, one process
    ref = LearnerNets(copy.deepcopy(actor), copy.deepcopy(critic), target, log_alpha=torch.nn.Parameter(log_alpha.detach().clone()))
    ref_params = [*ref.actor.parameters(), ref.log_alpha, *ref.critic.parameters()]
    nets = LearnerNets(actor, critic, target, log_alpha=log_alpha)
    flats = [FlatParameters([*actor.parameters(), log_alpha]), FlatParameters(critic.parameters())]
    params = [*actor.parameters(), log_alpha, *critic.parameters()]
    ref_opt = torch.optim.Adam(ref_params, lr=1e-2)
    opt = torch.optim.Adam([f.flat for f in flats], lr=1e-2)
    helper = ActorPartProcess(nets, flats, sac_loss.actor, opts, None, sac_loss.prepare(batch, nets), name="actor[0]")
    try:
        for step in range(3):
            for p in ref_params:
                p.grad = None
            for f in flats:
                f.zero_grad()
            torch.manual_seed(step)
            sum(v for k, v in sac_loss(batch, ref, opts).items() if k.startswith("loss_")).backward()
            torch.manual_seed(step)
            b = sac_loss.prepare(batch, nets)
            helper.submit(b)
            critic_terms = sac_loss.critic(b, nets, opts)
            critic_terms["loss_qvalue"].backward()
            actor_terms = helper.result()
            assert set(actor_terms) == {"loss_actor", "entropy", "loss_alpha"} and actor_terms["loss_actor"].dtype == torch.float32
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, ref_params)), f"step {step}"
            assert all(p.grad.abs().sum() > 0 for p in params)
            ref_opt.step()
            opt.step()
            assert all(torch.equal(p, q) for p, q in zip(params, ref_params))
        os.kill(helper.process.pid, signal.SIGKILL)
        helper.process.wait()
        with pytest.raises(RuntimeError, match=rf"actor\[0\]: the helper process running the actor's part of the update "
                                               rf"\(pid {helper.process.pid}\) exited with code -9"):
            helper.submit(b)
            helper.result()
    finally:
        helper.close()


def test_an_error_in_the_helper_process_reaches_the_learner_with_its_traceback():
    from rlweave.models.flat import FlatParameters
    from rlweave.workers.update_helper import ActorPartProcess

    actor, critic, target, log_alpha, batch = _sac_parts()
    nets = LearnerNets(actor, critic, target, log_alpha=log_alpha)
    flats = [FlatParameters([*actor.parameters(), log_alpha]), FlatParameters(critic.parameters())]
    no_obs = {k: v for k, v in sac_loss.prepare(batch, nets).items() if k != "obs"}  # the actor's part reads batch["obs"]
    helper = ActorPartProcess(nets, flats, sac_loss.actor, LossOptions(), None, no_obs, name="actor[0]")
    try:
        helper.submit(no_obs)
        with pytest.raises(RuntimeError, match=r"(?s)actor\[0\]: the actor's part of the update failed in its helper process:.*KeyError: 'obs'"):
            helper.result()
        helper.submit(no_obs)  # the helper lives on after a failed part
        with pytest.raises(RuntimeError, match="KeyError"):
            helper.result()
    finally:
        helper.close()
    assert helper.process.returncode == 0  # closing the socket ends it


@pytest.mark.parametrize("memfd, expected", [(True, "process"), (False, "thread")])
def test_the_learner_falls_back_to_a_helper_thread_where_a_helper_process_cannot_run(monkeypatch, memfd, expected):
    """actor.update_helper=process needs memfd (Linux): on macOS the learner runs the actor's part
    on a thread instead of failing at the first update."""
    import rlweave.workers.offpolicy_actor as oa
    from rlweave.cluster.worker import _IN_PROCESS, WorkerContext, _bind
    from rlweave.config import load_config
    from rlweave.models.run_policy import policy_kwargs

    monkeypatch.setattr(oa, "update_helper_available", lambda: memfd)
    cfg = load_config("sac-pendulum", ["policy.hidden=[8]", "critic.hidden=[8]"])
    env = gym.make("Pendulum-v1")
    ctx = WorkerContext(group="actor", rank=0, world_size=1, slot=None, slot_kind="cpu", num_threads=1, local=True)
    worker = _bind(oa.OffPolicyActorWorker, ctx, (OmegaConf.to_container(cfg.algorithm), policy_kwargs(cfg), OmegaConf.to_container(cfg.critic),
                                                  env.observation_space, env.action_space, 1, 0),
                   {"update_threads": 2, "update_helper": "process"})
    try:
        assert worker.update_helper == expected and worker.concurrent_parts
    finally:
        _IN_PROCESS.pop(("actor", 0), None)


def test_policy_delay_leaves_out_the_actor_and_alpha_terms():
    actor, critic, target, log_alpha, batch = _sac_parts()
    nets = LearnerNets(actor, critic, target, log_alpha=log_alpha)
    out = sac_loss(batch, nets, LossOptions(target_entropy=-2.0), update_actor=False)
    assert set(k for k in out if k.startswith("loss_")) == {"loss_qvalue"}
    out = sac_loss(batch, nets, LossOptions(target_entropy=-2.0, autotune_alpha=False))
    assert "loss_alpha" not in out and "loss_actor" in out


def test_iql_loss_values_against_the_formulas():
    actor, critic, target, _, batch = _sac_parts()
    value = QEnsemble(3, 0, hidden=(16,), num_q=1)
    opts = LossOptions(expectile=0.8, temperature=2.0, max_weight=5.0)
    out = iql_loss(batch, LearnerNets(actor, critic, target, value=value), opts)
    obs, act = batch["obs"], batch["action"]
    with torch.no_grad():
        qt = target(obs, act).min(0).values
        v = value(obs)[0]
        u = qt - v
        expected_v = (torch.where(u < 0, 0.2, 0.8) * u**2).mean()
        y = batch["reward"] + 0.99 * value(batch["next_obs"])[0]
        q = critic(obs, act)
        expected_q = ((q[0] - y) ** 2).mean() + ((q[1] - y) ** 2).mean()
        w = torch.exp(2.0 * u).clamp(max=5.0)
        mean, log_std = actor.head(actor.body(obs)).chunk(2, -1)
        log_std = log_std.clamp(-5.0, 2.0)
        unit = act / 2.0  # BOX is [-2, 2]: the [-1, 1] units of the policy's Gaussian
        logp = torch.distributions.Normal(torch.tanh(mean), log_std.exp()).log_prob(unit).sum(-1)
    assert out["loss_value"].item() == pytest.approx(expected_v.item(), rel=1e-5)
    assert out["loss_qvalue"].item() == pytest.approx(expected_q.item(), rel=1e-5)
    assert out["loss_actor"].item() == pytest.approx(-(w * logp).mean().item(), rel=1e-5)
    assert out["adv_weight"].item() <= 5.0


def test_iql_terms_train_disjoint_modules_and_not_the_target():
    actor, critic, target, _, batch = _sac_parts()
    value = QEnsemble(3, 0, hidden=(16,), num_q=1)
    mods = {"loss_value": value, "loss_qvalue": critic, "loss_actor": actor}
    for term, own in mods.items():
        for m in (actor, critic, value):
            m.zero_grad(set_to_none=True)
        iql_loss(batch, LearnerNets(actor, critic, target, value=value), LossOptions())[term].backward()
        for m in (actor, critic, value):
            touched = any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
            assert touched == (m is own), f"{term} and {type(m).__name__}"
    assert all(p.grad is None for p in target.parameters())


def test_crossq_normalises_current_and_next_state_actions_together():
    actor, critic, _, log_alpha, batch = _sac_parts("batch")
    critic.bn_momentum = 1.0  # running statistics become exactly the last batch's
    crossq_loss(batch, LearnerNets(actor, critic, log_alpha=log_alpha), LossOptions(target_entropy=-2.0), update_actor=False)
    seen = critic.running_mean_0[0, 0, :3]  # the observation columns of the input normaliser
    both = torch.cat([batch["obs"], batch["next_obs"]]).mean(0)
    assert torch.allclose(seen, both, atol=1e-5)


def test_soft_update_is_polyak_averaging():
    a, b = QEnsemble(2, 1, hidden=(4,)), QEnsemble(2, 1, hidden=(4,))
    expected = [0.9 * pt + 0.1 * po for pt, po in zip(a.parameters(), b.parameters())]
    soft_update(a, b, 0.1)
    assert all(torch.allclose(p, e) for p, e in zip(a.parameters(), expected))


def test_registry_knows_the_off_policy_algorithms():
    assert get_algorithm("sac").kind == "off_policy" and get_algorithm("sac").target_network
    iql = get_algorithm("iql")
    assert iql.kind == "offline" and iql.value_network and iql.target_network and iql.needs_dataset
    assert get_algorithm("crossq").kind == "off_policy" and not get_algorithm("crossq").target_network


# --------------------------------------------------------------------------- runner end to end
SMALL = ["policy.hidden=[32,32]", "critic.hidden=[32,32]", "algorithm.batch_size=32", "algorithm.learning_starts=150",
         "train.rollout_steps=50", "train.total_env_steps=400", "train.eval_every=4", "train.eval_episodes=2",
         "env.num_envs=2", *QUIET]


def test_async_sac_run_accounts_for_every_sample(ray_session, tmp_path):
    run_dir = tmp_path / "sac"
    rc, out = train("sac-pendulum", *SMALL, f"run.dir={run_dir}", "actor.precision=auto")
    assert rc == 0, out
    # the learner resolved auto on its own device and said what it chose (this machine's CPU)
    cpu = torch.device("cpu")
    assert f"[rlweave] {resolve_precision('auto', cpu).describe(cpu)}" in out
    rows = read_metrics(run_dir)
    assert [r["env_steps"] for r in rows] == [100, 200, 300, 400]  # 2 envs x 50 decisions per iteration
    # random actions until learning_starts; then the policy acts
    assert [r["samples/random_actions"] for r in rows] == [1, 1, 0, 0]
    # the learner takes iteration i-1's transitions in iteration i, and owes utd * (steps - 150) updates
    assert [r["samples/ingested"] for r in rows] == [0, 100, 100, 100]
    assert [r["samples/updates"] for r in rows] == [0, 0, 50, 100]
    assert rows[-1]["train/updates"] == 150
    assert [r["samples/staleness"] for r in rows] == [0, 0, 0, 1]  # v2 acted in iteration 3; the learner, at v3, trains on it in 4
    assert rows[-1]["eval/episode_return"] < 0
    assert {"train/loss_qvalue", "train/loss_actor", "train/alpha", "time/actor", "perf/updates_per_s"} <= set(rows[-1])
    # the final checkpoint holds every collected transition: 300 ingested, the last 100 staged
    replay = load_checkpoint(latest_checkpoint(run_dir))["replay"]
    assert replay[0]["rings"]["online"]["size"] == 300
    assert sum(len(it["transitions"]["reward"]) for it in replay[0]["staged"]) == 100


def test_auto_placement_tries_each_layout_on_learning_iterations_and_loses_no_sample(ray_session, tmp_path):
    """placement.mode=auto on 2 CPU slots: the learner beside collection, then apart from it; each
    layout runs two learning iterations (the second timed; iterations before learning_starts are not
    counted), then the faster measured. Every transition reaches the replay once across the switches."""
    run_dir = tmp_path / "auto"
    rc, out = train("sac-pendulum", *SMALL, "placement.mode=auto", "train.total_env_steps=800", "train.eval_every=0",
                    "train.checkpoint_every=0", f"run.dir={run_dir}")
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["samples/updates"] for r in rows] == [0, 0, 50, 100, 100, 100, 100, 100]
    layouts = [r["plan/layout"] for r in rows]
    assert layouts[:6] == [0, 0, 0, 0, 1, 1]
    best = 0 if rows[3]["time/iteration"] < rows[5]["time/iteration"] else 1
    assert layouts[6:] == [best, best]
    assert "placement auto: measured learner beside collection" in out and "learner apart" in out
    assert [r["samples/ingested"] for r in rows] == [0] + [100] * 7  # each iteration takes the previous one's
    assert rows[-1]["train/updates"] == 550 and max(r["samples/staleness"] for r in rows) <= 1
    replay = load_checkpoint(latest_checkpoint(run_dir))["replay"]
    assert replay[0]["rings"]["online"]["size"] == 700
    assert sum(len(it["transitions"]["reward"]) for it in replay[0]["staged"]) == 100


def test_weights_carried_by_the_collection_call_reach_every_env_sharing_a_rollout_replica(ray_session, tmp_path):
    """Two env workers share one rollout replica; each collection call hands it the learner's
    newest packet and the replica loads it once, before either env acts. So every transition of
    iteration i was acted by version i-1: staleness exactly 1 once the policy acts
    (``train.max_staleness=1`` would stop the run at 2)."""
    rc, out = train("sac-pendulum", *SMALL, "env.num_workers=2", "rollout.num_workers=1", "train.max_staleness=1",
                    "train.total_env_steps=600", "train.eval_every=0", f"run.dir={tmp_path / 'r'}")
    assert rc == 0, out
    rows = read_metrics(tmp_path / "r")
    assert [r["env_steps"] for r in rows] == [100, 200, 300, 400, 500, 600]
    # random actions until 150 steps (exempt); the policy first acts in iteration 3, with version 2,
    # and iteration 4's learner (version 3) takes those transitions in: one version behind, never two
    assert [r["samples/random_actions"] for r in rows] == [1, 1, 0, 0, 0, 0]
    assert [r["samples/staleness"] for r in rows] == [0, 0, 0, 1, 1, 1]


def test_same_seed_same_learning_on_one_or_two_update_threads_and_resume_continues(ray_session, tmp_path):
    """The actor's part on a helper process (the default of update_threads=2) or on a helper
    thread: the same numbers as one after the other."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, threads, helper in ((a, 1, "process"), (b, 2, "process"), (c, 2, "thread")):
        rc, out = train("sac-pendulum", *SMALL, f"actor.update_threads={threads}", f"actor.update_helper={helper}", f"run.dir={d}")
        assert rc == 0, out
    key = ["train/loss_qvalue", "train/loss_actor", "train/alpha", "eval/episode_return"]
    ra, rb, rc_ = ([[r.get(k) for k in key] for r in read_metrics(d)] for d in (a, b, c))
    assert ra == rb == rc_ and len(ra) == 4 and all(v is not None for v in ra[-1])
    # resume: more steps on top of the finished run, continuing its counters
    cfg_path = a / "config.yaml"
    cfg = OmegaConf.load(cfg_path)
    cfg.train.total_env_steps = 600
    OmegaConf.save(cfg, cfg_path)
    rc, out = run_cli("resume", str(a))
    assert rc == 0, out
    rows = read_metrics(a)
    assert [r["env_steps"] for r in rows] == [100, 200, 300, 400, 500, 600]
    assert rows[4]["samples/ingested"] == 100  # iteration 4's transitions, staged in the checkpoint
    assert rows[5]["train/updates"] == 150 + 100 + 100


def test_checkpoints_every_iteration_hold_the_pending_transitions_without_changing_the_run(ray_session, tmp_path):
    run_dir = tmp_path / "ckpt"
    rc, out = train("sac-pendulum", *SMALL, "train.checkpoint_every=1", "train.keep_checkpoints=10", f"run.dir={run_dir}")
    assert rc == 0, out
    rows = read_metrics(run_dir)
    # the learner sees the same data in each iteration as without checkpoints
    assert [r["samples/ingested"] for r in rows] == [0, 100, 100, 100]
    assert [r["samples/updates"] for r in rows] == [0, 0, 50, 100]
    assert [r["samples/staleness"] for r in rows] == [0, 0, 0, 1]
    # each checkpoint holds every collected transition: ingested ones in the ring, the iteration's own staged
    states = [load_checkpoint(p)["replay"][0] for p in sorted((run_dir / "checkpoints").iterdir())]
    assert [s["rings"].get("online", {}).get("size", 0) for s in states] == [0, 100, 200, 300]
    assert [sum(len(it["transitions"]["reward"]) for it in s["staged"]) for s in states] == [100, 100, 100, 100]


def test_collect_then_train_mode_has_no_staleness(ray_session, tmp_path):
    run_dir = tmp_path / "sync"
    rc, out = train("crossq-pendulum", *SMALL, "train.max_staleness=0", f"run.dir={run_dir}")
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["samples/ingested"] for r in rows] == [100, 100, 100, 100]
    assert [r["samples/updates"] for r in rows] == [0, 50, 100, 100]
    assert all(r["samples/staleness"] == 0 for r in rows)
    # policy_delay 3: the critics' Adam stepped on each of the 250 updates, the actor's (with the
    # temperature) on updates 0, 3, ..., 249 only
    optimizers = load_checkpoint(latest_checkpoint(run_dir))["actor"]["optimizers"]
    steps = {part: [float(s["step"]) for s in opt["state"].values()] for part, opt in optimizers.items()}
    assert steps == {"critic": [250.0], "actor": [84.0]}


@pytest.mark.parametrize(
    "recipe, overrides, fragment",
    [
        ("ppo-cartpole", ["algorithm.name=sac"], "algorithm.name: 'sac' is an off-policy algorithm; it runs with runner=offpolicy"),
        ("sac-pendulum", ["algorithm.name=ppo"], "algorithm.name: 'ppo' is an on-policy algorithm; it runs with runner=onpolicy"),
        ("sac-pendulum", ["train.sync_every=2"], "train.max_staleness: 1 can never be met with train.sync_every=2"),
        ("sac-pendulum", ["train.max_staleness=0", "train.sync_every=3"], "train.sync_every: 3 cannot meet train.max_staleness=0"),
        ("sac-pendulum", ["actor.num_workers=2", "env.num_workers=2"], "actor.num_workers: the off-policy learner runs on one rank"),
        ("sac-pendulum", ["env.id=CartPole-v1"], "policy.name: policy 'squashed_mlp' needs a bounded Box action space"),
        ("sac-pendulum", ["policy.name=mlp"], "policy.name: sac learns a tanh-squashed Gaussian actor"),
        ("sac-pendulum", ["critic.norm=group"], "critic.norm"),
        ("sac-pendulum", ["placement.groups.actor.threads=0"], "placement.groups.actor.threads: must be >= 1"),
        ("sac-pendulum", ["placement.mode=auto", "env.num_workers=3", "rollout.num_workers=3"],
         "placement.mode: auto found no layout for 3 env and 3 rollout workers on 2 cpu slot(s)"),
        ("ppo-cartpole", ["actor.precision=bfloat16"], "actor.precision: bfloat16 applies to the off-policy learner; ppo's actor"),
        ("sac-pendulum", ["actor.precision=float16"], "actor.precision"),
        ("crossq-pendulum", ["actor.update_threads=2"], "actor.update_threads: 2 runs two parts of an update at the same time "
         "(the critic's and the actor's, or the value and the policy losses); crossq's update has no such parts (dsrl, ppo, rlpd, sac have)"),
    ],
)
def test_off_policy_bad_input_is_refused_before_start(capsys, tmp_path, no_cluster_start, recipe, overrides, fragment):
    rc = main(["train", recipe, *overrides, f"run.dir={tmp_path / 'r'}", *QUIET])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- offline datasets
def _random_dataset(tmp_path: Path, env_id: str, episodes: int, name: str) -> Path:
    from rlweave.data.datasets import collect_dataset

    out = tmp_path / name
    info = collect_dataset(lambda: gym.make(env_id), None, episodes, out, name, seed=0)
    assert info["episodes"] == episodes and Path(info["path"]) == out
    return out


def test_dataset_round_trip_as_transitions(tmp_path):
    from rlweave.data.datasets import load_transitions

    path = _random_dataset(tmp_path, "Pendulum-v1", 3, "pend")
    env = gym.make("Pendulum-v1")
    data, stats = load_transitions(path, env.observation_space, env.action_space, gamma=0.9)
    assert stats["episodes"] == 3 and stats["steps"] == 600 and len(data["reward"]) == 600
    assert data["obs"].shape == (600, 3) and data["action"].shape == (600, 1)
    assert np.array_equal(data["next_obs"][:199], data["obs"][1:200])  # consecutive steps of one episode
    assert np.allclose(data["discount"], 0.9)  # Pendulum only truncates: every step bootstraps
    assert stats["return_mean"] == pytest.approx(data["reward"].sum() / 3, rel=1e-5)
    assert (data["policy_version"] == -2).all()


def test_dataset_with_other_spaces_is_refused_naming_both_shapes(tmp_path):
    from rlweave.data.datasets import DatasetError, check_spaces

    path = _random_dataset(tmp_path, "MountainCarContinuous-v0", 1, "car")
    env = gym.make("Pendulum-v1")
    with pytest.raises(DatasetError, match=r"observation shape \(2,\) and action shape \(1,\) do not match the env's observation shape \(3,\)"):
        check_spaces(path, env.observation_space, env.action_space)
    with pytest.raises(DatasetError, match="already exists"):
        _random_dataset(tmp_path, "MountainCarContinuous-v0", 1, "car")


def test_collect_from_a_run_then_rlpd_learns_from_it(ray_session, tmp_path, capsys):
    run_dir, ds = tmp_path / "sac", tmp_path / "pendulum_medium"
    rc, out = train("sac-pendulum", *SMALL, f"run.dir={run_dir}")
    assert rc == 0, out
    assert main(["collect", str(run_dir), "--episodes", "2", "-o", str(ds)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["episodes"] == 2 and info["steps"] == 400 and "iter_00000004" in info["source"]
    assert main(["collect", str(run_dir), "--episodes", "2", "-o", str(ds)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err
    # the same --seed draws the same stochastic actions: the same dataset again
    again = tmp_path / "pendulum_medium_again"
    assert main(["collect", str(run_dir), "--episodes", "2", "-o", str(again)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["return_mean"] == info["return_mean"]
    rlpd = tmp_path / "rlpd"
    rc, out = train("rlpd-pendulum", *SMALL, "critic.num_q=4", "algorithm.utd_ratio=2", f"replay.offline_dataset={ds}", f"run.dir={rlpd}")
    assert rc == 0, out
    assert "offline dataset" in out and "2 episodes, 400 steps" in out
    rows = read_metrics(rlpd)
    assert rows[-1]["train/updates"] == 2 * (300 - 150)  # the last iteration's steps are collected, not yet trained on
    replay = load_checkpoint(latest_checkpoint(rlpd))["replay"][0]
    assert set(replay["rings"]) == {"online"}  # the dataset is re-read at start, not copied into checkpoints


OFFLINE = ["env.id=Pendulum-v1", "policy.hidden=[32,32]", "critic.hidden=[32,32]", "algorithm.batch_size=32",
           "train.updates_per_iteration=10", "train.total_updates=30", "train.eval_every=3", "train.eval_episodes=1",
           "train.checkpoint_every=2", *QUIET]


def test_iql_learns_offline_from_a_dataset_and_resumes(ray_session, tmp_path):
    ds = _random_dataset(tmp_path, "Pendulum-v1", 2, "pend")
    run_dir = tmp_path / "iql"
    rc, out = train("iql-hopper-medium", *OFFLINE, f"replay.offline_dataset={ds}", f"run.dir={run_dir}")
    assert rc == 0, out
    assert "no env or rollout workers" in out and "2 episodes, 400 steps" in out and "1000 / return range" in out
    rows = read_metrics(run_dir)
    assert [r["samples/updates"] for r in rows] == [10, 10, 10]
    assert [r["train/updates"] for r in rows] == [10, 20, 30]
    assert all(r["env_steps"] == 0 for r in rows)
    assert "eval/episode_return" in rows[-1] and "eval/episode_return" not in rows[0]
    assert {"train/loss_value", "train/loss_qvalue", "train/loss_actor", "train/adv_weight"} <= set(rows[-1])
    state = load_checkpoint(latest_checkpoint(run_dir))
    assert state["actor"]["value"] is not None and state["envs"] == [] and state["actor"]["updates"] == 30
    # the recipe's cosine schedule: the actor's rate, set before the 30th of 30 updates; the others constant
    optimizers = state["actor"]["optimizers"]
    assert set(optimizers) == {"critic", "actor"}  # the critics' and value's Adam; the actor's with the temperature
    groups = [g for opt in optimizers.values() for g in opt["param_groups"]]
    assert all(len(g["params"]) == 1 for g in groups)  # each group one flat buffer
    actor_lr = [g["lr"] for g in groups if g["scheduled"]]
    assert actor_lr == [pytest.approx(3e-4 * 0.5 * (1 + math.cos(math.pi * 29 / 30)))]
    assert {g["lr"] for g in groups if not g["scheduled"]} == {3e-4}
    cfg = OmegaConf.load(run_dir / "config.yaml")
    cfg.train.total_updates = 45
    OmegaConf.save(cfg, run_dir / "config.yaml")
    rc, out = run_cli("resume", str(run_dir))
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["train/updates"] for r in rows] == [10, 20, 30, 40, 45]  # the last iteration takes what is left


def test_offline_bc_regresses_the_dataset_actions(ray_session, tmp_path):
    ds = _random_dataset(tmp_path, "Pendulum-v1", 1, "pend")
    run_dir = tmp_path / "bc"
    rc, out = train("iql-hopper-medium", *OFFLINE, "algorithm.name=offline_bc", f"replay.offline_dataset={ds}", f"run.dir={run_dir}")
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert rows[-1]["train/updates"] == 30 and "train/loss_bc" in rows[-1] and "train/loss_qvalue" not in rows[-1]
    assert load_checkpoint(latest_checkpoint(run_dir))["actor"]["critic"] is None


def test_offline_bench_runs_seeds_in_lanes_and_reports_them_in_order(tmp_path, capsys):
    ds = _random_dataset(tmp_path, "Pendulum-v1", 1, "pend")
    small = [o for o in OFFLINE if not o.startswith("train.total_updates=")]
    out_json = tmp_path / "offline.json"
    rc = main(["bench", "offline", "--dataset", str(ds), "--seeds", "3", "1", "--updates", "20", "--lanes", "2",
               "--keep", str(tmp_path / "runs"), "--json", str(out_json), *small])
    report = json.loads(out_json.read_text())
    assert rc == (0 if report["passed"] else 1)  # the exit code says whether IQL beat both; 20 updates decide nothing
    # four runs, two at a time, reported per algorithm in the order of --seeds whatever finished first
    assert [r["seed"] for r in report["runs"]["iql"]] == [3, 1]
    assert [r["seed"] for r in report["runs"]["offline_bc"]] == [3, 1]
    assert sorted(p.name for p in (tmp_path / "runs" / "iql").iterdir()) == ["seed1", "seed3"]
    for algo in ("iql", "offline_bc"):
        for r in report["runs"][algo]:
            rows = read_metrics(Path(r["run_dir"]))
            assert rows[-1]["train/updates"] == 20 and r["final_eval_return"] == rows[-1]["eval/episode_return"]
    out = capsys.readouterr().out
    assert "iql seed 3: final eval return" in out and "offline_bc seed 1: final eval return" in out
    with pytest.raises(SystemExit):
        main(["bench", "offline", "--dataset", str(ds), "--lanes", "0"])
    assert "--lanes must be at least 1, got 0" in capsys.readouterr().err


def test_offline_algorithms_need_a_dataset_and_an_update_budget(capsys, tmp_path, no_cluster_start):
    rc = main(["train", "iql-hopper-medium", f"run.dir={tmp_path / 'r'}", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2 and "replay.offline_dataset: iql learns from a dataset; make one with" in err, err
    ds = _random_dataset(tmp_path, "Hopper-v5", 1, "hop")
    rc = main(["train", "iql-hopper-medium", f"replay.offline_dataset={ds}", "train.total_updates=0", f"run.dir={tmp_path / 'r'}", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2 and "train.total_updates: iql learns from a dataset alone" in err, err
    rc = main(["train", "iql-hopper-medium", f"replay.offline_dataset={ds}", "algorithm.expectile=0.3", f"run.dir={tmp_path / 'r'}", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2 and "algorithm.expectile" in err, err
    assert not (tmp_path / "r").exists()


def test_rlpd_without_a_dataset_and_mismatched_dataset_are_refused(capsys, tmp_path, no_cluster_start):
    rc = main(["train", "rlpd-pendulum", f"run.dir={tmp_path / 'r'}", *QUIET])
    assert rc == 2 and "replay.offline_dataset: rlpd learns from a dataset" in capsys.readouterr().err
    car = _random_dataset(tmp_path, "MountainCarContinuous-v0", 1, "car")
    rc = main(["train", "sac-pendulum", f"replay.offline_dataset={car}", f"run.dir={tmp_path / 'r'}", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "replay.offline_dataset: dataset" in err and "(2,)" in err and "(3,)" in err


# --------------------------------------------------------------------------- imitation
def test_scripted_pendulum_expert_catches_and_pumps():
    from rlweave.envs.controllers import pendulum_swing_up

    u = pendulum_swing_up(np.array([[1.0, 0.0, 0.0], [math.cos(0.1), math.sin(0.1), 0.0], [-1.0, 0.0, 1.0], [-1.0, 0.0, -1.0]]))
    assert u.shape == (4, 1)
    assert u[0, 0] == 0.0  # upright at rest: nothing to do
    assert u[1, 0] == pytest.approx(-1.0, abs=1e-6)  # PD catch: -(10 * 0.1)
    assert u[2, 0] == 2.0 and u[3, 0] == -2.0  # at the bottom, pump energy along the motion (clipped)


def test_experts_and_gates():
    from rlweave.data.experts import ActionGapGate, ExpertError, load_expert

    obs_space = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
    act_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    expert = load_expert("rlweave.envs.controllers:pendulum_swing_up", obs_space, act_space)
    assert expert(np.zeros((5, 3), np.float32)).shape == (5, 1)
    with pytest.raises(ExpertError, match="cannot import 'rlweave.envs.controllers:nope'"):
        load_expert("rlweave.envs.controllers:nope", obs_space, act_space)
    with pytest.raises(ExpertError, match="neither a run folder nor 'module:function'"):
        load_expert("/no/such/run", obs_space, act_space)
    with pytest.raises(ExpertError, match=r"returns actions of shape \(3,\), the env needs \(1,\)"):
        load_expert("numpy:array", obs_space, act_space)  # identity: obs-shaped "actions"
    cheetah_obs = gym.spaces.Box(-np.inf, np.inf, (17,), np.float64)
    with pytest.raises(ExpertError, match=r"pendulum_swing_up' fails on this env's observations \(17,\): ValueError"):
        load_expert("rlweave.envs.controllers:pendulum_swing_up", cheetah_obs, gym.spaces.Box(-1, 1, (6,), np.float32))
    gate = ActionGapGate(0.5)
    assert gate(np.zeros((3, 3)), np.array([[0.0], [0.6], [-0.4]]), np.zeros((3, 1))).tolist() == [False, True, False]


def test_one_step_writer_keeps_only_the_chosen_envs():
    w = NStepWriter(1, 0.9, 3)
    w.add(np.arange(3.0)[:, None], np.ones((3, 1)), np.array([1.0, 2.0, 3.0]), np.zeros((3, 1)), np.zeros(3, bool), np.zeros(3, bool), 0,
          keep=np.array([True, False, True]))
    assert w.pop()["reward"].tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match="needs one-step transitions"):
        NStepWriter(2, 0.9, 1).add(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros(1), np.zeros((1, 1)), np.zeros(1, bool),
                                   np.zeros(1, bool), 0, keep=np.array([True]))


def test_bc_loss_is_the_squared_error_to_the_label():
    from rlweave.algorithms import bc_loss

    torch.manual_seed(0)
    actor = SquashedGaussianPolicy(3, BOX, hidden=(8,))
    obs, label = torch.randn(6, 3), torch.rand(6, 2) * 4 - 2
    out = bc_loss({"obs": obs, "action": label}, LearnerNets(actor))
    det, _ = actor.sample(obs, deterministic=True)
    assert out["loss_bc"].item() == pytest.approx(((det - label) ** 2).sum(-1).mean().item(), rel=1e-6)


IMITATION = ["policy.hidden=[32,32]", "algorithm.batch_size=32", "train.rollout_steps=50", "train.total_env_steps=300",
             "train.eval_every=3", "train.eval_episodes=1", "env.num_envs=2", *QUIET]


def test_bc_and_dagger_label_every_step_and_follow_the_beta_schedule(ray_session, tmp_path):
    for recipe in ("bc-pendulum", "dagger-pendulum"):
        run_dir = tmp_path / recipe
        rc, out = train(recipe, *IMITATION, f"run.dir={run_dir}")
        assert rc == 0, out
        rows = read_metrics(run_dir)
        assert [r["samples/labels"] for r in rows] == [100, 100, 100]  # 2 envs x 50 steps, every state labelled
        assert [r["samples/interventions"] for r in rows] == [0, 0, 0]
        shares = [r["samples/expert_share"] for r in rows]
        assert shares == ([1.0, 1.0, 1.0] if recipe == "bc-pendulum" else [1.0, 0.0, 0.0])
        assert [r["samples/updates"] for r in rows] == [100, 100, 100]  # collect, then train: utd 1 on all steps
        assert "train/loss_bc" in rows[-1] and "eval/episode_return" in rows[-1]


class _Operator:
    """An operator process's decision service: takes over every step of env 0."""

    def decide(self, obs, learner_action):
        return [i == 0 for i in range(len(obs))]


def test_hg_dagger_stores_only_the_steps_an_operator_took_over(ray_session, tmp_path):
    operator = ray.remote(_Operator).options(name="operator-test").remote()
    run_dir = tmp_path / "hg"
    rc, out = train("hg-dagger-pendulum", *IMITATION, "imitation.gate=operator", "imitation.operator=operator-test", f"run.dir={run_dir}")
    assert rc == 0, out
    rows = read_metrics(run_dir)
    assert [r["samples/interventions"] for r in rows] == [50, 50, 50]  # env 0 of 2, every step
    assert [r["samples/labels"] for r in rows] == [50, 50, 50]
    replay = load_checkpoint(latest_checkpoint(run_dir))["replay"][0]
    assert replay["rings"]["online"]["size"] == 150  # only the operator's steps were stored
    ray.kill(operator)


def test_imitation_needs_a_usable_expert(capsys, tmp_path, no_cluster_start):
    rc = main(["train", "dagger-pendulum", "imitation.expert=null", f"run.dir={tmp_path / 'r'}", *QUIET])
    assert rc == 2 and "imitation.expert: dagger needs an expert" in capsys.readouterr().err
    rc = main(["train", "bc-pendulum", "imitation.expert=nosuchmodule:f", f"run.dir={tmp_path / 'r'}", *QUIET])
    assert rc == 2 and "imitation.expert: cannot import 'nosuchmodule:f'" in capsys.readouterr().err


def test_state_independent_std_is_one_free_parameter_per_action_dim():
    torch.manual_seed(0)
    actor = SquashedGaussianPolicy(3, BOX, hidden=(8,), state_dependent_std=False)
    assert actor.head.out_features == 2 and actor.log_std.shape == (2,)
    obs, act = torch.randn(5, 3), torch.rand(5, 2) * 4 - 2
    with torch.no_grad():
        actor.log_std.fill_(-1.0)
    lp = actor.mean_log_prob(obs, act)
    mean = torch.tanh(actor.head(actor.body(obs)))
    expected = torch.distributions.Normal(mean, math.exp(-1.0)).log_prob(act / 2.0).sum(-1)
    assert torch.allclose(lp, expected, atol=1e-5)
    lp.sum().backward()
    assert actor.log_std.grad is not None and actor.log_std.grad.abs().sum() > 0
    a, _ = actor.sample(obs)
    assert a.shape == (5, 2) and (a.abs() <= 2).all()
