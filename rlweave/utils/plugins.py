"""Plugin modules: user code that fills rlweave's registries when imported.

A registration (``register_policy``, ``register_policy_loss``, ...) lives in the process that ran
it. A run's worker processes are fresh Python processes (Ray actors), so a name registered by the
user's script would be unknown there. Instead the config names the modules that register things
(``algorithm.plugins=[my_pkg.algos]``); the driver imports them when it checks the config, and
every worker imports them before its first registry lookup. Importing is idempotent (Python caches
modules), so calling this from several places costs nothing after the first time.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

__all__ = ["PluginError", "import_object", "import_plugins"]


class PluginError(ImportError):
    """A plugin module failed to import; the message is one line naming the module."""


def import_plugins(modules: Iterable[str] | None) -> None:
    """Import each module of ``modules`` (dotted names, as ``import`` takes them)."""
    for name in modules or ():
        try:
            importlib.import_module(str(name))
        except Exception as e:  # noqa: BLE001 - any failure of user code is reported the same way
            first = (str(e).splitlines() or [""])[0]
            raise PluginError(f"algorithm.plugins: cannot import '{name}': {type(e).__name__}: {first}") from e


def import_object(spec: str):
    """The object a ``module:attribute`` string names (lazy registry entries, user functions given in
    a config). Raises ImportError / AttributeError as Python does, and ValueError for a string
    without both parts; callers wrap them into their own one-line, key-naming errors."""
    module, sep, attr = str(spec).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
