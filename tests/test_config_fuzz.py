"""Malformed configuration, generated from the schema: every bad value of every key is refused
before anything starts, with one line that names the key and no traceback."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from helpers import QUIET
from rlweave.cli import main
from rlweave.config.schema import Config

# free-form sections (names chosen by the user) and keys whose every string is valid
_SKIP = {"placement.groups", "env.kwargs", "recipe", "description", "run.dir", "cluster.address", "env.id",
         "replay.offline_dataset", "imitation.expert", "imitation.operator", "algorithm.name", "policy.name"}


def _leaves(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if key in _SKIP:
            continue
        factory = f.default_factory
        if factory is not dataclasses.MISSING and isinstance(factory, type) and dataclasses.is_dataclass(factory):
            yield from _leaves(factory, key + ".")
        else:
            yield key, hints[f.name], f.metadata


def _bad_values(tp, meta) -> list[str]:
    args = typing.get_args(tp)
    base = next((a for a in args if a is not type(None)), tp) if typing.get_origin(tp) is typing.Union else tp
    out = []
    if base is bool:
        out.append("maybe")
    elif base in (int, float):
        out.append("seven")
        if base is int:
            out.append("2.5")
        if "min" in meta:
            out.append(str(meta["min"] - (1 if base is int else 0.5)))
        if "max" in meta:
            out.append(str(meta["max"] + 1))
    elif base is str and "choices" in meta:
        out.append("no_such_choice")
    elif typing.get_origin(base) in (list, typing.List):
        out.append("[a,b]" if typing.get_args(base)[0] in (int, float) else "{x: 1}")
    return out


CASES = [(key, v) for key, tp, meta in _leaves(Config) for v in _bad_values(tp, meta)]


def test_the_fuzz_covers_the_schema():
    keys = {k for k, _ in CASES}
    assert len(CASES) >= 150 and {"train.total_env_steps", "algorithm.expectile", "critic.norm", "env.num_envs"} <= keys


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_every_malformed_value_is_refused_naming_its_key(capsys, tmp_path, no_cluster_start, key, value):
    rc = main(["train", "ppo-cartpole", f"{key}={value}", f"run.dir={tmp_path / 'r'}", *QUIET])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("rlweave: error: ") and key in err, err
    assert not (tmp_path / "r").exists()


CONTRADICTIONS = [
    (["algorithm.name=sac"], "algorithm.name"),
    (["env.num_workers=3", "actor.num_workers=2"], "actor.num_workers"),
    (["algorithm.name=grpo", "env.num_envs=6", "algorithm.group_size=4"], "algorithm.group_size"),
    (["env.id=NoSuchEnv-v0"], "env.id"),
    (["placement.groups.nosuch.slots=0"], "placement.groups"),
    (["placement.groups.actor.slots=0-7"], "placement.groups.actor"),
    (["train.bogus=1"], "train.bogus"),
    (["nosection.x=1"], "nosection"),
    (["policy.name=squashed_mlp"], "policy.name"),
]


@pytest.mark.parametrize("overrides, key", CONTRADICTIONS, ids=[" ".join(o) for o, _ in CONTRADICTIONS])
def test_contradictions_and_unknown_keys_are_refused_naming_the_key(capsys, tmp_path, no_cluster_start, overrides, key):
    rc = main(["train", "ppo-cartpole", *overrides, f"run.dir={tmp_path / 'r'}", *QUIET])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and key in err and "Traceback" not in err, err


def test_a_broken_recipe_file_is_refused_naming_file_and_line(capsys, tmp_path, no_cluster_start):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("env:\n  id: CartPole-v1\n  num_envs: [4\ntrain:\n  total_env_steps: 100\n")
    rc = main(["train", str(recipe), f"run.dir={tmp_path / 'r'}", *QUIET])
    _, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(recipe) in err and "line" in err, err


@pytest.mark.parametrize("recipe", sorted(__import__("rlweave.config.load", fromlist=["list_recipes"]).list_recipes()))
def test_every_packaged_recipe_passes_the_schema(recipe):
    """A typo in a packaged recipe (an unknown key, a value of the wrong type) fails here, not in a user's run."""
    from rlweave.config import load_config

    cfg = load_config(recipe, [])
    assert cfg.recipe == recipe and cfg.description
