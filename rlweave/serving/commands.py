"""The ``rlweave`` sub-commands of the serving package, registered by :mod:`rlweave.cli` in one call.

Why a module of their own: the parser is built on every ``rlweave`` invocation, so registering
must not import torch or the model code; each command imports its implementation when it runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_serving_commands"]


def _serve(args: Any) -> int:
    from rlweave.serving.policy_server import serve_run

    return serve_run(args)


def add_serving_commands(sub: Any) -> None:
    """Registers ``rlweave serve`` on the CLI's sub-command parsers."""
    s = sub.add_parser("serve", help="serve a run's policy over websocket (openpi client protocol): rlweave serve RUN_DIR")
    s.add_argument("run_dir")
    s.add_argument("--checkpoint", default=None, help="checkpoint name, e.g. iter_00000050 (default: the latest)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback; others need a token)")
    s.add_argument("--port", type=int, default=8000, help="port (0: any free one, printed)")
    s.add_argument("--token", default=None, help="token clients must send (default: $RLWEAVE_TOKEN; generated off loopback)")
    s.add_argument("--tls-cert", default=None)
    s.add_argument("--tls-key", default=None)
    s.add_argument("--max-message-mb", type=float, default=8.0, help="largest request accepted (MiB)")
    s.add_argument("--batch-window-ms", type=float, default=2.0, help="how long a request waits for others to batch with")
    s.add_argument("--max-batch", type=int, default=32)
    s.add_argument("--stats", default=None, metavar="FILE", help="write request counts and p50/p99 latency as JSON here")
    s.add_argument("--log-every", type=float, default=30.0, metavar="S", help="seconds between latency log lines")
    s.set_defaults(fn=_serve)
