"""The shared server security settings (rlweave.serving.security): loopback by default, tokens,
size limits, on a real websockets server and a real Starlette app under uvicorn."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from helpers import other_local_address as _other_local_address
from rlweave.serving import SecurityError, ServerSecurity, bearer_headers, is_loopback

websockets = pytest.importorskip("websockets")
from websockets.asyncio.server import serve  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

TOKEN = "t" * 20 + "-test-token"


class _WsServer:
    """An echo server built only from ServerSecurity's keywords, on its own event-loop thread."""

    def __init__(self, sec: ServerSecurity):
        self.sec, self.ready = sec, threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self):
        async def echo(ws):
            try:
                async for message in ws:
                    try:
                        await ws.send(json.dumps({"ok": json.loads(message)}))
                    except ValueError as e:
                        self.sec.refuse("malformed")
                        await ws.send(json.dumps({"error": str(e)}))
            except ConnectionClosed as e:
                self.sec.note_closed(e)

        self.server = await serve(echo, **self.sec.websocket_kwargs())
        self.sec.port = self.server.sockets[0].getsockname()[1]

    def close(self):
        async def stop():
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_defaults_are_loopback_and_checked():
    lines: list[str] = []
    sec = ServerSecurity.create("t", announce=lines.append)
    assert sec.host == "127.0.0.1" and sec.loopback and sec.token is None and lines == []
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("0.0.0.0") and not is_loopback("")
    with pytest.raises(SecurityError, match="tls_cert/tls_key"):
        ServerSecurity.create("t", tls_cert="/nope.pem")
    with pytest.raises(SecurityError, match="token: at least 16"):
        ServerSecurity.create("t", token="short")


def test_non_loopback_generates_and_announces_one_token(monkeypatch):
    monkeypatch.delenv("RLWEAVE_TOKEN", raising=False)
    lines: list[str] = []
    sec = ServerSecurity.create("robot server", host="0.0.0.0", announce=lines.append)
    assert sec.token and len(sec.token) >= 32
    assert len(lines) == 2 and lines[0].startswith("[rlweave] WARNING: robot server listens on '0.0.0.0'")
    assert sec.token in lines[1] and sec.token not in lines[0]
    monkeypatch.setenv("RLWEAVE_TOKEN", TOKEN)
    lines.clear()
    sec = ServerSecurity.create("robot server", host="0.0.0.0", announce=lines.append)
    assert sec.token == TOKEN and len(lines) == 1 and TOKEN not in lines[0]


def test_default_bind_refuses_other_local_address():
    addr, cleanup = _other_local_address()
    srv = _WsServer(ServerSecurity.create("t"))
    try:
        with connect(f"ws://127.0.0.1:{srv.sec.port}") as ws:
            ws.send(json.dumps(1))
            assert json.loads(ws.recv()) == {"ok": 1}
        with pytest.raises(OSError):  # nothing listens there: connection refused
            socket.create_connection((addr, srv.sec.port), timeout=2).close()
    finally:
        srv.close()
        cleanup()


def test_websocket_token_size_and_malformed():
    sec = ServerSecurity.create("t", token=TOKEN, max_message_bytes=1000)
    srv = _WsServer(sec)
    url = f"ws://127.0.0.1:{sec.port}"
    try:
        with pytest.raises(InvalidStatus) as e:
            connect(url)
        assert e.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as e:
            connect(url, additional_headers=bearer_headers("x" * 20))
        assert e.value.response.status_code == 401
        assert sec.refusals["missing_token"] == 1 and sec.refusals["wrong_token"] == 1
        with connect(url, additional_headers=bearer_headers(TOKEN)) as ws:
            ws.send("{not json")  # malformed: an error answer, the connection keeps serving
            assert "error" in json.loads(ws.recv())
            ws.send(json.dumps([1, 2]))
            assert json.loads(ws.recv()) == {"ok": [1, 2]}
            ws.send("x" * 2000)  # over the limit: the server closes with 1009
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv()
            assert closed.value.rcvd.code == 1009
        deadline = time.monotonic() + 5
        while sec.refusals["oversize"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sec.refusals["oversize"] == 1 and sec.refusals["malformed"] == 1
        with connect(url, additional_headers=bearer_headers(TOKEN)) as ws:  # still serving
            ws.send(json.dumps("again"))
            assert json.loads(ws.recv()) == {"ok": "again"}
    finally:
        srv.close()


def test_asgi_middleware_under_uvicorn():
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request):
        try:
            return JSONResponse({"ok": json.loads(await request.body())})
        except ValueError:
            return JSONResponse({"error": "malformed JSON"}, status_code=400)

    async def health(request):
        return JSONResponse({"status": "ok"})

    sec = ServerSecurity.create("t", token=TOKEN, max_message_bytes=1000)
    app = sec.asgi(Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/health", health)]), open_paths=("/health",))
    sock = socket.socket()
    sock.bind((sec.host, 0))
    sec.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", **sec.uvicorn_kwargs()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sec.port}"

    def post(path, body: bytes, headers=None):
        req = urllib.request.Request(base + path, data=body, headers={**(headers or {})}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            assert r.status == 200
        assert post("/echo", b"1")[0] == 401
        assert post("/echo", b"1", bearer_headers("y" * 20))[0] == 401
        assert post("/echo", b"[1]", bearer_headers(TOKEN)) == (200, {"ok": [1]})
        assert post("/echo", b"{bad", bearer_headers(TOKEN))[0] == 400
        status, body = post("/echo", b"1" * 2000, bearer_headers(TOKEN))
        assert status == 413 and body["error"]["type"] == "request_too_large"
        assert post("/echo", b"2", bearer_headers(TOKEN)) == (200, {"ok": 2})
        assert dict(sec.refusals) == {"missing_token": 1, "wrong_token": 1, "oversize": 1}
    finally:
        server.should_exit = True
        thread.join(10)
