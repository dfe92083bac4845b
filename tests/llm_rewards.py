"""Reward functions for the language-model tests (``task.reward_fn=llm_rewards:NAME``)."""


def fails_on_odd(prompt, response):
    """Raises for every problem whose first operand is odd, scores 1 otherwise."""
    if prompt.meta["a"] % 2:
        raise ValueError("odd operand")
    return 1.0
