"""The trainer side of a remote robot: :class:`RemoteRobotEnv`, a gymnasium env whose steps run on a
robot server (``rlweave robot-server``). It is an ordinary env of the project's contract
(``env.id: remote/<host>:<port>``, any runner uses it unchanged), and it survives a network that
drops:

* it claims control at its first reset and sends heartbeats from a background thread (every
  ``heartbeat_timeout / 5``), so the robot stays unheld while the trainer is busy elsewhere;
* a step that gets no reply within ``step_timeout_s`` (or whose connection closes) means the link
  is lost: the env reconnects (waiting up to ``reconnect_timeout_s``), claims control again with
  the same session, and re-sends the SAME step (same episode and sequence number) with
  ``recover=true``;
* the robot applies a step at most once: if it had applied it, it returns the kept reply; if not,
  and it held the robot because the link was lost, it applies it now, once. Either way that step
  is the interrupted episode's last: ``truncated=True`` and ``info["aborted"] = True``.

The rule for an aborted episode's transitions, therefore: every step the robot applied is returned
exactly once, the interrupted one included (it becomes the episode's final, truncated transition,
bootstrapped from the observation the robot really reached), and nothing is invented or repeated.
A hold by an explicit e-stop cannot be recovered: the env raises :class:`RemoteRobotError` and the
run stops with that line.

Remote-step latency (request sent to reply decoded) is kept; :meth:`RemoteRobotEnv.latency` gives
p50/p99, and ``stats_file`` gets one JSON line per episode (steps, return, aborted, reconnects,
latency so far).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlweave.robot.protocol import ProtocolError, check_array, decode_frame, pack, space_from_spec, unpack
from rlweave.serving.security import DEFAULT_TOKEN_ENV, bearer_headers

__all__ = ["RemoteRobotEnv", "RemoteRobotError", "LatencyStats", "make_env"]


class RemoteRobotError(RuntimeError):
    """The robot refused, or stayed unreachable; one line naming the robot's address."""


class _LinkLost(Exception):
    pass


class LatencyStats:
    """Round-trip times of remote steps, in milliseconds (not a plain attribute, so env snapshots
    in checkpoints skip it)."""

    def __init__(self, keep: int = 100_000):
        self.samples: list[float] = []
        self.keep = keep

    def add(self, seconds: float) -> None:
        if len(self.samples) < self.keep:
            self.samples.append(seconds * 1e3)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"n": 0}
        a = np.asarray(self.samples)
        return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                "max_ms": float(a.max())}


def _address(address: str) -> str:
    if "://" in address:
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"env.id: remote/<host>:<port>, got remote/{address}")
    return f"ws://{host}:{port}"


class RemoteRobotEnv(gym.Env):
    """A robot served by ``rlweave robot-server``, as a gymnasium env (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, address: str, token: str | None = None, token_file: str | None = None, tls_ca: str | None = None,
                 name: str | None = None, step_timeout_s: float = 5.0, reset_timeout_s: float = 120.0,
                 reconnect_timeout_s: float = 300.0, connect_timeout_s: float = 10.0, stats_file: str | None = None):
        self.url = _address(address)
        if token is None and token_file:
            with open(token_file) as f:
                token = f.read().strip()
        self._token = token or os.environ.get(DEFAULT_TOKEN_ENV) or None
        self._tls_ca = tls_ca
        self.session = secrets.token_hex(16)
        self.client_name = name or f"trainer@{socket.gethostname()}:{os.getpid()}"
        self.step_timeout_s, self.reset_timeout_s = float(step_timeout_s), float(reset_timeout_s)
        self.reconnect_timeout_s = float(reconnect_timeout_s)
        self.stats_file = stats_file
        self._ws: Any = None
        self._next_id = 0
        self._controlling = False
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self.latencies = LatencyStats()
        self.episode_id, self.seq = 0, 0
        self.episode_return, self.aborted_episodes, self.reconnects, self.steps = 0.0, 0, 0, 0
        self._connect(time.monotonic() + float(connect_timeout_s))
        spec = self._call({"op": "spec"}, self.step_timeout_s)["spec"]
        self.spec_message = spec
        self.robot = spec["robot"]
        self._obs_spec = spec["observation"]
        self._act_spec = spec["action"]
        self.heartbeat_interval = float(spec["limits"]["heartbeat_timeout_s"]) / 5
        self.action_space = space_from_spec(self._act_spec)
        state = space_from_spec(self._obs_spec["state"])
        self._cameras = [k for k in self._obs_spec if k != "state"]
        self.observation_space = state if not self._cameras else gym.spaces.Dict(
            {"state": state, **{k: space_from_spec(self._obs_spec[k]) for k in self._cameras}})

    # ------------------------------------------------------------------ transport
    def _connect(self, deadline: float) -> None:
        """Opens a connection, retrying until ``deadline`` (a refused token is final at once)."""
        import ssl

        from websockets.exceptions import InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect

        ctx = None
        if self.url.startswith("wss://"):
            ctx = ssl.create_default_context(cafile=self._tls_ca)
        last: Exception | None = None
        while True:
            try:
                self._ws = connect(self.url, additional_headers=bearer_headers(self._token), open_timeout=2.0, close_timeout=0.5,
                                   max_size=None, ssl=ctx, ping_interval=None)
                return
            except InvalidStatus as e:
                if e.response.status_code == 401:
                    raise RemoteRobotError(f"robot {self.url}: token refused (401); give env.kwargs.token_file or ${DEFAULT_TOKEN_ENV}") from None
                last = e
            except (InvalidHandshake, OSError, TimeoutError) as e:  # not a websocket server (yet), or no route
                last = e
            if time.monotonic() >= deadline:
                raise RemoteRobotError(f"robot {self.url}: unreachable ({type(last).__name__}: {last})") from None
            time.sleep(0.25)

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close_socket() if hasattr(ws, "close_socket") else ws.socket.close()
            except Exception:  # noqa: BLE001 - already broken
                pass

    def _call(self, msg: dict, timeout: float) -> dict:
        """One request and its reply (``_LinkLost`` when the link fails)."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise _LinkLost()
        self._next_id += 1
        rid = self._next_id
        deadline = time.monotonic() + timeout
        try:
            self._ws.send(pack({**msg, "id": rid}))
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                reply = unpack(self._ws.recv(timeout=left))
                if reply.get("id") == rid:
                    return reply
        except (ConnectionClosed, TimeoutError, OSError) as e:
            raise _LinkLost() from e
        except ProtocolError as e:
            raise RemoteRobotError(f"robot {self.url}: bad reply: {e}") from None

    def _claim(self) -> dict:
        """Takes control. A holder that is disconnected (a run that ended without releasing, e.g.
        its worker was killed) keeps its claim for the server's grace period: wait for it to lapse
        (up to ``reconnect_timeout_s``); a connected holder is a refusal at once."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            reply = self._call({"op": "claim", "session": self.session, "name": self.client_name}, self.step_timeout_s)
            if reply["ok"] or reply.get("code") != "control_lapsing" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not reply["ok"]:
            raise RemoteRobotError(f"robot {self.url}: {reply['error']}")
        self._controlling = True
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeats, daemon=True, name="robot-heartbeat")
            self._hb_thread.start()
        return reply

    def _heartbeats(self) -> None:
        beat = pack({"op": "heartbeat"})
        while not self._hb_stop.wait(self.heartbeat_interval):
            ws = self._ws
            if ws is not None and self._controlling:
                try:
                    ws.send(beat)
                except Exception:  # noqa: BLE001 - the stepping thread notices the lost link and reconnects
                    pass

    def _reconnect(self, deadline: float) -> None:
        self._drop()
        self.reconnects += 1
        while True:
            self._connect(deadline)
            try:
                self._claim()
                return
            except _LinkLost:
                self._drop()
                if time.monotonic() >= deadline:
                    raise RemoteRobotError(f"robot {self.url}: link lost and not back within {self.reconnect_timeout_s} s") from None

    def _checked(self, reply: dict, what: str) -> dict:
        if not reply["ok"]:
            raise RemoteRobotError(f"robot {self.url}: {what} refused ({reply['code']}): {reply['error']}")
        return reply

    # ------------------------------------------------------------------ gymnasium
    def _observation(self, wire: dict):
        state = check_array("obs.state", wire.get("state"), self._obs_spec["state"])
        if not self._cameras:
            return state
        return {"state": state, **{k: decode_frame(wire.get(k), self._obs_spec[k]["shape"]) for k in self._cameras}}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            try:
                if not self._controlling:
                    self._claim()
                reply = self._checked(self._call({"op": "reset", "seed": seed}, self.reset_timeout_s), "reset")
                break
            except _LinkLost:  # a reset is safe to send again: it only starts a fresh episode
                self._reconnect(deadline)
        self.episode_id, self.seq, self.episode_return = int(reply["episode"]), 0, 0.0
        return self._observation(reply["obs"]), {}

    def step(self, action):
        action = np.asarray(action, dtype=self.action_space.dtype).reshape(self.action_space.shape)
        self.seq += 1
        msg = {"op": "step", "episode": self.episode_id, "seq": self.seq, "action": action}
        t0 = time.perf_counter()
        try:
            reply = self._call(msg, self.step_timeout_s)
            if reply["ok"]:
                self.latencies.add(time.perf_counter() - t0)
        except _LinkLost:
            reply = None
        if reply is None or (not reply["ok"] and reply["code"] == "held"):
            reply = self._recover(msg, reconnect=reply is None)
        self._checked(reply, f"step {self.seq} of episode {self.episode_id}")
        obs = self._observation(reply["obs"])
        self.steps += 1
        self.episode_return += reply["reward"]
        info = {"aborted": bool(reply["aborted"]), "clipped": bool(reply["clipped"])}
        if reply["terminated"] or reply["truncated"]:
            self.aborted_episodes += int(info["aborted"])
            self._write_stats(info["aborted"])
        return obs, float(reply["reward"]), bool(reply["terminated"]), bool(reply["truncated"]), info

    def _recover(self, msg: dict, reconnect: bool) -> dict:
        """Completes an interrupted step exactly once (see the module docstring)."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        while True:
            if reconnect:
                self._reconnect(deadline)
            try:
                return self._call({**msg, "recover": True}, self.step_timeout_s)
            except _LinkLost:
                reconnect = True

    def _write_stats(self, aborted: bool) -> None:
        if not self.stats_file:
            return
        line = {"robot": self.robot, "episode": self.episode_id, "steps": self.seq, "return": self.episode_return,
                "aborted": aborted, "aborted_episodes": self.aborted_episodes, "reconnects": self.reconnects,
                "latency": self.latencies.summary()}
        with open(self.stats_file, "a") as f:
            f.write(json.dumps(line) + "\n")

    def latency(self) -> dict[str, float]:
        """Remote-step round trips so far: ``n``, ``p50_ms``, ``p99_ms``, ``max_ms``."""
        return self.latencies.summary()

    def close(self) -> None:
        self._hb_stop.set()
        if self._controlling and self._ws is not None:
            try:
                self._call({"op": "release"}, 2.0)
            except (_LinkLost, RemoteRobotError):
                pass
        self._controlling = False
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # noqa: BLE001 - closing a broken link
                pass
            self._ws = None
        super().close()


def make_env(task: str, max_episode_steps: int | None = None, pixels: dict | None = None, **kwargs) -> gym.Env:
    """The ``remote`` suite's maker: ``env.id: remote/<host>:<port>`` (or ``remote/wss://host:port``),
    options from ``env.kwargs`` (token_file, tls_ca, name, step_timeout_s, reset_timeout_s,
    reconnect_timeout_s, stats_file). Cameras are the robot server's choice (``--camera``), so
    ``env.pixels`` is refused here."""
    if pixels:
        raise ValueError("env.pixels: a remote robot's cameras are set on the robot server (rlweave robot-server --camera)")
    env: gym.Env = RemoteRobotEnv(task, **kwargs)
    if max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env
