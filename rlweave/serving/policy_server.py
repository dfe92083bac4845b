"""``rlweave serve RUN_DIR``: a trained policy over websocket, in the openpi client protocol.

Protocol (what ``openpi_client.WebsocketClientPolicy`` expects, so robot-side code written for
openpi queries an rlweave policy unchanged): on connect the server sends its metadata (request
keys, action shape; :meth:`ServedPolicy.metadata`); then each binary message is one observation
(a map, :mod:`rlweave.serving.openpi_wire`) and its reply is ``{"actions": [chunk, *action_shape],
"server_timing": {...}}``. A request that cannot be served (not msgpack, wrong keys, shapes or
dtypes) is answered with a text frame naming the problem, as openpi's server reports errors, and
the connection stays open. ``{"__ctrl__": ...}`` messages (newer openpi clients) are acknowledged.
``GET /healthz`` answers 200 for liveness probes.

Batching: requests from all connections go to one queue; the batcher takes the first, waits at
most ``batch_window_ms`` for more (up to ``max_batch``), and runs one forward pass for all of them
(the wait ends early once every open connection has a request in the batch: an openpi client has
one request in flight at a time, so nothing else can join; one robot alone is never delayed)
on a single inference thread, so the event loop keeps receiving while the model runs and requests
that arrive during a pass form the next batch. Each reply's ``server_timing`` holds its own queue,
inference and total milliseconds and the batch size; p50/p99 over all requests go to the log every
``log_every_s`` and, with ``--stats FILE``, to a JSON file (rewritten at each log and at exit).

Security comes from :mod:`rlweave.serving.security` (loopback by default, a token off loopback,
TLS, the message size limit, refusal counts). openpi clients authenticate with
``Authorization: Api-Key <token>``, rlweave's with ``Bearer <token>``; both carry the same token.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import json
import signal
import sys
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlweave.serving.openpi_wire import WireError, packb, unpackb
from rlweave.serving.security import ServerSecurity, SecurityError
from rlweave.serving.served_policy import RequestError, ServedPolicy

__all__ = ["PolicyServer", "LatencyStats", "serve_run"]


def _log(line: str) -> None:
    print(f"[rlweave] serve: {line}", file=sys.stderr, flush=True)


@dataclass
class LatencyStats:
    """Per-request latencies (receipt to reply, the newest ``window`` of them) and batch sizes."""

    window: int = 100_000
    latencies_ms: deque = field(default_factory=deque)
    requests: int = 0
    errors: int = 0
    batches: int = 0
    batched_rows: int = 0
    max_batch_seen: int = 0

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self.batched_rows += size
        self.max_batch_seen = max(self.max_batch_seen, size)

    def record(self, latency_ms: float) -> None:
        self.requests += 1
        self.latencies_ms.append(latency_ms)
        if len(self.latencies_ms) > self.window:
            self.latencies_ms.popleft()

    def summary(self, refusals: Counter | None = None) -> dict:
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        pct = (lambda q: float(np.percentile(lat, q))) if lat.size else (lambda q: None)
        return {"requests": self.requests, "errors": self.errors, "p50_ms": pct(50), "p99_ms": pct(99),
                "mean_ms": float(lat.mean()) if lat.size else None, "max_ms": float(lat.max()) if lat.size else None,
                "batches": self.batches, "mean_batch": self.batched_rows / self.batches if self.batches else None,
                "max_batch": self.max_batch_seen, "refusals": dict(refusals or {})}


@dataclass
class _Pending:
    row: Any
    received: float
    future: asyncio.Future


class PolicyServer:
    """Serves ``served`` on the address ``security`` names (see the module docstring)."""

    def __init__(self, served: ServedPolicy, security: ServerSecurity, batch_window_ms: float = 2.0, max_batch: int = 32,
                 stats_path: str | Path | None = None, log_every_s: float = 30.0):
        if max_batch < 1:
            raise ValueError(f"--max-batch: must be >= 1, got {max_batch}")
        if batch_window_ms < 0:
            raise ValueError(f"--batch-window-ms: must be >= 0, got {batch_window_ms}")
        self.served, self.security = served, security
        self.batch_window_s, self.max_batch = batch_window_ms / 1000.0, max_batch
        self.stats_path = Path(stats_path) if stats_path else None
        self.log_every_s = log_every_s
        self.stats = LatencyStats()
        self._metadata = packb(served.metadata())
        self._queue: asyncio.Queue[_Pending] | None = None
        self._connections = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlweave-infer")  # one model, one thread
        self.url: str | None = None

    # ------------------------------------------------------------------ connection handling
    def _process_request(self, connection: Any, request: Any) -> Any:
        """The health check (open), then the token check; openpi's ``Api-Key`` scheme is read as
        a bearer token."""
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        auth = request.headers.get("Authorization")
        if auth and auth.lower().startswith("api-key "):
            del request.headers["Authorization"]
            request.headers["Authorization"] = "Bearer " + auth.split(" ", 1)[1].strip()
        return self.security.websocket_process_request(connection, request)

    async def _handle(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        self._connections += 1
        try:
            await ws.send(self._metadata)
            prev_total_ms: float | None = None
            async for message in ws:
                received = time.perf_counter()
                reply = await self._answer(message, received)
                if isinstance(reply, dict):
                    if prev_total_ms is not None:
                        reply["server_timing"]["prev_total_ms"] = prev_total_ms
                    await ws.send(packb(reply))
                    total_ms = (time.perf_counter() - received) * 1000.0
                    self.stats.record(total_ms)
                    prev_total_ms = total_ms
                else:
                    await ws.send(reply)
        except ConnectionClosed as e:
            self.security.note_closed(e)
        finally:
            self._connections -= 1

    async def _answer(self, message: Any, received: float) -> dict | str | bytes:
        """The reply to one message: actions (dict), an acknowledgement (bytes) or an error (str)."""
        try:
            if isinstance(message, str):
                raise RequestError("requests are binary msgpack messages, got a text frame")
            try:
                request = unpackb(message)
            except WireError as e:
                raise RequestError(str(e)) from None
            if isinstance(request, dict) and "__ctrl__" in request:
                return packb({"__ack__": str(request["__ctrl__"])})
            row = self.served.parse(request)
        except RequestError as e:
            self.stats.errors += 1
            self.security.refuse("malformed")
            return f"rlweave serve: bad request: {e}"
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(row, received, future))
        try:
            return await future
        except Exception as e:  # noqa: BLE001 - a failed forward pass answers its requests, the server goes on
            self.stats.errors += 1
            return f"rlweave serve: inference failed: {type(e).__name__}: {e}"

    # ------------------------------------------------------------------ batching
    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.batch_window_s
            while len(batch) < min(self.max_batch, max(1, self._connections)):
                timeout = deadline - loop.time()
                if timeout <= 0 and self._queue.empty():
                    break
                try:
                    batch.append(self._queue.get_nowait() if timeout <= 0 else
                                 await asyncio.wait_for(self._queue.get(), timeout))
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
            start = time.perf_counter()
            try:
                actions = await loop.run_in_executor(self._executor, self.served.infer, [p.row for p in batch])
            except Exception as e:  # noqa: BLE001
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            infer_ms = (time.perf_counter() - start) * 1000.0
            self.stats.record_batch(len(batch))
            for p, a in zip(batch, actions):
                if not p.future.done():  # the client may have gone
                    p.future.set_result({"actions": a, "server_timing": {
                        "infer_ms": infer_ms, "queue_ms": (start - p.received) * 1000.0, "batch_size": len(batch),
                        "total_ms": (time.perf_counter() - p.received) * 1000.0}})

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        return {**self.served.info, "url": self.url, **self.stats.summary(self.security.refusals)}

    def report(self) -> None:
        s = self.summary()
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        _log(f"{s['requests']} requests, p50 {fmt(s['p50_ms'])} ms, p99 {fmt(s['p99_ms'])} ms, "
             f"mean batch {fmt(s['mean_batch'])}, errors {s['errors']}, refusals {s['refusals'] or 0}")
        if self.stats_path is not None:
            tmp = self.stats_path.with_suffix(self.stats_path.suffix + ".tmp")
            tmp.write_text(json.dumps(s, indent=1))
            tmp.replace(self.stats_path)

    async def _reporter(self) -> None:
        while True:
            await asyncio.sleep(self.log_every_s)
            if self.stats.requests or self.stats.errors:
                self.report()

    # ------------------------------------------------------------------ running
    async def serve(self, stop: asyncio.Event, ready: Callable[[str], None] | None = None) -> None:
        """Serves until ``stop`` is set; ``ready(url)`` once listening (the port is chosen by the
        OS when ``security.port`` is 0)."""
        from websockets.asyncio.server import serve

        self._queue = asyncio.Queue()
        kwargs = {**self.security.websocket_kwargs(), "process_request": self._process_request}
        tasks = [asyncio.create_task(self._batcher()), asyncio.create_task(self._reporter())]
        try:
            async with serve(self._handle, compression=None, **kwargs) as server:
                self.security.port = server.sockets[0].getsockname()[1]
                self.url = self.security.websocket_url()
                if ready is not None:
                    ready(self.url)
                await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self.report()


# ---------------------------------------------------------------------- command
def serve_run(args: argparse.Namespace) -> int:
    """``rlweave serve``: loads the run's policy, then serves until SIGINT/SIGTERM."""
    from rlweave.config import ConfigError
    from rlweave.models.run_policy import RunPolicyError

    try:
        security = ServerSecurity.create("policy server", host=args.host, port=args.port, token=args.token,
                                         tls_cert=args.tls_cert, tls_key=args.tls_key,
                                         max_message_bytes=int(args.max_message_mb * 1024 * 1024))
        served = ServedPolicy.from_run(args.run_dir, args.checkpoint)
        server = PolicyServer(served, security, args.batch_window_ms, args.max_batch, args.stats, args.log_every)
    except (SecurityError, RunPolicyError, ValueError) as e:
        print(f"rlweave serve: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"rlweave serve: {Path(args.run_dir) / 'config.yaml'}: {e}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(url: str) -> None:
            info = served.info
            print(f"[rlweave] serving {info.get('run')}/{info.get('checkpoint')} ({info.get('policy')} on "
                  f"{info.get('env')}) at {url}", flush=True)

        await server.serve(stop, ready)

    try:
        asyncio.run(main())
    except OSError as e:  # e.g. the port is taken
        print(f"rlweave serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
