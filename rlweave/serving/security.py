"""Safe-by-default settings every rlweave server shares (robot server, policy server, OpenAI-compatible
endpoint, tool servers).

Why one module: each server is a door into a machine (a robot that moves, a model that answers, a
sandbox that runs code). The rules for opening that door must be the same everywhere and written
once:

* **Loopback unless asked.** ``host`` defaults to ``127.0.0.1``. Listening on any other address is
  an explicit choice and prints ONE warning line naming it.
* **A token whenever the door faces the network.** Off loopback a token is required: the user's
  (``token=`` or the environment variable, default ``RLWEAVE_TOKEN``) or one generated with
  :func:`secrets.token_urlsafe` at start and printed once. On loopback a token is used only when
  given. Tokens are compared with :func:`hmac.compare_digest` (no timing side channel). Clients send
  ``Authorization: Bearer <token>``. A missing or wrong token is answered with HTTP 401 *before* any
  data is served (websockets: in the opening handshake; ASGI: before the app sees the request), and
  each refusal is counted by reason (:attr:`ServerSecurity.refusals`).
* **TLS when given** a certificate and key (``tls_cert``/``tls_key`` -> :meth:`ssl_context`).
* **A size limit on every message** (``max_message_bytes``): websockets closes a connection that
  sends a larger frame (close code 1009); HTTP answers 413.

Servers build their transport from :meth:`ServerSecurity.websocket_kwargs` (websockets'
``serve``) or :class:`TokenMiddleware` / :meth:`ServerSecurity.uvicorn_kwargs` (Starlette + uvicorn).
"""

from __future__ import annotations

import hmac
import http
import ipaddress
import json
import os
import secrets
import socket
import ssl
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ServerSecurity", "SecurityError", "TokenMiddleware", "is_loopback", "bearer_headers", "DEFAULT_TOKEN_ENV"]

DEFAULT_TOKEN_ENV = "RLWEAVE_TOKEN"
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class SecurityError(ValueError):
    """Settings that would open a server unsafely or cannot work; the message is one line naming the option."""


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address. ``""``, ``0.0.0.0`` and ``::``
    (every interface) are not; a name is resolved, and is loopback only if all its addresses are."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def bearer_headers(token: str | None) -> dict[str, str]:
    """What a client sends to authenticate (nothing without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass
class ServerSecurity:
    """How one server listens and whom it lets in. Build it with :meth:`create` (which resolves the
    token and prints the warning/token lines once), not by hand, unless in a test."""

    name: str = "server"
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    refusals: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        token_env: str = DEFAULT_TOKEN_ENV,
        announce: Callable[[str], None] | None = None,
    ) -> "ServerSecurity":
        """Checked settings for server ``name``. ``token``: the given one, else ``$token_env``, else
        (off loopback only) a fresh one. ``announce`` prints the one warning line (non-loopback
        host) and the one line with a generated token (default: stderr)."""
        say = announce or (lambda line: print(line, file=sys.stderr, flush=True))
        if max_message_bytes <= 0:
            raise SecurityError(f"max_message_bytes: must be positive, got {max_message_bytes}")
        if bool(tls_cert) != bool(tls_key):
            raise SecurityError("tls_cert/tls_key: give both (the certificate and its private key) or neither")
        for opt, path in (("tls_cert", tls_cert), ("tls_key", tls_key)):
            if path and not os.path.isfile(path):
                raise SecurityError(f"{opt}: no such file: {path}")
        given = token
        token = token or os.environ.get(token_env) or None
        if token is not None and len(token) < 16:
            raise SecurityError(f"token: at least 16 characters (got {len(token)}); leave it unset to have one generated")
        sec = cls(name=name, host=host, port=int(port), token=token, tls_cert=tls_cert, tls_key=tls_key,
                  max_message_bytes=int(max_message_bytes))
        if not is_loopback(host):
            generated = sec.token is None
            if generated:
                sec.token = secrets.token_urlsafe(32)
            note = "generated token below" if generated else f"token from {'option' if given else token_env}"
            say(f"[rlweave] WARNING: {name} listens on {host!r}, not loopback: reachable from other machines "
                f"({note}; {'TLS' if sec.tls else 'NO TLS: the token crosses the network in clear'})")
            if generated:
                say(f"[rlweave] {name} token: {sec.token}  (clients send 'Authorization: Bearer <token>'; "
                    f"set {token_env} to choose it)")
        return sec

    # ------------------------------------------------------------------ properties
    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def scheme(self) -> str:
        """``ws``/``wss`` of the websocket URL clients use (``http``/``https`` is :attr:`http_scheme`)."""
        return "wss" if self.tls else "ws"

    @property
    def http_scheme(self) -> str:
        return "https" if self.tls else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server-side TLS context of ``tls_cert``/``tls_key`` (TLS 1.2 at least), or None."""
        if not self.tls:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise SecurityError(f"tls_cert/tls_key: cannot load {self.tls_cert} / {self.tls_key}: {e}") from None
        return ctx

    # ------------------------------------------------------------------ checks
    def refuse(self, reason: str) -> None:
        """Counts one refusal (``missing_token``, ``wrong_token``, ``oversize``, ``malformed``, ...)."""
        with self._lock:
            self.refusals[reason] += 1

    def check_authorization(self, authorization: str | None) -> str | None:
        """None when the ``Authorization`` header value lets the client in, else the refusal reason
        (counted). Without a configured token everyone is let in (loopback only, see :meth:`create`)."""
        if self.token is None:
            return None
        if not authorization:
            reason = "missing_token"
        else:
            scheme, _, presented = authorization.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self.token.encode())
            reason = None if ok else "wrong_token"
        if reason:
            self.refuse(reason)
        return reason

    # ------------------------------------------------------------------ websockets
    def websocket_process_request(self, connection: Any, request: Any) -> Any:
        """websockets' ``process_request`` hook: a 401 response for a missing/wrong token, during the
        handshake (so the handler never runs and no data is served), else None."""
        reason = self.check_authorization(request.headers.get("Authorization"))
        if reason is None:
            return None
        response = connection.respond(http.HTTPStatus.UNAUTHORIZED, f"{reason.replace('_', ' ')}\n")
        response.headers["WWW-Authenticate"] = 'Bearer realm="rlweave"'
        return response

    def websocket_kwargs(self) -> dict[str, Any]:
        """Keywords for ``websockets.asyncio.server.serve(handler, **kwargs)``: host, port, TLS, the
        message size limit and the token check."""
        return {"host": self.host, "port": self.port, "ssl": self.ssl_context(), "max_size": self.max_message_bytes,
                "process_request": self.websocket_process_request}

    def note_closed(self, exc: BaseException) -> None:
        """Counts a connection websockets closed because a message was over the limit (code 1009);
        call it from a handler's ``except ConnectionClosed``."""
        rcvd, sent = getattr(exc, "rcvd", None), getattr(exc, "sent", None)
        if any(frame is not None and frame.code == 1009 for frame in (rcvd, sent)):
            self.refuse("oversize")

    # ------------------------------------------------------------------ HTTP / ASGI
    def uvicorn_kwargs(self) -> dict[str, Any]:
        """Keywords for ``uvicorn.Config``/``uvicorn.run``: host, port and TLS files."""
        kw: dict[str, Any] = {"host": self.host, "port": self.port}
        if self.tls:
            kw.update(ssl_certfile=self.tls_cert, ssl_keyfile=self.tls_key)
        return kw

    def asgi(self, app: Any, open_paths: tuple[str, ...] = ()) -> "TokenMiddleware":
        """``app`` wrapped with the token check and the body-size limit (``open_paths``: exact paths
        served without a token, e.g. a health check)."""
        return TokenMiddleware(app, self, open_paths)

    def websocket_url(self, path: str = "") -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{self.scheme}://{host}:{self.port}{path}"


class TokenMiddleware:
    """Pure ASGI middleware (works under Starlette or any ASGI app): refuses HTTP requests and
    websocket handshakes without the right bearer token with 401, and HTTP bodies over
    ``max_message_bytes`` with 413 (by ``Content-Length``, or while streaming a chunked body),
    before the wrapped app does anything. Refusals are counted on the :class:`ServerSecurity`."""

    def __init__(self, app: Any, security: ServerSecurity, open_paths: tuple[str, ...] = ()):
        self.app, self.security, self.open_paths = app, security, set(open_paths)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if scope.get("path") not in self.open_paths:
            reason = self.security.check_authorization(headers.get("authorization"))
            if reason is not None:
                if scope["type"] == "websocket":  # 403 is what ASGI servers send for a closed handshake
                    return await send({"type": "websocket.close", "code": 1008, "reason": reason})
                return await _json(send, 401, {"error": {"type": "unauthorized", "message": reason.replace("_", " ")}},
                                   [(b"www-authenticate", b'Bearer realm="rlweave"')])
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        limit = self.security.max_message_bytes
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            self.security.refuse("oversize" if length.isdigit() else "malformed")
            return await _json(send, 413 if length.isdigit() else 400,
                               {"error": {"type": "request_too_large" if length.isdigit() else "bad_request",
                                          "message": f"request body over {limit} bytes" if length.isdigit() else "bad Content-Length"}})
        seen = 0
        started = False

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _Oversize()
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _Oversize:
            self.security.refuse("oversize")
            if not started:
                await _json(send, 413, {"error": {"type": "request_too_large", "message": f"request body over {limit} bytes"}})


class _Oversize(Exception):
    pass


async def _json(send: Callable, status: int, body: dict, extra: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": data})
