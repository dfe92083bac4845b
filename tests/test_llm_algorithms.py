"""Token-level language-model RL pieces against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlweave.algorithms.llm import (
    aggregate,
    dynamic_sampling_mask,
    kl_penalty,
    overlong_penalty,
    reinforce_pp_advantages,
    sequence_to_tokens,
    token_gae,
    truncated_importance_weights,
)

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_kl_estimators():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -0.5])
    x = lp - ref
    assert torch.allclose(kl_penalty(lp, ref, "k1"), x)
    assert torch.allclose(kl_penalty(lp, ref, "k2"), 0.5 * x**2)
    assert torch.allclose(kl_penalty(lp, ref, "k3"), torch.exp(-x) - 1 + x)
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    with pytest.raises(ValueError, match="algorithm.kl_estimator: 'k9'"):
        kl_penalty(lp, ref, "k9")


def test_aggregations_weigh_tokens_or_sequences():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [10.0, 20.0, 100.0, 100.0]])  # padding values must not count
    assert aggregate(x, MASK, "token_mean").item() == pytest.approx((1 + 2 + 3 + 10 + 20) / 5)
    assert aggregate(x, MASK, "seq_mean_token_mean").item() == pytest.approx((2.0 + 15.0) / 2)
    assert aggregate(x, MASK, "seq_mean_token_sum_norm", max_len=10).item() == pytest.approx((6 / 10 + 30 / 10) / 2)
    with pytest.raises(ValueError, match="algorithm.loss_agg"):
        aggregate(x, MASK, "median")


def test_reinforce_pp_returns_and_global_whitening():
    scores = torch.tensor([1.0, 0.0])
    kl = torch.full((2, 4), 0.1)
    adv = reinforce_pp_advantages(scores, MASK, kl=kl, kl_coef=0.5, gamma=1.0)
    # returns: seq 0 tokens: 1 - 0.05*3, 1 - 0.05*2, 1 - 0.05; seq 1: -0.05*2, -0.05
    raw = torch.tensor([0.85, 0.90, 0.95, -0.10, -0.05])
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    assert torch.allclose(adv[MASK.bool()], expected, atol=1e-5)
    assert torch.all(adv[~MASK.bool()] == 0)


def test_reinforce_pp_baseline_subtracts_the_group_mean():
    scores, groups = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 2, dtype=torch.long)
    adv = reinforce_pp_advantages(scores, mask, baseline=True, group_ids=groups)
    assert torch.allclose(adv[2:], torch.zeros(2, 2), atol=1e-6)  # group 1 all equal: no signal
    assert adv[0, 0] > 0 > adv[1, 0]
    with pytest.raises(ValueError, match="needs group_ids"):
        reinforce_pp_advantages(scores, mask, baseline=True)


def test_token_gae_puts_the_score_on_the_last_token():
    scores = torch.tensor([1.0, 2.0])
    values = torch.tensor([[0.5, 0.5, 0.5, 9.0], [0.2, 0.4, 9.0, 9.0]])
    adv, ret = token_gae(scores, values, MASK, gamma=1.0, lam=1.0)
    # lam = 1, gamma = 1: advantage = score - V(t); returns = score on every real token
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5, 0.0], [1.8, 1.6, 0.0, 0.0]]))
    adv0, _ = token_gae(scores, values, MASK, gamma=1.0, lam=0.0)
    # lam = 0: one-step TD, delta_t = V(t+1) - V(t) inside, score - V at the end
    assert torch.allclose(adv0[0, :3], torch.tensor([0.0, 0.0, 0.5]))


def test_dynamic_sampling_drops_groups_without_spread():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert dynamic_sampling_mask(scores, groups).tolist() == [False, False, True, True, False, False]


def test_overlong_penalty_is_soft():
    pen = overlong_penalty(torch.tensor([10, 16, 18, 20, 25]), max_len=20, buffer=4, penalty=1.0)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="algorithm.overlong_buffer"):
        overlong_penalty(torch.tensor([1]), max_len=4, buffer=5)


def test_truncated_importance_weights():
    w = truncated_importance_weights(torch.tensor([0.0, 0.0, -1.0]), torch.tensor([0.0, -2.0, 0.0]), cap=2.0)
    assert w.tolist() == pytest.approx([1.0, 2.0, math.exp(-1.0)])
    assert not w.requires_grad


def test_sequence_values_spread_on_real_tokens():
    assert sequence_to_tokens(torch.tensor([2, 3]), MASK).tolist() == [[2.0, 2.0, 2.0, 0.0], [3.0, 3.0, 0.0, 0.0]]


def test_llm_policy_loss_aggregates_and_adds_kl_and_importance_weights():
    from rlweave.algorithms.llm import llm_policy_loss

    torch.manual_seed(0)
    lp = torch.randn(2, 4, requires_grad=True)
    old, ref, behav = lp.detach() - 0.1, lp.detach() + 0.2, lp.detach() - 0.3
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
    ratio = torch.exp(lp.detach() - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    for agg in ("token_mean", "seq_mean_token_mean"):
        out = llm_policy_loss(lp, old, adv, MASK, clip_eps=0.2, clip_eps_high=0.28, loss_agg=agg)
        assert out["loss_policy"].item() == pytest.approx(aggregate(per_token, MASK, agg).item(), rel=1e-5)
        assert "loss_kl" not in out
    out = llm_policy_loss(lp, old, adv, MASK, ref_log_prob=ref, kl_coef=0.1, behaviour_log_prob=behav, is_cap=1.2)
    w = torch.exp(old - behav).clamp(max=1.2)
    assert out["loss_policy"].item() == pytest.approx(aggregate(per_token.clamp(max=1e9) * w, MASK).item(), rel=1e-5)
    assert out["loss_kl"].item() == pytest.approx(0.1 * aggregate(kl_penalty(lp.detach(), ref), MASK).item(), rel=1e-5)
    assert out["is_weight_mean"].item() == pytest.approx(w[MASK.bool()].mean().item(), rel=1e-5)
    (out["loss_policy"] + out["loss_kl"]).backward()
    assert lp.grad is not None and torch.all(lp.grad[~MASK.bool()] == 0)  # padding gets no gradient
