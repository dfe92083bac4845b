"""Errors a worker call raises in the driver: :class:`WorkerError` names the group, rank and method
where an exception happened and carries the remote traceback."""

from __future__ import annotations


PROCESS_DIED = "worker process died"


class WorkerError(RuntimeError):
    """An exception raised inside a worker, re-raised in the driver with where it happened."""

    def __init__(self, group: str, rank: int, method: str, message: str, remote_traceback: str = ""):
        self.group, self.rank, self.method = group, rank, method
        self.remote_traceback = remote_traceback
        self.short = f"worker {group}[rank {rank}] failed in {method}(): {message}"
        text = self.short + (f"\n--- remote traceback ---\n{remote_traceback}" if remote_traceback else "")
        super().__init__(text)

    @property
    def process_died(self) -> bool:
        """A worker process died (this one, or one it was calling), as opposed to an exception in
        worker code: the failure a restart of the worker groups can cure."""
        return PROCESS_DIED in self.short

    def __reduce__(self):
        return (WorkerError, (self.group, self.rank, self.method, self.short.split("(): ", 1)[-1], self.remote_traceback))
