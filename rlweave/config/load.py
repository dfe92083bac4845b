"""Loading a run's configuration: recipe YAML + Hydra overrides, checked against the schema.

Every failure is a :class:`ConfigError` whose message is one line naming the key, raised before any
worker starts.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlweave.config.schema import Config

RECIPES_DIR = Path(__file__).parent / "recipes"


class ConfigError(ValueError):
    """Bad configuration; the message is one line that names the key."""


def list_recipes() -> dict[str, str]:
    """Recipe name -> one-line description (the recipe's ``description`` key)."""
    out = {}
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        data = OmegaConf.load(path)
        out[path.stem] = str(data.get("description", ""))
    return out


def resolve_recipe(recipe: str) -> Path:
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"recipe file not found: {path}")
        return path
    candidate = RECIPES_DIR / f"{recipe}.yaml"
    if not candidate.is_file():
        names = ", ".join(list_recipes())
        raise ConfigError(f"unknown recipe '{recipe}'; known recipes: {names}")
    return candidate


def load_config(recipe: str, overrides: list[str] | tuple[str, ...] = (), carry: dict[str, Any] | None = None) -> DictConfig:
    """Merges the recipe onto the schema, applies Hydra-syntax overrides (``key=value``,
    ``+key=value`` for free-form dicts, ``~key``), and validates. Returns a read-only config.

    ``carry`` (dotted key -> value) is set between the recipe and the overrides: values a chained
    sub-run takes from the run that starts it (:mod:`rlweave.config.chain`)."""
    path = resolve_recipe(recipe)
    cfg = validate(_read_recipe(path), registries=False)  # the overrides may name the plugins
    for key, value in (carry or {}).items():
        OmegaConf.update(cfg, key, value, merge=False)
    apply_overrides(cfg, list(overrides))
    cfg = validate(cfg)
    if not cfg.recipe:
        cfg.recipe = path.stem
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """A recipe file's content. ``base: other-recipe`` at its top starts from that recipe (itself
    possibly based on another) and overrides what this file sets, so a variant states only how it
    differs (``dapo-arith`` is ``grpo-arith`` with DAPO's settings)."""
    try:
        raw = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - YAML syntax errors carry the line
        raise ConfigError(f"{path}: {_one_line(str(e))}") from None
    base = raw.pop("base", None) if isinstance(raw, DictConfig) else None
    if base is None:
        return raw
    base_path = resolve_recipe(str(base))
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        raise ConfigError(f"{path}: base: '{base}' makes a cycle of recipes")
    return OmegaConf.merge(_read_recipe(base_path, seen + (path.resolve(),)), raw)


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """Applies overrides in place. Parsing uses Hydra's own override grammar, so lists, quoting and
    sweeps-free syntax behave as Hydra users expect; unknown keys are refused by the schema."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(_one_line(str(e))) from None
    OmegaConf.set_struct(cfg, True)
    for o in parsed:
        key = o.key_or_group
        try:
            if o.is_delete():
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent) if parent else cfg
                if node is None or leaf not in node:
                    raise ConfigError(f"config key '{key}': cannot delete, not set")
                with _open_dict(node):
                    del node[leaf]
                continue
            value = o.value()
            if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
                # New keys may go only into dict-typed fields (env.kwargs, placement.groups.<name>);
                # '+' is accepted but not required there. Everywhere else the key is unknown.
                leaf = _make_room(cfg, key)
                if leaf is None:
                    raise ConfigError(f"config key '{key}': unknown key")
                with _open_dict(leaf):
                    OmegaConf.update(cfg, key, value, merge=True)
            else:
                OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as e:
            raise ConfigError(_omegaconf_message(e, key)) from None


_MISSING = object()


def _make_room(cfg: DictConfig, key: str):
    """Creates the missing dict entries on the way to ``key`` and returns the node that will hold
    its leaf, or None when the path crosses a schema section (where new keys are not allowed)."""
    parts = key.split(".")
    node = cfg
    for part in parts[:-1]:
        if part not in node:
            if OmegaConf.get_type(node) is not dict:
                return None
            elem = node._metadata.element_type
            with _open_dict(node):
                node[part] = OmegaConf.structured(elem) if dataclasses.is_dataclass(elem) else {}
        node = node[part]
        if not isinstance(node, DictConfig):
            return None
    if parts[-1] not in node and OmegaConf.get_type(node) is not dict:
        return None
    return node


def _open_dict(node):
    from omegaconf import open_dict

    return open_dict(node)


def validate(raw: DictConfig | dict, registries: bool = True) -> DictConfig:
    """Merges ``raw`` onto the schema (unknown keys, wrong types) and checks declared ranges;
    with ``registries``, also the names users can extend (:func:`check_registered`)."""
    schema = OmegaConf.structured(Config)
    try:
        cfg = OmegaConf.merge(schema, raw)
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    _check_ranges(Config, cfg, "")
    if registries:
        check_registered(cfg)
    return cfg


def check_registered(cfg: DictConfig) -> None:
    """Imports ``algorithm.plugins`` (in this process: the driver's lookups need them too) and
    checks ``policy.name`` against the policy registry. A fixed list of choices in the schema
    would refuse what ``register_policy`` adds."""
    from rlweave.models.registry import POLICIES
    from rlweave.utils.plugins import PluginError, import_plugins

    try:
        import_plugins(cfg.algorithm.plugins)
    except PluginError as e:
        raise ConfigError(_one_line(str(e))) from None
    if cfg.policy.name not in POLICIES:
        raise ConfigError(f"policy.name: '{cfg.policy.name}' is not a registered policy; known: {', '.join(sorted(POLICIES))} "
                          "(register_policy adds one, in a module algorithm.plugins names)")


def _check_ranges(cls: type, node: Any, prefix: str) -> None:
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        value = node[f.name]
        sub = _dataclass_type(f)
        if sub is not None:
            _check_ranges(sub, value, key + ".")
            continue
        if value is None:
            continue
        meta = f.metadata
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"{key}: '{value}' is not one of {', '.join(meta['choices'])}")
        if "min" in meta and isinstance(value, (int, float)) and value < meta["min"]:
            raise ConfigError(f"{key}: must be >= {meta['min']}, got {value}")
        if "max" in meta and isinstance(value, (int, float)) and value > meta["max"]:
            raise ConfigError(f"{key}: must be <= {meta['max']}, got {value}")


def _dataclass_type(f: dataclasses.Field) -> type | None:
    factory = f.default_factory
    if factory is not dataclasses.MISSING and isinstance(factory, type) and dataclasses.is_dataclass(factory):
        return factory
    return None


def _omegaconf_message(e: OmegaConfBaseException, key: str | None = None) -> str:
    key = getattr(e, "full_key", None) or key
    msg = str(getattr(e, "msg", None) or e).splitlines()[0]
    msg = re.sub(r"\s+", " ", msg).strip()
    if key:
        return f"config key '{key}': {msg}"
    return _one_line(msg)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
