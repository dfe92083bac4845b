"""A run's policy: the policy a config describes, and the one loader of a trained run's policy.

``rlweave eval``, ``rlweave collect`` and imitation experts (:mod:`rlweave.data.experts`) all load a
run's policy from its folder (``config.yaml`` + ``checkpoints/``) through :func:`load_run_policy`,
and every runner builds its policies from :func:`policy_kwargs`, so a policy is built the same way
wherever it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlweave.algorithms import get_algorithm
from rlweave.models.policies import Policy
from rlweave.models.registry import build_policy
from rlweave.utils.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

__all__ = ["RunPolicy", "RunPolicyError", "load_run_policy", "policy_kwargs", "read_run_config"]


class RunPolicyError(ValueError):
    """A run folder whose policy cannot be loaded; the message is one line naming the folder."""


@dataclass
class RunPolicy:
    """A trained run's policy (in eval mode, with its checkpoint's weights), the run's config and
    the checkpoint folder the weights came from."""

    policy: Policy
    cfg: DictConfig
    checkpoint: Path


def policy_kwargs(cfg: DictConfig) -> dict:
    """``build_policy`` keywords of ``cfg.policy``: the built-in policies take the settings they
    know; a user-registered builder gets every ``policy.*`` setting (it takes ``**kwargs`` for the
    ones it ignores). ``plugins`` (``algorithm.plugins``) travel along, so a worker process that
    builds the policy imports the module that registered it."""
    p = OmegaConf.to_container(cfg.policy)
    name = p.pop("name")
    extra = p.pop("kwargs", None) or {}
    spec = get_algorithm(cfg.algorithm.name)
    kwargs: dict = {"name": name, "critic": spec.uses_critic and spec.kind == "on_policy",
                    "plugins": list(cfg.algorithm.plugins)}
    if name == "squashed_mlp":
        kwargs.update(hidden=tuple(p["hidden"]), activation=p["activation"], state_dependent_std=p["state_dependent_std"])
    elif name == "mlp":
        kwargs.update(hidden=tuple(p["hidden"]), activation=p["activation"], normalize_obs=p["normalize_obs"],
                      log_std_init=p["log_std_init"], ortho_init=p["ortho_init"])
    elif name == "cnn":
        kwargs.update(log_std_init=p["log_std_init"])
    else:
        kwargs.update(p, hidden=tuple(p["hidden"]))
    kwargs.update(extra)
    return kwargs


def read_run_config(run_dir: str | Path) -> DictConfig:
    """The validated ``config.yaml`` of the run in ``run_dir`` (RunPolicyError if there is none;
    ConfigError if it does not validate)."""
    from rlweave.config import validate

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise RunPolicyError(f"{run_dir}: no config.yaml (not a run folder)")
    return validate(OmegaConf.load(run_dir / "config.yaml"))


def load_run_policy(run_dir: str | Path, checkpoint: str | None = None, *, observation_space=None, action_space=None,
                    chunk: int | None = None) -> RunPolicy:
    """The policy of the run in ``run_dir`` with the weights of ``checkpoint`` (a folder name under
    ``checkpoints/``, e.g. ``iter_00000040``; default: the latest verified one), in eval mode.

    ``observation_space`` / ``action_space``: the env the policy is to act in (default: the run's
    own env's); ``chunk``: actions per decision (default: the run's ``env.chunk``). Raises
    RunPolicyError (one line) when the folder holds no run, the checkpoint is missing, or its
    weights do not fit the spaces."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    if checkpoint:
        ckpts = {p.name: p for p in list_checkpoints(run_dir)}
        ckpt = ckpts.get(checkpoint)
        if ckpt is None:
            raise RunPolicyError(f"{run_dir}: no checkpoint {checkpoint} (have: {', '.join(ckpts) or 'none'})")
    else:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise RunPolicyError(f"{run_dir}: no checkpoint to load")
    if observation_space is None or action_space is None:
        from rlweave.envs import space_info

        env_cfg = OmegaConf.to_container(cfg.env)
        observation_space, action_space = space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
    policy = build_policy(observation_space=observation_space, action_space=action_space,
                          chunk=cfg.env.chunk if chunk is None else chunk, **policy_kwargs(cfg))
    try:
        policy.load_state_dict(load_checkpoint(ckpt)["actor"]["policy"])
    except RuntimeError as e:
        raise RunPolicyError(f"{run_dir}: its policy does not fit this env ({str(e).splitlines()[0]})") from None
    policy.eval()
    return RunPolicy(policy, cfg, ckpt)


def initial_policy_state(run_dir: str | Path) -> dict:
    """The policy weights a run starting from ``run_dir`` (``init.checkpoint``: an SFT run, or any
    embodied run) begins with: its newest verified checkpoint's actor policy. RunPolicyError (one
    line) when the folder holds no run or no checkpoint."""
    run_dir = Path(run_dir)
    read_run_config(run_dir)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise RunPolicyError(f"{run_dir}: no checkpoint to start from")
    return load_checkpoint(ckpt)["actor"]["policy"]

