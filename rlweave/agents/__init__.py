"""Agents: the multi-turn agent loop, tools (calculator, sandboxed Python, local search, MCP sources),
and multi-agent roles. Kept import-free so each submodule loads only what it needs."""
