"""Agent code written against the official ``openai`` client, trained by rlweave as it is.

:func:`calculator_agent` is ordinary OpenAI tool-use code: it sends the conversation with a
``calculator`` function tool, runs the calls the model makes, sends the results back as ``tool``
messages, and returns the model's final answer. Nothing in it knows about rlweave. rlweave trains
it by serving the policy at an OpenAI-compatible endpoint and handing the function a client
pointed there (recipe ``grpo-openai-calc``, whose ``agent.openai_fn`` names this function; run it
from the repository root, where ``examples`` imports)::

    rlweave train grpo-openai-calc

Run this file to watch one episode against a small, untrained policy and what rlweave recorded
from it (the token-level trajectory the trainer would score)::

    python examples/openai_agent.py
"""

from __future__ import annotations

import json
from typing import Any

from rlweave.agents.tasks.prompts import initial_messages
from rlweave.agents.tools.calculator import Calculator, evaluate, format_number
from rlweave.envs.text_tasks import Prompt

# The tool and the system prompt are rlweave's calc task's (data only: the OpenAI function-tool
# dict and two chat messages), so the SFT warm-up's expert traces show the model this exact text.
TOOLS = [Calculator.spec.to_openai()]


def calculate(expression: str) -> str:
    """The tool: rlweave's safe arithmetic evaluator (no ``eval``); an error is the model's observation."""
    try:
        return format_number(evaluate(expression))
    except Exception as e:  # noqa: BLE001 - a bad expression is something the model should read
        return f"error: {e}"


def calculator_agent(client, prompt, model: str = "policy", max_turns: int = 4) -> str | None:
    """One episode: ``prompt`` is the task's prompt (its ``text`` is the question). Returns the
    final answer text (the reward function reads it)."""
    if isinstance(prompt, str):
        prompt = Prompt(id="question", text=prompt, answer="", meta={"tools": ["calculator"]})
    messages: list[dict[str, Any]] = initial_messages(prompt)  # the system prompt and the question
    answer = None
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        answer = msg.content
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return answer


def _demo() -> None:
    """One episode against a random small policy, and the trajectory rlweave recorded."""
    import openai

    from rlweave.agents.endpoint import PolicyEndpoint
    from rlweave.generation.hf_generator import HFGenerator
    from rlweave.models.causal_lm import build_causal_lm, train_tokenizer
    from rlweave.models.chat_template import add_chat_template

    corpus = [json.dumps(TOOLS), *(m["content"] for m in initial_messages(Prompt("q", "What is 1234 * 5678?", "", {"tools": ["calculator"]})))]
    tokenizer = add_chat_template(train_tokenizer(corpus * 4, vocab_size=400))
    model = build_causal_lm(len(tokenizer), hidden_size=64, num_layers=2, max_positions=1024)
    with PolicyEndpoint(HFGenerator(model, tokenizer, max_new_tokens=24), tokenizer) as endpoint:
        client = openai.OpenAI(base_url=endpoint.base_url("demo"), api_key=endpoint.api_key, max_retries=0)
        answer = calculator_agent(client, "What is 1234 * 5678?")
        (trajectory,) = endpoint.recorder.pop("demo")[:1]
    print(f"final answer: {answer!r}")
    print(f"trajectory: {len(trajectory.prompt_ids)} prompt tokens, {len(trajectory.response_ids)} after them, "
          f"{trajectory.generated_tokens} generated in {len(trajectory.calls)} call(s)")


if __name__ == "__main__":
    _demo()
