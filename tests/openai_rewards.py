"""Reward functions for the OpenAI-endpoint recipe test (``task.reward_fn=openai_rewards:NAME``)."""


def conversation_length(prompt, response):
    """The number of messages in the episode's conversation (``prompt.meta["messages"]``): what
    shows that the reward function sees the agent's whole conversation, not just its answer."""
    messages = prompt.meta["messages"]
    assert messages[-1]["role"] == "assistant" and messages[0]["role"] == "system"
    return float(len(messages))


def digit_fraction(prompt, response):
    """The share of the final answer's characters that are digits: a reward an untrained policy
    already earns a little of, so a few GRPO iterations show whether training through the
    endpoint's recorded trajectories raises it (a check of the path, not of arithmetic)."""
    return sum(c.isdigit() for c in response) / len(response) if response else 0.0
