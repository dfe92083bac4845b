"""What every runner shares before its workers start: the cross-field config checks, the
placement of the env / rollout / actor groups, and the policy's constructor arguments."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms import get_algorithm
from rlweave.cluster import Cluster, PlacementError, make_plan
from rlweave.config import ConfigError
from rlweave.envs import space_info
from rlweave.models import build_policy

RUNNER_OF_KIND = {"on_policy": "onpolicy", "off_policy": "offpolicy"}


def check_compatible(cfg: DictConfig):
    """Checks what the schema cannot (cross-field rules, env and policy fit) before any worker
    starts. Returns the env's (observation_space, action_space)."""
    try:
        spec = get_algorithm(cfg.algorithm.name)
    except KeyError as e:
        raise ConfigError(f"algorithm.name: {e.args[0]}") from None
    runner = RUNNER_OF_KIND.get(spec.kind)
    if runner != cfg.runner:
        raise ConfigError(
            f"algorithm.name: '{spec.name}' is an {spec.kind.replace('_', '-')} algorithm; it runs with runner={runner} "
            f"(this config has runner={cfg.runner})"
        )
    if spec.kind == "off_policy":
        _check_off_policy(cfg)
    if cfg.env.num_workers % cfg.actor.num_workers:
        raise ConfigError(
            f"actor.num_workers: {cfg.actor.num_workers} must divide env.num_workers ({cfg.env.num_workers}) "
            "so every actor rank trains on the same amount of data"
        )
    if spec.episodic_groups and cfg.env.num_envs % cfg.algorithm.group_size:
        raise ConfigError(
            f"algorithm.group_size: {cfg.algorithm.group_size} must divide env.num_envs ({cfg.env.num_envs})"
        )
    env_cfg = OmegaConf.to_container(cfg.env)
    try:
        obs_space, act_space = space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
    except Exception as e:  # noqa: BLE001 - any failure to build the env is a config problem here
        raise ConfigError(f"env.id: cannot make '{cfg.env.id}': {str(e).splitlines()[0]}") from None
    try:
        build_policy(observation_space=obs_space, action_space=act_space, chunk=cfg.env.chunk, **policy_kwargs(cfg))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy.name: {str(e).splitlines()[0]}") from None
    if spec.needs_dataset and not cfg.replay.offline_dataset:
        raise ConfigError(
            f"replay.offline_dataset: {spec.name} learns from a dataset beside online data; "
            "make one with 'rlweave collect RUN_DIR --episodes N -o FOLDER' and pass its folder"
        )
    if spec.kind == "off_policy" and cfg.replay.offline_dataset:
        from rlweave.workers.datasets import DatasetError, check_spaces

        try:
            check_spaces(cfg.replay.offline_dataset, obs_space, act_space)
        except (DatasetError, ImportError) as e:
            raise ConfigError(f"replay.offline_dataset: {e}") from None
    return obs_space, act_space


def plan_placement(cfg: DictConfig, cluster: Cluster):
    """The placement plan of the env/rollout/actor groups on ``cluster`` (PlacementError if bad).
    Under ``placement.mode=auto`` this is the starting layout: the planner's first profiling plan
    for env and rollout, the actor on the first slots (it trains between collections)."""
    explicit = {k: OmegaConf.to_container(v) for k, v in cfg.placement.groups.items()}
    workers = {"env": cfg.env.num_workers, "rollout": cfg.rollout.num_workers, "actor": cfg.actor.num_workers}
    mode = cfg.placement.mode
    if mode == "auto":
        if set(explicit) & {"env", "rollout"}:
            raise PlacementError("placement.groups: env and rollout slots are the planner's to choose under placement.mode=auto")
        workers["env"] = workers["rollout"] = 1
        explicit.setdefault("actor", {"slots": f"0-{min(cluster.num_slots, cfg.actor.num_workers) - 1}"})
        mode = "collocated"
    plan = make_plan(cluster, workers, mode, explicit, cfg.placement.oversubscribe)
    n_env, n_roll, n_act = (plan.groups[g].num_workers for g in ("env", "rollout", "actor"))
    if n_env % n_act:
        raise PlacementError(f"placement.groups.actor: {n_act} actor ranks must divide {n_env} env workers")
    if n_env % n_roll:
        raise PlacementError(f"placement.groups.rollout: {n_roll} rollout workers must divide {n_env} env workers")
    return plan


def policy_kwargs(cfg: DictConfig) -> dict:
    p = OmegaConf.to_container(cfg.policy)
    name = p.pop("name")
    spec = get_algorithm(cfg.algorithm.name)
    kwargs: dict = {"name": name, "critic": spec.uses_critic and spec.kind == "on_policy"}
    if name == "squashed_mlp":
        kwargs.update(hidden=tuple(p["hidden"]), activation=p["activation"])
    elif name == "mlp":
        kwargs.update(hidden=tuple(p["hidden"]), activation=p["activation"], normalize_obs=p["normalize_obs"],
                      log_std_init=p["log_std_init"], ortho_init=p["ortho_init"])
    else:
        kwargs.update(log_std_init=p["log_std_init"])
    return kwargs




def _check_off_policy(cfg: DictConfig) -> None:
    """Rules of the asynchronous off-policy runner that the schema cannot state."""
    t = cfg.train
    if cfg.actor.num_workers != 1:
        raise ConfigError(f"actor.num_workers: the off-policy learner runs on one rank, got {cfg.actor.num_workers}")
    if cfg.placement.mode == "auto":
        raise ConfigError("placement.mode: auto is planned for the on-policy runner only; choose the slots of env, rollout and actor")
    if t.max_staleness == 0 and t.sync_every != 1:
        raise ConfigError(
            f"train.sync_every: {t.sync_every} cannot meet train.max_staleness=0 (collect-then-train needs fresh weights every iteration)"
        )
    if t.max_staleness > 0 and t.sync_every > t.max_staleness:
        raise ConfigError(
            f"train.max_staleness: {t.max_staleness} can never be met with train.sync_every={t.sync_every}: "
            f"the learner trains while env workers collect, so transitions reach it up to {t.sync_every} versions old"
        )
    if cfg.policy.name != "squashed_mlp":
        raise ConfigError(
            f"policy.name: {cfg.algorithm.name} learns a tanh-squashed Gaussian actor; set policy.name=squashed_mlp (got '{cfg.policy.name}')"
        )
    if len(cfg.algorithm.adam_betas) != 2:
        raise ConfigError(f"algorithm.adam_betas: needs two values, got {list(cfg.algorithm.adam_betas)}")
