"""Scripted controllers: experts that need no training (for imitation learning and tests).

A controller is a plain function ``controller(obs [n, obs_dim]) -> actions [n, act_dim]``; name one
in a config as ``module:function`` (``imitation.expert=rlweave.envs.controllers:pendulum_swing_up``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["pendulum_swing_up"]


def pendulum_swing_up(obs: np.ndarray) -> np.ndarray:
    """Energy-pumping swing-up with a PD catch at the top, for gymnasium's Pendulum-v1.

    Pendulum-v1 integrates ``thdd = a sin(th) + b u`` with a = 3g/(2l) = 15, b = 3/(ml^2) = 3
    (th = 0 upright). ``E = thd^2/2 + a cos(th)`` then changes as ``dE/dt = b u thd``, so
    ``u = k thd (a - E)`` pumps E towards the upright rest energy ``a``; near the top a PD law
    ``u = -(10 th + 2 thd)`` (stable for the linearised ``thdd = 15 th + 3 u``) holds it there.
    Torques are clipped to the env's [-2, 2]."""
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, 3)
    cos, sin, thd = obs[:, 0], obs[:, 1], obs[:, 2]
    th = np.arctan2(sin, cos)
    energy = 0.5 * thd**2 + 15.0 * cos
    pump = 0.5 * thd * (15.0 - energy)
    catch = -(10.0 * th + 2.0 * thd)
    u = np.where((cos > 0.85) & (np.abs(thd) < 6.0), catch, pump)
    return np.clip(u, -2.0, 2.0).astype(np.float32)[:, None]
