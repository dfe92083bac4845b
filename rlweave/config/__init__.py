"""Configuration: typed schema, recipe loading with Hydra overrides, one-line errors."""

from rlweave.config.load import ConfigError, list_recipes, load_config, resolve_recipe, to_yaml, validate
from rlweave.config.schema import Config

__all__ = ["Config", "ConfigError", "list_recipes", "load_config", "resolve_recipe", "to_yaml", "validate"]
