"""Agent tools (#26 item 2 and Bad input): the ToolBox contract, the calculator, BM25 search, the python
tool, and building tool boxes from config."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlweave.agents import sandbox as sandbox_mod
from rlweave.agents.tools import (
    ERROR_KINDS,
    Tool,
    ToolBox,
    ToolCall,
    ToolConfigError,
    ToolError,
    ToolSpec,
    known_tools,
    make_toolbox,
)
from rlweave.agents.tools.calculator import evaluate


class Sleeper(Tool):
    spec = ToolSpec("sleeper", "sleeps", {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"],
                                          "additionalProperties": False})
    timeout_s = 0.5

    async def run(self, arguments):
        await asyncio.sleep(arguments["s"])
        return f"slept {arguments['s']}"


class Hangs(Tool):
    spec = ToolSpec("hangs", "never answers")
    timeout_s = 0.2

    async def run(self, arguments):
        await asyncio.Event().wait()


class Buggy(Tool):
    spec = ToolSpec("buggy", "raises")

    async def run(self, arguments):
        raise ValueError("line one\nline two")


class Refuses(Tool):
    spec = ToolSpec("refuses", "raises ToolError")

    async def run(self, arguments):
        raise ToolError("no such record")


class Chatty(Tool):
    spec = ToolSpec("chatty", "long output")

    async def run(self, arguments):
        return "a" * 5000 + "END"


def test_spec_is_the_openai_function_form():
    box = ToolBox([Sleeper()])
    (spec,) = box.specs()
    assert spec == {"type": "function", "function": {"name": "sleeper", "description": "sleeps",
                                                     "parameters": Sleeper.spec.parameters}}
    json.dumps(spec)  # serialisable for the chat template and the OpenAI API


def test_bad_calls_become_counted_error_results():
    box = ToolBox([Sleeper(), Hangs(), Buggy(), Refuses()])
    calls = [
        ToolCall("sleeper", {"s": 0.01}),
        ToolCall("sleeper", None, raw='{"name": "sleeper", "arguments": {"s": ', parse_error="Expecting value: line 1"),
        ToolCall("search", {"query": "x"}),
        ToolCall("sleeper", {"s": "slow"}),
        ToolCall("sleeper", {}),
        ToolCall("sleeper", {"s": 0, "extra": 1}),
        ToolCall("hangs", {}),
        ToolCall("buggy", {}),
        ToolCall("refuses", {}),
    ]
    results = box.execute_sync(calls)
    assert [r.call for r in results] == calls  # one result per call, in order
    assert [r.error for r in results] == [None, "invalid_json", "unknown_tool", "bad_arguments", "bad_arguments",
                                          "bad_arguments", "timeout", "failed", "failed"]
    assert results[0].content == "slept 0.01"
    for r in results[1:]:
        assert r.content.startswith("error: ") and "\n" not in r.content
    assert results[2].content == "error: unknown tool 'search'; known: sleeper, hangs, buggy, refuses"
    assert "'slow' is not of type 'number'" in results[3].content
    assert "'s' is a required property" in results[4].content
    assert "timed out after 0.2 s" in results[6].content
    assert "ValueError" in results[7].content and "line one line two" in results[7].content
    assert results[8].content == "error: no such record"
    assert box.counts == {"invalid_json": 1, "unknown_tool": 1, "bad_arguments": 3, "timeout": 1, "failed": 2,
                          "server_died": 0}
    assert set(box.counts) == set(ERROR_KINDS) and box.n_calls == 9
    box.reset_counts()
    assert sum(box.counts.values()) == 0 and box.n_calls == 0


def test_calls_run_concurrently_and_a_hang_does_not_block_others():
    gate = asyncio.Event()

    class Waits(Tool):
        spec = ToolSpec("waits", "waits for the gate")
        timeout_s = 5.0

        async def run(self, arguments):
            await gate.wait()
            return "through"

    class Opens(Tool):
        spec = ToolSpec("opens", "opens the gate")

        async def run(self, arguments):
            gate.set()
            return "opened"

    async def main():
        box = ToolBox([Waits(), Opens(), Hangs()])
        return await box.execute([ToolCall("waits", {}), ToolCall("hangs", {}), ToolCall("opens", {})])

    results = asyncio.run(main())  # "waits" only finishes if "opens" ran while it was waiting
    assert [(r.error, r.content) for r in results] == [(None, "through"), ("timeout", "error: tool 'hangs' timed out after 0.2 s"),
                                                       (None, "opened")]


def test_long_output_is_cut_and_sync_execute_refuses_inside_a_loop():
    box = ToolBox([Chatty()], max_chars=200)
    (r,) = box.execute_sync([ToolCall("chatty", {})])
    assert r.error is None and len(r.content) < 300 and r.content.endswith("END") and "characters cut" in r.content

    async def inside():
        box.execute_sync([ToolCall("chatty", {})])

    with pytest.raises(RuntimeError, match="await box.execute"):
        asyncio.run(inside())


@pytest.mark.parametrize("expr,want", [
    ("1 + 2 * 3", 7), ("7 / 2", 3.5), ("8 / 2", 4), ("2 ** 100", 2 ** 100), ("-(3 - 10) % 4", 3),
    ("(10**40 + 1) // 3", (10 ** 40 + 1) // 3), ("(10**400) / (10**399)", 10), ("sqrt(16) + abs(-2)", 6.0),
    ("round(pi, 3)", 3.142), ("max(1, 5, 3)", 5), ("2 ** -1", 0.5),
])
def test_calculator_values(expr, want):
    got = evaluate(expr)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("expr,match", [
    ("10**10**10", "too large"), ("9**9**9**9", "too large"), ("factorial(100000)", "too large"),
    ("__import__('os').system('echo hi')", "unsupported"), ("().__class__", "unsupported"), ("x + 1", "unsupported"),
    ("open('f')", "unsupported"), ("[1, 2]", "unsupported"), ("1 / 0", "division by zero"), ("2.0 ** 5000", "Overflow"),
    ("(-8) ** 0.5", "not a real number"), ("1 +", "not a valid expression"), ("1" * 3000, "too long"),
])
def test_calculator_refuses(expr, match):
    with pytest.raises(ToolError, match=match):
        evaluate(expr)


def test_make_toolbox_from_config_and_its_one_line_errors(tmp_path):
    from omegaconf import OmegaConf

    (tmp_path / "a.md").write_text("# Alpha\n\nThe alpha document talks about rockets.")
    cfg = OmegaConf.create([
        "calculator",
        {"name": "search", "corpus": str(tmp_path / "a.md"), "k": 2, "timeout_s": 3},
    ])
    box = make_toolbox(cfg)
    assert box.names == ["calculator", "search"] and box.tools["search"].timeout_s == 3.0
    (r,) = box.execute_sync([ToolCall("calculator", {"expression": "6*7"})])
    assert r.content == "42"
    assert {"calculator", "python", "search", "mcp"} <= set(known_tools())
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[1\]: unknown tool 'calc'; known: calculator, mcp, python, search"):
        make_toolbox(["calculator", "calc"])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\] \(search\): missing 'corpus'"):
        make_toolbox([{"name": "search"}])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\] \(calculator\): .*unexpected keyword argument 'digits'"):
        make_toolbox([{"name": "calculator", "digits": 3}])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[1\] \(calculator\): two tools are named 'calculator'"):
        make_toolbox(["calculator", "calculator"])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\]: expected a tool name"):
        make_toolbox([{"corpus": "x"}])
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\] \(search\): corpus not found"):
        make_toolbox([{"name": "search", "corpus": str(tmp_path / "missing")}])


def _write_corpus(root):
    (root / "sub").mkdir(parents=True)
    (root / "paris.md").write_text("# Paris\n\nParis is the capital of France. The Eiffel Tower was completed in 1889.\n\n"
                                   "The Louvre is the most visited museum.")
    (root / "bio.txt").write_text("Photosynthesis converts light energy into chemical energy in green plants.")
    rows = [{"id": "everest", "title": "Mount Everest", "text": "Mount Everest is the highest mountain above sea level."},
            {"id": "nile", "title": "Nile", "contents": "The Nile is a long river flowing north through Africa."}]
    (root / "sub" / "wiki.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_search_finds_passages_caches_the_index_and_rebuilds_when_the_corpus_changes(tmp_path):
    corpus = tmp_path / "corpus"
    _write_corpus(corpus)
    box = make_toolbox([{"name": "search", "corpus": str(corpus)}])
    assert box.tools["search"].index.built
    r1, r2, r3 = box.execute_sync([ToolCall("search", {"query": "highest mountain", "k": 1}),
                                   ToolCall("search", {"query": "which museum is in the capital of France"}),
                                   ToolCall("search", {"query": "zebra xylophone"})])
    assert r1.content.startswith("[1] Mount Everest (id: everest)\n") and "[2]" not in r1.content
    assert r2.content.startswith("[1] Paris (id: paris.md#0)") and "Louvre" in r2.content
    assert r3.content == "no results"
    (bad,) = box.execute_sync([ToolCall("search", {"query": "nile", "k": 99})])
    assert bad.error == "bad_arguments"

    again = make_toolbox([{"name": "search", "corpus": str(corpus)}])  # same corpus: loaded, not rebuilt
    assert not again.tools["search"].index.built
    (r,) = again.execute_sync([ToolCall("search", {"query": "river Africa", "k": 1})])
    assert "(id: nile)" in r.content

    (corpus / "new.txt").write_text("Quokkas are small marsupials living on Rottnest Island.")
    changed = make_toolbox([{"name": "search", "corpus": str(corpus), "index_dir": str(tmp_path / "idx")}])
    assert changed.tools["search"].index.built and (tmp_path / "idx" / "meta.json").is_file()
    (r,) = changed.execute_sync([ToolCall("search", {"query": "quokka marsupials"})])
    assert "Rottnest" in r.content


def test_search_refuses_a_bad_jsonl_line_naming_file_and_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "text": "fine"}\n{"id": 2, "text": \n')
    with pytest.raises(ToolConfigError, match=r"docs\.jsonl:2: not JSON"):
        make_toolbox([{"name": "search", "corpus": str(path)}])
    path.write_text('{"id": 1, "body": "no text key"}\n')
    with pytest.raises(ToolConfigError, match=r"docs\.jsonl:1: no text field"):
        make_toolbox([{"name": "search", "corpus": str(path)}])


def test_python_tool_runs_code_and_reports_failures_as_observations():
    isolated = sandbox_mod.isolation_problem() is None
    box = make_toolbox([{"name": "python", "wall_s": 5, "cpu_s": 3, "allow_unisolated": not isolated}])
    ok, crash = box.execute_sync([ToolCall("python", {"code": "print(sum(range(10)))"}),
                                  ToolCall("python", {"code": "raise ValueError('boom')"})])
    assert ok.error is None and ok.content == "[exit code 0]\nstdout:\n45"
    assert crash.error is None and crash.content.startswith("[exit code 1]") and "ValueError: boom" in crash.content
    (bad,) = box.execute_sync([ToolCall("python", {"source": "print(1)"})])
    assert bad.error == "bad_arguments"


def test_python_tool_refuses_without_isolation_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "isolation_problem", lambda python=None: "namespaces are not permitted here")
    with pytest.raises(ToolConfigError, match=r"^agent\.tools\[0\] \(python\): sandbox isolation unavailable: "
                                              r"namespaces are not permitted here; set allow_unisolated=true"):
        make_toolbox([{"name": "python"}])
    box = make_toolbox([{"name": "python", "allow_unisolated": True, "wall_s": 5}])
    (r,) = box.execute_sync([ToolCall("python", {"code": "print('still runs')"})])
    assert r.content == "[exit code 0]\nstdout:\nstill runs"


def test_tools_served_by_a_worker_group_keep_call_order_and_counts():
    from rlweave.agents.tools.server_worker import GroupToolBox, ToolServerWorker
    from rlweave.cluster import Cluster, GroupPlacement, WorkerGroup

    cluster = Cluster.start(num_cpus=2, local=True)
    group = WorkerGroup(ToolServerWorker, GroupPlacement("tools", cluster.slots()[:2]), cluster, args=(["calculator"],))
    try:
        box = GroupToolBox(group)
        assert box.names == ["calculator"]
        calls = [ToolCall("calculator", {"expression": f"{i} * 10"}) for i in range(3)] + [ToolCall("nope", {})]
        results = box.execute_sync(calls)
        assert [r.content for r in results[:3]] == ["0", "10", "20"] and results[3].error == "unknown_tool"
        assert asyncio.run(box.execute(calls[:1]))[0].content == "0"
        assert box.counts["unknown_tool"] == 1 and box.n_calls == 5
        box.reset_counts()
        assert sum(box.counts.values()) == 0
        box.close()
    finally:
        group.shutdown()


def test_arguments_as_a_json_string_are_decoded():
    box = make_toolbox(["calculator"])
    ok, bad = box.execute_sync([ToolCall("calculator", '{"expression": "1+1"}'), ToolCall("calculator", '{"expression": ')])
    assert ok.content == "2" and bad.error == "invalid_json" and "arguments of 'calculator' are not valid JSON" in bad.content
