"""Peer calls between processes of one node over the direct (Unix socket) transport: same values
as a Ray call, several in flight, errors and process deaths reported as WorkerError."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
import ray

from rlweave.cluster import Cluster, Worker, WorkerError, WorkerGroup
from rlweave.utils import direct
from rlweave.cluster.placement import GroupPlacement, Slot


class Server(Worker):
    def scaled(self, x: np.ndarray, factor: float) -> dict:
        return {"y": x * factor, "rank": self.rank, "pid": os.getpid()}

    def fail(self) -> None:
        raise ValueError("bad request 42")

    def pid(self) -> int:
        return os.getpid()

    def unsendable(self):
        return threading.Lock()


class Caller(Worker):
    def configure(self, peer) -> None:
        self.peer = peer

    def transport(self) -> str:
        return "direct" if self.peer.direct is not None else "ray"

    def ask(self, x: np.ndarray, factors: list[float]) -> list:
        """Submits one request per factor, then collects them in reverse order."""
        pending = [self.peer.submit("scaled", x, f) for f in factors]
        out = []
        for p in reversed(pending):
            value, seconds = self.peer.result(p)
            out.append((value["y"], bool(value["y"].flags.writeable), value["pid"], seconds >= 0.0))
        return out

    def connected(self) -> list[str]:
        """The server addresses this process holds connections to."""
        return sorted({address for address, _ in direct._CONNECTIONS})

    def ask_fail(self, method: str = "fail") -> str:
        try:
            self.peer.result(self.peer.submit(method))
        except WorkerError as e:
            return e.short
        except RuntimeError as e:
            return f"RuntimeError: {e}"
        return "no error"


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def _pair(peer_calls: str):
    cluster = Cluster.start(peer_calls=peer_calls)
    server = WorkerGroup(Server, GroupPlacement("server", [Slot(0, 1)]), cluster)
    caller = WorkerGroup(Caller, GroupPlacement("caller", [Slot(0, 0)]), cluster)
    caller.run("configure", server.peer(0, caller.hosts[0]))
    return server, caller


@pytest.mark.parametrize("peer_calls", ["direct", "ray"])
def test_peer_calls_return_the_same_values_on_either_transport(ray_session, peer_calls):
    server, caller = _pair(peer_calls)
    try:
        assert caller.run("transport") == [peer_calls]
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        out = caller.run("ask", x, [1.0, 2.0, 3.0])[0]
        # collected in reverse order of submission: each reply matched to its own request
        assert [float(y[1, 2]) for y, *_ in out] == [18.0, 12.0, 6.0]
        np.testing.assert_array_equal(out[0][0], x * 3.0)
        assert {pid for _, _, pid, _ in out} == {server.run("pid")[0]}
        assert all(ok for *_, ok in out)
        if peer_calls == "direct":  # arrays come out of the socket in fresh, writable memory
            assert all(writable for _, writable, _, _ in out)
    finally:
        caller.shutdown()
        server.shutdown()


def test_a_failure_in_the_peer_names_its_group_rank_and_method(ray_session):
    server, caller = _pair("direct")
    try:
        assert caller.run("ask_fail") == ["worker server[rank 0] failed in fail(): ValueError('bad request 42')"]
        assert caller.run("ask_fail", "unsendable") == [
            "RuntimeError: unsendable() returned a value that cannot be sent: TypeError(\"cannot pickle '_thread.lock' object\")"]
        # the connection stays usable after an error
        assert float(caller.run("ask", np.ones(2, np.float32), [5.0])[0][0][0][0]) == 5.0
    finally:
        caller.shutdown()
        server.shutdown()


def test_a_killed_peer_process_is_reported_as_a_death(ray_session):
    server, caller = _pair("direct")
    try:
        caller.run("ask", np.ones(2, np.float32), [1.0])  # connection open
        os.kill(server.run("pid")[0], signal.SIGKILL)
        with pytest.raises(WorkerError) as err:
            caller.run("ask", np.ones(2, np.float32), [1.0])
        assert "worker server[rank 0] failed in (peer call)(): worker process died" in str(err.value)
    finally:
        caller.shutdown()


def test_connections_to_a_replaced_peer_are_closed_when_the_next_peer_is_opened(ray_session):
    server, caller = _pair("direct")
    second = None
    try:
        first_address = server.peer(0, caller.hosts[0]).direct[0]
        for _ in range(4):  # calls land on several of the host's threads: one connection each
            caller.run("ask", np.ones(2, np.float32), [1.0])
        assert caller.run("connected") == [[first_address]]
        server.shutdown()  # the plan switch's rebuild: the old rollout process exits
        second = WorkerGroup(Server, GroupPlacement("server2", [Slot(0, 1)]), caller.cluster)
        peer = second.peer(0, caller.hosts[0])
        caller.run("configure", peer)
        assert float(caller.run("ask", np.ones(2, np.float32), [3.0])[0][0][0][0]) == 3.0
        assert caller.run("connected") == [[peer.direct[0]]]
    finally:
        caller.shutdown()
        if second is not None:
            second.shutdown()


def test_a_caller_without_the_key_is_refused(ray_session):
    server, caller = _pair("direct")
    try:
        peer = server.peer(0, caller.hosts[0])
        address, authkey, _ = peer.direct
        with pytest.raises(Exception) as err:
            direct.DirectConnection(address, b"x" * len(authkey))
        assert "digest" in str(err.value).lower() or "authentication" in str(err.value).lower()
        # the server still answers callers that hold the key
        assert float(caller.run("ask", np.ones(2, np.float32), [2.0])[0][0][0][0]) == 2.0
    finally:
        caller.shutdown()
        server.shutdown()


def test_peer_calls_setting_is_checked():
    with pytest.raises(ValueError, match="cluster.peer_calls must be 'direct' or 'ray', got 'grpc'"):
        Cluster.start(peer_calls="grpc")
