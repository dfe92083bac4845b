"""How a worker opens the channels the runner wired it to."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rlweave.channel import Channel

_LOCK = threading.Lock()


@dataclass(frozen=True)
class ChannelSpec:
    """A channel as passed to workers: its name and whether it lives in the worker's own process
    (workers fused into one host process talk through a local channel, at function-call cost)."""

    name: str
    local: bool = False
    maxsize: int = 0

    def open(self) -> Channel:
        if not self.local:
            return Channel.connect(self.name)
        with _LOCK:  # fused workers of one host share the process's local channel of this name
            try:
                return Channel.connect(self.name)
            except ValueError:
                return Channel.create(self.name, maxsize=self.maxsize, local=True)
