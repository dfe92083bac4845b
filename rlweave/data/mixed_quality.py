"""Mixed-quality datasets for RECAP: expert, noisy-expert and failing episodes in one Minari
dataset, the kind of experience RECAP learns from (demonstrations beside autonomous rollouts of any
quality).

    python -m rlweave.data.mixed_quality recap-push -o data/recap/push-mixed \\
        --part expert:20 --part noisy=0.5:20 --part wrong_goal=0.15:20 [key=value ...]

Each ``--part SOURCE[=LEVEL]:EPISODES`` adds that many episodes of a behaviour built on one expert
(``--expert module:function``, MetaWorld push's scripted policy by default):

* ``expert``: the expert as it is;
* ``noisy=SIGMA``: the expert plus Gaussian action noise of std SIGMA, clipped to the action box
  (zero-mean noise: behaviour cloning averages it out where the states are the same, but the
  episodes drift to states the expert never visits and succeed less often);
* ``wrong_goal=D``: the expert told the goal is D metres away (along x) from where it is:
  confident, smooth, and systematically wrong at the states the good data also visits, which is
  what a behaviour-cloned policy cannot tell apart from the expert and an advantage can. It
  assumes MetaWorld's flat observation, whose last three entries are the goal position.

All episodes go through one ``collect_dataset`` run (one reset seed stream: no two episodes share a
start), the behaviour switching at each reset. The dataset's rewards are the env's (with
``env.kwargs.reward: success`` the return is the success flag). ``sources.json`` beside the data
names each episode's source; the command prints the success rate per source.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np

__all__ = ["Part", "parse_part", "behaviour", "collect_mixed", "main"]

SOURCES = ("expert", "noisy", "wrong_goal")


@dataclass(frozen=True)
class Part:
    """``episodes`` episodes of ``source`` at ``level`` (noise std, or goal offset in metres)."""

    source: str
    level: float
    episodes: int

    @property
    def name(self) -> str:
        return self.source if self.source == "expert" else f"{self.source}={self.level:g}"


def parse_part(text: str) -> Part:
    """``SOURCE[=LEVEL]:EPISODES`` -> :class:`Part` (ValueError naming the text otherwise)."""
    m = re.fullmatch(r"(\w+)(?:=([-+0-9.eE]+))?:(\d+)", text.strip())
    if not m or m.group(1) not in SOURCES:
        raise ValueError(f"--part {text!r}: expected SOURCE[=LEVEL]:EPISODES with SOURCE one of {', '.join(SOURCES)}")
    source, level, episodes = m.group(1), float(m.group(2) or 0.0), int(m.group(3))
    if source != "expert" and m.group(2) is None:
        raise ValueError(f"--part {text!r}: {source} needs a level ({source}=LEVEL:EPISODES)")
    if source == "noisy" and level < 0:
        raise ValueError(f"--part {text!r}: the noise std must be >= 0")
    return Part(source, level, episodes)


def behaviour(part: Part, expert: Callable[[np.ndarray], np.ndarray], action_space: gym.spaces.Box,
              rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """``act(obs) -> action`` of ``part``'s source around ``expert`` (one observation in, one
    action out, clipped to the action box)."""
    low, high = action_space.low, action_space.high

    def base(obs: np.ndarray) -> np.ndarray:
        return np.asarray(expert(np.asarray(obs)[None]), dtype=np.float32).reshape(action_space.shape)

    if part.source == "expert":
        return base
    if part.source == "noisy":
        def noisy(obs: np.ndarray) -> np.ndarray:
            a = base(obs) + part.level * rng.standard_normal(action_space.shape)
            return np.clip(a, low, high).astype(np.float32)
        return noisy

    def wrong_goal(obs: np.ndarray) -> np.ndarray:
        seen = np.array(obs, dtype=np.float64, copy=True)
        seen[-3] += part.level  # MetaWorld flat observation: the goal is the last three entries
        return base(seen)
    return wrong_goal


class _ResetHook(gym.Wrapper):
    """Calls ``on_reset()`` before each reset: the collector's behaviour switches per episode."""

    def __init__(self, env: gym.Env, on_reset: Callable[[], None]):
        super().__init__(env)
        self._on_reset = on_reset

    def reset(self, **kwargs):
        self._on_reset()
        return self.env.reset(**kwargs)


def collect_mixed(recipe: str, parts: list[Part], out: str | Path, expert_spec: str, seed: int = 0,
                  overrides: list[str] | None = None) -> dict:
    """Collects ``parts`` (in order) on ``recipe``'s env into one Minari dataset at ``out``;
    returns ``collect_dataset``'s summary plus ``success_by_source`` and writes
    ``out/sources.json`` (each episode's source and success)."""
    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.data.datasets import collect_dataset
    from rlweave.data.experts import load_expert
    from rlweave.envs import env_maker, space_info

    cfg = load_config(recipe, overrides or [])
    env_cfg = OmegaConf.to_container(cfg.env)
    obs_space, act_space = space_info(cfg.env.id, env_cfg["pixels"], env_cfg["kwargs"])
    expert = load_expert(expert_spec, obs_space, act_space)
    rng = np.random.default_rng(seed + 1)
    schedule = [p for p in parts for _ in range(p.episodes)]
    acts = {p: behaviour(p, expert, act_space, rng) for p in parts}
    state = {"episode": -1}
    outcomes: list[dict] = []

    def on_reset() -> None:
        state["episode"] += 1

    def act(obs: np.ndarray) -> np.ndarray:
        return acts[schedule[state["episode"]]](obs)

    kwargs = dict(env_cfg["kwargs"])
    if cfg.env.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.env.max_episode_steps
    make = env_maker(cfg.env.id)
    if "slot" in inspect.signature(make).parameters:
        kwargs["slot"] = 0

    class _Outcome(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                outcomes.append({"source": schedule[state["episode"]].name, "success": float(info.get("success", 0.0))})
            return obs, reward, terminated, truncated, info

    name = re.sub(r"[^A-Za-z0-9_]+", "_", Path(out).name).strip("_") or "dataset"
    info = collect_dataset(lambda **kw: _ResetHook(_Outcome(make(**kwargs, **kw)), on_reset), act, len(schedule), out, name,
                           seed=seed, description=f"{cfg.env.id}: mixed quality ({', '.join(f'{p.name}:{p.episodes}' for p in parts)})")
    (Path(out) / "sources.json").write_text(json.dumps(outcomes))
    by_source: dict[str, list[float]] = {}
    for o in outcomes:
        by_source.setdefault(o["source"], []).append(o["success"])
    info["success_by_source"] = {k: float(np.mean(v)) for k, v in by_source.items()}
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlweave.data.mixed_quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", help="recipe name or YAML path whose env collects")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    ap.add_argument("-o", "--out", required=True, help="dataset folder to write (must not exist)")
    ap.add_argument("--part", action="append", required=True, help="SOURCE[=LEVEL]:EPISODES (repeatable)")
    ap.add_argument("--expert", default="rlweave.envs.dsrl:metaworld_push_expert", help="module:function or a run folder")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        parts = [parse_part(p) for p in args.part]
        info = collect_mixed(args.recipe, parts, args.out, args.expert, args.seed, args.overrides)
    except Exception as e:  # noqa: BLE001 - one line for the user
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
