"""What a generation engine returns: :class:`Generation`, the sampled responses with their
behaviour log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Generation"]


@dataclass
class Generation:
    """``n`` responses per prompt, prompt-major (responses of prompt i at ``i*n .. i*n+n-1``).

    ``response_ids`` stop after the first end-of-sequence token (kept) or at ``max_new_tokens``
    (``finished`` False: truncated); ``logprobs`` has one entry per response token."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    group: list[int] = field(default_factory=list)  # index of each response's prompt
    version: int = -1  # the weights' version that sampled them
