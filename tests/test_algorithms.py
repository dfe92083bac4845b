"""Unit tests for rlweave.algorithms against hand-computed values."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.testing import assert_close

from rlweave.algorithms.advantages import gae_estimator, grpo_estimator
from rlweave.algorithms.llm import ppo_token_loss

from rlweave.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    POLICY_LOSSES,
    AlgorithmSpec,
    discounted_returns,
    entropy_bonus,
    gae,
    get_advantage_estimator,
    get_algorithm,
    get_policy_loss,
    group_normalized_advantages,
    masked_mean,
    normalize,
    ppo_loss,
    ppo_policy_loss,
    ppo_objective,
    register_advantage_estimator,
    register_algorithm,
    total_loss,
    value_loss,
)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def col(*xs: float) -> torch.Tensor:
    """[T] -> [T, 1] (one environment)."""
    return t(*xs).unsqueeze(1)


def logs(*ratios: float) -> torch.Tensor:
    """log-probs whose ratio against old_log_prob = 0 is exactly the given ratios."""
    return t(*(math.log(r) for r in ratios))


def k3(r: float) -> float:
    return (r - 1.0) - math.log(r)


# ----------------------------------------------------------------------------- advantages


def test_gae_three_steps_with_done_in_middle():
    # gamma=0.9, lam=0.8. Env 0: r=[1,2,3], V=[0.5,1.0,1.5], done=[0,1,0], next_value=2.0
    #   t=2: delta = 3 + 0.9*2.0 - 1.5 = 3.3              A2 = 3.3
    #   t=1: done -> no bootstrap: delta = 2 - 1.0 = 1.0   A1 = 1.0 (recursion cut too)
    #   t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4               A0 = 1.4 + 0.9*0.8*1.0 = 2.12
    #   returns = A + V = [2.62, 2.0, 4.8]
    # Env 1: r=[0,0,1], V=0, no dones, next_value=0
    #   A2 = 1, A1 = 0.72*1 = 0.72, A0 = 0.72*0.72 = 0.5184; returns = A
    rewards = torch.stack([t(1, 2, 3), t(0, 0, 1)], dim=1)
    values = torch.stack([t(0.5, 1.0, 1.5), t(0, 0, 0)], dim=1)
    dones = torch.stack([t(0, 1, 0), t(0, 0, 0)], dim=1)
    adv, ret = gae(rewards, values, dones, t(2.0, 0.0), gamma=0.9, lam=0.8)
    assert_close(adv, torch.stack([t(2.12, 1.0, 3.3), t(0.5184, 0.72, 1.0)], dim=1))
    assert_close(ret, torch.stack([t(2.62, 2.0, 4.8), t(0.5184, 0.72, 1.0)], dim=1))


def test_gae_lambda_one_is_monte_carlo_minus_value():
    # lam=1, gamma=0.5, no dones, r=[1,1], V=[0.2,0.4], next_value=4:
    #   returns: G1 = 1 + 0.5*4 = 3, G0 = 1 + 0.5*3 = 2.5 -> A = G - V = [2.3, 2.6]
    adv, ret = gae(col(1, 1), col(0.2, 0.4), col(0, 0), t(4.0), gamma=0.5, lam=1.0)
    assert_close(adv, col(2.3, 2.6))
    assert_close(ret, col(2.5, 3.0))


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="next_value"):
        gae(col(1, 1), col(0, 0), col(0, 0), t(1.0, 2.0), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="dones"):
        gae(col(1, 1), col(0, 0), col(0, 0, 0), t(1.0), gamma=0.9, lam=0.9)


def test_discounted_returns_cut_at_done_without_bootstrap():
    # gamma=0.9, r=[1,2,3], done=[0,1,0]: G2 = 3 (no bootstrap), G1 = 2 (done), G0 = 1 + 0.9*2 = 2.8
    assert_close(discounted_returns(col(1, 2, 3), col(0, 1, 0), gamma=0.9), col(2.8, 2.0, 3.0))


def test_group_normalized_advantages_two_groups_identical_and_singleton():
    # ids are arbitrary and interleaved: group 7 = scores [1,2,3] at positions 0,2,4,
    # group 3 = [5,5] (identical -> 0), group 9 = [4] (singleton -> 0).
    # group 7: mean 2, population std sqrt(((1)^2+0+(1)^2)/3) = sqrt(2/3) (unbiased would be 1)
    scores = t(1, 5, 2, 5, 3, 4)
    ids = torch.tensor([7, 3, 7, 3, 7, 9])
    a = 1.0 / (math.sqrt(2.0 / 3.0) + 1e-6)
    assert_close(group_normalized_advantages(scores, ids), t(-a, 0, 0, 0, a, 0))
    # Dr. GRPO: centre only
    assert_close(group_normalized_advantages(scores, ids, scale=False), t(-1, 0, 0, 0, 1, 0))


def test_group_normalized_advantages_population_std():
    # [0,0,4,4]: mean 2, population std 2 -> +-2/(2+eps); the unbiased std (2.309) would fail.
    out = group_normalized_advantages(t(0, 0, 4, 4), torch.tensor([0, 0, 0, 0]), eps=1e-6)
    b = 2.0 / (2.0 + 1e-6)
    assert_close(out, t(-b, -b, b, b))
    assert not torch.isnan(group_normalized_advantages(t(3.0), torch.tensor([0]))).any()


def test_group_normalized_advantages_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(64, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 10, (64,), generator=g)
    expected = torch.zeros_like(scores)
    for gid in ids.unique():
        sel = ids == gid
        s = scores[sel]
        expected[sel] = (s - s.mean()) / (s.std(unbiased=False) + 1e-6)
    assert_close(group_normalized_advantages(scores, ids), expected)


def test_normalize_uses_sample_std_and_mask():
    # [1,2,3,4]: mean 2.5, unbiased std sqrt((2.25+0.25+0.25+2.25)/3) = sqrt(5/3)
    s = math.sqrt(5.0 / 3.0) + 1e-8
    assert_close(normalize(t(1, 2, 3, 4)), t(-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s))
    # masked: the 100 is ignored and returned as 0
    out = normalize(t(1, 2, 100, 3, 4), mask=t(1, 1, 0, 1, 1))
    assert_close(out, t(-1.5 / s, -0.5 / s, 0.0, 0.5 / s, 1.5 / s))
    assert_close(normalize(t(5.0)), t(0.0))


# ----------------------------------------------------------------------------- losses


def test_ppo_policy_loss_clip_both_sides_both_signs():
    # clip_eps = 0.2, old_log_prob = 0 so ratio = exp(log_prob)
    #   (r=1.5, A=+1): max(-1.5, -1.2) = -1.2   clipped
    #   (r=0.5, A=+1): max(-0.5, -0.8) = -0.5
    #   (r=1.5, A=-1): max( 1.5,  1.2) =  1.5
    #   (r=0.5, A=-1): max( 0.5,  0.8) =  0.8   clipped
    #   (r=1.1, A=+2): inside the clip  = -2.2
    # loss = (-1.2 - 0.5 + 1.5 + 0.8 - 2.2) / 5 = -0.32; clip_fraction = 2/5
    ratios = (1.5, 0.5, 1.5, 0.5, 1.1)
    log_prob = logs(*ratios).requires_grad_(True)
    out = ppo_policy_loss(log_prob, torch.zeros(5, dtype=torch.float64), t(1, 1, -1, -1, 2), clip_eps=0.2)
    assert_close(out["loss_policy"], torch.tensor(-0.32, dtype=torch.float64))
    assert_close(out["clip_fraction"], torch.tensor(0.4, dtype=torch.float64))
    assert_close(out["ratio_mean"], torch.tensor(5.1 / 5, dtype=torch.float64))
    assert_close(out["approx_kl"], torch.tensor(sum(k3(r) for r in ratios) / 5, dtype=torch.float64))
    assert not out["clip_fraction"].requires_grad and not out["approx_kl"].requires_grad
    # d/dlogp of -A*r/N = -A*r/5 where unclipped, 0 where the clip is active
    out["loss_policy"].backward()
    assert_close(log_prob.grad, t(0.0, -0.1, 0.3, 0.0, -0.44))


def test_ppo_policy_loss_dual_clip_caps_negative_advantage():
    # dual_clip = 3, clip_eps = 0.2
    #   (r=5, A=-1): max(5, 1.2) = 5 -> capped at 3*1 = 3
    #   (r=2, A=-1): max(2, 1.2) = 2 < 3, unchanged
    #   (r=5, A=+1): max(-5, -1.2) = -1.2, positive A is never dual-clipped
    # loss = (3 + 2 - 1.2) / 3 = 3.8/3 ; without dual clip (5 + 2 - 1.2)/3 = 5.8/3
    args = (logs(5, 2, 5), torch.zeros(3, dtype=torch.float64), t(-1, -1, 1))
    out = ppo_policy_loss(*args, dual_clip=3.0)
    assert_close(out["loss_policy"], torch.tensor(3.8 / 3, dtype=torch.float64))
    assert_close(out["dual_clip_fraction"], torch.tensor(1 / 3, dtype=torch.float64))
    plain = ppo_policy_loss(*args)
    assert_close(plain["loss_policy"], torch.tensor(5.8 / 3, dtype=torch.float64))
    assert "dual_clip_fraction" not in plain
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="dual_clip"):
            ppo_policy_loss(*args, dual_clip=bad)


def test_ppo_policy_loss_clip_higher_is_asymmetric():
    # clip_eps = 0.2 (low), clip_eps_high = 0.28: clip range [0.8, 1.28]
    #   (r=1.3,  A=+1): clamp -> 1.28, max(-1.3, -1.28) = -1.28   clipped
    #   (r=0.7,  A=-1): clamp -> 0.8,  max(0.7, 0.8)   =  0.8     clipped
    #   (r=1.25, A=+1): inside [0.8, 1.28] = -1.25 (symmetric 0.2 would clip it to -1.2)
    # loss = (-1.28 + 0.8 - 1.25) / 3 = -1.73/3; clip_fraction = 2/3
    args = (logs(1.3, 0.7, 1.25), torch.zeros(3, dtype=torch.float64), t(1, -1, 1))
    out = ppo_policy_loss(*args, clip_eps=0.2, clip_eps_high=0.28)
    assert_close(out["loss_policy"], torch.tensor(-1.73 / 3, dtype=torch.float64))
    assert_close(out["clip_fraction"], torch.tensor(2 / 3, dtype=torch.float64))
    sym = ppo_policy_loss(*args, clip_eps=0.2)  # (-1.2 + 0.8 - 1.2) / 3
    assert_close(sym["loss_policy"], torch.tensor(-1.6 / 3, dtype=torch.float64))


def test_ppo_policy_loss_masked_mean_ignores_padding():
    # [B=2, L=3] tokens; valid: (1.5,+1)->-1.2, (0.5,-1)->0.8, (1.1,+2)->-2.2 ; padding has
    # huge ratios/advantages that would dominate an unmasked mean.
    # loss = (-1.2 + 0.8 - 2.2)/3 = -2.6/3 ; clip_fraction = 2/3 ; ratio_mean = 3.1/3
    log_prob = torch.stack([logs(1.5, 0.5, 3.0), logs(1.1, 9.0, 9.0)])
    adv = torch.stack([t(1, -1, 100), t(2, 50, -50)])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = ppo_policy_loss(log_prob, torch.zeros_like(log_prob), adv, mask=mask)
    assert_close(out["loss_policy"], torch.tensor(-2.6 / 3, dtype=torch.float64))
    assert_close(out["clip_fraction"], torch.tensor(2 / 3, dtype=torch.float64))
    assert_close(out["ratio_mean"], torch.tensor(3.1 / 3, dtype=torch.float64))
    assert_close(out["approx_kl"], torch.tensor((k3(1.5) + k3(0.5) + k3(1.1)) / 3, dtype=torch.float64))


def test_masked_mean_ignores_nan_in_padding_and_empty_mask():
    assert_close(masked_mean(t(1, float("nan"), 3), t(1, 0, 1)), torch.tensor(2.0, dtype=torch.float64))
    assert_close(masked_mean(t(1, 2), t(0, 0)), torch.tensor(0.0, dtype=torch.float64))


def test_value_loss_clipped_term_wins():
    # values=[2,0], old=[1,0.5], returns=[3,1], clip 0.2
    #   e0: unclipped (2-3)^2 = 1; clipped v = 1 + 0.2 = 1.2 -> (1.2-3)^2 = 3.24 -> 3.24 (clipped wins)
    #   e1: unclipped (0-1)^2 = 1; clipped v = 0.5 - 0.2 = 0.3 -> (0.3-1)^2 = 0.49 -> 1
    # loss = 0.5 * (3.24 + 1)/2 = 1.06 ; unclipped: 0.5 * (1 + 1)/2 = 0.5
    out = value_loss(t(2, 0), t(3, 1), old_values=t(1, 0.5), clip_eps=0.2)
    assert_close(out["loss_value"], torch.tensor(1.06, dtype=torch.float64))
    assert_close(out["value_clip_fraction"], torch.tensor(0.5, dtype=torch.float64))
    assert_close(value_loss(t(2, 0), t(3, 1))["loss_value"], torch.tensor(0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="old_values"):
        value_loss(t(2, 0), t(3, 1), clip_eps=0.2)


def test_value_loss_masked():
    # only e0 valid: 0.5 * (2-3)^2 = 0.5
    out = value_loss(t(2, 0), t(3, 100), mask=t(1, 0))
    assert_close(out["loss_value"], torch.tensor(0.5, dtype=torch.float64))


def test_entropy_bonus():
    out = entropy_bonus(t(1, 2, 3), coef=0.01)
    assert_close(out["loss_entropy"], torch.tensor(-0.02, dtype=torch.float64))
    assert_close(out["entropy"], torch.tensor(2.0, dtype=torch.float64))
    masked = entropy_bonus(t(1, 2, 3), coef=0.01, mask=t(1, 1, 0))  # mean 1.5
    assert_close(masked["loss_entropy"], torch.tensor(-0.015, dtype=torch.float64))


def test_ppo_loss_combines_terms_and_total():
    # policy: (r=1.5,A=+1)->-1.2, (r=0.5,A=-1)->0.8 : mean -0.2
    # entropy [1,3] mean 2, ent_coef 0.1 -> -0.2
    # value: values [2,0], returns [3,1]: 0.5*MSE = 0.5*(1+1)/2 = 0.5, vf_coef 0.5 -> 0.25
    # total = -0.2 - 0.2 + 0.25 = -0.15
    lp, old, adv, ent = logs(1.5, 0.5), torch.zeros(2, dtype=torch.float64), t(1, -1), t(1, 3)
    out = ppo_loss(lp, old, adv, ent, values=t(2, 0), returns=t(3, 1), vf_coef=0.5, ent_coef=0.1)
    assert_close(out["loss_policy"], torch.tensor(-0.2, dtype=torch.float64))
    assert_close(out["loss_entropy"], torch.tensor(-0.2, dtype=torch.float64))
    assert_close(out["loss_value"], torch.tensor(0.25, dtype=torch.float64))
    assert_close(out["value_mse"], torch.tensor(0.5, dtype=torch.float64))
    assert_close(total_loss(out), torch.tensor(-0.15, dtype=torch.float64))
    # critic-free (GRPO): no value terms at all; total = -0.2 - 0.2
    free = ppo_loss(lp, old, adv, ent, ent_coef=0.1)
    assert "loss_value" not in free and "value_mse" not in free
    assert_close(total_loss(free), torch.tensor(-0.4, dtype=torch.float64))
    with pytest.raises(ValueError, match="returns"):
        ppo_loss(lp, old, adv, ent, values=t(2, 0))


def test_ppo_loss_value_clip_passes_through():
    # value part from test_value_loss_clipped_term_wins: 1.06 unweighted, vf_coef 2 -> 2.12
    lp, old = logs(1.0, 1.0), torch.zeros(2, dtype=torch.float64)
    out = ppo_loss(lp, old, t(0, 0), None, values=t(2, 0), old_values=t(1, 0.5), returns=t(3, 1),
                   value_clip=0.2, vf_coef=2.0)
    assert_close(out["loss_value"], torch.tensor(2.12, dtype=torch.float64))
    assert_close(out["value_mse"], torch.tensor(1.06, dtype=torch.float64))
    assert "loss_entropy" not in out


def test_total_loss_sums_only_loss_keys():
    terms = {"loss_a": torch.tensor(1.0), "loss_b": torch.tensor(2.0), "entropy": torch.tensor(100.0),
             "clip_fraction": torch.tensor(5.0)}
    assert_close(total_loss(terms), torch.tensor(3.0))
    with pytest.raises(ValueError, match="loss_"):
        total_loss({"entropy": torch.tensor(1.0)})


# ----------------------------------------------------------------------------- registry


def test_registry_builtin_algorithms():
    ppo, grpo = get_algorithm("ppo"), get_algorithm("grpo")
    assert (ppo.kind, ppo.advantage, ppo.loss, ppo.uses_critic, ppo.episodic_groups) == (
        "on_policy", "gae", "ppo", True, False)
    assert (grpo.kind, grpo.advantage, grpo.loss, grpo.uses_critic, grpo.episodic_groups) == (
        "on_policy", "grpo", "ppo", False, True)
    # one implementation per kind: embodied steps (on_policy) and language-model tokens
    assert get_advantage_estimator("gae", "on_policy") is gae_estimator
    assert get_advantage_estimator("grpo", "on_policy") is grpo_estimator
    assert get_policy_loss("ppo", "on_policy") is ppo_objective
    assert get_policy_loss("ppo", "token") is ppo_token_loss
    with pytest.raises(dataclasses.FrozenInstanceError):
        ppo.name = "x"  # type: ignore[misc]


def test_registry_unknown_names_list_known_ones_on_one_line():
    with pytest.raises(KeyError) as err:
        get_algorithm("ppx")
    msg = str(err.value)
    assert msg == f"unknown algorithm 'ppx'; known: {', '.join(sorted(ALGORITHMS))}"
    assert all(f" {name}," in msg or msg.endswith(f" {name}") for name in ("crossq", "dagger", "grpo", "iql", "ppo", "sac", "sft"))
    assert "\n" not in msg
    with pytest.raises(KeyError, match=r"^unknown advantage estimator 'gea'; known: .*gae, grpo"):
        get_advantage_estimator("gea")
    with pytest.raises(KeyError, match=r"^unknown policy loss 'pop'; known: .*ppo"):
        get_policy_loss("pop")


def test_register_algorithm_duplicate_and_validation():
    spec = AlgorithmSpec(name="test_algo", kind="on_policy", advantage="gae", loss="ppo",
                         uses_critic=True, episodic_groups=False, description="test")
    try:
        register_algorithm(spec)
        assert get_algorithm("test_algo") is spec
        with pytest.raises(ValueError, match="'test_algo' is already registered"):
            register_algorithm(spec)
    finally:
        ALGORITHMS.pop("test_algo", None)
    with pytest.raises(ValueError, match="kind must be one of on_policy, off_policy, imitation"):
        AlgorithmSpec(name="x", kind="online", advantage=None, loss="ppo", uses_critic=False,
                      episodic_groups=False, description="")
    bad_loss = dataclasses.replace(spec, name="test_bad", loss="nope")
    with pytest.raises(KeyError, match="unknown policy loss 'nope'"):
        register_algorithm(bad_loss)
    assert "test_bad" not in ALGORITHMS
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("gae", gae)
    assert ADVANTAGE_ESTIMATORS.get("gae", "on_policy") is gae_estimator and POLICY_LOSSES.get("ppo", "on_policy") is ppo_objective
