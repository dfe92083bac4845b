"""MCP servers as tool sources (#26 item 2): a real MCP server (tests/mcp_echo_server.py, made with the
mcp SDK) over stdio and streamable HTTP: list, call, bad arguments, server errors, and a server killed
mid-run (calls in flight -> server_died, then the next call restarts it)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlweave.agents.tools import ToolCall, ToolConfigError, make_toolbox

SERVER = str(Path(__file__).with_name("mcp_echo_server.py"))


@pytest.fixture(scope="module")
def box():
    box = make_toolbox(["calculator", {"mcp": {"command": [sys.executable, SERVER]}, "timeout_s": 10}])
    yield box
    box.close()


def test_lists_the_server_tools_with_their_schemas(box):
    assert box.names == ["calculator", "add", "echo", "sleep", "fail", "pid"]
    specs = {s["function"]["name"]: s["function"] for s in box.specs()}
    assert specs["add"]["description"] == "Add two integers."
    params = specs["add"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["a", "b"]
    assert params["properties"]["a"]["type"] == "integer"


def test_calls_bad_arguments_and_server_errors(box):
    box.reset_counts()
    add, echo, calc, missing, wrong, fails = box.execute_sync([
        ToolCall("add", {"a": 2, "b": 40}),
        ToolCall("echo", {"text": "héllo\nworld"}),
        ToolCall("calculator", {"expression": "2**10"}),
        ToolCall("add", {"a": 1}),
        ToolCall("echo", {"text": 5}),
        ToolCall("fail", {"message": "disk on fire"}),
    ])
    assert (add.error, add.content) == (None, "42")
    assert (echo.error, echo.content) == (None, "héllo\nworld")
    assert calc.content == "1024"
    assert missing.error == "bad_arguments" and "'b' is a required property" in missing.content
    assert wrong.error == "bad_arguments" and "5 is not of type 'string'" in wrong.content
    assert fails.error == "failed" and fails.content.startswith("error: ")
    assert box.counts["bad_arguments"] == 2 and box.counts["failed"] == 1


def test_a_slow_call_times_out_without_breaking_the_session(box):
    tool = box.tools["sleep"]
    tool.timeout_s, saved = 0.5, tool.timeout_s
    try:
        slow, fast = box.execute_sync([ToolCall("sleep", {"seconds": 20}), ToolCall("add", {"a": 1, "b": 2})])
    finally:
        tool.timeout_s = saved
    assert slow.error == "timeout" and fast.content == "3"
    (again,) = box.execute_sync([ToolCall("echo", {"text": "still here"})])
    assert again.content == "still here"


def test_server_killed_mid_run_gives_server_died_then_recovers(box):
    source = box.tools["add"].source
    deaths, restarts = source.deaths, source.restarts
    box.reset_counts()
    (first_pid,) = box.execute_sync([ToolCall("pid", {})])
    pid = int(first_pid.content)

    async def kill_while_in_flight():
        async def killer():
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)

        k = asyncio.create_task(killer())
        results = await box.execute([ToolCall("sleep", {"seconds": 8}), ToolCall("sleep", {"seconds": 8})])
        await k
        return results

    died = asyncio.run(kill_while_in_flight())
    assert [r.error for r in died] == ["server_died", "server_died"]
    assert all(r.latency_s < 7 for r in died)  # failed on the death, did not wait the sleep out
    assert box.counts["server_died"] == 2 and source.deaths == deaths + 1 and source.restarts == restarts

    add, new_pid = box.execute_sync([ToolCall("add", {"a": 5, "b": 6}), ToolCall("pid", {})])
    assert (add.error, add.content) == (None, "11")
    assert int(new_pid.content) != pid and source.restarts == restarts + 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the HTTP MCP server did not start"
                time.sleep(0.2)
        box = make_toolbox([{"mcp": {"url": f"http://127.0.0.1:{port}/mcp"}, "prefix": "remote_"}])
        try:
            assert "remote_add" in box.names
            (r,) = box.execute_sync([ToolCall("remote_add", {"a": 20, "b": 22})])
            assert (r.error, r.content) == (None, "42")
        finally:
            box.close()
    finally:
        proc.kill()
        proc.wait()


def test_a_server_that_cannot_start_is_refused_naming_the_entry(tmp_path):
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[1\] \(mcp\): could not start MCP server"):
        make_toolbox(["calculator", {"mcp": {"command": [sys.executable, str(tmp_path / "no_such_server.py")],
                                             "startup_timeout_s": 20}}])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\] \(mcp\): give exactly one of 'command'"):
        make_toolbox([{"mcp": {}}])


def test_a_refused_config_leaves_no_server_running(tmp_path):
    import psutil

    def servers() -> list:
        return [p for p in psutil.Process().children(recursive=True) if SERVER in " ".join(p.cmdline())]

    before = len(servers())
    (tmp_path / "doc.txt").write_text("a document")
    taken = {"name": "search", "corpus": str(tmp_path / "doc.txt"), "tool_name": "add"}  # takes the name first
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[1\] \(mcp\): two tools are named 'add'"):
        make_toolbox([taken, {"mcp": {"command": [sys.executable, SERVER]}}])
    deadline = time.monotonic() + 10
    while len(servers()) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(servers()) == before
