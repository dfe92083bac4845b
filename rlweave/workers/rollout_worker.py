"""Rollout worker: holds a replica of the policy and answers env workers' requests (observations
of a micro-batch) with actions, log-probs and values. Weights arrive from the actor as versioned, checksummed
packets."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from rlweave.cluster import Worker
from rlweave.models import build_policy, flat_params_checksum
from rlweave.models.inputs import float_observations, policy_input
from rlweave.utils.memory import device_memory_mb, peak_rss_mb
from rlweave.sync.weights import WeightPacket, resolve_buckets, unpack_into
from rlweave.cluster.dispatch import group_method


class RolloutWorker(Worker):
    """A policy replica that answers env workers' action requests (one micro-batch of observations
    at a time, seeded noise per request, so the actions do not depend on the plan). Kept apart from
    the trainer so inference can sit beside the envs while training runs elsewhere; its weights
    come from the actor as verified packets."""
    def __init__(
        self,
        policy_cfg: dict,
        observation_space,
        action_space,
        chunk: int,
    ):
        self.policy = build_policy(observation_space=observation_space, action_space=action_space, chunk=chunk, **policy_cfg)
        self.policy.to(self.device).eval()  # the slot's GPU when there is one
        self.version = 0
        # no RNG of its own: sampling noise comes seeded with each request (see ``infer``)
        self.requests = self.rows = 0
        self.compute_s = 0.0
        self._lock = threading.Lock()
        self.record_events = False
        self.events: list[tuple[str, float, float]] = []
        self.offloaded = False
        self._loaded_checksum: str | None = None
        self.shapes = {name: p.shape for name, p in self.policy.named_parameters()}
        self.float_obs = float_observations(observation_space)

    def infer(self, obs: np.ndarray | dict, version: int | None, noise_seed: int, rows: tuple[int, int, int]) -> dict:
        """Actions, log-probs and values for one request. ``rows = (lo, hi, n)``: the request holds
        rows lo..hi of its env worker's n envs, and uses those rows of the noise drawn for all n
        from ``noise_seed`` (so a micro-batch gets exactly the actions the whole batch would).
        ``version``: the policy version the caller needs (on-policy), or None for whatever this
        replica holds (off-policy); the reply says which version answered."""
        if version is not None and version != self.version:
            raise RuntimeError(
                f"on-policy check failed: rollout holds policy version {self.version}, asked for version {version}"
            )
        with self._lock:  # one request at a time: concurrent forwards would only share the slot
            t0 = time.perf_counter()
            if self.offloaded:
                raise RuntimeError("rollout replica is offloaded: load weights before asking for actions")
            lo, hi, n = rows
            noise = self.policy.sample_noise(n, torch.Generator().manual_seed(noise_seed))[lo:hi]
            x = policy_input(obs, self.float_obs, self.device, copy=True)  # a writable copy (Ray hands read-only arrays)
            with torch.inference_mode():
                action, log_prob, value = (t.cpu() for t in self.policy.act(x, noise=noise))
                executed = self.policy.env_action(action)
            self.requests += 1
            self.rows += hi - lo
            spent = time.perf_counter() - t0
            self.compute_s += spent
            if self.record_events:
                self.events.append((f"infer {hi - lo} rows", t0, spent))
        reply = {"action": action.numpy(), "log_prob": log_prob.numpy(), "value": value.numpy(), "time/compute": spent,
                 "version": self.version}
        if executed is not action:  # the stored action (learner) differs from the executed one (env)
            reply["env_action"] = executed.numpy()
        return reply

    @group_method("all")
    def stats(self) -> dict:
        """Requests and rows answered since the last call, recorded events, peak memory."""
        out = {"requests": self.requests, "rows": self.rows, "time/compute": self.compute_s, "peak_rss_mb": peak_rss_mb(), "events": self.events}
        out.update({f"device/{k}": v for k, v in device_memory_mb(self.device).items()})
        self.requests = self.rows = 0
        self.compute_s = 0.0
        self.events = []
        return out

    @group_method("all")
    def configure(self, record_events: bool) -> None:
        self.record_events = record_events

    @group_method("all")
    def offload(self) -> dict:
        """Releases the replica's weights while the device is another group's turn (the trainer's,
        when they share slots). The next ``load_weights`` brings them back: weights are re-sent
        every iteration anyway, so nothing is copied back. Returns device memory before/after."""
        before = device_memory_mb(self.device)
        released = 0
        for p in self.policy.parameters():
            released += p.numel()
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.offloaded = True
        self._loaded_checksum = None
        return {"released_params": released, "before": before, "after": device_memory_mb(self.device)}

    @group_method("all")
    def load_weights(self, packet: WeightPacket) -> str:
        """Loads ``packet`` and returns the checksum of what it loaded. Several env workers that
        share this replica may each hand it the same packet at the start of their collection
        (the off-policy runner's carried sync): the first loads it, the others wait for that and
        find it loaded, so none of them acts with the previous weights."""
        with self._lock:  # not while a request computes with the weights
            if not self.offloaded and packet.version == self.version and packet.checksum == self._loaded_checksum:
                return self._loaded_checksum
            if self.offloaded:
                for name, p in self.policy.named_parameters():
                    p.data = torch.empty(self.shapes[name], dtype=p.dtype, device=p.device)
                self.offloaded = False
            unpack_into(self.policy, resolve_buckets(packet.buckets))
            got = flat_params_checksum(self.policy)
            if got != packet.checksum:
                raise RuntimeError(f"weight sync v{packet.version}: checksum {got} != actor's {packet.checksum}")
            self.version = packet.version
            self._loaded_checksum = got
            return got

    @group_method("all")
    def checksum(self) -> str:
        return flat_params_checksum(self.policy)

    @group_method("all")
    def state_dict(self) -> dict:
        return {"torch_rng": torch.get_rng_state().numpy(), "version": self.version}

    @group_method("per_rank")
    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.from_numpy(np.asarray(state["torch_rng"])))
        self.version = state["version"]
