"""A language-model RL iteration's data, as the driver sees it: rollout outputs grouped by prompt,
the groups as one response batch, and the iteration's metrics record built from them. Pure
functions of their inputs, so the runner's iteration reads as the workflow."""

from __future__ import annotations

import numpy as np
import torch

from rlweave.algorithms.llm import dynamic_sampling_mask
from rlweave.models.causal_lm import response_batch

__all__ = ["assemble", "groups_of", "fresh_groups", "rl_metrics", "agent_metrics"]


def groups_of(gen: dict, n: int) -> list[dict]:
    """A rollout worker's output as groups of ``n`` rows (the responses to one prompt), each
    marked ``informative`` when its rewards are not all equal (DAPO's dynamic sampling keeps those)."""
    rows = [{"prompt_ids": p, "response_ids": r, "logprobs": lp, "finished": f, "reward": rw, "version": gen["version"]}
            for p, r, lp, f, rw in zip(gen["prompt_ids"], gen["response_ids"], gen["logprobs"], gen["finished"], gen["rewards"])]
    if "loss_mask" in gen:  # multi-turn agent rows: 0 on the tool observations inside the response
        for row, m, a in zip(rows, gen["loss_mask"], gen["agent"]):
            row["loss_mask"], row["agent"] = m, a
    if "role" in gen:  # a multi-role workflow (rlweave/agents/workflows.py): each row's role and its stat pairs
        for row, role, st in zip(rows, gen["role"], gen["role_stats"]):
            row["role"], row["role_stats"] = role, st
    groups = []
    for i in range(0, len(rows), n):
        grp = rows[i : i + n]
        rewards = torch.tensor([r["reward"] for r in grp])
        informative = bool(dynamic_sampling_mask(rewards, torch.zeros(len(grp), dtype=torch.long)).any())
        groups.append({"rows": grp, "gen_version": gen["version"], "informative": informative,
                       "reward_failures": gen["reward_failures"] if i == 0 else 0,  # counted once per worker output
                       "time/generate": gen["time/generate"] if i == 0 else 0.0})
    return groups


def fresh_groups(groups: list[dict], version: int, max_staleness: int) -> tuple[list[dict], int]:
    """Asynchronous PPO's staleness bound, applied before an update at policy ``version``: groups
    sampled more than ``max_staleness`` versions earlier are dropped; returns the kept groups and
    how many were dropped (logged as ``train/stale_groups_dropped``): a stale group's importance
    weights would be capped almost everywhere, so it would mostly add variance. Single-turn rows
    and multi-turn agent trajectories alike (a trajectory's turns all come from one engine version: the weights land
    between generations). Nothing fresh enough left: ``RuntimeError`` on one line."""
    kept = [g for g in groups if version - g["gen_version"] <= max_staleness]
    if not kept:
        oldest = version - min(g["gen_version"] for g in groups)
        raise RuntimeError(f"async PPO: every one of {len(groups)} groups is older than train.max_staleness={max_staleness} "
                           f"versions (the oldest {oldest}); nothing left to train on")
    return kept, len(groups) - len(kept)


def assemble(groups: list[dict], pad_token_id: int) -> dict:
    """The groups' rows as one response batch (each prompt once) plus response-aligned [B, R]
    behaviour log-probs and the per-row facts the update and the metrics need."""
    rows = [r for g in groups for r in g["rows"]]
    batch = response_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_token_id)
    B, R = batch["response_ids"].shape
    behaviour = np.zeros((B, R), dtype=np.float32)
    for i, r in enumerate(rows):
        behaviour[i, : len(r["logprobs"])] = r["logprobs"]
    resp_len = batch["resp_len"]
    mask = np.arange(R)[None, :] < resp_len[:, None]
    if any("loss_mask" in r for r in rows):  # multi-turn rows: observation tokens out of losses and advantages
        loss_mask = np.zeros((B, R), dtype=np.int8)
        for i, r in enumerate(rows):
            loss_mask[i, : len(r["response_ids"])] = r.get("loss_mask", 1)
        batch["loss_mask"], mask = loss_mask, mask & loss_mask.astype(bool)
    agent = [r["agent"] for r in rows if "agent" in r]
    if agent:  # per-trajectory counts summed over the rows kept
        batch["agent"] = {k: sum(a[k] for a in agent) for k in agent[0]}
    if any("role" in r for r in rows):  # multi-role rows: roles (agent.role_weights) and stat pairs summed over the rows kept
        from rlweave.agents.workflows import sum_stats

        batch["role"] = np.array([r.get("role", "") for r in rows])
        batch["role_stats"] = sum_stats([r["role_stats"] for r in rows if "role_stats" in r])
    return {
        **batch, "mask": mask, "behaviour_logprobs": behaviour,
        "rewards": np.array([r["reward"] for r in rows], dtype=np.float32),
        "group": np.array([gi for gi, g in enumerate(groups) for _ in g["rows"]], dtype=np.int64),
        "finished": np.array([r["finished"] for r in rows]), "gen_version": np.array([r["version"] for r in rows]),
        "reward_failures": sum(g["reward_failures"] for g in groups),
        "width_tokens": np.array([len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows]),
        "time/generate": sum(g["time/generate"] for g in groups),
        "informative_groups": sum(g["informative"] for g in groups),
    }


def rl_metrics(batch: dict, scored: dict, scores: torch.Tensor, kl: torch.Tensor | None, outs: list[dict], times: dict,
               epochs: int, version: int) -> dict:
    """Rewards, lengths, the rollout-trainer log-prob gap, KL, tokens/s per stage and the actor
    ranks' own figures (each ``time/actor_*`` the slowest rank's; the rest averaged)."""
    m = torch.as_tensor(batch["mask"]).bool()
    gen_tokens = int(m.sum())
    rewards = np.asarray(batch["rewards"])
    record = {
        "train/reward": float(np.mean(rewards)), "train/score": float(scores.mean()),
        "train/accuracy": float(np.mean(rewards > 0)), "train/response_length": float(np.mean(batch["resp_len"])),
        "train/truncated_responses": float(np.mean(~np.asarray(batch["finished"]))),
        "train/reward_error_rate": batch["reward_failures"] / max(1, len(rewards)),
        "train/informative_groups": batch["informative_groups"],
        # staleness: versions between the weights that sampled a row and those the update starts from
        "train/policy_lag": float(np.mean(version - 1 - np.asarray(batch["gen_version"]))),
        "train/staleness_max": int(np.max(version - 1 - np.asarray(batch["gen_version"]))),
        "throughput/generate_tokens_per_s": gen_tokens / max(batch["time/generate"], 1e-9),
        "throughput/score_tokens_per_s": int(np.sum(batch["width_tokens"])) / max(times["time/score"], 1e-9),
        "throughput/train_tokens_per_s": int(np.sum(batch["width_tokens"])) * epochs / max(times["time/update"], 1e-9),
    }
    if scored:  # the train-inference gap: rollout engine vs trainer log-probs of the same tokens, same weights
        gap = (torch.as_tensor(batch["behaviour_logprobs"]) - torch.as_tensor(scored["logprobs"])).abs()[m]
        record["rollout/logprob_gap"] = float(gap.sum()) / max(1, gen_tokens)
        record["rollout/logprob_gap_max"] = float(gap.max()) if gap.numel() else 0.0
    else:  # measured inside the update, whose own forward was the anchor
        record["rollout/logprob_gap"] = sum(o["logprob_gap_sum"] for o in outs) / max(1, gen_tokens)
        record["rollout/logprob_gap_max"] = max(o["logprob_gap_max"] for o in outs)
    if kl is not None:
        record["train/kl"] = float(kl[m].mean())
    if "agent" in batch:
        record.update(agent_metrics(batch["agent"], "train"))
    if "role_stats" in batch:  # train/reward/<role> and the workflow's rates
        from rlweave.agents.workflows import ratio_metrics

        record.update(ratio_metrics(batch["role_stats"], "train"))
    for k, v in outs[0].items():  # time/actor_*: inside the slowest rank; time/update minus these is transfer and waiting
        if k.startswith("time/actor_"):
            record[k] = max(o[k] for o in outs)
        elif isinstance(v, (int, float)) and not k.startswith(("time/", "logprob_gap")):
            record[f"train/{k}" if not k.startswith("peak") else k] = float(np.mean([o[k] for o in outs]))
    return record


def agent_metrics(stats: dict, prefix: str) -> dict:
    """Multi-turn agent figures from :func:`~rlweave.agents.loop.agent_stats` sums: tool calls and
    turns per trajectory, the fraction of turns that parse (closed, every tool call valid JSON with
    a name), finished trajectories, the mean tool latency, and failed tool calls by kind."""
    n = max(1, stats["trajectories"])
    out = {f"{prefix}/tool_calls_per_trajectory": stats["tool_calls"] / n, f"{prefix}/turns_per_trajectory": stats["turns"] / n,
           f"{prefix}/format_valid": stats["parsed_turns"] / max(1, stats["turns"]), f"{prefix}/finished": stats["finished"] / n}
    if "tool_latency_s" in stats:
        out[f"{prefix}/tool_latency_s"] = stats["tool_latency_s"] / max(1, stats["tool_calls"])  # mean per call
    out.update({f"{prefix}/tool_errors/{k[len('errors_'):]}": v for k, v in stats.items() if k.startswith("errors_")})
    return out


def eval_record(outs: list[dict]) -> dict:
    """One evaluation's figures from the rollout workers' ``evaluate`` results (one per worker, or
    per batch of prompts): accuracy, response length, the agent figures of multi-turn episodes and,
    for multi-role workflows, per-role rewards and the workflow's rates."""
    n = sum(o["n"] for o in outs)
    record = {"eval/accuracy": sum(o["correct"] for o in outs) / max(1, n),
              "eval/response_length": sum(o["response_tokens"] for o in outs) / max(1, n)}
    agent = [o["agent"] for o in outs if o.get("agent")]
    if agent:  # multi-turn evaluation: greedy episodes with the tools
        record.update(agent_metrics({k: sum(a[k] for a in agent) for k in agent[0]}, "eval"))
    stats = [o["stats"] for o in outs if o.get("stats")]
    if stats:  # a multi-role workflow: per-role rewards and its own rates (eval/reward/<role>, ...)
        from rlweave.agents.workflows import ratio_metrics, sum_stats

        record.update(ratio_metrics(sum_stats(stats), "eval"))
    return record
