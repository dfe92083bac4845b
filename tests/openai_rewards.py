"""Reward functions for the OpenAI-endpoint recipe test (``task.reward_fn=openai_rewards:NAME``)."""


def conversation_length(prompt, response):
    """The number of messages in the episode's conversation (``prompt.meta["messages"]``): what
    shows that the reward function sees the agent's whole conversation, not just its answer."""
    messages = prompt.meta["messages"]
    assert messages[-1]["role"] == "assistant" and messages[0]["role"] == "system"
    return float(len(messages))
