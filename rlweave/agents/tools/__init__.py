"""Tools an agent calls: the contract (:mod:`.base`), built-ins (calculator, sandboxed python, BM25
search) and MCP servers as tool sources, all built from config by :func:`make_toolbox`."""

from rlweave.agents.tools.base import (
    DEFAULT_MAX_CHARS,
    DEFAULT_TIMEOUT_S,
    ERROR_KINDS,
    Tool,
    ToolBox,
    ToolCall,
    ToolConfigError,
    ToolError,
    ToolResult,
    ToolServerDied,
    ToolSpec,
    known_tools,
    make_toolbox,
    register_tool,
)

__all__ = [
    "DEFAULT_MAX_CHARS", "DEFAULT_TIMEOUT_S", "ERROR_KINDS", "Tool", "ToolBox", "ToolCall", "ToolConfigError",
    "ToolError", "ToolResult", "ToolServerDied", "ToolSpec", "known_tools", "make_toolbox", "register_tool",
]
