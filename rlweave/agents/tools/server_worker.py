"""Tools as a worker group: :class:`ToolServerWorker` holds a :class:`ToolBox` in its own process(es), and
:class:`GroupToolBox` gives the agent loop the ToolBox interface over such a group.

Why: sandboxed Python, BM25 indexes and MCP server processes cost memory and CPU that should not
sit in the rollout process (which holds the model), and a pool of tool workers can be placed on
other nodes and sized by the planner like any other group. Calls are spread over the ranks in
contiguous shares (``shard`` dispatch) and the results come back in call order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rlweave.agents.tools.base import ERROR_KINDS, ToolCall, ToolResult, make_toolbox
from rlweave.cluster import Worker
from rlweave.cluster.dispatch import group_method


def _flatten(per_rank: list[list[ToolResult]]) -> list[ToolResult]:
    return [r for rank_results in per_rank for r in rank_results]


class ToolServerWorker(Worker):
    """One rank of a tool-server group: the tools of ``tools`` (the ``agent.tools`` entries)."""

    def __init__(self, tools: Sequence[Any], max_chars: int | None = None):
        kwargs = {} if max_chars is None else {"max_chars": max_chars}
        self.box = make_toolbox(tools, **kwargs)

    @group_method("rank0")
    def specs(self) -> list[dict]:
        return self.box.specs()

    @group_method("shard", collect=_flatten)
    def execute(self, calls: list[ToolCall]) -> list[ToolResult]:
        """This rank's share of the calls, run concurrently; bad calls are results, never raised."""
        return self.box.execute_sync(calls) if calls else []

    @group_method("all")
    def error_counts(self) -> dict[str, int]:
        return {**self.box.counts, "calls": self.box.n_calls}

    @group_method("all")
    def reset_counts(self) -> None:
        self.box.reset_counts()

    @group_method("all")
    def close_tools(self) -> None:
        self.box.close()


class GroupToolBox:
    """The :class:`ToolBox` interface (``specs``, ``execute``, ``execute_sync``, ``counts``) over a
    :class:`~rlweave.cluster.WorkerGroup` of :class:`ToolServerWorker`, for the agent loop."""

    def __init__(self, group: Any):
        self.group = group
        self._specs: list[dict] | None = None

    def specs(self) -> list[dict]:
        if self._specs is None:
            self._specs = self.group.specs()
        return self._specs

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.specs()]

    def execute_sync(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return self.group.execute(list(calls)) if calls else []

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return await asyncio.to_thread(self.execute_sync, calls)

    @property
    def counts(self) -> dict[str, int]:
        """Error counts by kind, summed over the ranks."""
        per_rank = self.group.error_counts()
        return {kind: sum(c[kind] for c in per_rank) for kind in ERROR_KINDS}

    @property
    def n_calls(self) -> int:
        return sum(c["calls"] for c in self.group.error_counts())

    def reset_counts(self) -> None:
        self.group.reset_counts()

    def close(self) -> None:
        self.group.close_tools()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
