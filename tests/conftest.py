"""Shared test set-up: make the ``tests`` package importable everywhere.

Ray worker processes and subprocesses build the test environments in ``tests/nan_env.py`` by import
path (``tests.nan_env``) and unpickle worker classes defined in test modules by reference (``test_worker``,
imported top-level by pytest), so the repository root and ``tests/`` go on ``sys.path`` here and on
``PYTHONPATH`` before any test starts Ray (Ray's processes inherit the driver's environment).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parent)
REPO_ROOT = str(Path(TESTS_DIR).parent)

for _p in (TESTS_DIR, REPO_ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)
_pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
os.environ["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, TESTS_DIR] + [p for p in _pp if p not in (REPO_ROOT, TESTS_DIR)])
# Nothing outside this machine is reachable: keep Ray from trying to report usage.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MUJOCO_GL", "egl")  # before any test module imports mujoco (importorskip("metaworld") does)


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def ray_session():
    """A fresh local Ray for one test module (``address="local"``: never a cluster someone left
    running); modules that need a worker set-up hook define their own."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def no_cluster_start(monkeypatch):
    """Fails a test whose command starts a cluster: for inputs that must be refused before anything starts."""
    from rlweave.cluster import Cluster

    def refuse(cls, *args, **kwargs):
        raise AssertionError("Cluster.start was called: the input was not refused before anything started")

    monkeypatch.setattr(Cluster, "start", classmethod(refuse))


# The modules that take longest (seconds in `pytest --durations=0`, serial, 2-core AMD EPYC), run
# first: CI runs the suite on two xdist workers, one module to a worker at a time (`--dist loadfile`
# in pyproject.toml), and a long module left for last would keep one worker busy while the other
# idles. Modules not named keep their collection order after these.
LONGEST_FIRST = (
    "test_offpolicy.py", "test_llm_runner.py", "test_fault_tolerance.py", "test_vla_pipeline.py", "test_flow.py",
    "test_bench_vla_flow.py", "test_runtime.py", "test_placement.py", "test_libero_expert.py", "test_robot_training.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
