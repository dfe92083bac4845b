"""Agent tasks (#26): the task registry, calc and multihop prompts, splits and rewards, the generated
corpus (deterministic, answers reachable by following the hops), and expert traces that run the real
calculator and BM25 search tools."""

from __future__ import annotations

import json
import re

import pytest

from rlweave.agents.tasks import ExpertMiss, initial_messages
from rlweave.agents.tasks.calc import CalcTask
from rlweave.agents.tasks.multihop import MultihopTask, make_corpus
from rlweave.agents.traces import main as traces_main
from rlweave.envs.text_tasks import TASKS, ArithmeticTask, Prompt, TaskDataError, TextTask, make_task, register_task

N = 60  # people in the test corpora (30 companies, 6 cities): small enough to index in milliseconds


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("mh") / "corpus", N, seed=3, test_fraction=0.2)


def _read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


# --------------------------------------------------------------------------- registry
def test_unknown_task_names_every_registered_one_on_one_line():
    with pytest.raises(ValueError) as e:
        make_task({"name": "nope"})
    msg = str(e.value)
    assert msg.startswith("task.name: unknown task 'nope'; known: ") and "\n" not in msg
    assert all(n in msg for n in ("arithmetic", "calc", "jsonl_qa", "multihop"))


def test_register_task_adds_a_buildable_task_and_built_ins_keep_their_behaviour():
    @register_task("tiny_test_task")
    def _build(cfg):
        return ArithmeticTask(ops=("-",), max_digits=1)

    try:
        assert make_task({"name": "tiny_test_task"}).ops == ("-",)
    finally:
        TASKS.pop("tiny_test_task")
    arith = make_task({"name": "arithmetic", "ops": None, "min_digits": None, "max_digits": None})
    assert (arith.ops, arith.min_digits, arith.max_digits) == (("+",), 1, 2)  # schema None = the old defaults
    calc = make_task({"name": "calc"})
    assert isinstance(calc, CalcTask) and (calc.ops, calc.min_digits, calc.max_digits) == (("*",), 4, 5)


def test_task_config_errors_name_the_key_before_start():
    from rlweave.config import ConfigError, load_config
    from rlweave.runners.llm_checks import check_llm

    for overrides, fragment in ((["task.name=nope"], "task.name: unknown task 'nope'"),
                                (["task.name=multihop"], "task.corpus: multihop needs a folder"),
                                (["task.name=multihop", "task.corpus=/tmp/x", "task.hops=[4]"], "task.hops: [4]")):
        with pytest.raises(ConfigError) as e:
            check_llm(load_config("grpo-arith", overrides))
        assert fragment in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- calc
def test_calc_splits_are_disjoint_prompts_name_the_calculator_and_reward_is_exact():
    task = make_task({"name": "calc", "test_fraction": 0.2})
    train = {p.id for s in range(3) for p in task.prompts("train", 300, seed=s)}
    test = {p.id for s in range(3) for p in task.prompts("test", 100, seed=s)}
    assert train and test and not train & test
    p = task.prompts("train", 1, seed=0)[0]
    a, b = p.meta["a"], p.meta["b"]
    assert 1000 <= a <= 99999 and 1000 <= b <= 99999 and p.answer == str(a * b)
    assert p.meta["tools"] == ["calculator"] and p.text == f"What is {a} * {b}?"
    assert task.reward(p, f"The answer is {a * b}.") == 1.0
    assert task.reward(p, f"The answer is {a * b + 1}.") == 0.0 and task.reward(p, "no idea") == 0.0


def test_calc_expert_trace_calls_the_real_calculator_and_matches_the_rl_prompt():
    task = make_task({"name": "calc"})
    p = task.prompts("train", 1, seed=5)[0]
    trace = task.expert_trace(p)
    assert trace[:2] == initial_messages(p)  # SFT traces start where RL episodes start
    assert "calculator" in trace[0]["content"] and trace[1] == {"role": "user", "content": p.text}
    call = trace[2]["tool_calls"][0]["function"]
    assert call == {"name": "calculator", "arguments": {"expression": f"{p.meta['a']} * {p.meta['b']}"}}
    assert trace[3]["role"] == "tool" and trace[3]["name"] == "calculator" and trace[3]["content"] == p.answer
    assert trace[4] == {"role": "assistant", "content": f"The answer is {p.answer}."}
    assert task.reward(p, trace[-1]["content"]) == 1.0


# --------------------------------------------------------------------------- multihop corpus
def test_corpus_is_a_function_of_its_seed(tmp_path, corpus):
    again = make_corpus(tmp_path / "again", N, seed=3, test_fraction=0.2)
    other = make_corpus(tmp_path / "other", N, seed=4, test_fraction=0.2)
    for name in ("docs/corpus.jsonl", "train.jsonl", "test.jsonl", "meta.json"):
        assert (again / name).read_bytes() == (corpus / name).read_bytes()
    assert (other / "docs/corpus.jsonl").read_bytes() != (corpus / "docs/corpus.jsonl").read_bytes()
    docs = _read(corpus / "docs/corpus.jsonl")
    assert len(docs) == N + N // 2 + N // 10 and len({d["title"] for d in docs}) == len(docs)  # unique names


def test_every_answer_is_reached_by_following_the_hops_through_the_documents(corpus):
    docs = {d["id"]: d for d in _read(corpus / "docs/corpus.jsonl")}
    questions = _read(corpus / "train.jsonl") + _read(corpus / "test.jsonl")
    assert {q["hops"] for q in questions} == {1, 2, 3}
    for q in questions:
        chain = [docs[d] for d in q["docs"]]
        assert chain[0]["title"] in q["question"]  # the question names where to start
        for here, there in zip(chain, chain[1:]):
            assert there["title"] in here["text"]  # each page names the next hop's entity
        assert re.search(rf"\b{re.escape(q['answer'])}\b", chain[-1]["text"])
    # a 3-hop chain read as a person would: company -> its founder -> the founder's birthplace -> its region
    by_title = {d["title"]: d["text"] for d in docs.values()}
    q = next(q for q in questions if q["kind"] == "founder_region")
    company = re.fullmatch(r"In which region was the founder of (.+) born\?", q["question"]).group(1)
    founder = re.search(r" by (.+?)\. ", by_title[company]).group(1)
    city = re.search(r" was born in \d+ in (.+?)\.$", by_title[founder]).group(1)
    assert re.search(r"in the region of (.+?),", by_title[city]).group(1) == q["answer"]
    # every year and founder is stated twice, as names are (a second mention teaches copying the first)
    for d in docs.values():
        facts = re.findall(r"\b\d{4}\b", d["text"]) + re.findall(r" by (.+?)[.;]", d["text"])
        assert facts and all(d["text"].count(f) == 2 for f in facts)


def test_test_questions_share_no_person_or_company_with_train_questions(corpus):
    docs = {d["id"]: d for d in _read(corpus / "docs/corpus.jsonl")}
    train, test = _read(corpus / "train.jsonl"), _read(corpus / "test.jsonl")
    assert test and not {q["question"] for q in train} & {q["question"] for q in test}
    held_out = {docs[d]["title"] for q in test for d in q["docs"] if not d.startswith("city")}
    seen = " ".join(q["question"] + " " + q["answer"] for q in train)
    assert held_out and not [name for name in held_out if name in seen]


def test_multihop_task_makes_its_corpus_on_first_use_filters_hops_and_refuses_a_mismatch(tmp_path, corpus):
    task = make_task({"name": "multihop", "corpus": str(tmp_path / "new"), "hops": [2], "entities": N, "corpus_seed": 3,
                      "test_fraction": 0.2})
    assert (tmp_path / "new" / "docs/corpus.jsonl").read_bytes() == (corpus / "docs/corpus.jsonl").read_bytes()
    prompts = task.prompts("test", 20, seed=0)
    assert {p.meta["hops"] for p in prompts} == {2} and all(p.meta["tools"] == ["search"] for p in prompts)
    assert not {p.id for p in task.prompts("train", 500, 0)} & {p.id for p in task.prompts("test", 500, 0)}
    p = prompts[0]
    assert task.reward(p, f"The answer is {p.answer.upper()}.") == 1.0 and task.reward(p, "The answer is Nowhere.") == 0.0
    assert task.tool_entries()[0]["k"] == 3  # task.search_k's default
    with pytest.raises(ValueError, match=r"^task.search_k: .* got 0"):
        make_task({"name": "multihop", "corpus": str(tmp_path / "new"), "entities": N, "corpus_seed": 3,
                   "test_fraction": 0.2, "search_k": 0})
    with pytest.raises(TaskDataError, match=r"^task.corpus: .* was made with entities=60 \(config 61\)"):
        make_task({"name": "multihop", "corpus": str(tmp_path / "new"), "entities": N + 1, "corpus_seed": 3,
                   "test_fraction": 0.2})


def test_two_hop_expert_trace_retrieves_the_needed_documents_with_bm25(corpus):
    task = MultihopTask(corpus, hops=[2], entities=N, seed=3, test_fraction=0.2)
    box = task.make_toolbox()
    try:
        for p in task.prompts("train", 4, seed=1):
            trace = task.expert_trace(p, box)
            assert trace[:2] == initial_messages(p)
            calls = [m["tool_calls"][0]["function"] for m in trace if m.get("tool_calls")]
            results = [m["content"] for m in trace if m["role"] == "tool"]
            assert [c["arguments"]["query"] for c in calls] == p.meta["queries"] and len(results) == 2
            for doc_id, result in zip(p.meta["docs"], results):
                assert f"(id: {doc_id})" in result  # the hop's page was among the BM25 hits
            assert task.reward(p, trace[-1]["content"]) == 1.0
    finally:
        box.close()
    one = MultihopTask(corpus, hops=[2], entities=N, seed=3, test_fraction=0.2, search_k=1)
    box = one.make_toolbox()
    try:  # one passage a search: the scripted query's page comes first
        trace = one.expert_trace(p, box)
        results = [m["content"] for m in trace if m["role"] == "tool"]
        assert all(r.count("(id: ") == 1 for r in results) and one.reward(p, trace[-1]["content"]) == 1.0
        lost = Prompt(id="x", text="?", answer="y", meta={**p.meta, "queries": ["qqqq zzzz", "qqqq"]})
        with pytest.raises(ExpertMiss, match="prompt x: search"):
            task.expert_trace(lost, box)
    finally:
        box.close()


def test_trace_writer_writes_messages_and_openai_tool_specs(tmp_path, corpus, capsys):
    out = tmp_path / "calc.jsonl"
    assert traces_main(["--task", "calc", "--n", "3", "--out", str(out)]) == 0
    rows = _read(out)
    assert len(rows) == 3 and all(set(r) == {"messages", "tools"} for r in rows)
    assert rows[0]["tools"][0]["type"] == "function" and rows[0]["tools"][0]["function"]["name"] == "calculator"
    out = tmp_path / "mh.jsonl"
    args = ["--task", "multihop", "--n", "5", "--out", str(out), "--corpus", str(corpus), "--hops", "3",
            "--entities", str(N), "--corpus-seed", "3"]
    with pytest.raises(SystemExit):  # the corpus was made with another test fraction: refused, nothing written
        traces_main(args)
    assert "task.corpus" in capsys.readouterr().err and not out.exists()
    assert traces_main([*args, "--test-fraction", "0.2"]) == 0
    rows = _read(out)
    assert len(rows) == 5 and all(len([m for m in r["messages"] if m["role"] == "tool"]) == 3 for r in rows)
    assert [t["function"]["name"] for t in rows[0]["tools"]] == ["search"]


def test_agent_tasks_are_text_tasks():
    assert issubclass(CalcTask, TextTask) and issubclass(MultihopTask, TextTask)
