"""MCP servers as tool sources: each tool a server lists becomes a :class:`Tool` (``mcp`` SDK client).

Why a background event loop: an MCP session (stdio pipes or a streamable-HTTP connection) lives in
anyio task groups that must be entered and left in one task, while the agent loop may call tools
from any event loop or from plain threads (:meth:`ToolBox.execute_sync`). So one thread per source
owns a loop and a *holder task* that keeps the session open; calls are submitted to that loop with
``run_coroutine_threadsafe`` and awaited from the caller's loop.

Failure policy: when the server dies (process killed, connection closed), the calls in flight (and
a call that finds the connection already closed) fail with :class:`ToolServerDied` (``server_died``),
never retried since a tool may have side effects; the session is marked dead, and the next call
starts the server again (``command``) or reconnects (``url``); :attr:`MCPSource.restarts` counts those.
A tool error reported by the server (``isError``) is ``failed``, with the server's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import threading
from collections.abc import Sequence
from typing import Any

from rlweave.agents.tools.base import Tool, ToolConfigError, ToolError, ToolServerDied, ToolSpec, register_tool


class MCPTool(Tool):
    """One tool of an MCP server; ``run`` forwards to its :class:`MCPSource`."""

    def __init__(self, source: "MCPSource", remote_name: str, description: str, input_schema: dict[str, Any],
                 prefix: str = "", timeout_s: float = 30.0):
        self.source, self.remote_name, self.timeout_s = source, remote_name, float(timeout_s)
        schema = dict(input_schema or {"type": "object"})
        schema.setdefault("type", "object")
        self.spec = ToolSpec(name=prefix + remote_name, description=description or "", parameters=schema)

    async def run(self, arguments: dict[str, Any]) -> str:
        return await self.source.call(self.remote_name, arguments)


def _field(obj: Any, snake: str, camel: str, default: Any = None) -> Any:
    """A result field by its mcp 2.x name, else its 1.x name (``is_error`` / ``isError``, ...)."""
    return getattr(obj, snake, getattr(obj, camel, default))


def _result_text(result: Any) -> str:
    """Text contents joined; other content kinds named; structured content when there is no text."""
    parts = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        parts.append(item.text if kind == "text" else f"[{kind or 'non-text'} content]")
    structured = _field(result, "structured_content", "structuredContent")
    if not parts and structured is not None:
        parts.append(json.dumps(structured))
    return "\n".join(parts)


def _is_connection_loss(exc: BaseException) -> bool:
    import anyio
    from mcp.shared import exceptions
    from mcp.types import CONNECTION_CLOSED

    mcp_error = getattr(exceptions, "MCPError", None) or getattr(exceptions, "McpError")  # mcp 2.x, 1.x
    if isinstance(exc, mcp_error):
        return getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED
    if isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError,
                        BrokenPipeError)):
        return True
    try:
        import httpx
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, httpx.TransportError)


class MCPSource:
    """A connection to one MCP server (``command`` over stdio, or ``url`` over streamable HTTP)."""

    def __init__(self, command: Sequence[str] | str | None = None, url: str | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None, prefix: str = "",
                 startup_timeout_s: float = 30.0, stderr_log: str | None = None):
        if (command is None) == (url is None):
            raise ToolConfigError("give exactly one of 'command' (a stdio server) or 'url' (streamable HTTP)")
        if isinstance(command, str):
            command = shlex.split(command)
        if command is not None and (not command or not all(isinstance(c, str) for c in command)):
            raise ToolConfigError(f"'command' must be a non-empty list of strings, got {command!r}")
        self.command = list(command) if command is not None else None
        self.url, self.env, self.cwd, self.prefix = url, dict(env or {}), cwd, prefix
        self.startup_timeout_s = float(startup_timeout_s)
        self.stderr_log = stderr_log
        self._opened = 0
        self.deaths = 0  # sessions found dead by a call
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{self.describe()}", daemon=True)
        self._thread.start()

    @property
    def restarts(self) -> int:
        """Sessions started after the first: server restarts (``command``) or reconnects (``url``)."""
        return max(0, self._opened - 1)

    def describe(self) -> str:
        return " ".join(self.command) if self.command else str(self.url)

    # -- lifecycle (all coroutines below run on the source's own loop) ------------------------------

    def _transport(self, errlog: Any) -> contextlib.AbstractAsyncContextManager:
        if self.url is not None:
            from mcp.client import streamable_http

            connect = getattr(streamable_http, "streamable_http_client", None) or streamable_http.streamablehttp_client
            return connect(self.url)  # yields (read, write) in mcp 2.x, (read, write, session id) in 1.x
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert self.command is not None
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env or None, cwd=self.cwd)
        return stdio_client(params, errlog=errlog)

    async def _hold(self, ready: asyncio.Future) -> None:
        """Keeps one session open until told to stop (or the server dies and a call says so)."""
        from mcp import ClientSession

        stop = self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                errlog = stack.enter_context(open(self.stderr_log or os.devnull, "a"))  # the server's stderr
                streams = await stack.enter_async_context(self._transport(errlog))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                tools, cursor = [], None
                while True:  # the listing may be paginated
                    page = await session.list_tools(params=None if cursor is None else _cursor_params(cursor))
                    tools.extend(page.tools)
                    cursor = _field(page, "next_cursor", "nextCursor")
                    if not cursor:
                        break
                self._session = session
                self._opened += 1
                ready.set_result(tools)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - startup failures go to whoever waits on `ready`
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None

    async def _open(self) -> list[Any]:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(self._hold(ready))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.startup_timeout_s)
        except asyncio.TimeoutError:
            self._holder.cancel()
            raise TimeoutError(f"no answer within {self.startup_timeout_s:g} s") from None

    async def _close_session(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._holder is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._holder, 10)
            self._holder = None

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._session is None:
                await self._close_session()
                try:
                    await self._open()
                except Exception as exc:
                    raise ToolServerDied(f"restarting {self.describe()} failed: {type(exc).__name__}: {exc}") from None
            session, holder = self._session, self._holder
        try:
            result = await session.call_tool(name, arguments)
        except Exception as exc:
            if not _is_connection_loss(exc):
                raise ToolError(f"{name}: {exc}") from None
            if self._holder is holder and self._session is session:  # first to see it: retire this session
                self.deaths += 1
                self._session = None
            raise ToolServerDied(f"{type(exc).__name__}: {exc}") from None
        if _field(result, "is_error", "isError", False):
            raise ToolError(_result_text(result) or f"{name} reported an error")
        return _result_text(result)

    # -- caller side (any thread, any loop) ---------------------------------------------------------

    def start(self, timeout_s: float | None = None) -> list[Any]:
        """Starts the server (or connects) and returns the MCP tool descriptions; raises on failure."""
        fut = asyncio.run_coroutine_threadsafe(self._open(), self._loop)
        tools = fut.result(timeout=(timeout_s or self.startup_timeout_s) + 5)
        return tools

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Calls a tool of the server from any event loop; cancelling the await cancels the call."""
        fut = asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)
        return await asyncio.wrap_future(fut)

    def tools(self, call_timeout_s: float = 30.0) -> list[MCPTool]:
        """Starts the source and wraps each listed tool as an :class:`MCPTool` (``call_timeout_s`` each)."""
        listed = self.start()
        return [MCPTool(self, t.name, t.description or "", dict(_field(t, "input_schema", "inputSchema") or {}),
                        prefix=self.prefix, timeout_s=call_timeout_s) for t in listed]

    def close(self) -> None:
        """Stops the session (and the server process), then the loop thread. Idempotent."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close_session(), self._loop).result(timeout=15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def _cursor_params(cursor: str) -> Any:
    from mcp import types

    return types.PaginatedRequestParams(cursor=cursor)


@register_tool("mcp")
def make_mcp_tools(command: Sequence[str] | str | None = None, url: str | None = None, env: dict[str, str] | None = None,
                   cwd: str | None = None, prefix: str = "", startup_timeout_s: float = 30.0,
                   stderr_log: str | None = None) -> list[Tool]:
    """Options: ``command`` (list, or a string split like a shell) or ``url``; ``env``, ``cwd``,
    ``prefix`` (put before every tool name, to avoid clashes), ``startup_timeout_s``, ``stderr_log``
    (file for the server's stderr; default discarded)."""
    source = MCPSource(command=command, url=url, env=env, cwd=cwd, prefix=prefix, startup_timeout_s=startup_timeout_s,
                       stderr_log=stderr_log)
    try:
        tools = source.tools()
    except Exception as exc:
        source.close()
        raise ToolConfigError(f"could not start MCP server '{source.describe()}': {type(exc).__name__}: {exc}") from None
    if not tools:
        source.close()
        raise ToolConfigError(f"MCP server '{source.describe()}' lists no tools")
    return list(tools)
