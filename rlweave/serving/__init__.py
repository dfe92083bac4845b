"""Serving: what every rlweave server shares (:mod:`rlweave.serving.security`: loopback by default,
bearer tokens, TLS, message size limits)."""

from rlweave.serving.security import DEFAULT_TOKEN_ENV, SecurityError, ServerSecurity, TokenMiddleware, bearer_headers, is_loopback

__all__ = ["DEFAULT_TOKEN_ENV", "SecurityError", "ServerSecurity", "TokenMiddleware", "bearer_headers", "is_loopback"]
