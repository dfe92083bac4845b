"""World models as environments: action-conditioned dynamics with reward and termination heads,
trained from the project's datasets, stepped as the ``world_model/<model folder>`` env suite.

Modules: :mod:`base` (the contract and the kind registry), :mod:`ensemble` (the CPU state model),
:mod:`data` (episodes from Minari datasets), :mod:`train` (training and open-loop error),
:mod:`env` (the env suite), :mod:`video` (real vs imagined), :mod:`cli` (the commands).
"""

from rlweave.world_models.base import MODEL_KINDS, WorldModel, WorldModelError, WorldStep, load_world_model

__all__ = ["MODEL_KINDS", "WorldModel", "WorldModelError", "WorldStep", "load_world_model"]
