"""Checks of a run's config that the schema cannot make, shared by the runners: the algorithm
against the runner, the env's spaces against the policy, the placement against the cluster. Each
refusal is one line naming the key, before anything starts."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms import ALGORITHMS, AlgorithmSpec, algorithm_loss, get_algorithm, has_concurrent_parts
from rlweave.algorithms.losses import value_part_of
from rlweave.cluster import Cluster, PlacementError, make_plan
from rlweave.config import ConfigError
from rlweave.envs import space_info
from rlweave.models import build_policy
from rlweave.models.run_policy import policy_kwargs

__all__ = ["algorithm_for_runner", "check_compatible", "check_compatible_policy", "check_update_threads", "plan_placement"]


def algorithm_for_runner(cfg: DictConfig):
    """The config's algorithm spec, refused on one line when unknown or not made for ``cfg.runner``."""
    try:
        spec = get_algorithm(cfg.algorithm.name)
    except KeyError as e:
        raise ConfigError(f"algorithm.name: {e.args[0]}") from None
    if cfg.runner not in spec.runners:
        raise ConfigError(
            f"algorithm.name: '{spec.name}' is an {spec.kind.replace('_', '-')} algorithm; it runs with "
            f"runner={' or '.join(spec.runners)} (this config has runner={cfg.runner})"
        )
    return spec


def check_compatible(cfg: DictConfig):
    """Checks what the schema cannot (cross-field rules, env and policy fit) before any worker
    starts. Returns the env's (observation_space, action_space)."""
    obs_space, act_space, _ = check_compatible_policy(cfg)
    return obs_space, act_space


def check_compatible_policy(cfg: DictConfig):
    """:func:`check_compatible`, also returning the policy it builds to check the fit (initialised
    from torch's current random state): ``(observation_space, action_space, policy)``."""
    spec = algorithm_for_runner(cfg)
    if spec.kind in ("off_policy", "imitation", "offline"):
        _check_off_policy(cfg)
    if cfg.run.deterministic and cfg.placement.mode == "auto":
        raise ConfigError(
            "run.deterministic: placement.mode=auto re-plans from timings, and a layout change ends running episodes; "
            "choose the slots (placement.mode collocated, disaggregated or hybrid)"
        )
    if cfg.actor.strategy == "fsdp":
        raise ConfigError("actor.strategy: fsdp shards language models; this workflow's actor replicates its policy "
                          "on every rank (ddp or auto)")
    if cfg.actor.precision != "float32" and spec.kind not in ("off_policy", "imitation", "offline"):
        raise ConfigError(f"actor.precision: {cfg.actor.precision} applies to the off-policy learner; "
                          f"{spec.name}'s actor trains in float32")
    check_update_threads(cfg, spec)
    if cfg.algorithm.critic_warmup_iterations and not (spec.kind == "on_policy" and spec.uses_critic):
        raise ConfigError(f"algorithm.critic_warmup_iterations: {spec.name} trains no critic (PPO's value head is what it warms up)")
    if cfg.algorithm.target_kl is not None and spec.kind != "on_policy":
        raise ConfigError(f"algorithm.target_kl: {spec.name} takes no epochs of ratio-clipped steps (on-policy PPO/GRPO do)")
    if (spec.kind == "offline" or cfg.runner == "policy_sft") and cfg.train.total_updates < 1:
        raise ConfigError(f"train.total_updates: {spec.name} learns from a dataset alone; give the number of gradient updates (> 0)")
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
        policy = build_policy(observation_space=obs_space, action_space=act_space, chunk=cfg.env.chunk, **policy_kwargs(cfg))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy.name: {str(e).splitlines()[0]}") from None
    if cfg.init.checkpoint:
        from rlweave.models.run_policy import RunPolicyError, initial_policy_state

        try:
            initial_policy_state(cfg.init.checkpoint)
        except RunPolicyError as e:
            raise ConfigError(f"init.checkpoint: {e}") from None
    if cfg.init.sft_recipe and not cfg.init.checkpoint and cfg.runner != "llm":
        _check_warmup(cfg)
    if cfg.runner == "policy_sft":
        _check_demonstrations(cfg, obs_space, act_space)
    elif spec.needs_dataset and not cfg.replay.offline_dataset:
        raise ConfigError(
            f"replay.offline_dataset: {spec.name} learns from a dataset{'' if spec.kind == 'offline' else ' beside online data'}; "
            "make one with 'rlweave collect RUN_DIR --episodes N -o FOLDER' and pass its folder"
        )
    if spec.kind == "imitation":
        from rlweave.data.experts import ExpertError, load_expert

        if not cfg.imitation.expert:
            raise ConfigError(f"imitation.expert: {spec.name} needs an expert: a run folder or module:function")
        try:
            load_expert(cfg.imitation.expert, obs_space, act_space)
        except ExpertError as e:
            raise ConfigError(f"imitation.expert: {e}") from None
    if spec.kind in ("off_policy", "offline") and cfg.replay.offline_dataset:
        from rlweave.data.datasets import DatasetError, check_spaces

        try:
            check_spaces(cfg.replay.offline_dataset, obs_space, act_space)
        except (DatasetError, ImportError) as e:
            raise ConfigError(f"replay.offline_dataset: {e}") from None
    return obs_space, act_space, policy


def _check_warmup(cfg: DictConfig) -> None:
    """``init.sft_recipe``: a supervised recipe for policies that can run with this run's policy and
    env settings (its demonstrations included), checked before anything starts."""
    from rlweave.config.chain import warmup_config

    sub = warmup_config(cfg)
    if sub.cfg.runner != "policy_sft":
        raise ConfigError(f"init.sft_recipe: '{cfg.init.sft_recipe}' is not a supervised fine-tuning recipe for policies "
                          f"(its runner is {sub.cfg.runner}; need policy_sft)")
    try:
        check_compatible(sub.cfg)
    except ConfigError as e:
        raise sub.refuse(e) from None


def _check_demonstrations(cfg: DictConfig, obs_space, act_space) -> None:
    """``runner: policy_sft`` learns from ``data.path``, a dataset whose spaces are the env's."""
    from rlweave.data.datasets import DatasetError
    from rlweave.data.demos import check_demonstration_spaces

    if not cfg.data.path:
        raise ConfigError("data.path: supervised fine-tuning of a policy learns from demonstrations; make them with "
                          "'rlweave collect RECIPE --expert module:function --episodes N -o FOLDER' and pass its folder")
    try:
        check_demonstration_spaces(cfg.data.path, obs_space, act_space)
    except (DatasetError, ImportError) as e:
        raise ConfigError(f"data.path: {e}") from None


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


def check_update_threads(cfg: DictConfig, spec: AlgorithmSpec) -> None:
    """``actor.update_threads`` > 1 needs an update made of concurrent parts: the critic's and the
    actor's (SAC, RLPD), or an on-policy loss whose value terms run apart (PPO, on one actor rank)."""
    if cfg.actor.update_threads == 1 or has_concurrent_parts(algorithm_loss(spec)):
        return
    if spec.kind == "on_policy" and cfg.runner == "onpolicy" and spec.uses_critic and value_part_of(algorithm_loss(spec)):
        if cfg.actor.num_workers > 1:
            raise ConfigError(f"actor.update_threads: {cfg.actor.update_threads} runs the value loss in a helper process of "
                              f"the one actor rank; this config has actor.num_workers={cfg.actor.num_workers}")
        return
    splits = sorted(n for n, a in ALGORITHMS.items() if has_concurrent_parts(algorithm_loss(a)) or
                    (a.kind == "on_policy" and a.uses_critic and value_part_of(algorithm_loss(a))))
    raise ConfigError(f"actor.update_threads: {cfg.actor.update_threads} runs two parts of an update at the same time "
                      f"(the critic's and the actor's, or the value and the policy losses); {spec.name}'s update has no "
                      f"such parts ({', '.join(splits)} have)")


# the actors of the off-policy learner (sample / sample_noise with tanh-squashed actions): the
# Gaussian one and the flow one (SAC Flow)
_SQUASHED_ACTORS = ("squashed_mlp", "flow_sac")


def _check_off_policy(cfg: DictConfig) -> None:
    """Rules of the asynchronous off-policy runner that the schema cannot state."""
    t = cfg.train
    if cfg.actor.num_workers != 1:
        raise ConfigError(f"actor.num_workers: the off-policy learner runs on one rank, got {cfg.actor.num_workers}")
    if t.max_staleness == 0 and t.sync_every != 1:
        raise ConfigError(
            f"train.sync_every: {t.sync_every} cannot meet train.max_staleness=0 (collect-then-train needs fresh weights every iteration)"
        )
    if t.max_staleness > 0 and t.sync_every > t.max_staleness:
        raise ConfigError(
            f"train.max_staleness: {t.max_staleness} can never be met with train.sync_every={t.sync_every}: "
            f"the learner trains while env workers collect, so transitions reach it up to {t.sync_every} versions old"
        )
    if cfg.policy.name not in _SQUASHED_ACTORS:
        raise ConfigError(
            f"policy.name: {cfg.algorithm.name} learns a tanh-squashed Gaussian actor or flow actor; set policy.name=squashed_mlp "
            f"or flow_sac (got '{cfg.policy.name}')"
        )
    if cfg.policy.name == "flow_sac" and cfg.algorithm.name == "iql":
        raise ConfigError("policy.name: iql extracts its policy by the density of dataset actions, which flow_sac has no "
                          "closed form for; set policy.name=squashed_mlp")
    if cfg.policy.get("normalize_obs") and not (cfg.get("init") and (cfg.init.checkpoint or cfg.init.sft_recipe)):
        raise ConfigError("policy.normalize_obs: an off-policy actor normalises by fixed statistics that a behaviour-cloning run "
                          "fits on its demonstrations; set init.checkpoint (or init.sft_recipe) to one, or normalize_obs=false")
    if len(cfg.algorithm.adam_betas) != 2:
        raise ConfigError(f"algorithm.adam_betas: needs two values, got {list(cfg.algorithm.adam_betas)}")
