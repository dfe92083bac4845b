"""Expert tool-use traces for the SFT warm-up of agent tasks.

``python -m rlweave.agents.traces --task calc|multihop --n N --out FILE.jsonl`` writes one JSON
object per line: ``{"messages": [...], "tools": [...]}``, the conversation of a scripted expert
solving a train prompt (system prompt, question, tool calls with the REAL tools' results, final
``The answer is X.``) and the tool specs in OpenAI function form (what
``tokenizer.apply_chat_template(messages, tools=...)`` takes). The system prompt and the answer
line come from :mod:`rlweave.agents.tasks.prompts`, as the RL episodes' do.

Why real tools and not canned outputs: the warm-up must show the observations the policy will read
during RL (the search tool's formatting, the calculator's number format). A prompt whose expert
misses (its search did not return the needed document) is skipped and counted, never written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from rlweave.agents.tasks.base import AgentTask, ExpertMiss
from rlweave.envs.text_tasks import make_task

__all__ = ["write_traces", "main"]


def write_traces(task: AgentTask, n: int, out: str | Path, split: str = "train", seed: int = 0) -> dict[str, Any]:
    """Writes up to ``n`` expert traces of ``split`` prompts (drawn with ``seed``, distinct when the
    split has enough) to ``out``; returns ``{"written", "missed", "path"}``."""
    prompts = task.prompts(split, n, seed)
    box = task.make_toolbox()
    specs = box.specs()
    written = missed = 0
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for prompt in prompts:
                try:
                    messages = task.expert_trace(prompt, box)
                except ExpertMiss:
                    missed += 1
                    continue
                f.write(json.dumps({"messages": messages, "tools": specs}) + "\n")
                written += 1
        os.replace(tmp, out)
    finally:
        box.close()
        tmp.unlink(missing_ok=True)
    return {"written": written, "missed": missed, "path": str(out)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlweave.agents.traces",
                                 description="Write expert tool-use traces ({messages, tools} per line) for SFT.")
    ap.add_argument("--task", required=True, choices=("calc", "multihop"))
    ap.add_argument("--n", type=int, required=True, help="traces to write")
    ap.add_argument("--out", required=True, help="JSONL file to write")
    ap.add_argument("--split", default="train", choices=("train", "test"))
    ap.add_argument("--seed", type=int, default=0, help="draw of prompts")
    ap.add_argument("--corpus", help="multihop: corpus folder (made when missing)")
    ap.add_argument("--hops", default="1,2", help="multihop: hop counts, comma-separated")
    ap.add_argument("--entities", type=int, default=300, help="multihop: people in a newly made corpus")
    ap.add_argument("--corpus-seed", type=int, default=0, help="multihop: seed of a newly made corpus")
    ap.add_argument("--test-fraction", type=float, default=0.1, help="share of problems held out (as the task's)")
    ap.add_argument("--min-digits", type=int, help="calc: default 4")
    ap.add_argument("--max-digits", type=int, help="calc: default 5")
    ap.add_argument("--ops", help="calc: operations, comma-separated (default *)")
    args = ap.parse_args(argv)
    cfg: dict[str, Any] = {"name": args.task, "corpus": args.corpus, "entities": args.entities,
                           "corpus_seed": args.corpus_seed, "test_fraction": args.test_fraction,
                           "min_digits": args.min_digits, "max_digits": args.max_digits,
                           "hops": [int(h) for h in args.hops.split(",") if h.strip()],
                           "ops": args.ops.split(",") if args.ops else None}
    try:
        task = make_task(cfg)
    except ValueError as e:  # TaskDataError included: one line naming the key
        ap.error(str(e))
    stats = write_traces(task, args.n, args.out, args.split, args.seed)
    print(json.dumps(stats))
    return 0 if stats["written"] else 1


if __name__ == "__main__":
    sys.exit(main())
