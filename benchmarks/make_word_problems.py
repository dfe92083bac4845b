"""Writes a GSM8K-style question-answer dataset made here: short word problems over 2-digit
addition and subtraction, each answer a worked line ending in ``#### N``.

Why: nothing can be downloaded on these machines, and ``task.name=jsonl_qa`` needs a dataset a user
could have brought; this one has GSM8K's format (``{question, answer}`` records, ``####`` answers)
at a size a tiny model learns on a CPU. Train and test share no (a, b, template) triple.

    python benchmarks/make_word_problems.py --out data/word-problems   # train.jsonl, test.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NAMES = ["Ana", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana"]
ITEMS = ["apples", "books", "coins", "shells", "stamps", "cards"]
TEMPLATES = {
    "+": ["{name} has {a} {item} and gets {b} more. How many {item}?",
          "{name} had {a} {item} and found {b} more. How many {item}?"],
    "-": ["{name} has {a} {item} and gives away {b}. How many {item}?",
          "{name} had {a} {item} and lost {b}. How many {item}?"],
}

def problems(seed: int) -> list[dict]:
    """Every (op, a, b, template) with 10 <= b <= a <= 99, worded with a seeded name and item."""
    rng = random.Random(seed)
    out = []
    for op, templates in TEMPLATES.items():
        for a in range(10, 100):
            for b in range(10, a + 1):
                t = rng.randrange(len(templates))
                name, item = rng.choice(NAMES), rng.choice(ITEMS)
                result = a + b if op == "+" else a - b
                out.append({"question": templates[t].format(name=name, item=item, a=a, b=b),
                            "answer": f"{a} {op} {b} = {result}\n#### {result}"})
    rng.shuffle(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/word-problems")
    p.add_argument("--test", type=int, default=400, help="held-out problems")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = problems(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("test", rows[: args.test]), ("train", rows[args.test:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    print(f"{out}: {len(rows) - args.test} train, {args.test} test problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
