"""Chained sub-runs: a run that first runs another recipe (an SFT warm-up before RL) and starts
from its result.

Why this exists: a warm-up that runs with its own recipe's task or model silently trains the wrong
thing (RL on subtraction started from a model warmed up on addition never sees a reward). So the
sub-run's config is built here, once, for every chain: its own recipe, then what it must share with
the run that starts it, then the user's explicit sub-run overrides, then the run-wide settings.

What is shared depends on the kind of run (:data:`CARRIED`):

* language models: ``model.*`` and ``task.*`` whole (the sub-run trains the very model the run
  continues, whose architecture must match for its weights to load, on the run's task: what the
  user asked for), and ``rollout.max_new_tokens`` (its evaluation answers are as long as the run's)
  and the agent's tools, limits and workflow (``agent.tools``, ``max_turns``, ``max_tokens``,
  ``tool_timeout_s``, ``workflow``: the warm-up learns and is evaluated on the episodes RL runs, of
  every role);
* embodied policies (a VLA's SFT before PPO): ``policy.*`` whole (the architecture) and the env
  settings that define the task and what the policy sees: ``env.id``, ``env.chunk``,
  ``env.pixels``, ``env.max_episode_steps``, ``env.kwargs``, ``env.eval_kwargs`` (not the number of
  envs or workers: those are each run's own);
* both: the ``data.*`` keys the run sets (differing from the schema's defaults): the RL recipe
  itself uses no SFT data, so a ``data.*`` it carries is meant for its warm-up.

Free-form dict settings (``policy.kwargs``, ``env.kwargs``, ``env.eval_kwargs``) are carried whole,
not key by key, so the sub-run has exactly the run's (a key only the sub-recipe had would build
another architecture).

``init.sft_overrides`` (the sub-run's own settings, e.g. its learning rate) apply after these, so a
user can still give the warm-up anything explicitly.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlweave.config.load import ConfigError, load_config, validate
from rlweave.config.schema import Config

# run kind -> (sections carried whole, single keys carried, sections whose set keys are carried)
CARRIED: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "llm": (("model", "task"), ("rollout.max_new_tokens", "agent.tools", "agent.max_turns", "agent.max_tokens",
                                "agent.tool_timeout_s", "agent.workflow"), ("data",)),
    "embodied": (("policy",), ("env.id", "env.chunk", "env.pixels", "env.max_episode_steps", "env.kwargs", "env.eval_kwargs"),
                 ("data",)),
}
WARMUP_DONE = "warmup-done.json"  # in RUN/sft once the warm-up finished: later attempts of the run start RL from it
WHOLE = ("kwargs", "eval_kwargs")  # free-form dict settings carried as one value

__all__ = ["CARRIED", "WARMUP_DONE", "SubRun", "carried_values", "sub_run_config", "warmup_config"]


class SubRun:
    """A chained sub-run's config and the keys it took from the run that starts it."""

    def __init__(self, recipe: str, cfg: DictConfig, differs: dict[str, Any]):
        self.recipe = recipe
        self.cfg = cfg
        self.differs = differs  # carried keys whose value is not the sub-recipe's own

    def describe(self) -> str:
        """One line: what the sub-run took from this run that its own recipe does not say."""
        if not self.differs:
            return "the same model and task as this run"
        return "this run's " + ", ".join(f"{k}={_short(v)}" for k, v in self.differs.items())

    def refuse(self, error: Exception) -> ConfigError:
        """The one-line refusal when the sub-recipe cannot run with what it took from this run."""
        keys = ", ".join(self.differs) or "settings"
        return ConfigError(f"init.sft_recipe: '{self.recipe}' cannot run with {keys} from this run: {error}")


def carried_values(cfg: DictConfig) -> dict[str, Any]:
    """The dotted keys (and values) a sub-run takes from ``cfg``."""
    sections, keys, set_sections = CARRIED["llm" if cfg.runner == "llm" else "embodied"]
    out: dict[str, Any] = {}
    for section in sections:
        out.update(_flatten(OmegaConf.to_container(cfg[section]), section))
    for key in keys:
        out.update(_flatten(_plain(OmegaConf.select(cfg, key)), key))
    defaults = OmegaConf.structured(Config)
    for section in set_sections:
        given = _flatten(OmegaConf.to_container(cfg[section]), section)
        base = _flatten(OmegaConf.to_container(defaults[section]), section)
        out.update({k: v for k, v in given.items() if base.get(k) != v})
    return out


def sub_run_config(cfg: DictConfig, recipe: str, overrides: list[str], run_wide: dict[str, Any]) -> SubRun:
    """``recipe`` with the values it shares with ``cfg``, then ``overrides`` (the sub-run's own),
    then ``run_wide`` (seed, cluster, progress, trackers: dotted key -> value, set as values, never
    parsed as override text). Errors name the sub-recipe's key."""
    carry = carried_values(cfg)
    try:
        own = load_config(recipe)
        sub = OmegaConf.create(OmegaConf.to_container(load_config(recipe, list(overrides), carry=carry)))
        for key, value in run_wide.items():
            OmegaConf.update(sub, key, value, merge=False)
        sub = validate(sub)
    except ConfigError as e:
        raise ConfigError(f"init.sft_recipe: {e}") from None
    OmegaConf.set_readonly(sub, True)
    # carried keys the sub-recipe says otherwise, and that its own overrides did not set again
    differs = {k: v for k, v in carry.items()
               if _plain(OmegaConf.select(own, k)) != v and _plain(OmegaConf.select(sub, k)) == v}
    return SubRun(recipe, sub, differs)


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict) and prefix.rpartition(".")[2] not in WHOLE:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}"))
        return out
    return {prefix: node}


def _plain(v: Any) -> Any:
    return OmegaConf.to_container(v) if isinstance(v, DictConfig) or OmegaConf.is_list(v) else v


def _short(v: Any) -> str:
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def warmup_config(cfg: DictConfig) -> SubRun:
    """The warm-up run of ``cfg``: ``init.sft_recipe`` with what it shares with this run (see the
    module's docstring), ``init.sft_overrides``, this run's seed and cluster, and no progress line
    of its own."""
    r = cfg.run
    run_wide = {"seed": cfg.seed, "run.progress": r.progress, "run.tensorboard": r.tensorboard,
                "cluster.local": cfg.cluster.local, "run.loggers": list(r.loggers),
                # the warm-up's tracker run sits beside the run's: same project, group and tags
                "run.group": r.group or cfg.recipe or None, "run.project": r.project, "run.tags": list(r.tags)}
    return sub_run_config(cfg, cfg.init.sft_recipe, list(cfg.init.sft_overrides), run_wide)

