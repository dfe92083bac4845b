"""Flow-matching math shared by every flow policy: the training loss, K-step samplers, and the
exact log-density of a sampled denoising chain (what PPO-style fine-tuning of a flow policy needs).

Everything here works on a *velocity callable* ``velocity(x_t [B, H, A], t [B]) -> v [B, H, A]``.
The conditioning (a state MLP's features, or a VLA action expert's cached image+text prefix) is
captured in the closure, so the same functions serve a small state-based policy and a large VLA.
A velocity may instead return a pair ``(v, std)``: a flow-noise standard deviation from a noise
head on the same trunk (πRL's flow-noise), computed in the same forward pass.

Convention (rectified flow): **x_0 is noise, x_1 is data**, ``x_t = (1 - t) x_0 + t x_1``, and the
target velocity is ``x_1 - x_0``; sampling integrates t from 0 to 1 with K Euler steps on the grid
``t_k = k / K``. The π0 / openpi code uses the mirror image (t = 1 noise, t = 0 data, velocity
``noise - data``); a π0 velocity ``v_pi(x, tau)`` is used here as ``v(x, t) = -v_pi(x, 1 - t)``.

Samplers (``sampler=``):

* ``"ode"``: deterministic Euler, ``x_{k+1} = x_k + v dt``. The chain is a function of x_0, so its
  log-density given x_0 is degenerate; :func:`sample_chain` reports 0 (the chain has probability one
  given x_0) and :func:`chain_log_prob` refuses it (no ratio to take).
* ``"flow_noise"`` (πRL flow-noise): the Euler mean plus Gaussian noise of a given, possibly
  learned, per-step std: ``x_{k+1} ~ N(x_k + v dt, std_k^2)``. The marginals are no longer those of
  the ODE; the std is part of the policy (a parameter or a noise head) and is trained with it.
* ``"flow_sde"`` (πRL flow-SDE): the ODE turned into an SDE with the same marginals,
  ``dx = [v - sigma_t^2 / (2 (1 - t)) (x - t v)] dt + sigma_t dW``. The correction is
  ``sigma^2 / 2`` times the score, which for this path is ``-(x - t v) / (1 - t)`` (``x - t v`` is
  the model's estimate of the noise x_0). Euler-Maruyama: ``x_{k+1} ~ N(x_k + drift dt,
  sigma_k^2 dt)``. Here ``noise_std`` is the diffusion coefficient sigma, not the step's std.
  The default schedule (:func:`flow_sde_sigmas`) is πRL's ``a sqrt((1 - t) / t)`` in this
  convention, with t floored at 1/K so the first step stays finite.

``noise_std`` is a float (constant), a Tensor whose first axis has one entry per step (each entry
broadcastable to [B, H, A], e.g. shape [K] or [K, H, A]), or a callable ``(x_t, t) -> std``
(state-dependent). Every transition is Gaussian, so the chain's log-density given x_0 is the sum of
K Gaussian log-densities over H * A dimensions; it does not include log N(x_0; 0, I).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

import torch
from torch import Tensor

__all__ = [
    "SAMPLERS",
    "FlowSample",
    "ChainStats",
    "flow_matching_loss",
    "flow_sde_sigmas",
    "sample_chain",
    "chain_stats",
    "chain_log_prob",
    "chain_entropy",
]

SAMPLERS = ("ode", "flow_noise", "flow_sde")
TIME_SAMPLING = ("uniform", "beta")
DEFAULT_SDE_NOISE_LEVEL = 0.5

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_HALF_LOG_2PIE = 0.5 * math.log(2.0 * math.pi * math.e)

Velocity = Callable[[Tensor, Tensor], Union[Tensor, "tuple[Tensor, Tensor]"]]
NoiseStd = Union[float, Tensor, Callable[[Tensor, Tensor], Tensor], None]


@dataclass
class FlowSample:
    """A sampled chain. ``chain[:, 0]`` is x_0 and ``chain[:, -1]`` equals ``actions``."""

    actions: Tensor  # [B, H, A]
    chain: Tensor  # [B, K + 1, H, A]
    log_prob: Tensor  # [B]: log p(x_1..x_K | x_0); zeros for "ode"
    step_log_prob: Tensor  # [B, K]: one Gaussian transition each; zeros for "ode"


@dataclass
class ChainStats:
    """Log-density of a stored chain under the current velocity, and the transitions' entropy."""

    log_prob: Tensor  # [B]
    step_log_prob: Tensor  # [B, K]
    entropy: Tensor  # [B]: sum over steps of the Gaussian transitions' entropies (see chain_entropy)


# ---- training ---------------------------------------------------------------------------------
def _sample_times(n: int, time_sampling: str, generator: torch.Generator | None, like: Tensor) -> Tensor:
    u = torch.rand(n, generator=generator, device=like.device if generator is None else generator.device).to(like)
    if time_sampling == "uniform":
        return u
    if time_sampling == "beta":
        # π0's schedule, mirrored into this convention: tau ~ Beta(1.5, 1) (CDF tau^1.5, so
        # inverse-CDF sampling keeps the generator) puts more weight on the noisy end; t = 1 - tau
        # scaled into [0, 0.999] never asks for the velocity exactly at the data end.
        tau = u.pow(2.0 / 3.0)
        return 0.999 * (1.0 - tau)
    raise ValueError(f"time_sampling must be one of {TIME_SAMPLING}, got {time_sampling!r}")


def _velocity_only(out) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def flow_matching_loss(velocity: Velocity, actions: Tensor, generator: torch.Generator | None = None,
                       time_sampling: str = "uniform", noise: Tensor | None = None,
                       reduction: str = "mean") -> Tensor:
    """Conditional flow-matching (rectified-flow) loss on data ``actions`` [B, H, A].

    Draws x_0 ~ N(0, I) (or takes ``noise``) and t per row, and regresses ``velocity(x_t, t)`` onto
    ``x_1 - x_0``. ``time_sampling``: ``"uniform"`` or ``"beta"`` (π0's emphasis on noisy times).
    ``reduction``: ``"mean"`` (scalar) or ``"none"`` (per-row mean squared error [B], for
    weighted imitation such as advantage-conditioned BC)."""
    B = actions.shape[0]
    if noise is None:
        noise = torch.randn(actions.shape, generator=generator,
                            device=actions.device if generator is None else generator.device).to(actions)
    t = _sample_times(B, time_sampling, generator, actions)
    tb = t.view(B, *([1] * (actions.dim() - 1)))
    x_t = (1.0 - tb) * noise + tb * actions
    err = (_velocity_only(velocity(x_t, t)) - (actions - noise)).square()
    if reduction == "mean":
        return err.mean()
    if reduction == "none":
        return err.reshape(B, -1).mean(-1)
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


# ---- noise schedules and one transition -------------------------------------------------------
def flow_sde_sigmas(steps: int, noise_level: float = DEFAULT_SDE_NOISE_LEVEL, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> Tensor:
    """πRL's flow-SDE diffusion coefficients [K] at t_k = k/K: ``a sqrt((1 - t) / max(t, 1/K))``.

    Large near the noise end (t = 0), where extra noise costs little, and small near the data end,
    so exploration does not blur the final action."""
    t = torch.arange(steps, dtype=torch.float64) / steps
    sig = noise_level * torch.sqrt((1.0 - t) / t.clamp(min=1.0 / steps))
    return sig.to(dtype=dtype, device=device)


def _resolve_noise_std(sampler: str, steps: int, noise_std: NoiseStd, like: Tensor) -> NoiseStd:
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if sampler == "flow_sde" and noise_std is None:
        return flow_sde_sigmas(steps, DEFAULT_SDE_NOISE_LEVEL, like.dtype, like.device)
    if isinstance(noise_std, Tensor):
        if noise_std.dim() == 0:
            return noise_std.to(like)
        if noise_std.shape[0] != steps:
            raise ValueError(f"noise_std tensor needs one entry per step on its first axis ({steps}), "
                             f"got shape {tuple(noise_std.shape)}")
        return noise_std.to(like)
    return noise_std


def _std_at(noise_std: NoiseStd, k: int, x: Tensor, t: Tensor, head_std: Tensor | None) -> Tensor | float:
    """The noise std (flow_noise) or diffusion coefficient (flow_sde) of step ``k`` at (x, t)."""
    if head_std is not None:
        return head_std
    if noise_std is None:
        raise ValueError("flow_noise needs noise_std (or a velocity returning (v, std))")
    if callable(noise_std) and not isinstance(noise_std, Tensor):
        return noise_std(x, t)
    if isinstance(noise_std, Tensor) and noise_std.dim() > 0:
        return noise_std[k]
    return noise_std


def _transition(sampler: str, x: Tensor, t: Tensor, v: Tensor, dt: float, std) -> tuple[Tensor, Tensor | None]:
    """Mean and std of x_{k+1} given x_k = x (std None for the ODE)."""
    if sampler == "ode":
        return x + v * dt, None
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device)
    if sampler == "flow_noise":
        return x + v * dt, std.expand_as(x)
    tb = t.view(-1, *([1] * (x.dim() - 1)))
    # score of p_t: -(x - t v) / (1 - t); 1 - t >= 1/K on the Euler grid
    drift = v - std.square() / (2.0 * (1.0 - tb)) * (x - tb * v)
    return x + drift * dt, (std * math.sqrt(dt)).expand_as(x)


def _gauss_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-row log N(x; mean, diag std^2), summed over every axis but the first."""
    z = (x - mean) / std
    return (-0.5 * z.square() - std.log()).flatten(1).sum(-1) - z[0].numel() * _HALF_LOG_2PI


# ---- sampling ---------------------------------------------------------------------------------
def sample_chain(velocity: Velocity, x0: Tensor, steps: int, sampler: str = "ode", noise_std: NoiseStd = None,
                 generator: torch.Generator | None = None, step_noise: Tensor | None = None) -> FlowSample:
    """K Euler (or Euler-Maruyama) steps from x_0 [B, H, A], keeping every intermediate state.

    ``step_noise`` [B, K, H, A]: the standard normal draws of the stochastic samplers (default:
    drawn from ``generator``), so a caller can make a sample depend on its own seed only. The
    log-probs are computed from the stored states exactly as :func:`chain_log_prob` recomputes
    them, so the two agree to rounding."""
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    noise_std = _resolve_noise_std(sampler, steps, noise_std, x0)
    B = x0.shape[0]
    dt = 1.0 / steps
    x = x0
    states = [x0]
    step_lp: list[Tensor] = []
    for k in range(steps):
        t = torch.full((B,), k * dt, dtype=x0.dtype, device=x0.device)
        out = velocity(x, t)
        v, head_std = (out if isinstance(out, tuple) else (out, None))
        std = None if sampler == "ode" else _std_at(noise_std, k, x, t, head_std)
        mean, sd = _transition(sampler, x, t, v, dt, std)
        if sd is None:
            x = mean
        else:
            eps = (step_noise[:, k].to(x) if step_noise is not None
                   else torch.randn(x.shape, generator=generator,
                                    device=x.device if generator is None else generator.device).to(x))
            x = mean + sd * eps
            step_lp.append(_gauss_log_prob(x, mean, sd))
        states.append(x)
    chain = torch.stack(states, dim=1)
    step_log_prob = torch.stack(step_lp, dim=1) if step_lp else x0.new_zeros(B, steps)
    return FlowSample(actions=x, chain=chain, log_prob=step_log_prob.sum(-1), step_log_prob=step_log_prob)


# ---- log-densities of stored chains -----------------------------------------------------------
def chain_stats(velocity: Velocity, chain: Tensor, sampler: str, noise_std: NoiseStd = None,
                fold_steps: bool = False) -> ChainStats:
    """Log-density (total and per step) and transition entropy of a stored ``chain``
    [B, K + 1, H, A] under the *current* velocity, with gradients (PPO's new log-probs).

    ``fold_steps=True`` evaluates all K steps in one velocity call on [K * B, H, A] (step-major:
    row ``k * B + b`` is step k of chain b), so the velocity must accept a multiple of the batch and
    repeat its conditioning (``cond.repeat(K, 1)``); cheaper than K calls when the network is small
    and the batch is what limits the device."""
    if sampler == "ode":
        raise ValueError("the ode sampler's chain is deterministic given x_0: it has no log-density to "
                         "evaluate; sample with 'flow_noise' or 'flow_sde'")
    B, K1 = chain.shape[:2]
    steps = K1 - 1
    if steps < 1:
        raise ValueError(f"a chain needs at least two states, got shape {tuple(chain.shape)}")
    noise_std = _resolve_noise_std(sampler, steps, noise_std, chain)
    dt = 1.0 / steps
    grid = torch.arange(steps, dtype=chain.dtype, device=chain.device) * dt
    xs = chain[:, :-1]
    if fold_steps:
        x_all = xs.transpose(0, 1).reshape(steps * B, *chain.shape[2:])
        t_all = grid.repeat_interleave(B)
        out = velocity(x_all, t_all)
        v_all, head_all = (out if isinstance(out, tuple) else (out, None))
        v_steps = v_all.view(steps, B, *chain.shape[2:])
        head_steps = None if head_all is None else head_all.reshape(steps, B, *head_all.shape[1:])
        if callable(noise_std) and not isinstance(noise_std, Tensor) and head_all is None:
            std_all = noise_std(x_all, t_all)
            std_all = torch.as_tensor(std_all, dtype=chain.dtype, device=chain.device)
            head_steps = std_all.expand_as(x_all).reshape(steps, B, *chain.shape[2:])
    step_lp, ent = [], []
    for k in range(steps):
        x = xs[:, k]
        t = grid[k].expand(B)
        if fold_steps:
            v, head_std = v_steps[k], (None if head_steps is None else head_steps[k])
        else:
            out = velocity(x, t)
            v, head_std = (out if isinstance(out, tuple) else (out, None))
        mean, sd = _transition(sampler, x, t, v, dt, _std_at(noise_std, k, x, t, head_std))
        step_lp.append(_gauss_log_prob(chain[:, k + 1], mean, sd))
        ent.append(sd.log().flatten(1).sum(-1) + sd[0].numel() * _HALF_LOG_2PIE)
    step_log_prob = torch.stack(step_lp, dim=1)
    return ChainStats(log_prob=step_log_prob.sum(-1), step_log_prob=step_log_prob,
                      entropy=torch.stack(ent, dim=1).sum(-1))


def chain_log_prob(velocity: Velocity, chain: Tensor, sampler: str, noise_std: NoiseStd = None,
                   per_step: bool = False, fold_steps: bool = False) -> Tensor:
    """log p(x_1..x_K | x_0) of a stored chain [B, K + 1, H, A]: [B], or [B, K] with
    ``per_step`` (for losses that treat each denoising step as an action, as πRL can)."""
    stats = chain_stats(velocity, chain, sampler, noise_std, fold_steps)
    return stats.step_log_prob if per_step else stats.log_prob


def chain_entropy(velocity: Velocity, chain: Tensor, sampler: str, noise_std: NoiseStd = None,
                  fold_steps: bool = False) -> Tensor:
    """Entropy proxy [B]: the summed entropies of the Gaussian transitions at the chain's states,
    ``sum_k sum_d (log std_kd + 0.5 log(2 pi e))``.

    By the chain rule of entropy, its expectation over chains is the exact entropy of the denoising
    chain given x_0 (the density :func:`chain_log_prob` measures); it is not the entropy of the
    final action's marginal, which has no closed form. It depends on the parameters only through a
    learned std (flow-noise); for a fixed flow-SDE schedule it is a constant."""
    return chain_stats(velocity, chain, sampler, noise_std, fold_steps).entropy
