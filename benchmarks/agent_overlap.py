"""Do slow tools stall generation? Generated tokens/s of the multi-turn agent loop when every tool
call takes 100 ms (S) against the same loop with instant tools (I, baseline), measured in one run.

  I  instant  the calculator as it is (microseconds a call)
  S  slow     the same calculator behind a 100 ms wait (``--latency-ms``), as a search engine or
              a sandboxed program would take

Both sides run the same episodes: ``--prompts`` questions x ``--samples`` trajectories each (the
grpo-calc recipe's batch: 16 x 8), a Qwen3 of the grpo-calc size that has learnt one calculator
episode (so every trajectory calls the tool, then answers), sampled with fixed seeds, so both sides
generate the same tokens and make the same calls (checked). The loop runs all trajectories' calls of
a turn concurrently, so a turn waits for the slowest call once, not once per trajectory. Each side
runs in its own process, a discarded warm-up first, rounds in A B, B A order. Headline: generated
(model) tokens/s, slow / instant.

    rlweave bench agent-overlap [--json FILE] [--prompts 16] [--samples 8] [--latency-ms 100] [--repeats 2]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

SIDES = ("instant", "slow")
QUESTION, EXPRESSION, ANSWER = "What is 1234 * 5678?", "1234 * 5678", "7006652"


def _toolbox(latency_s: float):
    """The calculator, behind an asyncio wait of ``latency_s`` (0: as it is)."""
    import asyncio

    from rlweave.agents.tools import make_toolbox
    from rlweave.agents.tools.base import Tool, ToolBox

    calculator = make_toolbox(["calculator"])
    if latency_s <= 0:
        return calculator
    inner = calculator.tools["calculator"]

    class Slow(Tool):
        spec, timeout_s = inner.spec, inner.timeout_s + latency_s

        async def run(self, arguments: dict) -> str:
            await asyncio.sleep(latency_s)
            return await inner.run(arguments)

    return ToolBox([Slow()])


def _policy(hidden: int, layers: int, specs: list[dict]):
    """A tokenizer with the chat template and a Qwen3 that has learnt the expert's calculator
    episode (a few seconds of SFT on it), so that its trajectories call the tool and answer."""
    from rlweave.agents.memorised import memorise_episode
    from rlweave.agents.tasks.prompts import final_answer, initial_messages, tool_call_message, tool_message
    from rlweave.envs.text_tasks import Prompt

    prompt = Prompt(id="q", text=QUESTION, answer=ANSWER, meta={"tools": ["calculator"]})
    expert = initial_messages(prompt) + [tool_call_message("calculator", {"expression": EXPRESSION}, "c0"),
                                         tool_message("calculator", ANSWER, "c0"),
                                         {"role": "assistant", "content": final_answer(ANSWER)}]
    tok, model, _ = memorise_episode(expert, specs, hidden=hidden, layers=layers, arch="qwen3", lr=3e-3, max_steps=300)
    return tok, model, initial_messages(prompt)


def _side(side: str, prompts: int, samples: int, latency_ms: float, hidden: int, layers: int) -> dict:
    from rlweave.agents.loop import AgentLoop
    from rlweave.generation.hf_generator import HFGenerator

    box = _toolbox(latency_ms / 1000 if side == "slow" else 0.0)
    tok, model, start = _policy(hidden, layers, box.specs())
    engine = HFGenerator(model, tok, max_new_tokens=48, temperature=0.25)
    loop = AgentLoop(engine, tok, box, max_turns=3, max_tokens=128, max_turn_tokens=48)
    t0 = time.perf_counter()
    trajs = loop.run([start] * prompts, n=samples, seed=0)
    timed = time.perf_counter() - t0
    box.close()
    generated = sum(sum(t.loss_mask) for t in trajs)
    calls = sum(len(t.tool_calls) for t in trajs)
    return {"timed_s": timed, "generated_tokens": generated, "tokens_per_s": generated / timed, "tool_calls": calls,
            "turns": sum(t.turns for t in trajs), "answered": sum(t.finished for t in trajs),
            "tool_wait_s": sum(c["latency_s"] for t in trajs for c in t.tool_calls) / max(1, calls)}


def main(argv: list[str] | None = None) -> int:
    p = C.paired_parser("rlweave bench agent-overlap", __doc__, repeats=2)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8, help="trajectories per prompt")
    p.add_argument("--latency-ms", type=float, default=100.0, help="the slow side's wait per tool call")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    params = {"prompts": args.prompts, "samples": args.samples, "latency_ms": args.latency_ms, "hidden": args.hidden,
              "layers": args.layers}
    if args.side:
        return C.serve_side(lambda **kw: _side(args.side, **kw), args.side_params)
    sides = {s: (lambda s=s: C.run_side(__file__, s, params, args.threads)) for s in SIDES}
    _, results = C.interleave(sides, args.repeats, describe=lambda s, r: f"{r['tokens_per_s']:.0f} tokens/s, "
                                                                         f"{r['tool_calls']} calls")
    same = all(a["generated_tokens"] == b["generated_tokens"] and a["tool_calls"] == b["tool_calls"]
               for a, b in zip(results["instant"], results["slow"]))
    stats = {s: {"tokens_per_s": C.median([r["tokens_per_s"] for r in results[s]]),
                 "tool_calls": results[s][0]["tool_calls"], "generated_tokens": results[s][0]["generated_tokens"]}
             for s in SIDES}
    ratio = C.ratio_stats([r["tokens_per_s"] for r in results["slow"]], [r["tokens_per_s"] for r in results["instant"]])
    for s in SIDES:
        print(f"{s:>8}: {stats[s]['tokens_per_s']:.0f} generated tokens/s (median), {stats[s]['tool_calls']} tool calls")
    print(f"slow / instant: {ratio['median']:.2f}x ({args.prompts} x {args.samples} trajectories, {args.latency_ms:.0f} ms "
          f"tools; same tokens and calls on both sides: {same}; load average {C.load_average()})")
    out = C.report("agent-overlap", argv or [], "generated tokens/s of the agent loop with 100 ms tools / with instant tools",
                   {"instant": {"tool_latency_ms": 0}, "slow": {"tool_latency_ms": args.latency_ms}},
                   args.repeats, threads=args.threads)
    out["ratio"] = ratio["median"]
    out["results"] = {"sides": stats, "runs": results, "slow_over_instant": ratio, "same_work": same, **params}
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
