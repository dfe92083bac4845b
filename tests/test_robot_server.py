"""The robot server's rules on a real server (websockets on loopback, a MuJoCo/gymnasium simulator as
the robot): one controller, limits, heartbeats, tokens, size limits, malformed requests, frames."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
import pytest

pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from rlweave.robot.client import RemoteRobotEnv, RemoteRobotError  # noqa: E402
from rlweave.robot.driver import SimDriver  # noqa: E402
from rlweave.robot.protocol import pack, unpack  # noqa: E402
from rlweave.robot.server import Limits, ServerThread  # noqa: E402
from rlweave.serving import ServerSecurity, bearer_headers  # noqa: E402

TOKEN = "robot-test-token-0123456789"


def _server(env_id: str = "Pendulum-v1", token: str | None = None, max_bytes: int = 64 * 1024, camera: dict | None = None,
            **limits) -> ServerThread:
    sec = ServerSecurity.create("robot server", token=token, max_message_bytes=max_bytes)
    return ServerThread(lambda: SimDriver(env_id, camera=camera), sec, Limits(**limits))


class Raw:
    """A bare protocol client: what a buggy or hostile client can send."""

    def __init__(self, srv: ServerThread, token: str | None = None):
        self.ws = connect(srv.url, additional_headers=bearer_headers(token))
        self.n = 0

    def ask(self, op: str, **fields) -> dict:
        self.n += 1
        self.ws.send(pack({"op": op, "id": self.n, **fields}))
        return unpack(self.ws.recv(timeout=10))

    def send_raw(self, data) -> dict:
        self.ws.send(data)
        return unpack(self.ws.recv(timeout=10))

    def close(self):
        self.ws.close()


def _act(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float32)


def test_camera_frames_and_spaces_through_the_env():
    with _server("InvertedPendulum-v5", camera={"width": 32, "height": 24}, camera_format="png") as srv:
        env = RemoteRobotEnv(srv.url)
        try:
            assert set(env.observation_space.spaces) == {"state", "image"}
            obs, _ = env.reset(seed=3)
            assert obs["image"].shape == (24, 32, 3) and obs["image"].dtype == np.uint8 and obs["image"].any()
            assert obs["state"].shape == (4,)
            obs, r, te, tr, info = env.step(np.zeros(1, np.float32))
            assert env.observation_space.contains(obs) and info == {"aborted": False, "clipped": False}
        finally:
            env.close()


def test_a_second_trainer_is_refused_naming_the_holder():
    with _server() as srv:
        first = RemoteRobotEnv(srv.url, name="trainer-A")
        second = RemoteRobotEnv(srv.url, name="trainer-B")  # reading the spec needs no control
        try:
            first.reset(seed=0)
            with pytest.raises(RemoteRobotError, match="control held by trainer-A .*one controlling trainer at a time"):
                second.reset(seed=0)
            raw = Raw(srv)
            reply = raw.ask("step", episode=1, seq=1, action=_act(0.0))  # stepping without control
            assert not reply["ok"] and reply["code"] == "control" and "trainer-A" in reply["error"]
            raw.close()
            first.step(_act(0.0))  # the holder is unaffected
            assert srv.call(lambda: srv.server.counters["refused_second_trainer"]) == 1
        finally:
            first.close()
            second.close()
        second2 = RemoteRobotEnv(srv.url, name="trainer-B")  # released: the next trainer may claim
        second2.reset(seed=0)
        second2.close()


def test_a_vanished_trainers_claim_lapses_after_the_grace_period():
    with _server(control_grace_s=0.5) as srv:
        raw = Raw(srv)  # claims, then vanishes without releasing (a killed worker)
        assert raw.ask("claim", session="v" * 16, name="vanished")["ok"]
        raw.ws.close()
        env = RemoteRobotEnv(srv.url, name="next")
        t0 = time.monotonic()
        env.reset(seed=0)  # waits for the claim to lapse, then takes control
        assert time.monotonic() - t0 >= 0.3 and srv.call(lambda: srv.server.controller.name) == "next"
        env.close()


def test_actions_are_clipped_or_refused_by_the_rule():
    with _server(max_action_delta=0.5, max_rate_hz=40.0) as srv:
        raw = Raw(srv)
        assert raw.ask("claim", session="s" * 16, name="t")["ok"]
        ep = raw.ask("reset", seed=0)["episode"]
        r = raw.ask("step", episode=ep, seq=1, action=_act(5.0))  # out of the box [-2, 2]: clipped to 2
        assert r["ok"] and r["clipped"] and r["applied_action"].tolist() == [2.0]
        r = raw.ask("step", episode=ep, seq=2, action=_act(-2.0))  # a jump of 4 > delta 0.5: clipped to 1.5
        assert r["ok"] and r["clipped"] and r["applied_action"].tolist() == [1.5]
        r = raw.ask("step", episode=ep, seq=3, action=_act(1.2))  # inside both: untouched
        assert r["ok"] and not r["clipped"] and r["applied_action"].tolist() == [np.float32(1.2)]
        r = raw.ask("step", episode=ep, seq=4, action=_act(np.nan))  # non-finite: refused, nothing applied
        assert not r["ok"] and r["code"] == "limits"
        t0 = time.monotonic()
        for seq in range(4, 10):
            assert raw.ask("step", episode=ep, seq=seq, action=_act(1.2))["ok"]
        assert time.monotonic() - t0 >= 5 / 40.0  # paced: never faster than max_rate_hz
        counters = srv.call(lambda: dict(srv.server.counters))
        assert counters["clipped"] == 2 and counters["steps"] == 9 and counters["rate_delayed"] >= 5
        raw.close()


def test_heartbeat_loss_holds_the_robot_and_the_step_is_applied_at_most_once():
    timeout = 0.4
    with _server(heartbeat_timeout_s=timeout) as srv:
        env = RemoteRobotEnv(srv.url)  # heartbeats from its thread keep the robot unheld while it idles
        env.reset(seed=0)
        time.sleep(3 * timeout)
        assert srv.call(lambda: srv.server.held) is None
        env.close()
        raw = Raw(srv)
        raw.ask("claim", session="r" * 16, name="silent")
        ep = raw.ask("reset", seed=1)["episode"]
        assert raw.ask("step", episode=ep, seq=1, action=_act(0.5))["ok"]
        deadline = time.monotonic() + 5
        while not srv.call(lambda: srv.server.holds[-1]["kind"] == "link") and time.monotonic() < deadline:
            time.sleep(0.02)
        hold = srv.call(lambda: srv.server.holds[-1])
        assert hold["kind"] == "link" and hold["aborted_episode"]
        assert timeout < hold["since_last_message_s"] <= timeout * 1.05 + 0.25  # + slack for a loaded machine
        steps = srv.call(lambda: srv.server.counters["steps"])
        r = raw.ask("step", episode=ep, seq=2, action=_act(0.5))
        assert not r["ok"] and r["code"] == "held" and "recover=true" in r["error"]
        r = raw.ask("step", episode=ep, seq=2, action=_act(0.5), recover=True)
        assert r["ok"] and r["aborted"] and r["truncated"] and r["seq"] == 2
        again = raw.ask("step", episode=ep, seq=2, action=_act(0.5), recover=True)  # the same step: its kept reply
        assert again["ok"] and np.array_equal(again["obs"]["state"], r["obs"]["state"])
        assert srv.call(lambda: srv.server.counters["steps"]) == steps + 1  # applied once
        r = raw.ask("step", episode=ep, seq=3, action=_act(0.5))
        assert not r["ok"] and r["code"] == "episode"  # the aborted episode is over: reset first
        raw.close()


def test_missing_and_wrong_tokens_are_refused_before_any_data_and_counted():
    with _server(token=TOKEN) as srv:
        for token in (None, "not-the-token-at-all"):
            with pytest.raises(InvalidStatus) as e:
                connect(srv.url, additional_headers=bearer_headers(token))
            assert e.value.response.status_code == 401
        with pytest.raises(RemoteRobotError, match="token refused"):
            RemoteRobotEnv(srv.url, token="wrong-token-0123456789")
        refusals = srv.server.security.refusals
        assert refusals["missing_token"] == 1 and refusals["wrong_token"] == 2
        env = RemoteRobotEnv(srv.url, token=TOKEN)
        env.reset(seed=0)
        env.close()


def test_oversize_messages_are_refused_and_the_server_keeps_serving():
    with _server(max_bytes=4096) as srv:
        raw = Raw(srv)
        raw.ws.send(pack({"op": "spec", "pad": b"x" * 10_000}))
        with pytest.raises(ConnectionClosed) as e:
            raw.ws.recv(timeout=10)
        assert e.value.rcvd.code == 1009
        deadline = time.monotonic() + 5
        while srv.server.security.refusals["oversize"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.server.security.refusals["oversize"] == 1
        raw = Raw(srv)
        assert raw.ask("spec")["ok"]
        raw.close()


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/rlweave-robot-pwned",))


def test_malformed_requests_get_an_error_and_the_connection_keeps_serving():
    with _server() as srv:
        raw = Raw(srv)
        raw.ask("claim", session="m" * 16, name="t")
        ep = raw.ask("reset", seed=0)["episode"]
        obj = np.empty(1, dtype=object)
        obj[0] = _Boom()
        pickled = msgpack.packb({"op": "step", "episode": ep, "seq": 1, "action": obj}, default=msgpack_numpy.encode, use_bin_type=True)
        bad = {
            "text frame": "hello",
            "not msgpack": b"\xc1\xc1\xc1",
            "not a map": pack([1, 2]),
            "unknown op": pack({"op": "fly"}),
            "missing field": pack({"op": "step", "episode": ep, "seq": 1}),
            "extra field": pack({"op": "reset", "seed": 0, "speed": 9}),
            "wrong type": pack({"op": "reset", "seed": "zero"}),
            "float64 action": pack({"op": "step", "episode": ep, "seq": 1, "action": np.zeros(1)}),
            "wrong shape": pack({"op": "step", "episode": ep, "seq": 1, "action": np.zeros(3, np.float32)}),
            "pickled object array": pickled,
            "out of order": pack({"op": "step", "episode": ep, "seq": 7, "action": _act(0.0)}),
        }
        for what, data in bad.items():
            r = raw.send_raw(data)
            assert r["ok"] is False and r["error"], what
        assert not os.path.exists("/tmp/rlweave-robot-pwned")
        assert raw.ask("step", episode=ep, seq=1, action=_act(0.1))["ok"]  # the same connection still serves
        refusals = srv.server.security.refusals
        assert refusals["malformed"] >= 7 and refusals["schema"] == 2
        raw.close()


def test_command_off_loopback_warns_once_and_prints_a_generated_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RLWEAVE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "rlweave.cli", "robot-server", "--sim", "Pendulum-v1", "--host", "0.0.0.0",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        ready = proc.stdout.readline()
        assert "robot server: sim:Pendulum-v1 on ws://0.0.0.0:" in ready
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    lines = [line for line in err.splitlines() if line.startswith("[rlweave]")]
    assert len(lines) == 2 and "WARNING: robot server listens on '0.0.0.0', not loopback" in lines[0]
    assert "robot server token: " in lines[1]


def test_tls_with_a_self_signed_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                           "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {made.stderr.decode()[-200:]}")
    sec = ServerSecurity.create("robot server", token=TOKEN, tls_cert=str(cert), tls_key=str(key))
    with ServerThread(lambda: SimDriver("Pendulum-v1"), sec, Limits()) as srv:
        assert srv.url.startswith("wss://")
        env = RemoteRobotEnv(srv.url, token=TOKEN, tls_ca=str(cert))
        env.reset(seed=0)
        env.step(_act(0.0))
        env.close()
        with pytest.raises(RemoteRobotError, match="unreachable"):  # plain websockets to a TLS server: no handshake
            RemoteRobotEnv(srv.url.replace("wss://", "ws://"), token=TOKEN, connect_timeout_s=0.5)


class _Link:
    """A TCP relay standing in for the network between trainer and robot: ``pause()`` holds every
    byte (a link that is down while TCP retransmits), ``sever()`` breaks every connection."""

    def __init__(self, target_port: int):
        import socket
        import threading

        self.target, self.paused, self.conns = ("127.0.0.1", target_port), threading.Event(), []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                while self.paused.is_set():
                    time.sleep(0.005)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def pause(self):
        self.paused.set()

    def resume(self):
        self.paused.clear()

    def sever(self):
        import socket

        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns = []

    def close(self):
        self.sever()
        self.listener.close()


@pytest.mark.parametrize("failure", ["pause", "sever"])
def test_a_lost_link_aborts_the_episode_and_no_step_is_lost_or_repeated(failure):
    """Without network namespaces: the link is a relay in this process. A pause longer than the
    heartbeat timeout (bytes delivered late, the same connection survives) and a severed connection
    (the trainer reconnects) both end the running episode as aborted, with each step once."""
    import threading

    timeout = 0.3
    with _server(heartbeat_timeout_s=timeout) as srv:
        link = _Link(srv.server.security.port)
        env = RemoteRobotEnv(f"127.0.0.1:{link.port}", step_timeout_s=10.0 if failure == "pause" else 1.0)
        try:
            env.reset(seed=0)
            returned = [env.step(_act(0.3)) for _ in range(5)]
            if failure == "pause":
                link.pause()
                threading.Timer(4 * timeout, link.resume).start()
            else:
                link.sever()
            obs, reward, terminated, truncated, info = env.step(_act(0.3))
            assert info["aborted"] and truncated and not terminated
            assert env.aborted_episodes == 1 and env.reconnects == (1 if failure == "sever" else 0)
            hold = srv.call(lambda: srv.server.holds[-1])
            assert hold["kind"] == "link" and hold["aborted_episode"] and hold["episode"] == env.episode_id
            assert srv.call(lambda: srv.server.counters["steps"]) == len(returned) + 1  # each step applied once
            env.reset(seed=1)  # the run goes on with a fresh episode
            assert not env.step(_act(0.0))[4]["aborted"]
        finally:
            env.close()
            link.close()


def test_default_bind_is_loopback_only():
    """With no host given the robot server listens on loopback alone: another local address of
    the machine refuses the connection."""
    import socket

    from helpers import other_local_address

    addr, cleanup = other_local_address()
    try:
        with _server() as srv:
            port = int(srv.url.rsplit(":", 1)[1])
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=2).close()
    finally:
        cleanup()
