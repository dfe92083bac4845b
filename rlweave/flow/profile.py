"""Offline profile of an embodied recipe's stages, for ``rlweave plan`` (no training).

Measures in this process what the runner measures during its first iterations: one env worker
stepping its envs (at the full batch and at half of it), one policy forward at the same row
counts, and the round trip of one request between two Ray processes (an embedded Ray, started and
stopped here). The costs feed the same :class:`~rlweave.flow.Planner` the run uses.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rlweave.flow.planner import Planner, physical_cores
from rlweave.flow.simulate import StageCosts
from rlweave.models.inputs import float_observations, policy_input
from rlweave.utils.tree import tree_index, tree_map


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_stage_costs(env_cfg: dict, policy, total_envs: int, repeats: int = 10, ray_round_trip: bool = True) -> StageCosts:
    """Env step and inference cost at ``total_envs`` and half of it, plus the cross-process
    request price (a Ray actor echoing an observation batch)."""
    from rlweave.envs import VectorEnv

    costs = StageCosts()
    env = VectorEnv(env_cfg["id"], total_envs, seed=0, chunk=env_cfg.get("chunk", 1), pixels=env_cfg.get("pixels"),
                    kwargs=env_cfg.get("kwargs"))
    obs = env.reset()
    space = env.single_action_space
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a CPU slot is one core, as in the workers
    try:
        for rows in sorted({total_envs, max(1, total_envs // 2)}):
            sl = slice(0, rows)
            x = policy_input(tree_index(obs, sl), float_observations(env.single_observation_space), copy=True)
            with torch.inference_mode():
                action = policy.env_action(policy.act(x)[0]).numpy()
                costs.infer.add(rows, median_time(lambda: policy.act(x), repeats))
            if not hasattr(space, "n"):
                action = np.clip(action, space.low, space.high)
            costs.env.add(rows, median_time(lambda: env.step(action, envs=sl), repeats))
    finally:
        torch.set_num_threads(threads)
        env.close()
    if ray_round_trip:
        costs.remote_overhead = _ray_round_trip(tree_map(np.array, obs))
    return costs


def offline_planner(cfg, cluster, policy) -> Planner:
    """A planner for the recipe ``cfg`` on ``cluster``'s slots with stage costs measured offline
    (no training): what ``rlweave plan`` ranks. ``policy`` is the recipe's policy, as the caller
    built it (``rlweave plan``: the one its config check built; it is not built again here)."""
    from omegaconf import OmegaConf

    total = cfg.env.num_workers * cfg.env.num_envs
    policy.eval()
    planner = Planner(
        slots=cluster.slots(),
        total_envs=total, steps=cfg.train.rollout_steps, cores=physical_cores(cluster),
        max_micro_batches=cfg.planner.max_micro_batches, env_multiple=cfg.actor.num_workers, margin=cfg.planner.margin,
        min_gain=cfg.planner.min_gain, gpu_slots=cluster.slot_kind == "gpu",
    )
    measured = measure_stage_costs(OmegaConf.to_container(cfg.env), policy, total)
    planner.costs.env, planner.costs.infer = measured.env, measured.infer
    planner.costs.remote_overhead = measured.remote_overhead
    return planner


def _ray_round_trip(payload: np.ndarray, repeats: int = 50) -> float:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        echo = ray.remote(num_cpus=0)(_Echo).remote()
        ray.get(echo.echo.remote(payload))
        return median_time(lambda: ray.get(echo.echo.remote(payload)), repeats)
    finally:
        if started:
            ray.shutdown()


class _Echo:
    """A Ray actor that returns what it is sent: the cross-process request whose round trip is
    measured."""

    def echo(self, x):
        return x
