"""RECAP (π*0.6: RL with Experience and Corrections via Advantage-conditioned Policies) on the
policy SFT runner: ``algorithm.name: recap`` with ``runner: policy_sft``.

What it does, in the order a run does it:

1. **Returns.** Each row of the dataset (demonstrations, autonomous rollouts of any quality,
   corrections, all in one Minari dataset) gets its Monte-Carlo return ``G_t = sum_k gamma^k
   r_{t+k}`` to its episode's end. With MetaWorld's ``reward: success`` and episodes that end on
   success, ``G_t = gamma^(steps left)`` for a success and 0 for a failure: the paper's "how soon
   will this succeed", in a discounted form.
2. **Value.** A small MLP ``V(s)`` is regressed on those returns, once, when the trainer loads
   the dataset (``prepare_demonstrations``; same seed on every rank, so every rank holds the same
   labels). It is *cross-fitted by episode*: an episode's values come from a model that never saw
   that episode. Why: on a few hundred episodes an MLP memorises its training returns, so
   ``G_t - V(s_t)`` would be near zero (noise) on every training row and the indicator would say
   nothing; held-out values measure what the state alone predicts, which is what an advantage
   compares against.
3. **Advantages and the indicator.** ``A_t = R_t - V(s_t)`` with ``R_t`` the MC return
   (``algorithm.recap.n_step: 0``) or ``N`` rewards plus ``gamma^N V(s_{t+N})``. The threshold
   ``epsilon`` is the quantile that labels ``positive_fraction`` of the rows "good" (the paper
   sets its per-task threshold from the advantage distribution in the same way), ``I = [A > epsilon]``.
4. **Policy.** The ordinary imitation loss on *all* rows, with the indicator as an input
   (``recap_flow_mlp``): the loss ``recap`` hands it to ``policy.bc_loss(obs, actions,
   indicator=...)``; ``indicator_dropout`` of the rows train the "unknown" slot instead, which
   classifier-free guidance at acting time needs. The policy acts with indicator 1.

Why an input rather than a weight (AWR-style): weighting discards what the bad rows teach about
the states and motions, and a weighted flow still averages modes; conditioning keeps one model of
all the data and lets inference pick the good part of it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from rlweave.algorithms.contracts import POLICY_LOSSES, PolicySFTLossInput
from rlweave.algorithms.registry import AlgorithmSpec, register_algorithm
from rlweave.utils.tree import is_dict

__all__ = ["RecapOptions", "returns_to_go", "advantage_targets", "indicator_of", "value_features", "fit_values",
           "prepare_demonstrations", "recap_loss"]

UNKNOWN = 2  # the indicator slot of rows trained without it (rlweave.models.recap_policy.UNKNOWN)


@dataclass
class RecapOptions:
    """``algorithm.recap`` (see :class:`rlweave.config.schema.RecapConfig` for the meaning)."""

    positive_fraction: float = 0.3
    n_step: int = 0
    indicator_dropout: float = 0.0
    value_hidden: tuple[int, ...] = (256, 256)
    value_updates: int = 2000
    value_lr: float = 1e-3
    value_folds: int = 5

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> "RecapOptions":
        """The options of an ``algorithm`` section (its ``recap`` dict; defaults where absent)."""
        given = dict(cfg.get("recap") or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"algorithm.recap: unknown key(s) {unknown}; known: {sorted(known)}")
        if "value_hidden" in given:
            given["value_hidden"] = tuple(int(h) for h in given["value_hidden"])
        return cls(**given)


# ----------------------------------------------------------------------------- returns, advantages
def _episode_ends(episode: np.ndarray) -> np.ndarray:
    """Index one past each row's episode's last row (rows of an episode are contiguous)."""
    n = len(episode)
    change = np.flatnonzero(np.diff(episode) != 0) + 1
    bounds = np.concatenate([change, [n]])
    return np.repeat(bounds, np.diff(np.concatenate([[0], bounds])))


def returns_to_go(rewards: np.ndarray, episode: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return from each row to its episode's end, ``G_t = r_t + gamma G_{t+1}``
    (no bootstrap past the end: a time-limited failure is worth what it collected)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if t == len(rewards) - 1 or episode[t + 1] != episode[t]:
            running = 0.0
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def advantage_targets(rewards: np.ndarray, episode: np.ndarray, values: np.ndarray, gamma: float,
                      n_step: int = 0) -> np.ndarray:
    """``R_t`` the advantage compares ``V(s_t)`` with: the MC return (``n_step`` 0), or ``N``
    discounted rewards plus ``gamma^N V(s_{t+N})`` where ``t+N`` is inside the episode (the MC
    tail where it is not)."""
    mc = returns_to_go(rewards, episode, gamma)
    if n_step <= 0:
        return mc
    n = len(rewards)
    ends = _episode_ends(np.asarray(episode))
    idx = np.arange(n)
    boot = idx + n_step
    inside = boot < ends
    # N-step sum = G_t - gamma^N G_{t+N} inside the episode
    target = mc.copy()
    target[inside] = mc[inside] - gamma ** n_step * mc[boot[inside]] + gamma ** n_step * np.asarray(values, np.float64)[boot[inside]]
    return target


def indicator_of(advantages: np.ndarray, positive_fraction: float) -> tuple[np.ndarray, float]:
    """``(I [N] int64, epsilon)``: ``I = [A > epsilon]`` with ``epsilon`` the ``1 -
    positive_fraction`` quantile of the advantages (ties at the threshold count as not good)."""
    adv = np.asarray(advantages, dtype=np.float64)
    if positive_fraction >= 1.0:
        return np.ones(len(adv), dtype=np.int64), float("-inf")
    eps = float(np.quantile(adv, 1.0 - positive_fraction)) if len(adv) else 0.0
    return (adv > eps).astype(np.int64), eps


# ----------------------------------------------------------------------------- the value function
def value_features(obs: Any) -> np.ndarray:
    """The float features V(s) sees: a 1-D observation as it is, or a dict observation's
    ``state`` (camera images would need a vision encoder, which this value does not have)."""
    if is_dict(obs):
        if "state" not in obs:
            raise ValueError(f"recap: the value function needs a 1-D observation or a 'state' key, got keys {sorted(obs)}")
        obs = obs["state"]
    x = np.asarray(obs, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"recap: the value function needs 1-D observations, got rows of shape {x.shape[1:]}")
    return x


def _mlp(inp: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(inp, h), nn.SiLU()]
        inp = h
    return nn.Sequential(*layers, nn.Linear(inp, 1))


def _fit_predict(x_train: Tensor, y_train: Tensor, x_pred: Tensor, opts: RecapOptions, rng: np.random.Generator) -> Tensor:
    net = _mlp(x_train.shape[1], opts.value_hidden)
    optim = torch.optim.Adam(net.parameters(), lr=opts.value_lr)
    batch = min(256, len(x_train))
    for _ in range(opts.value_updates):
        idx = torch.from_numpy(rng.integers(0, len(x_train), size=batch))
        loss = (net(x_train[idx]).squeeze(-1) - y_train[idx]).square().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    with torch.no_grad():
        return net(x_pred).squeeze(-1)


def fit_values(features: np.ndarray, targets: np.ndarray, episode: np.ndarray, opts: RecapOptions, seed: int) -> np.ndarray:
    """V(s) [N] regressed on ``targets``, cross-fitted over ``value_folds`` folds of episodes
    (each row's value from a model that did not train on its episode; one model for all rows when
    there is one fold or one episode). Inputs and targets are standardised by the dataset's own
    statistics; predictions are clipped to the targets' range. Leaves the caller's torch RNG as
    it was."""
    x = features.astype(np.float32)
    x = (x - x.mean(0)) / np.maximum(x.std(0), 1e-4)
    y = np.asarray(targets, dtype=np.float64)
    y_mean, y_std = float(y.mean()), float(max(y.std(), 1e-6))
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(((y - y_mean) / y_std).astype(np.float32))
    rng = np.random.default_rng(seed)
    eps = np.unique(episode)
    folds = min(opts.value_folds, len(eps))
    pred = torch.zeros(len(x))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if folds <= 1:
            pred = _fit_predict(xt, yt, xt, opts, rng)
        else:
            fold_of = dict(zip(rng.permutation(eps).tolist(), np.arange(len(eps)) % folds))
            row_fold = np.array([fold_of[e] for e in episode.tolist()])
            for k in range(folds):
                held = torch.from_numpy(row_fold == k)
                pred[held] = _fit_predict(xt[~held], yt[~held], xt[held], opts, rng)
    # V is an expectation of returns: outside the returns' range is extrapolation, not information
    return np.clip(pred.double().numpy() * y_std + y_mean, y.min(), y.max())


def prepare_demonstrations(demos: Any, cfg: Mapping[str, Any], seed: int) -> dict:
    """Fits V(s) on the dataset's returns and adds the per-row advantage ``indicator`` column
    to ``demos`` (a :class:`rlweave.data.demos.Demonstrations`); returns what it found, for the
    run's log: the threshold, the share of good rows, the value's held-out error."""
    opts = RecapOptions.of(cfg)
    if demos.rewards is None:
        raise ValueError("recap: the dataset has no rewards; RECAP's returns need them")
    gamma = float(cfg.get("gamma", 0.99))
    episode = np.asarray(demos.episode)
    mc = returns_to_go(demos.rewards, episode, gamma)
    values = fit_values(value_features(demos.obs), mc, episode, opts, seed)
    targets = advantage_targets(demos.rewards, episode, values, gamma, opts.n_step)
    indicator, eps = indicator_of(targets - values, opts.positive_fraction)
    demos.columns["indicator"] = indicator
    explained = 1.0 - float(np.var(mc - values)) / max(float(np.var(mc)), 1e-12)
    return {"recap/threshold": eps, "recap/good_share": float(indicator.mean()),
            "recap/value_rmse": float(np.sqrt(np.mean((mc - values) ** 2))), "recap/value_explained_variance": explained}


# ----------------------------------------------------------------------------- the policy loss
def recap_loss(inp: PolicySFTLossInput) -> dict[str, Tensor]:
    """``recap`` (kind policy_sft): the policy's own imitation loss on every row, conditioned on the
    row's advantage indicator (``inp.extras["indicator"]``); ``algorithm.recap.indicator_dropout``
    of the rows get the unknown slot instead. ``good_share``: the batch's share of good rows."""
    indicator = inp.extras.get("indicator")
    if indicator is None:
        raise RuntimeError("recap: the rows carry no advantage indicator (the trainer did not run prepare_demonstrations)")
    bc = getattr(inp.policy, "bc_loss", None)
    if bc is None or "indicator" not in inspect.signature(bc).parameters:
        raise TypeError(f"policy {type(inp.policy).__name__} takes no advantage indicator in bc_loss: "
                        "RECAP needs a conditioned policy (policy.name: recap_flow_mlp)")
    indicator = indicator.long()
    p = RecapOptions.of(inp.cfg).indicator_dropout
    shown = indicator
    if p > 0:
        drop = torch.rand(indicator.shape, device=indicator.device) < p
        shown = torch.where(drop, torch.full_like(indicator, UNKNOWN), indicator)
    terms = dict(bc(inp.obs, inp.actions, indicator=shown))
    terms["good_share"] = indicator.float().mean().detach()
    return terms


recap_loss.prepare_demonstrations = prepare_demonstrations  # the trainer calls it once the dataset is loaded

POLICY_LOSSES.register("recap", recap_loss, "policy_sft")
register_algorithm(
    AlgorithmSpec(name="recap", kind="sft", advantage=None, loss="recap", uses_critic=False, episodic_groups=False,
                  description="RECAP: imitation of all the data conditioned on an advantage indicator from a value "
                              "function fitted on the dataset's returns; acts as 'good' (runner policy_sft)",
                  needs_dataset=True, runners=("policy_sft",))
)
