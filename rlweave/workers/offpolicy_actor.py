"""Off-policy actor worker: the learner of SAC, CrossQ, RLPD, the imitation algorithms (BC,
DAgger, HG-DAgger) and the offline ones (IQL, offline BC) of the registry: everything that learns
from replay.

It holds the actor (the policy the rollout workers run), a critic ensemble, an optional Polyak
target copy, an optional state-value network (IQL), and the entropy temperature; its replay shard is a :class:`~rlweave.cluster.Peer`
(usually a function call into a :class:`~rlweave.workers.replay.ReplayBufferWorker` living in the
same process). What differs between algorithms is the registry entry (the loss, target network or
not) and the config (critic width, normalisation, policy delay, n-step), not a subclass.

Speed choices, each measured against SB3's SAC on these CPUs (``rlweave bench sac-vs-sb3``):
the critics of the ensemble run as one batched matmul per layer; the actor, critic and temperature
losses share one backward pass (their gradients touch disjoint parameters), or, with
``actor.update_threads=2``, the critic's and the actor's parts of the loss
(:class:`~rlweave.algorithms.ActorCriticLoss`) run forward and backward on two threads at once;
each fused Adam steps flat parameter buffers (one tensor per param group); the target update is
one multi-tensor lerp; the batches of a whole ``train`` call are sampled at once; diagnostics are
reduced once per call, not per update.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import math
import random
import time
from functools import partial

import numpy as np
import torch

from rlweave.algorithms import LearnerNets, LossOptions, algorithm_loss, has_concurrent_parts, load_algorithm, soft_update
from rlweave.cluster import Peer, Worker
from rlweave.models import QEnsemble, build_policy
from rlweave.models.flat import FlatParameters
from rlweave.utils.memory import peak_rss_mb
from rlweave.utils.precision import resolve_precision
from rlweave.workers.update_helper import ActorPartProcess, run_part
from rlweave.workers.update_helper import available as update_helper_available
from rlweave.sync.weights import WeightPacket, pack_state, share_packet
from rlweave.cluster.dispatch import group_method

_BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount")


class _ActorPartThread:
    """The actor's part of concurrent updates on a thread of the learner's process
    (``actor.update_helper=thread``); same interface as :class:`ActorPartProcess`."""

    def __init__(self, run):
        self.run = run  # batch -> detached terms, after the part's backward pass
        # denormals are flushed per thread (see cluster.hosts)
        self.pool = cf.ThreadPoolExecutor(1, thread_name_prefix="learner-actor-part", initializer=torch.set_flush_denormal, initargs=(True,))
        self.future: cf.Future | None = None

    def submit(self, batch: dict) -> None:
        self.future = self.pool.submit(self.run, batch)

    def result(self) -> dict:
        return self.future.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class OffPolicyActorWorker(Worker):
    """The learner of every replay-based algorithm (off-policy, imitation, offline): holds the
    actor, critics, target and temperature, samples its replay shard and runs the registered loss,
    and exports the weights the rollout workers act with. One class for all of them, because the
    algorithms differ in their registry entry and config, not in the learner."""
    def __init__(
        self,
        algo_cfg: dict,
        policy_cfg: dict,
        critic_cfg: dict,
        observation_space,
        action_space,
        chunk: int,
        seed: int,
        total_updates: int = 0,
        precision: str = "float32",
        update_threads: int = 1,
        update_helper: str = "process",
    ):
        self.cfg = algo_cfg
        # actor.precision=bfloat16: the losses run under autocast, so the hidden layers' matmuls
        # (nearly all of an update's time) take bf16 operands with float32 accumulation; the
        # models keep their output layers, and the optimiser its state, in float32
        # (auto: bf16 only where this process's device multiplies bf16 natively, utils.precision)
        self.precision = resolve_precision(precision, self.device)
        self.autocast_dtype = self.precision.dtype
        # actor.update_threads=2: the critic's and the actor's parts of an update (ActorCriticLoss,
        # concurrent) run at the same time: they read the same weights and write disjoint
        # gradients, and each is single-threaded matmuls too small for intra-op threads to pay
        # (measured: 2 intra-op threads slowed SAC's learner down). The actor's part runs in a
        # helper process sharing the parameters' memory (actor.update_helper=process; no GIL
        # between the parts, see workers.update_helper) or on a thread of this process; GPU
        # learners, and systems without memfd (macOS), use the thread
        self._helper: ActorPartProcess | _ActorPartThread | None = None
        self.update_helper = update_helper if self.device.type == "cpu" and update_helper_available() else "thread"
        self.total_updates = int(total_updates)  # the horizon of algorithm.actor_lr_schedule
        self.spec = load_algorithm(algo_cfg)  # imports algorithm.plugins first: user registrations reach this process
        self.loss_fn = algorithm_loss(self.spec, "offpolicy")  # kind learner
        self.concurrent_parts = int(update_threads) > 1 and has_concurrent_parts(self.loss_fn)
        torch.manual_seed(seed)
        self.policy = build_policy(observation_space=observation_space, action_space=action_space, chunk=chunk, **policy_cfg)
        obs_dim = int(np.prod(observation_space.shape))
        layers = dict(hidden=tuple(critic_cfg["hidden"]), activation=critic_cfg["activation"],
                      norm=None if critic_cfg["norm"] == "none" else critic_cfg["norm"], bn_momentum=critic_cfg["bn_momentum"])
        self.critic = (QEnsemble(obs_dim, self.policy.head_dim, num_q=critic_cfg["num_q"], **layers)
                       if self.spec.uses_critic else None)  # imitation learns the actor alone
        self.target = copy.deepcopy(self.critic).requires_grad_(False) if self.spec.target_network else None
        self.value = QEnsemble(obs_dim, 0, num_q=1, **layers) if self.spec.value_network else None
        self.log_alpha = torch.nn.Parameter(torch.tensor(math.log(algo_cfg["alpha_init"]), dtype=torch.float32, device=self.device))
        for m in (self.policy, self.critic, self.target, self.value):
            if m is not None:
                m.to(self.device)
        lr = algo_cfg["lr"]
        # Two Adams, as in SB3 and CleanRL: the critics' (and IQL's value network's), stepped on
        # every update, and the actor's with the temperature, stepped on actor updates only
        # (algorithm.policy_delay), so a delayed actor's moments do not move in between. Within
        # each, one param group per distinct learning rate (a scheduled actor rate keeps its own),
        # and each group's parameters live in one flat buffer (FlatParameters): a step is one
        # kernel on one tensor per group and zeroing the gradients one fill, instead of grouping a
        # dozen tensors on every update (step and zeroing 0.50 -> 0.40 ms of a ~5 ms SAC update,
        # profiled here). The target network was copied above, before its critic's parameters
        # moved into the buffers.
        cosine = algo_cfg["actor_lr_schedule"] == "cosine"
        critic_params = [p for m in (self.critic, self.value) if m is not None for p in m.parameters()]
        parts: dict[str, dict[tuple[float, bool], list]] = {"critic": {}, "actor": {}}
        for part, params, key in (("actor", list(self.policy.parameters()), "actor_lr"), ("critic", critic_params, "critic_lr"),
                                  ("actor", [self.log_alpha], "alpha_lr")):
            if params:
                parts[part].setdefault((float(algo_cfg[key] or lr), cosine and key == "actor_lr"), []).extend(params)
        self.flats: list[FlatParameters] = []
        self.optimizers: dict[str, torch.optim.Adam] = {}
        for part, groups in parts.items():
            param_groups = []
            for (group_lr, sched), params in groups.items():
                self.flats.append(FlatParameters(params))
                param_groups.append({"params": [self.flats[-1].flat], "lr": group_lr, "initial_lr": group_lr, "scheduled": sched})
            if param_groups:
                self.optimizers[part] = torch.optim.Adam(param_groups, betas=tuple(algo_cfg["adam_betas"]), fused=True)
        self.scheduled = [g for opt in self.optimizers.values() for g in opt.param_groups if g["scheduled"]]
        te = algo_cfg["target_entropy"]
        self.nets = LearnerNets(actor=self.policy, critic=self.critic, target=self.target, value=self.value, log_alpha=self.log_alpha)
        self.loss_options = LossOptions(
            target_entropy=-float(self.policy.head_dim) if te is None else float(te), autotune_alpha=algo_cfg["autotune_alpha"],
            expectile=algo_cfg["expectile"], temperature=algo_cfg["temperature"], max_weight=algo_cfg["max_weight"],
            bc_coef=algo_cfg["bc_coef"],
        )
        self.replay: Peer | None = None
        self.updates = 0
        self.version = 0
        torch.manual_seed(seed * 31 + self.rank)
        random.seed(seed * 31 + self.rank)

    @group_method("all")
    def describe_precision(self) -> str:
        """What ``actor.precision`` resolved to here, for the run's start-up log."""
        return self.precision.describe(self.device)

    @group_method("peers")
    def configure_replay(self, replay: Peer) -> None:
        """The replay shard this rank ingests into and samples from."""
        self.replay = replay

    def _call_replay(self, method: str, *args):
        return self.replay.result(self.replay.submit(method, *args))[0]

    # ------------------------------------------------------------------ training
    def ingest(self, count: int, max_staleness: int | None = None) -> dict:
        """Moves ``count`` transition batches from the channel into replay. ``max_staleness``:
        refuse transitions produced by a policy more than that many versions behind this one
        (random warm-up actions carry version -1 and dataset rows -2: both exempt)."""
        got = self._call_replay("ingest", count)
        acted = [v for v in got["versions"] if v >= 0]
        staleness = self.version - min(acted) if acted else 0
        if max_staleness is not None and staleness > max_staleness:
            raise RuntimeError(
                f"staleness check failed: transitions of policy version {min(acted)} reached the learner at "
                f"version {self.version} (train.max_staleness={max_staleness})"
            )
        return {"ingested": got["transitions"], "staleness": staleness}

    @group_method("rank0", blocking=False)
    def train(self, num_updates: int, ingest: int, max_staleness: int | None = None, export: bool = False) -> dict:
        """Ingests ``ingest`` transition batches, then runs ``num_updates`` gradient updates on
        uniformly sampled batches, and moves to the next policy version; ``export``: the reply's
        ``weights`` holds that version's packet (saves the runner a call of its own)."""
        t0 = time.perf_counter()
        out: dict = self.ingest(ingest, max_staleness)
        t1 = time.perf_counter()
        if num_updates > 0 and self._call_replay("size") > 0:  # (HG-DAgger may have no label yet)
            out.update(self._update(num_updates))
        self.version += 1
        if export:
            out["weights"] = self.export_weights()
        out["time/actor_wait"] = t1 - t0
        out["time/actor_train"] = time.perf_counter() - t1
        out["peak_rss_mb"] = peak_rss_mb()
        return out

    def _update(self, num_updates: int) -> dict:
        c = self.cfg
        arrays = self._call_replay("sample", c["batch_size"], num_updates)
        data = {k: torch.from_numpy(np.ascontiguousarray(arrays[k])).to(self.device) for k in _BATCH_KEYS}
        for k in ("obs", "next_obs", "action"):
            if data[k].dtype != torch.float32:
                data[k] = data[k].float()
        logs: list[dict] = []
        delay, tau = c["policy_delay"], c["tau"]
        for u in range(num_updates):
            if self.scheduled:  # cosine decay to 0 over the run's updates (IQL's actor)
                frac = min(self.updates / max(self.total_updates, 1), 1.0)
                for g in self.scheduled:
                    g["lr"] = g["initial_lr"] * 0.5 * (1.0 + math.cos(math.pi * frac))
            batch = {k: v[u] for k, v in data.items()}
            update_actor = self.updates % delay == 0
            for flat in self.flats:  # gradients are views of the flat buffers: zeroed, never set to None
                flat.zero_grad()
            if self.concurrent_parts and update_actor:
                batch = self.loss_fn.prepare(batch, self.nets)  # the actor's noise, drawn here, before the fork
                helper = self._actor_part(batch)
                helper.submit(batch)
                out = self._backward(self.loss_fn.critic, batch)
                out.update(helper.result())  # its gradients are written: the optimisers may step
            else:
                out = self._backward(partial(self.loss_fn, update_actor=update_actor), batch)
            self._grad_norms(out, update_actor)
            if "critic" in self.optimizers:
                self.optimizers["critic"].step()
            if update_actor:
                self.optimizers["actor"].step()
            if self.target is not None:
                soft_update(self.target, self.critic, tau)
            self.updates += 1
            logs.append(out)
        metrics = {}
        for k in dict.fromkeys(k for log in logs for k in log):  # actor terms may be absent from some (policy_delay)
            vals = torch.stack([log[k] for log in logs if k in log])
            metrics[f"train/{k}"] = float(vals.mean())
            if k.endswith("grad_norm"):  # a blow-up shows in the largest update, not the mean
                metrics[f"train/{k}_max"] = float(vals.max())
        metrics["train/updates"] = self.updates
        return metrics

    def _grad_norms(self, out: dict, update_actor: bool) -> None:
        """The 2-norms of the actor's gradient (on actor updates) and of the critics', before the
        optimiser steps: ``actor_grad_norm`` and ``critic_grad_norm`` (flow actors backpropagate
        through K sampling steps, where gradients may blow up). One multi-tensor norm each."""
        for key, module, on in (("actor_grad_norm", self.policy, update_actor), ("critic_grad_norm", self.critic, True)):
            grads = [p.grad for p in module.parameters() if p.grad is not None] if module is not None and on else []
            if grads:
                out[key] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))

    def _backward(self, loss_fn, batch: dict) -> dict:
        """:func:`~rlweave.workers.update_helper.run_part` with this learner's modules and precision."""
        return run_part(loss_fn, batch, self.nets, self.loss_options, self.autocast_dtype, self.device.type)

    def _actor_part(self, batch: dict) -> ActorPartProcess | _ActorPartThread:
        """Where the actor's part of concurrent updates runs, started at the first one (``batch``:
        the shapes of every batch)."""
        if self._helper is None:
            if self.update_helper == "process":
                self._helper = ActorPartProcess(self.nets, self.flats, self.loss_fn.actor, self.loss_options,
                                                self.autocast_dtype, batch, name=f"{self.group_name}[{self.rank}]")
            else:
                self._helper = _ActorPartThread(partial(self._backward, self.loss_fn.actor))
        return self._helper

    def close(self) -> None:
        """Stops the helper of concurrent updates (called when the worker is removed)."""
        if self._helper is not None:
            self._helper.close()
            self._helper = None

    # ------------------------------------------------------------------ weights and state
    @group_method("rank0")
    def export_weights(self) -> WeightPacket:
        return share_packet(pack_state(self.policy, self.version))

    @group_method("all")
    def load_initial_weights(self, state: dict) -> list[str]:
        """Starts the actor from another run's policy weights (``init.checkpoint``: a behaviour-
        cloning run, for offline-to-online); critics, target and temperature start fresh. Returns
        the names of the policy's tensors the source lacks (fresh); a tensor the source has that
        this policy lacks is an error."""
        result = self.policy.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise ValueError(f"init.checkpoint: its policy has tensors this one lacks: {', '.join(result.unexpected_keys[:5])}")
        return list(result.missing_keys)

    @group_method("rank0")
    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "target": self.target.state_dict() if self.target is not None else None,
            "value": self.value.state_dict() if self.value is not None else None,
            "log_alpha": self.log_alpha.detach().cpu().clone(),
            "optimizers": {part: opt.state_dict() for part, opt in self.optimizers.items()},
            "updates": self.updates,
            "version": self.version,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    @group_method("all")
    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        if self.target is not None:
            self.target.load_state_dict(state["target"])
        if self.value is not None:
            self.value.load_state_dict(state["value"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for part, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][part])
        self.updates, self.version = state["updates"], state["version"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
