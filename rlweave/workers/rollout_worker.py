"""Rollout worker: holds a replica of the policy and answers env workers' observation requests
with actions, log-probs and values. Weights arrive from the actor as versioned, checksummed
packets."""

from __future__ import annotations

import numpy as np
import torch

from rlweave.cluster import Worker
from rlweave.models import build_policy, flat_params_checksum
from rlweave.workers.channels import ChannelSpec
from rlweave.workers.weights import WeightPacket, resolve_buckets, unpack_into


class RolloutWorker(Worker):
    def __init__(
        self,
        policy_cfg: dict,
        observation_space,
        action_space,
        chunk: int,
        seed: int,
        obs_channel: ChannelSpec,
        action_channel: ChannelSpec,
        env_workers_served: int,
    ):
        self.policy = build_policy(observation_space=observation_space, action_space=action_space, chunk=chunk, **policy_cfg)
        self.policy.eval()
        self.version = 0
        self.generator_seed = seed * 7919 + self.rank
        torch.manual_seed(self.generator_seed)
        self.obs_ch = obs_channel.open()
        self.act_ch = action_channel.open()
        self.env_workers_served = env_workers_served
        self.float_obs = not (hasattr(observation_space, "dtype") and observation_space.dtype == np.uint8)

    def serve(self, version: int) -> dict:
        """Answers requests until every env worker it serves has said it is done."""
        if version != self.version:
            raise RuntimeError(f"rollout has policy version {self.version}, asked to serve version {version}")
        stops = requests = 0
        with torch.inference_mode():
            while stops < self.env_workers_served:
                msg = self.obs_ch.get(key=self.rank)
                if msg.get("stop"):
                    stops += 1
                    continue
                obs = torch.from_numpy(np.asarray(msg["obs"]))
                if self.float_obs:
                    obs = obs.float()
                action, log_prob, value = self.policy.act(obs)
                self.act_ch.put(
                    {"action": action.numpy(), "log_prob": log_prob.numpy(), "value": value.numpy()},
                    key=msg["env_rank"],
                    version=self.version,
                )
                requests += 1
        return {"requests": requests}

    def load_weights(self, packet: WeightPacket) -> str:
        unpack_into(self.policy, resolve_buckets(packet.buckets))
        got = flat_params_checksum(self.policy)
        if got != packet.checksum:
            raise RuntimeError(f"weight sync v{packet.version}: checksum {got} != actor's {packet.checksum}")
        self.version = packet.version
        return got

    def checksum(self) -> str:
        return flat_params_checksum(self.policy)

    def state_dict(self) -> dict:
        return {"torch_rng": torch.get_rng_state().numpy(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.from_numpy(np.asarray(state["torch_rng"])))
        self.version = state["version"]
