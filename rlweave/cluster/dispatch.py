"""Declared dispatch: a worker method says how a call on its whole group is split across ranks and
how the ranks' results are gathered, so a driver reads like a one-process program.

Why: without it every runner split data per rank by hand and called methods by string name
(``group.call_each("update", [(shard,) for shard in ...])``), three runners three ways. With it a
worker writes::

    class ActorWorker(Worker):
        @group_method("shard", collect="concat")
        def score(self, rows): ...

and a runner writes ``scores = self.actor.score(batch)``: the group gives each rank its contiguous
share of the rows and concatenates what they return.

Modes (``group_method(mode)``):

* ``all``: every rank gets the same arguments; the result is the list of every rank's result.
* ``rank0``: rank 0 alone; the result is its result.
* ``shard``: the first argument is split into contiguous shares, one per rank (a list, an array, or
  a dict of arrays with one row axis; or the method's own ``shard`` function); the rest go whole.
* ``per_rank``: the first argument is a sequence holding one entry per rank.
* ``peers``: the first argument is another :class:`~rlweave.cluster.WorkerGroup`; rank ``r`` gets a
  peer handle to that group's rank ``r % its size`` (how env workers reach rollout workers).

``blocking=False`` returns a :class:`~rlweave.cluster.Handle` (its ``wait()`` gathers), so a driver
can overlap two groups' calls. ``collect`` turns the ranks' results into the call's result: ``list``
(the default), ``first``, ``concat`` (dicts of arrays joined along rows), or a function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

MODES = ("all", "rank0", "shard", "per_rank", "peers")
COLLECTORS: dict[str, Callable[[list], Any]] = {}

__all__ = ["Dispatch", "MODES", "collect_results", "concat_rows", "declared_methods", "dispatch_of", "group_method", "plan_calls",
           "row_shards", "row_slices"]


@dataclass(frozen=True)
class Dispatch:
    """How a group call of one worker method runs: see the module's docstring."""

    mode: str = "all"
    blocking: bool = True
    shard: Callable[[Any, int], list] | None = None
    collect: str | Callable[[list], Any] = "list"


def group_method(mode: str = "all", *, blocking: bool = True, shard: Callable[[Any, int], list] | None = None,
                 collect: str | Callable[[list], Any] | None = None) -> Callable:
    """Declares a worker method callable on its whole group as ``group.method(...)``."""
    if mode not in MODES:
        raise ValueError(f"group_method: mode '{mode}' is not one of {', '.join(MODES)}")
    if shard is not None and mode != "shard":
        raise ValueError("group_method: a shard function needs mode 'shard'")
    if collect is None:
        collect = "first" if mode == "rank0" else "list"
    if isinstance(collect, str) and collect not in COLLECTORS:
        raise ValueError(f"group_method: collect '{collect}' is not one of {', '.join(COLLECTORS)}")
    spec = Dispatch(mode, blocking, shard, collect)

    def declare(fn: Callable) -> Callable:
        fn.__rlweave_dispatch__ = spec
        return fn

    return declare


def dispatch_of(cls: type, name: str) -> Dispatch | None:
    """The declared dispatch of ``cls.name``, or None when it is not a group method."""
    return getattr(getattr(cls, name, None), "__rlweave_dispatch__", None)


def declared_methods(cls: type) -> list[str]:
    """The names of ``cls``'s group methods."""
    return [name for name in dir(cls) if not name.startswith("_") and dispatch_of(cls, name) is not None]


def plan_calls(spec: Dispatch, group: Any, method: str, args: tuple, kwargs: dict) -> list[tuple[int, tuple, dict]]:
    """The (rank, args, kwargs) of each call a group call makes under ``spec``."""
    n = group.world_size
    if spec.mode == "all":
        return [(r, args, kwargs) for r in range(n)]
    if spec.mode == "rank0":
        return [(0, args, kwargs)]
    if not args:
        raise TypeError(f"{group.name}.{method}: a '{spec.mode}' call needs its first argument")
    first, rest = args[0], args[1:]
    if spec.mode == "shard":
        shares = (spec.shard or row_shards)(first, n)
        return [(r, (shares[r], *rest), kwargs) for r in range(n)]
    if spec.mode == "per_rank":
        if len(first) != n:
            raise ValueError(f"{group.name}.{method}: {len(first)} per-rank values for {n} ranks")
        return [(r, (first[r], *rest), kwargs) for r in range(n)]
    other = first  # peers
    return [(r, (other.peer(r % other.world_size, group.hosts[r]), *rest), kwargs) for r in range(n)]


def collect_results(spec: Dispatch, results: list) -> Any:
    """The call's result from the ranks' results, per ``spec.collect``."""
    how = spec.collect
    return how(results) if callable(how) else COLLECTORS[how](results)


# --------------------------------------------------------------------------- splitting and joining rows
def row_slices(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices of ``range(n)``, sizes differing by at most one (the first ones
    larger): rank r's share of n rows."""
    k, r = divmod(n, parts)
    out, s = [], 0
    for i in range(parts):
        e = s + k + (i < r)
        out.append(slice(s, e))
        s = e
    return out


def row_shards(data: Any, parts: int) -> list:
    """``data`` (a list, an array, or a dict whose values share one row count) in ``parts``
    contiguous shares."""
    if isinstance(data, dict):
        lengths = {len(v) for v in data.values()}
        if len(lengths) > 1:
            raise ValueError(f"shard: the dict's values have different row counts {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        return [{k: v[s] for k, v in data.items()} for s in row_slices(n, parts)]
    if isinstance(data, (list, tuple, np.ndarray)) or hasattr(data, "__getitem__"):
        return [data[s] for s in row_slices(len(data), parts)]
    raise TypeError(f"shard: cannot split a {type(data).__name__} into rows")


def concat_rows(results: Sequence[dict]) -> dict:
    """Dicts of arrays from each rank, joined along rows (the inverse of :func:`row_shards`)."""
    return {k: np.concatenate([np.asarray(r[k]) for r in results]) for k in results[0]}


COLLECTORS.update({"list": list, "first": lambda results: results[0], "concat": concat_rows})
