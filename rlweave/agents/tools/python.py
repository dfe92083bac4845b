"""``python``: runs model-written code in :class:`rlweave.agents.sandbox.Sandbox` and reports its output.

A program that crashes or is killed is a normal observation (its traceback or the limit it hit is
what the model needs to see), not a tool error; only a sandbox that cannot start is ``failed``.
Isolation is checked when the tool is built, so a machine without namespaces is refused before the
first rollout rather than on the first call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from rlweave.agents.sandbox import Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable
from rlweave.agents.tools.base import Tool, ToolConfigError, ToolError, ToolSpec, register_tool


def format_result(res: SandboxResult) -> str:
    """The observation: exit status, then stdout and stderr (each already bounded by the sandbox)."""
    parts = [f"[{res.summary()}]"]
    if res.stdout:
        parts.append("stdout:\n" + res.stdout.rstrip("\n"))
    if res.stderr:
        parts.append("stderr:\n" + res.stderr.rstrip("\n"))
    if not res.stdout and not res.stderr:
        parts.append("(no output)")
    return "\n".join(parts)


class PythonTool(Tool):
    """Executes a Python program in a fresh sandbox per call; at most ``max_concurrency`` at once."""

    spec = ToolSpec(
        name="python",
        description="Run a Python 3 program in an isolated sandbox (no network, read-only filesystem except the "
                    "working folder, CPU/memory/time limits) and return its exit status, stdout and stderr. "
                    "Use print() to show results.",
        parameters={"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                    "required": ["code"], "additionalProperties": False},
    )

    def __init__(self, sandbox: Sandbox, max_concurrency: int = 4, timeout_s: float | None = None):
        self.sandbox = sandbox
        self.timeout_s = float(timeout_s) if timeout_s is not None else sandbox.limits.wall_s + 10.0
        self._slots = threading.BoundedSemaphore(max(1, int(max_concurrency)))  # any event loop, any thread

    async def run(self, arguments: dict[str, Any]) -> str:
        try:
            res = await asyncio.to_thread(self._run_in_slot, arguments["code"])
        except SandboxUnavailable as exc:
            raise ToolError(str(exc)) from None
        return format_result(res)

    def _run_in_slot(self, code: str) -> SandboxResult:
        with self._slots:
            return self.sandbox.run(code)


_LIMIT_FIELDS = {f.name for f in dataclasses.fields(SandboxLimits)}


@register_tool("python")
def make_python(env_passthrough: list[str] | tuple[str, ...] = (), allow_unisolated: bool = False,
                max_concurrency: int = 4, **limits: Any) -> Tool:
    """Options: the :class:`SandboxLimits` fields (``cpu_s``, ``wall_s``, ``memory_mb``, ...),
    ``env_passthrough``, ``allow_unisolated``, ``max_concurrency``."""
    unknown = sorted(set(limits) - _LIMIT_FIELDS)
    if unknown:
        raise ToolConfigError(f"unknown option '{unknown[0]}'; known: allow_unisolated, env_passthrough, "
                              f"max_concurrency, {', '.join(sorted(_LIMIT_FIELDS))}")
    sandbox = Sandbox(SandboxLimits(**limits), env_passthrough=tuple(env_passthrough), allow_unisolated=allow_unisolated)
    try:
        sandbox.check()
    except SandboxUnavailable as exc:
        raise ToolConfigError(str(exc)) from None
    return PythonTool(sandbox, max_concurrency=max_concurrency)
