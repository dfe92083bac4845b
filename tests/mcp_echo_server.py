"""A tiny MCP server (the mcp SDK's MCPServer, FastMCP before mcp 2) for tests/test_mcp_tools.py.

Runs over stdio by default, or streamable HTTP with ``--http PORT``. Tools: ``add``, ``echo``,
``sleep`` (to have a call in flight when the test kills the server), ``fail`` (raises) and ``pid``.
"""

from __future__ import annotations

import asyncio
import os
import sys

try:
    from mcp.server.mcpserver import MCPServer
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer

server = MCPServer("rlweave-test-echo")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer (to keep a call in flight)."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def fail(message: str) -> str:
    """Always raise an error with the given message."""
    raise ValueError(message)


@server.tool()
def pid() -> int:
    """The server's process id (the test kills it to check recovery)."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
