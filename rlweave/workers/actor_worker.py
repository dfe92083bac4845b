"""Actor worker: trains the policy on the trajectories of its env workers.

Each actor rank takes the trajectories addressed to it, computes advantages with the algorithm's
estimator from the registry, and runs epochs of minibatch updates with the algorithm's loss. With
several ranks the policy is wrapped in DistributedDataParallel (gloo on CPU, NCCL on GPU) and the
observation-normalisation statistics are merged across ranks, so every rank keeps identical
weights. The trainer is the same for every on-policy algorithm: what differs is data in the
``AlgorithmSpec`` (estimator, loss, critic or not), not subclasses.
"""

from __future__ import annotations

import contextlib
import random
import time

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from rlweave.algorithms import (OnPolicyAdvantageInput, OnPolicyLossInput, algorithm_estimator, algorithm_loss, load_algorithm,
                                normalize, total_loss)
from rlweave.algorithms.contracts import PolicySFTLossInput
from rlweave.data.demos import Demonstrations, load_demonstrations
from rlweave.cluster import Worker
from rlweave.models import build_policy
from rlweave.models.flat import FlatParameters, adam_step
from rlweave.models.inputs import float_observations, policy_input
from rlweave.utils.tree import is_dict, tree_concat, tree_index, tree_map
from rlweave.utils.memory import device_memory_mb, peak_rss_mb
from rlweave.workers.channels import ChannelSpec
from rlweave.workers.value_part import ValuePart
from rlweave.sync.weights import WeightPacket, pack_state, share_packet
from rlweave.cluster.dispatch import group_method


class ActorWorker(Worker):
    """The on-policy trainer (PPO, GRPO and any on-policy registry entry): one rank of the policy's
    data-parallel training. Takes the trajectories its env workers send over the trajectory
    channel, computes advantages and runs the algorithm's minibatch epochs, then exports the weights
    the rollout workers act with next, so every algorithm shares one trainer."""
    def __init__(
        self,
        algo_cfg: dict,
        policy_cfg: dict,
        observation_space,
        action_space,
        chunk: int,
        seed: int,
        trajectory_channel: ChannelSpec | None,
        trajectories_per_rank: int,
        runner: str = "onpolicy",
        update_threads: int = 1,
    ):
        self.cfg = algo_cfg
        self.spec = load_algorithm(algo_cfg)  # imports algorithm.plugins first: user registrations reach this process
        # on-policy RL, or supervised fine-tuning on demonstrations (runner policy_sft): the same
        # trainer, weights and checkpoint state; only the loss kind and the data source differ
        self.estimator = algorithm_estimator(self.spec, runner) if runner == "onpolicy" else None
        self.loss_fn = algorithm_loss(self.spec, runner)
        self.demos: Demonstrations | None = None
        self.seed = seed
        torch.manual_seed(seed)  # identical initial weights on every rank
        self.policy = build_policy(
            observation_space=observation_space,
            action_space=action_space,
            chunk=chunk,
            **policy_cfg,
        )
        self.policy.to(self.device)  # the slot's GPU when there is one
        self.float_obs = float_observations(observation_space)
        self.offloaded = False
        # One flat buffer behind all parameters and gradients: fused Adam and gradient clipping are
        # then one kernel each per step (small-MLP updates are bound by per-op overhead).
        self.flat = FlatParameters(self.policy.parameters())
        self.optimizer = torch.optim.Adam([self.flat.flat], lr=algo_cfg["lr"], eps=1e-5, fused=True)
        # critic warm-up (refused before start for critic-free algorithms: runners/checks.py): its own
        # Adam over the critic-only entries of the flat buffer (the rest get no gradient, so no step),
        # leaving the main optimizer's state as if the warm-up had not happened
        self.warmup_iterations = int(algo_cfg.get("critic_warmup_iterations") or 0)
        self._critic_mask: Tensor | None = None
        self.warmup_optimizer = (torch.optim.Adam([self.flat.flat], lr=algo_cfg["lr"], eps=1e-5, fused=True)
                                 if self.warmup_iterations else None)
        self.traj_ch = trajectory_channel.open() if trajectory_channel is not None else None
        self.trajectories_per_rank = trajectories_per_rank
        self.version = 0
        self.iteration = 0
        self.obs_stats_frozen = False  # set by load_initial_weights (init.obs_stats: keep)
        self.ddp: DistributedDataParallel | None = None
        self.rng = np.random.default_rng(seed * 31 + self.rank)
        torch.manual_seed(seed * 31 + self.rank)
        random.seed(seed * 31 + self.rank)
        # actor.update_threads=2: each minibatch's value loss in a helper process (value_part.py)
        self.value_part = ValuePart(self.policy, self.flat, self.loss_fn, algo_cfg) if int(update_threads) > 1 else None

    # ------------------------------------------------------------------ training
    @group_method("all", blocking=False)
    def train(self, version: int, progress: float = 0.0, num_env_workers: int | None = None) -> dict:
        """One iteration of updates on this rank's trajectories. ``progress`` is the fraction of the
        run's env-step budget already spent (drives learning-rate and clip annealing);
        ``num_env_workers``: the env group's size this iteration (it changes when the env group is
        scaled; env worker e sends to rank e % world size; default: the count given at start)."""
        if version != self.version:
            raise RuntimeError(f"actor holds policy version {self.version}, asked to train version {version}")
        t0 = time.perf_counter()
        expected = (self.trajectories_per_rank if num_env_workers is None
                    else sum(1 for e in range(num_env_workers) if e % self.world_size == self.rank))
        envelopes = self.traj_ch.get_batch_envelopes(float(expected), key=self.rank)
        stale = [e.version for e in envelopes if e.version != self.version]
        if stale:
            raise RuntimeError(
                f"on-policy check failed: trajectories of policy version(s) {sorted(set(stale))} reached "
                f"the actor at version {self.version}"
            )
        # env-rank order, whatever order they arrived in: the update is then reproducible
        trajs = sorted((e.item for e in envelopes), key=lambda t: int(t["env_rank"][0]))
        received = [(int(t["env_rank"][0]), int(t["policy_version"][0]), int(t["env_steps"][0])) for t in trajs]
        t1 = time.perf_counter()
        if self.offloaded:
            self.onload()
        batch, info, whiten = self._prepare(trajs)
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        metrics = self._update(batch, progress, whiten)
        if self.policy.obs_rms is not None and not self.obs_stats_frozen:
            # Statistics move only after the update, so the update sees the normaliser the rollout
            # used: the stored log-probs stay exactly on-policy.
            self._update_obs_stats(batch["obs"])
        self.iteration += 1
        self.version += 1
        metrics.update(info)
        metrics["time/actor_wait"] = t1 - t0
        metrics["time/actor_train"] = time.perf_counter() - t1
        metrics["received"] = received
        metrics["peak_rss_mb"] = peak_rss_mb()
        metrics.update({f"device/{k}": v for k, v in device_memory_mb(self.device).items()})
        return metrics

    def _obs(self, x, device=None):
        return policy_input(tree_map(np.ascontiguousarray, x), self.float_obs, device)

    def _prepare(self, trajs: list[dict]) -> tuple[TensorDict, dict, bool]:
        """Concatenates this rank's trajectories along the env axis and computes advantages with
        the algorithm's registered estimator. Returns the batch, metrics, and whether the
        minibatches' advantages are to be whitened (the estimator says)."""
        cat = lambda k, axis=1: tree_concat([t[k] for t in trajs], axis)  # noqa: E731
        T = min(t["rewards"].shape[0] for t in trajs)
        if any(t["rewards"].shape[0] != T for t in trajs):  # episodic trajectories differ in length
            trajs = [_pad_time(t, max(tt["rewards"].shape[0] for tt in trajs)) for t in trajs]
            T = trajs[0]["rewards"].shape[0]
        obs = cat("obs")  # [T, N, *obs] (each leaf of a dict observation)
        N = _leaf(obs).shape[1]
        flat_obs = self._obs(tree_map(lambda v: v.reshape(T * N, *v.shape[2:]), obs))
        rewards = torch.from_numpy(cat("rewards")).float()
        terminated = torch.from_numpy(cat("terminated"))
        truncated = torch.from_numpy(cat("truncated"))
        old_values = torch.from_numpy(cat("value")).float()  # same weights and normaliser as the rollout's: no recompute
        last_value = None
        with torch.no_grad():
            if self.spec.uses_critic:
                # Bootstrap through time limits: r += gamma * V(final obs) where an episode was truncated.
                offsets = np.cumsum([0] + [_leaf(t["obs"]).shape[1] for t in trajs])
                idx = np.concatenate([t["boot_idx"] + np.array([0, off]) for t, off in zip(trajs, offsets)])
                if len(idx):
                    boot_obs = self._obs(cat("boot_obs", 0), self.device)
                    v = self.policy.value(boot_obs).cpu()
                    rewards[idx[:, 0], idx[:, 1]] += self.cfg["gamma"] * v
                last_value = self.policy.value(self._obs(cat("last_obs", 0), self.device)).cpu()
            episodic = "mask" in trajs[0]  # episodic collections (episodic_groups) mark their padding
            est = self.estimator(OnPolicyAdvantageInput(
                rewards=rewards, values=old_values, dones=(terminated | truncated).float(), next_value=last_value,
                cfg=self.cfg, mask=torch.from_numpy(cat("mask")) if episodic else None,
                episode_return=torch.from_numpy(cat("episode_return", 0)).float() if episodic else None,
                group_id=torch.from_numpy(cat("group_id", 0)) if episodic else None,
            ))
        info: dict = dict(est.info)
        returns = est.returns if est.returns is not None else torch.zeros(T, N)
        actions = torch.from_numpy(cat("action"))
        log_probs = torch.from_numpy(cat("log_prob")).float()
        batch = TensorDict(
            {
                "obs": flat_obs,
                "action": actions.reshape(T * N, *actions.shape[2:]),
                "log_prob": log_probs.reshape(T * N, *log_probs.shape[2:]),  # [T*N] or, per factor, [T*N, K]
                "adv": est.advantages.reshape(-1),
                "returns": returns.reshape(-1),
                "value": old_values.reshape(-1),
            },
            batch_size=[T * N],
        )
        if est.mask is not None:  # the estimator's steps to train on (episodic padding left out)
            batch = batch[est.mask.reshape(-1).bool()]
        info["train/samples"] = batch.batch_size[0]
        return batch, info, est.whiten

    def _update_obs_stats(self, flat_obs: torch.Tensor) -> None:
        rms = self.policy.obs_rms
        x = flat_obs.double()
        if self.world_size > 1 and dist.is_initialized():
            n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
            s, ss = x.sum(0), (x * x).sum(0)
            for t in (n, s, ss):
                dist.all_reduce(t)
            mean = s / n
            var = ss / n - mean * mean
            rms.update_from_moments(mean, var.clamp_min(0), n.item())
        else:
            rms.update(x)

    def _module(self) -> torch.nn.Module:
        if self.world_size > 1 and dist.is_initialized():
            if self.ddp is None:
                self.ddp = DistributedDataParallel(self.policy, broadcast_buffers=False)
            return self.ddp
        return self.policy

    def _update(self, batch: TensorDict, progress: float, whiten: bool) -> dict:
        """Epochs of minibatch steps with the algorithm's registered loss (kind on_policy)."""
        cfg = self.cfg
        frac = max(0.0, 1.0 - progress)
        lr = cfg["lr"] * frac if cfg.get("lr_anneal") else cfg["lr"]
        for opt in (self.optimizer, self.warmup_optimizer):
            for group in opt.param_groups if opt is not None else ():
                group["lr"] = lr
        clip = cfg["clip_eps"] * frac if cfg.get("clip_anneal") else cfg["clip_eps"]
        model = self._module()
        B = batch.batch_size[0]
        mb = max(1, cfg["minibatch_size"] // self.world_size)
        sums: torch.Tensor | None = None
        names: list[str] = []
        count = 0
        keys = ("obs", "action", "log_prob", "adv", "returns", "value")
        n_mb = B // mb if B >= mb else 1  # full minibatches only (a short tail is left out), or one of all rows
        whiten = whiten and cfg.get("norm_adv", True)
        warmup = self.iteration < self.warmup_iterations
        target_kl = None if warmup else cfg.get("target_kl")
        epochs = 0
        for _ in range(cfg["epochs"]):
            epochs += 1
            at_epoch_start, count_at_start = sums, count
            perm = torch.from_numpy(self.rng.permutation(B))
            # one gather per epoch, then every minibatch's views in one split per key
            parts = {k: batch[k][perm].split(mb if B >= mb else max(1, B)) for k in keys}
            for i in range(n_mb):
                mbatch = {k: v[i] for k, v in parts.items()}
                if whiten:  # over the whole minibatch, before any split
                    mbatch["adv"] = normalize(mbatch["adv"])
                self.flat.zero_grad()
                stacked, terms = self._accumulate(model, mbatch, clip, value_only=warmup)
                if warmup:
                    self.flat.flat.grad.mul_(self._critic_only(mbatch))
                if cfg["max_grad_norm"] > 0:
                    self.flat.clip_grad_norm_(cfg["max_grad_norm"])
                # optimizer.step(), bit for bit, without its Python layers
                adam_step(self.warmup_optimizer if warmup else self.optimizer)
                # summed as one stacked tensor: two ops per minibatch and no sync to Python
                sums = stacked if sums is None else sums + stacked
                names = names or list(terms)
                count += 1
            if target_kl is not None and self._epoch_kl(sums, at_epoch_start, count - count_at_start, names) > 1.5 * target_kl:
                break
        totals = [] if sums is None else sums.tolist()
        out = {f"train/{k}": v / max(1, count) for k, v in zip(names, totals)}
        out["train/lr"] = lr
        out["train/updates"] = count
        out["train/epochs"] = epochs
        if self.warmup_iterations:
            out["train/critic_warmup"] = float(warmup)
        return out

    def _epoch_kl(self, sums: Tensor | None, at_start: Tensor | None, steps: int, names: list[str]) -> float:
        """Mean ``approx_kl`` of the epoch just run (its minibatches' terms are ``sums - at_start``),
        averaged over the ranks so that all of them stop after the same epoch."""
        if sums is None or not steps or "approx_kl" not in names:
            return 0.0
        i = names.index("approx_kl")
        kl = (sums[i] - (at_start[i] if at_start is not None else 0.0)).detach().reshape(1).double() / steps
        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(kl)
            kl /= self.world_size
        return float(kl.item())

    def _critic_only(self, mbatch: dict) -> Tensor:
        """1 on the flat buffer's entries that the policy's log-probs do not depend on (the
        critic's own layers), 0 elsewhere; found once, by autograd, for any policy class."""
        if self._critic_mask is None:
            log_prob, _, _ = self.policy(mbatch["obs"], mbatch["action"])
            grads = torch.autograd.grad(log_prob.float().sum(), self.flat.params, allow_unused=True)
            self._critic_mask = torch.cat([torch.full((n,), float(g is None), dtype=self.flat.flat.dtype, device=self.flat.flat.device)
                                           for g, n in zip(grads, self.flat.numels)])
            if not self._critic_mask.any():
                raise ValueError("algorithm.critic_warmup_iterations: the policy has no parameters of the critic's own "
                                 "(every parameter moves its actions)")
        return self._critic_mask

    def close(self) -> None:
        """Stops the value loss's helper process (called when the worker is removed)."""
        if self.value_part is not None:
            self.value_part.close()

    @group_method("all", collect="first")
    def load_initial_weights(self, state: dict, keep_obs_stats: bool = True) -> list[str]:
        """Starts from another run's policy weights (``init.checkpoint``). Tensors this policy has
        and the source lacks (a value head an SFT run did not train) keep their fresh values and
        are returned by name; a tensor the source has that this policy lacks, or of another
        shape, is an error. ``keep_obs_stats`` (``init.obs_stats: keep``): observation statistics
        that came with the weights stay as they are, so the policy computes the function it was
        trained as."""
        result = self.policy.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise ValueError(f"init.checkpoint: its policy has tensors this one lacks: {', '.join(result.unexpected_keys[:5])}")
        loaded_stats = any(k.startswith("obs_rms.") for k in state) and not any(k.startswith("obs_rms.") for k in result.missing_keys)
        self.obs_stats_frozen = keep_obs_stats and loaded_stats
        return list(result.missing_keys)

    def _accumulate(self, model, mbatch: dict, clip: float, value_only: bool = False) -> tuple[torch.Tensor, dict]:
        """Gradients of one minibatch's loss, in micro-batches of ``algorithm.micro_batch_size``
        rows when set (gradient accumulation: the same gradient, a fraction of the activation
        memory, for policies too large to forward a whole minibatch at once, such as VLAs on a
        GPU). ``value_only``: the gradient of the value loss alone (the critic warm-up). Returns the
        loss terms averaged over the minibatch (stacked) and their names."""
        cfg, n = self.cfg, len(mbatch["adv"])
        step = cfg.get("micro_batch_size") or n
        parts = [slice(i, min(n, i + step)) for i in range(0, n, step)]
        if self.value_part is not None and not value_only and len(parts) == 1 and model is self.policy:
            return self.value_part.accumulate(mbatch, clip)
        critic = self.spec.uses_critic
        stacked = None
        for j, sl in enumerate(parts):
            mb = {k: v[sl] for k, v in mbatch.items()} if len(parts) > 1 else mbatch
            sync = contextlib.nullcontext() if j == len(parts) - 1 or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                log_prob, entropy, value = model(mb["obs"], mb["action"])
                if not cfg["ent_coef"]:  # no bonus: keep the entropy out of the graph, log it only
                    entropy_mean, entropy = entropy.detach().mean(), None
                terms = self.loss_fn(OnPolicyLossInput(
                    log_prob=log_prob, old_log_prob=mb["log_prob"], advantages=mb["adv"], entropy=entropy,
                    values=value if critic else None, old_values=mb["value"] if critic else None,
                    returns=mb["returns"] if critic else None, obs=mb["obs"], action=mb["action"],
                    clip_eps=clip, cfg=cfg,
                ))
                if entropy is None:
                    terms["entropy"] = entropy_mean
                w = (sl.stop - sl.start) / n
                loss = terms["loss_value"] if value_only else total_loss(terms)
                (loss * w if w != 1 else loss).backward()
            part = torch.stack([v.detach() for v in terms.values()])
            part = part * w if w != 1 else part
            stacked = part if stacked is None else stacked + part
        return stacked, terms

    # ------------------------------------------------------------------ supervised fine-tuning
    @group_method("all")
    def load_demonstrations(self, path: str, observation_space=None, action_space=None) -> dict:
        """Reads the demonstrations every rank samples its minibatches from (each rank its own
        rows, by its own RNG); returns their size."""
        self.demos = load_demonstrations(path, self.policy.chunk, observation_space, action_space)
        if self.policy.obs_rms is not None and not is_dict(self.demos.obs):
            # a normalising policy (policy.normalize_obs) sees its inputs through the demonstrations'
            # statistics, fitted once here; a resume then restores the checkpoint's (the same ones)
            self.policy.update_obs_stats(torch.as_tensor(self.demos.obs, dtype=torch.float64))
        info = {"steps": len(self.demos), "episodes": self.demos.episodes, "success_rate": self.demos.success_rate}
        # a loss that needs more per row than (obs, actions) computes it once here (RECAP: its
        # value function and advantage indicator), from the same seed on every rank
        prepare = getattr(self.loss_fn, "prepare_demonstrations", None)
        if prepare is not None:
            info.update(prepare(self.demos, self.cfg, self.seed))
        return info

    @group_method("all", collect="first")
    def imitate(self, num_updates: int, progress: float = 0.0) -> dict:
        """``num_updates`` steps of the algorithm's ``policy_sft`` loss on minibatches of the
        demonstrations (``algorithm.minibatch_size`` rows in all, split over the ranks; gradients
        averaged over ranks before each step, so every rank keeps identical weights)."""
        if self.demos is None:
            raise RuntimeError("imitate: no demonstrations loaded (load_demonstrations first)")
        cfg = self.cfg
        lr = cfg["lr"] * max(0.0, 1.0 - progress) if cfg.get("lr_anneal") else cfg["lr"]
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mb = max(1, cfg["minibatch_size"] // self.world_size)
        distributed = self.world_size > 1 and dist.is_initialized()
        self.policy.train()
        t0 = time.perf_counter()
        sums: torch.Tensor | None = None
        names: list[str] = []
        step = cfg.get("micro_batch_size") or mb  # gradient accumulation, as in the RL update
        for _ in range(num_updates):
            sample = self.demos.sample(mb, self.rng)
            self.flat.zero_grad()
            stacked = None
            for lo in range(0, mb, step):
                rows = slice(lo, min(mb, lo + step))
                obs = self._obs(tree_index(sample["obs"], rows), self.device)
                actions = torch.from_numpy(sample["actions"][rows]).to(self.device)
                extras = {k: torch.from_numpy(v[rows]).to(self.device) for k, v in sample.get("columns", {}).items()}
                terms = self.loss_fn(PolicySFTLossInput(policy=self.policy, obs=obs, actions=actions, weights=None, cfg=cfg,
                                                        extras=extras))
                w = (rows.stop - rows.start) / mb
                (total_loss(terms) * w).backward()
                part = torch.stack([v.detach().float() for v in terms.values()]) * w
                stacked = part if stacked is None else stacked + part
            if distributed:
                dist.all_reduce(self.flat.flat.grad)
                self.flat.flat.grad.div_(self.world_size)
            if cfg["max_grad_norm"] > 0:
                self.flat.clip_grad_norm_(cfg["max_grad_norm"])
            adam_step(self.optimizer)
            sums = stacked if sums is None else sums + stacked
            names = names or list(terms)
        self.policy.eval()
        self.iteration += 1
        self.version += 1
        out = {f"train/{k}": v / max(1, num_updates) for k, v in zip(names, [] if sums is None else sums.tolist())}
        out.update({"train/lr": lr, "train/updates": num_updates, "time/actor_train": time.perf_counter() - t0,
                    "peak_rss_mb": peak_rss_mb()})
        return out

    # ------------------------------------------------------------------ device turns
    @group_method("all")
    def offload(self) -> dict:
        """Moves the model and the optimizer state to host memory while the device is another
        group's turn (a GPU shared with the rollout); ``train`` brings them back. A no-op on CPU,
        where there is no separate device memory to free. Returns device memory before/after."""
        before = device_memory_mb(self.device)
        if self.device.type == "cuda" and not self.offloaded:
            self._move(torch.device("cpu"))
            torch.cuda.empty_cache()
            self.offloaded = True
        return {"before": before, "after": device_memory_mb(self.device)}

    @group_method("all")
    def onload(self) -> None:
        if self.offloaded:
            self._move(self.device)
            self.offloaded = False

    def _move(self, device: torch.device) -> None:
        self.flat.to(device)  # first: the module's move then only carries its buffers
        self.policy.to(device)
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = v.to(device)

    # ------------------------------------------------------------------ weights and state
    @group_method("rank0")
    def export_weights(self) -> WeightPacket:
        return share_packet(pack_state(self.policy, self.version))

    @group_method("rank0")
    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **({"warmup_optimizer": self.warmup_optimizer.state_dict()} if self.warmup_optimizer is not None else {}),
            "version": self.version,
            "iteration": self.iteration,
            "rng": {
                "numpy": self.rng.bit_generator.state,
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
            },
        }

    @group_method("all")
    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.warmup_optimizer is not None and "warmup_optimizer" in state:
            self.warmup_optimizer.load_state_dict(state["warmup_optimizer"])
        self.version = state["version"]
        self.iteration = state["iteration"]
        self.rng.bit_generator.state = state["rng"]["numpy"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])


def _pad_time(traj: dict, T: int) -> dict:
    """Pads an episodic trajectory to ``T`` steps (padding is masked out)."""
    out = dict(traj)
    t = traj["rewards"].shape[0]
    if t == T:
        return out
    for k in ("obs", "action", "log_prob", "value", "rewards", "terminated", "truncated", "mask"):
        out[k] = tree_map(lambda v: np.concatenate([v, np.zeros((T - t, *v.shape[1:]), dtype=v.dtype)]), traj[k])
    return out


def _leaf(x):
    """An array of ``x`` (x itself, or a dict observation's first leaf): for its shape."""
    return next(iter(x.values())) if is_dict(x) else x
