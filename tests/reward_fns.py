"""Reward functions for tests/test_text_tasks.py (loaded by name in a separate process)."""

import time


def length_reward(prompt, response):
    return float(len(response))


def raises(prompt, response):
    raise ValueError("bad response format")


def hangs(prompt, response):
    if "hang" in response:
        time.sleep(3600)
    return 1.0


not_callable = 3
