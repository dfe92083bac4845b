"""``rlweave robot-server``: the robot side of a remote robot. It owns a :class:`RobotDriver` and
lets ONE trainer at a time drive it over websockets (protocol: :mod:`rlweave.robot.protocol`),
with the safety rules enforced here, whatever a client sends:

* **Security** (:mod:`rlweave.serving.security`): loopback unless ``--host`` says otherwise, a bearer
  token off loopback, TLS when given, a size limit on every message.
* **Schema**: every request is checked (op, fields, types; the action's exact shape and dtype);
  a bad one is answered with an error and the connection keeps being served.
* **One controller**: ``claim`` is granted to one session; another is refused with a message naming
  the holder. The same session may claim again from a new connection (a trainer reconnecting).
* **Limits** (the rule): a non-finite action is refused; finite actions are clipped to the joint /
  action box and, with ``--max-action-delta``, to that distance from the previous action
  (``clipped: true`` in the reply, counted); steps faster than ``--max-rate-hz`` are delayed to
  that rate, never run faster.
* **Heartbeats**: every message from the controller counts as one; when none arrives for
  ``--heartbeat-timeout`` seconds the driver is held (e-stop), within one watchdog tick after the
  timeout (tick = timeout / 20), so within ``1.05 x timeout``. A dropped controller connection is
  held at once.
* **At most once**: steps carry ``(episode, seq)``; the last step's reply is kept, and asking for
  the same step again returns it without moving the robot. A hold aborts the running episode: the
  one step the trainer was sending may be sent again with ``recover=true`` and is then applied
  once (or its kept reply returned) and ends the episode (``truncated`` and ``aborted``); any other
  step is refused until a reset. A hold by an explicit e-stop (``hold`` op) is not recoverable.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlweave.robot.driver import RobotDriver, SimDriver, StepOutcome
from rlweave.robot.protocol import PROTOCOL_VERSION, ProtocolError, array_spec, check_array, check_request, encode_frame, pack, unpack
from rlweave.serving.security import SecurityError, ServerSecurity
from rlweave.utils.plugins import import_object

__all__ = ["Limits", "RobotServer", "ServerThread", "main", "run"]

LINK_HOLDS = ("heartbeat lost", "controller disconnected")  # holds a reconnecting trainer may recover from


@dataclass
class Limits:
    """Robot-side limits (see the module docstring for the rule)."""

    max_rate_hz: float | None = None
    max_action_delta: float | None = None
    action_low: np.ndarray | None = None  # tighter than the driver's box, if given
    action_high: np.ndarray | None = None
    heartbeat_timeout_s: float = 1.0
    control_grace_s: float = 15.0  # how long a lost controller's session keeps its claim (to reconnect)
    camera_format: str = "jpeg"
    camera_quality: int = 90


@dataclass
class _Control:
    session: str
    name: str
    conn: Any  # the websocket connection, None once lost
    last_seen: float
    since: float
    lost_at: float = 0.0


class RobotServer:
    """The server; build with a driver factory (called on the driver's own thread, so a renderer's GL
    context lives where it is used), then ``await start()`` / ``await serve_forever()``."""

    def __init__(self, driver_factory: Callable[[], RobotDriver], security: ServerSecurity, limits: Limits | None = None,
                 events: str | None = None, log_steps: bool = False):
        self.security, self.limits = security, limits or Limits()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="robot-driver")  # all driver calls
        self.driver: RobotDriver = self._pool.submit(driver_factory).result()
        spec = self.driver.spec()
        low = spec.action_low if self.limits.action_low is None else np.maximum(spec.action_low, self.limits.action_low)
        high = spec.action_high if self.limits.action_high is None else np.minimum(spec.action_high, self.limits.action_high)
        self.action_low, self.action_high = np.asarray(low, spec.action_dtype), np.asarray(high, spec.action_dtype)
        self.action_spec = array_spec(self.action_low.shape, spec.action_dtype, self.action_low, self.action_high)
        observation = {"state": array_spec(spec.state_shape, spec.state_dtype, spec.state_low, spec.state_high)}
        for key, (h, w) in spec.cameras.items():
            observation[key] = {"shape": [h, w, 3], "dtype": "|u1", "encoding": self.limits.camera_format}
        self.spec_message = {"protocol": PROTOCOL_VERSION, "robot": spec.name, "observation": observation, "action": self.action_spec,
                             "limits": {"max_rate_hz": self.limits.max_rate_hz, "max_action_delta": self.limits.max_action_delta,
                                        "heartbeat_timeout_s": self.limits.heartbeat_timeout_s, "out_of_limits": "clip",
                                        "max_message_bytes": security.max_message_bytes}}
        self.cameras = list(spec.cameras)
        self.controller: _Control | None = None
        self.held: str | None = "no controller"
        self.hold_kind = "idle"
        self.episode, self.seq, self.episode_open, self.aborted = 0, 0, False, False
        self.last_step: tuple[int, int, dict] | None = None
        self.prev_action: np.ndarray | None = None
        self.last_apply = 0.0
        self.counters: Counter = Counter()
        self.holds: list[dict] = []
        self._events = open(events, "a", buffering=1) if events else None
        self.log_steps = log_steps
        self._server = None
        self._watchdog: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        from websockets.asyncio.server import serve

        self._server = await serve(self._handler, **self.security.websocket_kwargs(), ping_interval=None)
        self.security.port = self._server.sockets[0].getsockname()[1]
        self._watchdog = asyncio.create_task(self._watch())

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._watchdog:
            self._watchdog.cancel()
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        self.driver.hold("server stopping")
        self._pool.submit(self.driver.close).result()
        self._pool.shutdown()
        if self._events:
            self._events.close()

    def _event(self, event: str, **fields) -> None:
        if self._events:
            self._events.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    async def _call(self, fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ safety
    def _hold(self, reason: str, kind: str, since: float | None = None) -> None:
        """E-stop now (called on the event loop; a driver's ``hold`` must be fast and thread-safe)."""
        self.driver.hold(reason)
        was_running = self.episode_open and not self.aborted
        self.held, self.hold_kind = reason, kind
        if self.episode_open:
            self.aborted = True
        self.counters["holds"] += 1
        record = {"reason": reason, "kind": kind, "episode": self.episode, "seq": self.seq, "aborted_episode": was_running,
                  "since_last_message_s": since, "time": time.time()}
        self.holds.append(record)
        self._event("hold", **record)

    async def _watch(self) -> None:
        tick = self.limits.heartbeat_timeout_s / 20
        while True:
            await asyncio.sleep(tick)
            c = self.controller
            if c is None or c.conn is None or self.held is not None:  # already held: nothing moves
                continue
            silent = time.monotonic() - c.last_seen
            if silent > self.limits.heartbeat_timeout_s:
                self._hold(f"heartbeat lost ({silent:.3f} s without a message from {c.name})", "link", since=silent)

    def _limit(self, action: np.ndarray) -> tuple[np.ndarray, bool]:
        if not np.isfinite(action).all():
            raise ProtocolError("step.action: non-finite values are refused", "limits")
        out = np.clip(action, self.action_low, self.action_high)
        delta = self.limits.max_action_delta
        if delta is not None and self.prev_action is not None:
            out = np.clip(out, self.prev_action - delta, self.prev_action + delta)
        out = out.astype(action.dtype)
        clipped = not np.array_equal(out, action)
        self.counters["clipped"] += int(clipped)
        return out, clipped

    async def _pace(self) -> None:
        if self.limits.max_rate_hz:
            wait = self.last_apply + 1.0 / self.limits.max_rate_hz - time.monotonic()
            if wait > 0:
                self.counters["rate_delayed"] += 1
                await asyncio.sleep(wait)
        self.last_apply = time.monotonic()

    # ------------------------------------------------------------------ connections
    async def _handler(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for raw in ws:
                reply = await self._handle(ws, raw)
                if reply is not None:
                    await ws.send(pack(reply))
        except ConnectionClosed as e:
            self.security.note_closed(e)
        finally:
            c = self.controller
            if c is not None and c.conn is ws:
                c.conn, c.lost_at = None, time.monotonic()
                if self.held is None:
                    self._hold(f"controller disconnected ({c.name})", "link")

    async def _handle(self, ws, raw: Any) -> dict | None:
        c = self.controller
        if c is not None and c.conn is ws:
            c.last_seen = time.monotonic()
        rid = None
        try:
            msg = unpack(raw, self.security.max_message_bytes)
            rid = msg.get("id") if isinstance(msg.get("id"), int) else None
            op = check_request(msg)
            if op == "heartbeat":
                return None
            out = await getattr(self, f"_op_{op}")(ws, msg)
        except ProtocolError as e:
            if e.code in ("malformed", "schema", "oversize"):  # the request itself was bad: the server's refusal counts
                self.security.refuse(e.code)
            self.counters[f"refused_{e.code}"] += 1  # every refusal, rule breaks (control, held, limits, ...) included
            return {"ok": False, "id": rid, "code": e.code, "error": str(e)}
        except Exception as e:  # noqa: BLE001 - a driver failure: hold the robot, tell the client, keep serving
            self._hold(f"driver error: {type(e).__name__}: {e}", "error")
            return {"ok": False, "id": rid, "code": "driver", "error": f"driver error: {type(e).__name__}: {e}"}
        return {"ok": True, "id": rid, **out}

    def _require_control(self, ws) -> _Control:
        c = self.controller
        if c is None or c.conn is not ws:
            holder = "nobody" if c is None else f"{c.name} (session {c.session[:8]})"
            raise ProtocolError(f"this connection does not control the robot (held by {holder}); claim first", "control")
        return c

    # ------------------------------------------------------------------ operations
    async def _op_spec(self, ws, msg: dict) -> dict:
        c = self.controller
        return {"spec": {**self.spec_message, "controller": None if c is None else c.name, "held": self.held}}

    async def _op_claim(self, ws, msg: dict) -> dict:
        now, c = time.monotonic(), self.controller
        lapsed = c is not None and c.conn is None and now - c.lost_at > self.limits.control_grace_s
        if c is not None and c.session != msg["session"] and not lapsed:
            self.counters["refused_second_trainer"] += 1
            self._event("refuse_claim", name=msg["name"], holder=c.name)
            since = time.strftime("%H:%M:%S", time.localtime(time.time() - (now - c.since)))
            if c.conn is None:  # lost, its claim not yet lapsed: a trainer may wait for it
                left = self.limits.control_grace_s - (now - c.lost_at)
                raise ProtocolError(f"control held by {c.name} (session {c.session[:8]}, since {since}; disconnected, "
                                    f"its claim lapses in {left:.1f} s); one controlling trainer at a time", "control_lapsing")
            raise ProtocolError(f"control held by {c.name} (session {c.session[:8]}, since {since}); "
                                "one controlling trainer at a time", "control")
        if c is not None and c.conn is not ws and self.episode_open and not self.aborted:
            # the same trainer on a new connection: its link was interrupted, whether or not this
            # server noticed yet; the running episode is aborted either way (one rule, no race)
            self._hold(f"controller reconnected ({c.name})", "link")
        if c is not None and c.conn is not None and c.conn is not ws:
            asyncio.create_task(c.conn.close(1001, "control taken by a new connection of the same session"))
        since = c.since if c is not None and c.session == msg["session"] else now
        self.controller = _Control(msg["session"], msg["name"], ws, now, since)
        self._event("claim", name=msg["name"], session=msg["session"][:8])
        return {"held": self.held, "episode": self.episode, "seq": self.seq, "aborted": self.aborted}

    async def _op_release(self, ws, msg: dict) -> dict:
        c = self._require_control(ws)
        self.controller = None
        self._hold(f"released by {c.name}", "idle")
        self._event("release", name=c.name)
        return {}

    async def _op_hold(self, ws, msg: dict) -> dict:
        self._hold("e-stop requested", "estop")
        return {"held": self.held}

    async def _op_reset(self, ws, msg: dict) -> dict:
        c = self._require_control(ws)
        self.driver.release()
        self.held, self.hold_kind = None, "none"
        obs = await self._call(self._reset, msg.get("seed"))
        self.episode += 1
        self.seq, self.episode_open, self.aborted, self.prev_action, self.last_step = 0, True, False, None, None
        self.counters["resets"] += 1
        self._event("reset", episode=self.episode, name=c.name, **({"obs": obs["state"].tolist()} if self.log_steps else {}))
        return {"episode": self.episode, "obs": obs}

    def _reset(self, seed: int | None) -> dict:
        return self._wire(self.driver.reset(seed))

    def _wire(self, obs: dict) -> dict:
        out = {"state": np.asarray(obs["state"], dtype=self.spec_message["observation"]["state"]["dtype"])}
        for key in self.cameras:
            out[key] = encode_frame(obs[key], self.limits.camera_format, self.limits.camera_quality)
        return out

    async def _op_step(self, ws, msg: dict) -> dict:
        self._require_control(ws)
        action = check_array("step.action", msg["action"], self.action_spec)
        ep, seq, recover = msg["episode"], msg["seq"], bool(msg.get("recover", False))
        if self.last_step is not None and (ep, seq) == self.last_step[:2]:  # asked again: never applied twice
            self.counters["replayed"] += 1
            reply = dict(self.last_step[2])
            if recover and self.aborted:
                reply.update(truncated=True, aborted=True)
                self.episode_open = False
                self._event("recovered", episode=ep, seq=seq, applied_now=False)
            return reply
        if ep != self.episode or not self.episode_open:
            raise ProtocolError(f"step: episode {ep} is not running (current: {self.episode}, "
                                f"{'running' if self.episode_open else 'ended'}); reset first", "episode")
        if seq != self.seq + 1:
            raise ProtocolError(f"step: seq {seq} out of order (the next is {self.seq + 1})", "sequence")
        recovering = False
        if self.held is not None:
            if not (recover and self.aborted and self.hold_kind == "link"):
                hint = ("re-send this step with recover=true (applied once, ends the episode) or reset"
                        if self.hold_kind == "link" and self.aborted else "reset to continue")
                raise ProtocolError(f"robot held ({self.held}); episode {ep} aborted after seq {self.seq}: {hint}", "held")
            recovering = True
        applied, clipped = self._limit(action)
        await self._pace()
        if recovering:
            self.driver.release()
        try:
            outcome: StepOutcome = await self._call(self.driver.apply, applied)
        finally:
            if recovering:
                self.driver.hold("recovered step done; reset to continue")
        obs = await self._call(self._wire, outcome.obs) if self.cameras else self._wire(outcome.obs)
        self.seq, self.prev_action = seq, applied
        reply = {"episode": ep, "seq": seq, "obs": obs, "reward": float(outcome.reward), "terminated": bool(outcome.terminated),
                 "truncated": bool(outcome.truncated or recovering), "aborted": recovering, "clipped": clipped,
                 "applied_action": applied}
        if outcome.terminated or outcome.truncated or recovering:
            self.episode_open = False
        self.last_step = (ep, seq, reply)
        self.counters["steps"] += 1
        if recovering:
            self._event("recovered", episode=ep, seq=seq, applied_now=True)
        if self.log_steps:
            self._event("step", episode=ep, seq=seq, action=applied.tolist(), reward=reply["reward"],
                        obs=obs["state"].tolist(), terminated=reply["terminated"], truncated=reply["truncated"])
        return reply


class ServerThread:
    """A :class:`RobotServer` on its own event-loop thread (tests, or embedding in a process that
    has other work); ``with ServerThread(...) as srv: srv.url``."""

    def __init__(self, driver_factory: Callable[[], RobotDriver], security: ServerSecurity, limits: Limits | None = None, **kwargs):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="robot-server")
        self.thread.start()

        async def build():
            server = RobotServer(driver_factory, security, limits, **kwargs)
            await server.start()
            return server

        self.server: RobotServer = asyncio.run_coroutine_threadsafe(build(), self.loop).result(60)
        self.url = security.websocket_url()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on the server's loop (reads of its state without races)."""
        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------- the command
def _driver_factory(args) -> Callable[[], RobotDriver]:
    if args.driver:
        return import_object(args.driver)
    camera = None
    if args.camera:
        w, _, h = args.camera.partition("x")
        camera = {"width": int(w), "height": int(h)}
    return lambda: SimDriver(args.sim, camera=camera, max_episode_steps=args.max_episode_steps)


def run(args) -> int:
    """The command: checked settings, then serve until interrupted."""
    import os

    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        token = open(args.token_file).read().strip() if args.token_file else None
        sec = ServerSecurity.create("robot server", host=args.host, port=args.port, token=token, tls_cert=args.tls_cert,
                                    tls_key=args.tls_key, max_message_bytes=args.max_message_bytes)
        if args.heartbeat_timeout <= 0:
            raise SecurityError("--heartbeat-timeout: must be positive")
    except (SecurityError, OSError) as e:
        print(f"rlweave: error: {e}", file=sys.stderr)
        return 2
    limits = Limits(max_rate_hz=args.max_rate_hz, max_action_delta=args.max_action_delta, heartbeat_timeout_s=args.heartbeat_timeout,
                    control_grace_s=args.control_grace, camera_format=args.camera_format)

    async def serve() -> None:
        server = RobotServer(_driver_factory(args), sec, limits, events=args.events, log_steps=args.log_steps)
        await server.start()
        print(f"[rlweave] robot server: {server.spec_message['robot']} on {sec.websocket_url()} "
              f"(heartbeat timeout {limits.heartbeat_timeout_s} s)", flush=True)
        try:
            await server.serve_forever()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    from rlweave.robot.command import add_arguments

    p = argparse.ArgumentParser(prog="rlweave robot-server", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
