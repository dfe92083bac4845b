"""A user-written on-policy algorithm for rlweave: an advantage estimator, a loss, a policy, and
the algorithm that ties them together, all registered by name.

rlweave imports this module wherever it looks names up (the driver and every worker process)
because the run's config names it in ``algorithm.plugins``. Train with it from the repository
root::

    rlweave train ppo-cartpole algorithm.plugins=[examples.my_algorithm] algorithm.name=a2c_td policy.name=shared_mlp

or ``python examples/my_algorithm.py [key=value ...]``, which runs that command. See
docs/write-your-own-algorithm.md.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor

from rlweave.algorithms import (Advantages, AlgorithmSpec, OnPolicyAdvantageInput, OnPolicyLossInput, register_advantage_estimator,
                                register_algorithm, register_policy_loss)
from rlweave.models import SpaceMismatchError, register_policy
from rlweave.models.policies import MLPPolicy, Policy

# how often each piece ran in this process (with cluster.local=true the workers live in the
# driver's process, so a test can read it; in Ray worker processes it counts there)
CALLS: Counter[str] = Counter()


@register_advantage_estimator("td", kind="on_policy")
def td_advantages(inp: OnPolicyAdvantageInput) -> Advantages:
    """One-step TD errors as advantages: ``A_t = r_t + gamma * V(s_{t+1}) * (1 - done_t) - V(s_t)``
    (GAE with lambda = 0: low variance, biased by the critic). Returns ``A + V`` as the critic's
    targets; the trainer whitens each minibatch's advantages (``algorithm.norm_adv``)."""
    CALLS["estimator"] += 1
    if inp.next_value is None:
        raise ValueError("the 'td' estimator needs a critic")
    gamma = inp.cfg["gamma"]
    next_values = torch.cat([inp.values[1:], inp.next_value[None]])
    adv = inp.rewards + gamma * next_values * (1.0 - inp.dones) - inp.values
    return Advantages(adv, returns=adv + inp.values, info={"train/td_error_abs": float(adv.abs().mean())})


@register_policy_loss("a2c", kind="on_policy")
def a2c_loss(inp: OnPolicyLossInput) -> dict[str, Tensor]:
    """Advantage actor-critic: ``-A * log pi(a|s)``, the critic's squared error (times
    ``algorithm.vf_coef``) and an entropy bonus (``algorithm.ent_coef``). No trust region, so
    keep ``algorithm.epochs`` small. Keys ``loss_*`` are summed and minimised; the rest is logged."""
    CALLS["loss"] += 1
    c = inp.cfg
    out = {"loss_policy": -(inp.advantages * inp.log_prob).mean()}
    if inp.values is not None and inp.returns is not None:
        out["loss_value"] = c["vf_coef"] * 0.5 * (inp.values - inp.returns).square().mean()
    if inp.entropy is not None:
        out["loss_entropy"] = -c["ent_coef"] * inp.entropy.mean()
    with torch.no_grad():
        out["approx_kl"] = (inp.old_log_prob - inp.log_prob).mean()
    return out


@register_policy("shared_mlp")
def shared_mlp(observation_space, action_space, hidden=(64, 64), activation="tanh", chunk=1, critic=True,
               normalize_obs=False, log_std_init=0.0, ortho_init=True, **_ignored) -> Policy:
    """An MLP whose actor and critic heads share one trunk. A builder gets the env's spaces, and
    ``chunk``, ``critic`` and every ``policy.*`` setting as keywords (``**_ignored`` takes the rest)."""
    CALLS["policy"] += 1
    if len(observation_space.shape) != 1:  # rlweave reports it as "policy 'shared_mlp' needs ..."
        raise SpaceMismatchError(f"needs a 1-D Box observation space, got {observation_space}")
    return MLPPolicy(int(observation_space.shape[0]), action_space, hidden=hidden, activation=activation, chunk=chunk,
                     critic=critic, normalize_obs=normalize_obs, log_std_init=log_std_init, ortho_init=ortho_init,
                     shared_backbone=True)


register_algorithm(AlgorithmSpec(
    name="a2c_td", kind="on_policy", advantage="td", loss="a2c", uses_critic=True, episodic_groups=False,
    description="A2C with one-step TD advantages (the example of docs/write-your-own-algorithm.md)",
))


if __name__ == "__main__":
    # run through the command line in a fresh process, which imports this file by its module name
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "rlweave.cli", "train", "ppo-cartpole", "algorithm.plugins=[examples.my_algorithm]",
           "algorithm.name=a2c_td", "policy.name=shared_mlp", "algorithm.epochs=4", *sys.argv[1:]]
    sys.exit(subprocess.call(cmd, cwd=root))
