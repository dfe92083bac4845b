"""The tool contract of the agent loop: specs the model sees, calls it makes, results it reads back.

Why one module: the agent loop (which parses model text into :class:`ToolCall` s and feeds
:class:`ToolResult` contents back as observations), the built-in tools, MCP sources and the tool-server
worker all meet here, so the contract has one home and no tool-specific code.

Contract (DESIGN.md, *Agents*): tools are async with timeouts, and a failing tool is an observation,
not a crash. :meth:`ToolBox.execute` therefore never raises for a bad call: invalid JSON, an unknown
tool, arguments that fail the tool's JSON schema, a timeout, an exception inside the tool or a dead
tool server each become a :class:`ToolResult` whose ``error`` is one of :data:`ERROR_KINDS` and whose
``content`` is a one-line message written for the model. The box counts errors by kind so the runner
can log how often the policy calls tools wrongly.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jsonschema

ERROR_KINDS: tuple[str, ...] = ("invalid_json", "unknown_tool", "bad_arguments", "timeout", "failed", "server_died")
"""Kinds of failed tool calls, the values of :attr:`ToolResult.error` and the keys of :attr:`ToolBox.counts`."""

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_CHARS = 4000


class ToolError(Exception):
    """Raised by a tool for a failure the model should read (``failed``); the message is shown as is."""


class ToolServerDied(ToolError):
    """Raised by a tool whose server process died while the call was in flight (``server_died``)."""


class ToolConfigError(ValueError):
    """Bad tool configuration; the message is one line naming the config key (``agent.tools[i]``)."""


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = dataclasses.field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI function-tool form, also what ``tokenizer.apply_chat_template(tools=[...])`` takes."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


class Tool(abc.ABC):
    """One callable tool. Subclasses set :attr:`spec` and implement :meth:`run`.

    ``run`` receives arguments already validated against ``spec.parameters`` and returns the text the
    model reads. It raises :class:`ToolError` for failures the model should see; any other exception
    is reported as ``failed`` with its type and message.
    """

    spec: ToolSpec
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def name(self) -> str:
        return self.spec.name

    @abc.abstractmethod
    async def run(self, arguments: dict[str, Any]) -> str:
        """Runs the tool on validated arguments and returns the observation text."""

    async def aclose(self) -> None:
        """Releases what the tool holds (processes, sessions). Default: nothing."""


@dataclasses.dataclass
class ToolCall:
    """One call parsed from model text. A call whose JSON did not parse has ``parse_error`` set and
    ``arguments`` None; ``raw`` keeps the model's text for logs."""

    name: str
    arguments: dict[str, Any] | str | None  # a str is decoded as JSON (the OpenAI API's form)
    raw: str = ""
    parse_error: str | None = None


@dataclasses.dataclass
class ToolResult:
    """The outcome of one call. ``error`` is None or one of :data:`ERROR_KINDS`; ``content`` is what the
    model reads in both cases (for errors, one line starting with ``error:``)."""

    call: ToolCall
    content: str
    error: str | None
    latency_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def truncate(text: str, max_chars: int) -> str:
    """Keeps the head and tail of a long observation, with a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    return f"{text[:head]}\n...[{len(text) - max_chars} characters cut]...\n{text[-tail:]}"


class ToolBox:
    """The tools an agent may call, by name; validates and runs calls concurrently.

    ``max_chars`` bounds each observation (head and tail kept) so a chatty tool cannot blow the
    context. :attr:`counts` holds error counts by kind since the last :meth:`reset_counts`;
    :attr:`n_calls` the number of calls.
    """

    def __init__(self, tools: Iterable[Tool] = (), max_chars: int = DEFAULT_MAX_CHARS):
        self.tools: dict[str, Tool] = {}
        self.max_chars = int(max_chars)
        self.counts: dict[str, int] = {}
        self.n_calls = 0
        self.reset_counts()
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        name = tool.spec.name
        if name in self.tools:
            raise ToolConfigError(f"two tools are named '{name}'; tool names must be unique")
        cls = jsonschema.validators.validator_for(tool.spec.parameters)
        cls.check_schema(tool.spec.parameters)
        self._validators[name] = cls(tool.spec.parameters)
        self.tools[name] = tool

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __len__(self) -> int:
        return len(self.tools)

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def specs(self) -> list[dict[str, Any]]:
        """The tools in OpenAI function form, for the chat template and the OpenAI API."""
        return [t.spec.to_openai() for t in self.tools.values()]

    def reset_counts(self) -> None:
        self.counts = {kind: 0 for kind in ERROR_KINDS}
        self.n_calls = 0

    async def execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Runs the calls concurrently, in order of the results; never raises for a bad call."""
        results = await asyncio.gather(*(self._execute_one(c) for c in calls))
        self.n_calls += len(results)
        for r in results:
            if r.error is not None:
                self.counts[r.error] += 1
        return list(results)

    def execute_sync(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """:meth:`execute` for callers without an event loop (a private loop, kept between calls)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("ToolBox.execute_sync called inside a running event loop; use `await box.execute(calls)`")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.execute(calls))

    async def _execute_one(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        error, content = await self._run_checked(call)
        if error is not None:
            content = "error: " + _one_line(content)
        else:
            content = truncate(content, self.max_chars)
        return ToolResult(call=call, content=content, error=error, latency_s=time.perf_counter() - start)

    async def _run_checked(self, call: ToolCall) -> tuple[str | None, str]:
        if call.parse_error is not None:
            return "invalid_json", f"the tool call is not valid JSON ({call.parse_error})"
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "(none)"
            return "unknown_tool", f"unknown tool '{call.name}'; known: {known}"
        arguments = {} if call.arguments is None else call.arguments
        if isinstance(arguments, str):  # the OpenAI wire form: arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return "invalid_json", f"the arguments of '{call.name}' are not valid JSON ({exc.msg} at char {exc.pos})"
        if not isinstance(arguments, Mapping):
            return "bad_arguments", f"arguments of '{call.name}' must be a JSON object, got {type(arguments).__name__}"
        problem = jsonschema.exceptions.best_match(self._validators[call.name].iter_errors(arguments))
        if problem is not None:
            where = "/".join(str(p) for p in problem.absolute_path)
            return "bad_arguments", f"bad arguments for '{call.name}'" + (f" at '{where}'" if where else "") + f": {problem.message}"
        try:
            out = await asyncio.wait_for(tool.run(dict(arguments)), timeout=tool.timeout_s)
        except asyncio.TimeoutError:
            return "timeout", f"tool '{call.name}' timed out after {tool.timeout_s:g} s"
        except ToolServerDied as exc:
            return "server_died", f"the server of tool '{call.name}' died: {exc}"
        except ToolError as exc:
            return "failed", str(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's bug is the model's observation, never the loop's crash
            return "failed", f"tool '{call.name}' failed: {type(exc).__name__}: {exc}"
        return None, str(out)

    async def aclose(self) -> None:
        """Closes every tool (and MCP sessions behind them)."""
        seen: set[int] = set()
        for tool in self.tools.values():
            owner = getattr(tool, "source", tool)  # tools of one MCP source share it: close it once
            if id(owner) in seen:
                continue
            seen.add(id(owner))
            await owner.aclose()

    def close(self) -> None:
        """:meth:`aclose` for callers without an event loop."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self.aclose())
        self._loop.close()


# --------------------------------------------------------------------------------------------------
# Registry: config entries -> tools

ToolFactory = Callable[..., "Tool | list[Tool]"]
_TOOL_FACTORIES: dict[str, ToolFactory] = {}
_BUILTIN_MODULES: tuple[str, ...] = ("calculator", "python", "search", "mcp_source")


def register_tool(name: str) -> Callable[[ToolFactory], ToolFactory]:
    """Registers a factory ``f(**options) -> Tool | list[Tool]`` under ``name`` for :func:`make_toolbox`."""

    def deco(factory: ToolFactory) -> ToolFactory:
        _TOOL_FACTORIES[name] = factory
        return factory

    return deco


def _load_builtins() -> None:
    import importlib

    for mod in _BUILTIN_MODULES:
        importlib.import_module(f"rlweave.agents.tools.{mod}")


def known_tools() -> list[str]:
    _load_builtins()
    return sorted(_TOOL_FACTORIES)


def _plain(obj: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists, so configs from recipes and from code look the same."""
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover
        return obj
    return OmegaConf.to_container(obj, resolve=True) if OmegaConf.is_config(obj) else obj


def make_toolbox(cfg: Sequence[Mapping[str, Any] | str] | None, key: str = "agent.tools",
                 max_chars: int = DEFAULT_MAX_CHARS) -> ToolBox:
    """Builds a :class:`ToolBox` from config entries: ``"calculator"``, ``{"name": "search", "corpus": ...}``,
    ``{"mcp": {"command": [...]}}`` or ``{"mcp": {"url": ...}}``. Any entry may set ``timeout_s``.

    Errors are :class:`ToolConfigError` with one line naming ``key[i]``, raised before any tool runs.
    """
    _load_builtins()
    cfg = _plain(cfg) or []
    if isinstance(cfg, (str, Mapping)):
        raise ToolConfigError(f"{key} must be a list of tool entries, got {type(cfg).__name__}")
    box = ToolBox(max_chars=max_chars)
    try:
        _add_entries(box, cfg, key)
    except BaseException:
        box.close()  # MCP servers already started for earlier entries
        raise
    return box


def _add_entries(box: ToolBox, cfg: Sequence[Mapping[str, Any] | str], key: str) -> None:
    for i, entry in enumerate(cfg):
        where = f"{key}[{i}]"
        if isinstance(entry, str):
            name, options = entry, {}
        elif isinstance(entry, Mapping) and "mcp" in entry:
            name = "mcp"
            options = dict(entry["mcp"] or {})
            extra = {k: v for k, v in entry.items() if k != "mcp"}
            options.update(extra)
        elif isinstance(entry, Mapping) and "name" in entry:
            options = {k: v for k, v in entry.items() if k != "name"}
            name = str(entry["name"])
        else:
            raise ToolConfigError(f"{where}: expected a tool name, {{name: ..., ...}} or {{mcp: {{command|url: ...}}}}, got {entry!r}")
        factory = _TOOL_FACTORIES.get(name)
        if factory is None:
            raise ToolConfigError(f"{where}: unknown tool '{name}'; known: {', '.join(known_tools())}")
        timeout = options.pop("timeout_s", None)
        try:
            made = factory(**options)
        except ToolConfigError as exc:
            raise ToolConfigError(f"{where} ({name}): {exc}") from None
        except TypeError as exc:
            raise ToolConfigError(f"{where} ({name}): {_one_line(str(exc))}") from None
        made = made if isinstance(made, list) else [made]
        for tool in made:
            if timeout is not None:
                tool.timeout_s = float(timeout)
            try:
                box.add(tool)
            except (ToolConfigError, jsonschema.exceptions.SchemaError) as exc:
                for t in made:  # an MCP source none of whose tools made it into the box
                    getattr(getattr(t, "source", None), "close", lambda: None)()
                raise ToolConfigError(f"{where} ({name}): {_one_line(str(exc))}") from None
