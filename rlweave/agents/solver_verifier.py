"""Two roles of ONE policy trained jointly: a solver answers the task's question with its tools, a
verifier checks each solver answer (``agent.workflow: solver_verifier``).

Per prompt: ``n`` solver episodes (the agent loop, the task's own system prompt and tools, exactly
a ``tools`` workflow episode), then one verifier episode per solver answer. The verifier is the
same model told its role by another system prompt
(:data:`~rlweave.agents.tasks.prompts.VERIFIER_PROMPT`); it sees the question and the solver's
extracted final answer, may call the same tools, and must end with ``The answer is correct.`` or
``The answer is incorrect.``.

Rewards (each role's own, never the team's):

* solver: the task's reward of its final answer (exact match for ``calc``), as in ``grpo-calc``;
* verifier: 1 when its verdict equals the truth of the answer it judged (accepts a correct
  answer, rejects a wrong one), else 0; no verdict line is 0. "Correct" means the solver's reward
  is > 0. Why not the team outcome (the team scores when the verifier accepts a correct answer):
  rewarded on that, a verifier only gains by accepting, so it learns to say "correct" always
  and stops checking anything.

The team's answer (logged, not trained on) is the solver's answer when the verifier accepts it:
``team/accuracy`` counts solver episodes whose answer is correct and accepted.

GRPO groups: the ``n`` solver episodes of a prompt are one group; the ``n`` verifier episodes of
that prompt (one per solver answer) are another. Why not ``m`` verdicts per solver answer (a group
of identical contexts): that costs ``n*m`` verifier episodes per prompt; with one verdict each,
the baseline is the verifier's mean success on that question across the answers it saw, a fair
baseline because the solver's answers are drawn independently of each verdict. Rows are
prompt-major, the solver group then the verifier group, so the runner's ``group_size`` chunks
make exactly these groups (DAPO's filter and every estimator work unchanged).

Both roles' rows are one batch for one update of the one policy; every model token weighs the
same (``loss_agg``), and ``agent.role_weights`` (default 1 per role) scales a role's advantages.

Evaluation (greedy, held-out prompts): the solver's answers, the verifier's verdicts on them
(``eval/reward/solver``, ``eval/reward/verifier``), and a fixed probe per prompt, the gold answer
or a near miss (half each by a hash of the prompt), so ``eval/verifier/probe_accuracy`` measures
the verifier on both kinds even when the solver is almost always right (or wrong).
"""

from __future__ import annotations

import json
import os
import random
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence

from rlweave.agents.chat import initial_conversation
from rlweave.agents.loop import AgentLoop, Trajectory, agent_stats
from rlweave.agents.tasks.base import ExpertMiss
from rlweave.agents.tasks.prompts import parse_verdict, verdict_line, verifier_messages
from rlweave.agents.workflows import Workflow, sum_stats
from rlweave.envs.text_tasks import Prompt, answers_match, extract_answer

__all__ = ["SolverVerifierRollout", "verifier_reward", "shown_answer", "near_miss", "verifier_trace", "write_traces",
           "WORKFLOW", "ROLES"]

ROLES = ("solver", "verifier")
MAX_SHOWN_CHARS = 24  # the proposed answer the verifier reads is cut to this: its prompt's length stays bounded
VERIFIER_SEED = 1_000_003  # offset of the verifier episodes' sampling seed from the solver's


def verifier_reward(verdict: bool | None, solver_correct: bool) -> float:
    """1 when the verdict (True accepts) equals the truth of the answer judged; 0 otherwise, and
    for no verdict."""
    return 1.0 if verdict is not None and verdict == bool(solver_correct) else 0.0


def shown_answer(final_text: str) -> str:
    """What the verifier is shown of a solver episode: its extracted final answer (``none`` when it
    gave none), cut to :data:`MAX_SHOWN_CHARS`."""
    got = extract_answer(final_text)
    return (got if got else "none")[:MAX_SHOWN_CHARS]


def near_miss(prompt: Prompt, rng: random.Random, others: Sequence[str] = ()) -> str:
    """A wrong answer close to the gold one, the kind a solver that copies a tool result makes: a
    digit changed, two neighbours swapped, a digit dropped or repeated, or off by a power of ten's
    multiple. A non-numeric answer becomes another prompt's (``others``)."""
    gold = prompt.answer
    if not gold.lstrip("-").isdigit():
        wrong = [o for o in others if not answers_match(o, gold)]
        return rng.choice(wrong) if wrong else gold + " " + gold
    value = int(gold)
    for _ in range(20):
        d = list(str(abs(value)))
        kind, i = rng.randrange(5), rng.randrange(len(d))
        if kind == 0:
            d[i] = rng.choice([c for c in "0123456789" if c != d[i]])
        elif kind == 1 and len(d) > 1:
            i = min(i, len(d) - 2)
            d[i], d[i + 1] = d[i + 1], d[i]
        elif kind == 2 and len(d) > 1:
            del d[i]
        elif kind == 3:
            d.insert(i, d[i])
        else:
            d = list(str(abs(value + rng.choice([-1, 1]) * rng.randint(1, 9) * 10 ** i)))
        cand = ("-" if value < 0 else "") + str(int("".join(d)))
        if not answers_match(cand, gold):
            return cand
    return str(int(gold) + 1)


def verifier_trace(task, prompt: Prompt, proposed: str, toolbox) -> list[dict[str, Any]]:
    """The verifier's expert conversation: its opening, the task expert's own tool calls with the
    REAL tools' results (it recomputes), then the verdict comparing ``proposed`` with the answer.
    Raises :class:`ExpertMiss` as the solver's expert does."""
    accept = answers_match(proposed, prompt.answer)
    return [*verifier_messages(prompt, proposed), *task.expert_steps(prompt, toolbox),
            {"role": "assistant", "content": verdict_line(accept)}]


def _proposals(task, prompts: Sequence[Prompt], seed: int) -> list[str]:
    """Half gold answers, half near misses (each prompt's coin seeded by ``seed`` and its id)."""
    answers = [p.answer for p in prompts]
    out = []
    for p in prompts:
        rng = random.Random(zlib.crc32(f"{seed}:{p.id}".encode()))
        out.append(p.answer if rng.random() < 0.5 else near_miss(p, rng, answers))
    return out


def write_traces(task, n: int, out: str | Path, seed: int = 0, agent_cfg: dict | None = None,
                 split: str = "train") -> dict[str, Any]:
    """``n`` solver traces (the task's expert) and ``n`` verifier traces (:func:`verifier_trace`,
    judging the gold answer or a near miss, half each) on ``n`` ``split`` prompts, one
    ``{"messages", "tools"}`` per line, alternating roles; returns ``{"written", "missed", "path",
    "accepts"}``."""
    from rlweave.agents.rollout import tool_entries
    from rlweave.agents.tools import make_toolbox

    prompts = task.prompts(split, n, seed)
    box = make_toolbox(tool_entries(agent_cfg, task)) if agent_cfg else task.make_toolbox()
    specs = box.specs()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    written = missed = accepts = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for p, proposed in zip(prompts, _proposals(task, prompts, seed)):
                try:
                    traces = [task.expert_trace(p, box), verifier_trace(task, p, proposed, box)]
                except ExpertMiss:
                    missed += 1
                    continue
                for messages in traces:
                    f.write(json.dumps({"messages": messages, "tools": specs}) + "\n")
                written += 2
                accepts += int(answers_match(proposed, p.answer))
        os.replace(tmp, out)
    finally:
        box.close()
        tmp.unlink(missing_ok=True)
    return {"written": written, "missed": missed, "path": str(out), "accepts": accepts}


def _corpus(task, agent_cfg: dict, prompts: Sequence[Prompt]) -> list[str]:
    """The solver's chat corpus plus each prompt's verifier trace (gold or near miss)."""
    from rlweave.agents.rollout import chat_corpus, tool_entries
    from rlweave.agents.tools import make_toolbox
    from rlweave.models.chat_template import render_text

    out = chat_corpus(task, agent_cfg, prompts)
    box = make_toolbox(tool_entries(agent_cfg, task))
    specs = box.specs()
    try:
        for p, proposed in zip(prompts, _proposals(task, prompts, 0)):
            try:
                out.append(render_text(verifier_trace(task, p, proposed, box), specs))
            except (ExpertMiss, AttributeError):  # no expert: the opening and the verdict still teach the words
                out.append(render_text([*verifier_messages(p, proposed), {"role": "assistant", "content": verdict_line(True)}],
                                       specs))
    finally:
        box.close()
    return out


def _openings(prompt: Prompt) -> list[list[dict]]:
    """Both roles' first conversations (the verifier's with an answer as long as it may be shown)."""
    return [initial_conversation(prompt), verifier_messages(prompt, "9" * MAX_SHOWN_CHARS)]


class SolverVerifierRollout:
    """The episode producer of the ``solver_verifier`` workflow (see the module doc)."""

    def __init__(self, generator, tokenizer, agent_cfg: dict, max_turn_tokens: int, task,
                 scorer: Callable[[Sequence[Prompt], Sequence[str]], list[float]]):
        from rlweave.agents.rollout import tool_entries
        from rlweave.agents.tools import make_toolbox

        self.task, self.scorer = task, scorer
        self.toolbox = make_toolbox(tool_entries(agent_cfg, task))
        self.loop = AgentLoop(generator, tokenizer, self.toolbox, max_turns=agent_cfg.get("max_turns", 4),
                              max_tokens=agent_cfg.get("max_tokens", 256), max_turn_tokens=max_turn_tokens)

    def _verify(self, prompts: Sequence[Prompt], proposed: Sequence[str], seed: int, greedy: bool
                ) -> tuple[list[Trajectory], list[bool | None]]:
        trajs = self.loop.run([verifier_messages(p, a) for p, a in zip(prompts, proposed)], n=1, seed=seed, greedy=greedy)
        return trajs, [parse_verdict(t.final_text) for t in trajs]

    def generate(self, prompts: Sequence[Prompt], n: int, seed: int, greedy: bool = False) -> tuple[dict, list[str]]:
        """Per prompt: ``n`` solver rows, then the ``n`` verifier rows judging them; both roles'
        rewards computed here (``out["rewards"]``), with ``role`` and ``role_stats`` per row."""
        solvers = self.loop.run([initial_conversation(p) for p in prompts], n=n, seed=seed, greedy=greedy)
        asked = [prompts[i // n] for i in range(len(solvers))]
        s_rewards = [float(r) for r in self.scorer(asked, [t.final_text for t in solvers])]
        verifiers, verdicts = self._verify(asked, [shown_answer(t.final_text) for t in solvers], seed + VERIFIER_SEED, greedy)
        rows: list[tuple[Trajectory, str, float, dict]] = []
        for g in range(len(prompts)):
            part = range(g * n, (g + 1) * n)
            for i in part:
                ok, accepted = s_rewards[i] > 0, verdicts[i] is True
                rows.append((solvers[i], "solver", s_rewards[i],
                             {"reward/solver": [s_rewards[i], 1], "team/accuracy": [int(ok and accepted), 1]}))
            for i in part:
                ok, v = s_rewards[i] > 0, verdicts[i]
                rows.append((verifiers[i], "verifier", verifier_reward(v, ok),
                             {"reward/verifier": [verifier_reward(v, ok), 1], "verifier/accept_rate": [int(v is True), 1],
                              "verifier/verdict_rate": [int(v is not None), 1],
                              "verifier/accept_if_correct": [int(ok and v is True), int(ok)],
                              "verifier/reject_if_wrong": [int(not ok and v is False), int(not ok)]}))
        out = {"prompt_ids": [t.prompt_ids for t, *_ in rows], "response_ids": [t.response_ids for t, *_ in rows],
               "logprobs": [t.logprobs for t, *_ in rows], "finished": [t.finished for t, *_ in rows],
               "loss_mask": [t.loss_mask for t, *_ in rows], "agent": [agent_stats([t]) for t, *_ in rows],
               "group": [i // (2 * n) for i in range(len(rows))], "rewards": [r for _, _, r, _ in rows],
               "role": [role for _, role, _, _ in rows], "role_stats": [s for *_, s in rows],
               "version": self.loop.generator.version}
        return out, [t.final_text for t, *_ in rows]

    def evaluate(self, prompts: Sequence[Prompt]) -> dict:
        """Greedy episodes of both roles on held-out ``prompts`` (the verifier judging the solver's
        answers), plus the verifier on a fixed probe per prompt; the worker's evaluation record
        (``correct``: the solver's) with the summed ``stats``."""
        out, _ = self.generate(prompts, 1, 0, greedy=True)
        probes = _proposals(self.task, prompts, seed=0)
        trajs, verdicts = self._verify(prompts, probes, 0, greedy=True)
        stats = sum_stats(out["role_stats"] + [
            {"verifier/probe_accuracy": [verifier_reward(v, answers_match(a, p.answer)), 1]}
            for p, a, v in zip(prompts, probes, verdicts)])
        solver = [i for i, role in enumerate(out["role"]) if role == "solver"]  # eval/accuracy and lengths: the solver's
        return {"correct": int(sum(out["rewards"][i] > 0 for i in solver)), "n": len(prompts),
                "response_tokens": sum(len(out["response_ids"][i]) for i in solver),
                "agent": {k: sum(out["agent"][i][k] for i in solver) for k in out["agent"][0]}, "stats": stats}

    def close(self) -> None:
        self.toolbox.close()


WORKFLOW = Workflow("solver_verifier", SolverVerifierRollout, roles=ROLES, openings=_openings,
                    expert_traces=write_traces, corpus=_corpus)
