"""Throughput of the OpenAI-compatible endpoint with concurrent agent episodes: calls batched into
shared decode loops (B) against the same endpoint generating one call at a time (U, baseline,
``max_batch=1``), with the engine called directly on every episode's context at once (D: no HTTP,
no JSON, no recorder; the bound), measured in one run.

  B  batched    PolicyEndpoint(max_batch=64)
  U  unbatched  PolicyEndpoint(max_batch=1)
  D  direct     HFGenerator.generate_ids on all episodes' contexts, turn by turn

``--episodes`` episodes run at once, each in its own thread with its own ``openai.OpenAI`` client;
each makes ``--turns`` chat calls, appending the reply and a user turn every time (so every call
extends the recorded trajectory). Every reply is exactly ``--tokens`` tokens (stop tokens are
suppressed until then), so all sides generate the same tokens. The policy is a fresh (untrained)
Qwen3 of the ``grpo-calc`` size with a tokenizer trained here. Each side runs in its own process,
a discarded warm-up first, rounds in A B, B A order. Headline: generated tokens/s per side; B / U.

    rlweave bench openai_endpoint [--json FILE] [--episodes 16] [--turns 3] [--tokens 32] [--repeats 2]
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

SIDES = ("batched", "unbatched", "direct")
USER_TURN = "Go on."


def _policy(hidden: int, layers: int):
    from rlweave.agents.tasks.prompts import initial_messages
    from rlweave.envs.text_tasks import Prompt
    from rlweave.models.causal_lm import build_causal_lm, train_tokenizer
    from rlweave.models.chat_template import add_chat_template

    prompt = Prompt("q", "What is 1234 * 5678?", "", {"tools": ["calculator"]})
    corpus = [m["content"] for m in initial_messages(prompt)] + [USER_TURN, "The answer is 7006652."]
    tok = add_chat_template(train_tokenizer(corpus * 8, vocab_size=512))
    model = build_causal_lm(len(tok), arch="qwen3", hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                            intermediate_size=2 * hidden, max_positions=1024, seed=0)
    return tok, model.eval(), initial_messages(prompt)


def _side(side: str, episodes: int, turns: int, tokens: int, hidden: int, layers: int) -> dict:
    import openai

    from rlweave.agents.chat import observation_ids, prompt_ids
    from rlweave.agents.endpoint import PolicyEndpoint
    from rlweave.generation.hf_generator import HFGenerator

    tok, model, start = _policy(hidden, layers)
    engine = HFGenerator(model, tok, max_new_tokens=tokens, min_new_tokens=tokens)
    generated = 0
    if side == "direct":
        from rlweave.models.chat_template import stop_token_ids

        t0 = time.perf_counter()
        contexts = [prompt_ids(tok, start, None)] * episodes
        messages = [list(start) for _ in range(episodes)]
        for turn in range(turns):
            gen = engine.generate_ids(contexts, n=1, seed=turn, stop_ids=stop_token_ids(tok))
            generated += sum(len(r) for r in gen.response_ids)
            if turn + 1 < turns:
                for i, r in enumerate(gen.response_ids):
                    messages[i].append({"role": "assistant", "content": tok.decode(r)})
                    obs = observation_ids(tok, messages[i], [{"role": "user", "content": USER_TURN}], None)
                    messages[i].append({"role": "user", "content": USER_TURN})
                    contexts[i] = contexts[i] + r + obs
        timed = time.perf_counter() - t0
        return {"timed_s": timed, "generated_tokens": generated, "tokens_per_s": generated / timed, "mean_batch": episodes}
    endpoint = PolicyEndpoint(engine, tok, max_batch=64 if side == "batched" else 1).start()
    counts = [0] * episodes
    gate = threading.Barrier(episodes + 1)

    def episode(i: int) -> None:
        client = openai.OpenAI(base_url=endpoint.base_url(f"e{i}"), api_key=endpoint.api_key, max_retries=0)
        messages = list(start)
        gate.wait()
        for _ in range(turns):
            reply = client.chat.completions.create(model="policy", messages=messages)
            counts[i] += reply.usage.completion_tokens
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": USER_TURN}]
        client.close()

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(episodes)]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    timed = time.perf_counter() - t0
    one_trajectory = all(len(endpoint.recorder.episode(f"e{i}")) == 1 for i in range(episodes))
    batcher = endpoint.batcher
    endpoint.stop()
    return {"timed_s": timed, "generated_tokens": sum(counts), "tokens_per_s": sum(counts) / timed,
            "mean_batch": batcher.requests / max(1, batcher.batches), "one_trajectory_per_episode": one_trajectory}


def main(argv: list[str] | None = None) -> int:
    p = C.paired_parser("rlweave bench openai_endpoint", __doc__, repeats=2)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32, help="tokens per reply")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    params = {"episodes": args.episodes, "turns": args.turns, "tokens": args.tokens, "hidden": args.hidden,
              "layers": args.layers}
    if args.side:
        return C.serve_side(lambda **kw: _side(args.side, **kw), args.side_params)
    sides = {s: (lambda s=s: C.run_side(__file__, s, params, args.threads)) for s in SIDES}
    _, results = C.interleave(sides, args.repeats, describe=lambda s, r: f"{r['tokens_per_s']:.0f} tokens/s, "
                                                                         f"mean batch {r['mean_batch']:.1f}")
    stats = {s: {"tokens_per_s": C.median([r["tokens_per_s"] for r in results[s]]),
                 "mean_batch": C.median([r["mean_batch"] for r in results[s]]),
                 "generated_tokens": results[s][0]["generated_tokens"]} for s in SIDES}
    for s in SIDES:
        print(f"{s:>9}: {stats[s]['tokens_per_s']:.0f} generated tokens/s (median), mean batch {stats[s]['mean_batch']:.1f}")
    ratio = C.ratio_stats([r["tokens_per_s"] for r in results["batched"]], [r["tokens_per_s"] for r in results["unbatched"]])
    bound = C.ratio_stats([r["tokens_per_s"] for r in results["batched"]], [r["tokens_per_s"] for r in results["direct"]])
    print(f"batched / unbatched: {ratio['median']:.2f}x; batched / direct engine: {bound['median']:.2f}x  "
          f"({args.episodes} episodes x {args.turns} turns x {args.tokens} tokens; load average {C.load_average()})")
    out = C.report("openai_endpoint", argv or [], "generated tokens/s of concurrent openai-client episodes, "
                   "batched vs one call at a time, and the engine's direct bound",
                   {"batched": {"max_batch": 64}, "unbatched": {"max_batch": 1}, "direct": {"http": False}},
                   args.repeats, threads=args.threads)
    out["results"] = {"sides": stats, "runs": results, "batched_over_unbatched": ratio, "batched_over_direct": bound,
                      **params}
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
