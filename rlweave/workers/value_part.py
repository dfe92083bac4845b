"""The value loss of an on-policy minibatch in a helper process (``actor.update_threads=2``).

A PPO minibatch step is bound by per-operation overhead on small networks (HalfCheetah's 64x64
MLPs: ~0.9 ms a step, hundreds of small operations), and while the actor trains, the env
workers' cores are idle. The policy loss and the value loss read disjoint parameters when the
critic is a network of its own (:attr:`~rlweave.models.policies.Policy.split_critic`), and their
gradients land on disjoint entries of the flat gradient buffer. So the value loss (the critic's
forward and backward passes) runs in the helper process of :mod:`rlweave.workers.update_helper`,
bound to the learner's parameters and gradients in shared memory, while this process runs the
policy loss; the optimizer steps after both are done, on the whole gradient, as before.

The numbers are the one-process update's, bit for bit: both parts read the same prepared
(normalised) observations, the critic's values come from the same operations, the loss's value
terms are the ones it declares (``value_part``, :func:`~rlweave.algorithms.losses.value_part_of`),
and the logged terms come back in the same order (tested).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlweave.algorithms import LearnerNets, OnPolicyLossInput, total_loss
from rlweave.algorithms.losses import value_part_of
from rlweave.models.flat import FlatParameters
from rlweave.workers.update_helper import ActorPartProcess, available, run_part

__all__ = ["ValuePart"]


def _value_terms(batch: dict[str, Tensor], nets: LearnerNets, options: tuple[Callable, dict]) -> dict[str, Tensor]:
    """The helper's part: the critic's values on the prepared observations, and the loss's value
    terms (``loss_value`` and its diagnostics)."""
    value_terms, cfg = options
    values = nets.actor.value_prepared(batch["x"])
    return value_terms(values, batch["old_value"], batch["returns"], cfg)


class ValuePart:
    """Runs an on-policy minibatch's loss as two concurrent parts (see the module docstring).

    ``policy``: a policy with :attr:`split_critic`; ``flat``: the flat buffers behind all its
    parameters (moved into shared memory when the helper starts); ``loss_fn``: the registered
    on-policy loss, which must declare its value terms; ``cfg``: the ``algorithm`` section.
    """

    def __init__(self, policy: torch.nn.Module, flat: FlatParameters, loss_fn: Callable, cfg: dict):
        if not getattr(policy, "split_critic", False):
            raise ValueError(f"actor.update_threads: the value loss runs apart from the policy loss only for a policy "
                             f"with a critic of its own; {type(policy).__name__} has none")
        value_terms = value_part_of(loss_fn)
        if value_terms is None:
            raise ValueError("actor.update_threads: the algorithm's loss declares no value terms to compute apart")
        self.policy, self.flat, self.loss_fn, self.cfg = policy, flat, loss_fn, cfg
        self.options = (value_terms, cfg)
        self.nets = LearnerNets(actor=policy)
        self._helper: ActorPartProcess | None = None
        self._shapes: dict[str, tuple] | None = None

    def accumulate(self, mbatch: dict[str, Tensor], clip: float) -> tuple[Tensor, dict[str, Tensor]]:
        """Gradients of one minibatch's loss (policy terms here, value terms in the helper).
        Returns the stacked loss terms and their dict, as the one-process update does."""
        policy, cfg = self.policy, self.cfg
        with torch.no_grad():
            x = policy.prepare(mbatch["obs"])
        part = {"x": x, "returns": mbatch["returns"], "old_value": mbatch["value"]}
        helper = self._helper_for(part)
        if helper is not None:
            helper.submit(part)
        log_prob, entropy = policy.evaluate_prepared(x, mbatch["action"])
        if not cfg["ent_coef"]:  # no bonus: keep the entropy out of the graph, log it only
            entropy_mean, entropy = entropy.detach().mean(), None
        terms = self.loss_fn(OnPolicyLossInput(
            log_prob=log_prob, old_log_prob=mbatch["log_prob"], advantages=mbatch["adv"], entropy=entropy,
            values=None, old_values=None, returns=None, obs=mbatch["obs"], action=mbatch["action"],
            clip_eps=clip, cfg=cfg,
        ))
        total_loss(terms).backward()
        # the helper's gradients are written once its terms are back: the optimizer may step after this
        terms.update(helper.result() if helper is not None else
                     run_part(_value_terms, part, self.nets, self.options, None, x.device.type))
        if entropy is None:
            terms["entropy"] = entropy_mean
        return torch.stack([v.detach() for v in terms.values()]), terms

    def _helper_for(self, part: dict[str, Tensor]) -> ActorPartProcess | None:
        """The helper process, started at the first minibatch (its shared slot takes that
        minibatch's shapes). None where it cannot run the part, so it runs here after the policy
        part: off CPU, without memfd (macOS), or for a minibatch of other shapes (an iteration
        with fewer rows than one minibatch)."""
        if part["x"].device.type != "cpu" or not available():
            return None
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in part.items()}
        if self._helper is None:
            self._helper = ActorPartProcess(self.nets, [self.flat], _value_terms, self.options, None,
                                            {k: v.detach().clone() for k, v in part.items()}, name="actor (value loss)")
            self._shapes = shapes
        return self._helper if shapes == self._shapes else None

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None
