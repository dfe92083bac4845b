"""The ``rlweave robot-server`` command's options, kept apart from the server so that building the
``rlweave`` parser imports nothing of the ``robot`` extra (websockets, msgpack, Pillow)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "add_command"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``rlweave robot-server`` options (also ``python -m rlweave.robot.server``)."""
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sim", metavar="ENV_ID", help="a simulated robot: any gymnasium id with flat Box spaces")
    which.add_argument("--driver", metavar="MODULE:FACTORY", help="a real robot: a function returning a RobotDriver")
    p.add_argument("--camera", metavar="WxH", help="--sim: render a camera of this size (MuJoCo envs)")
    p.add_argument("--camera-format", choices=("jpeg", "png"), default="jpeg")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default loopback; anything else needs a token)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token-file", help="file holding the bearer token (default: $RLWEAVE_TOKEN, else generated off loopback)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--max-message-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--max-rate-hz", type=float, help="steps faster than this are delayed to it")
    p.add_argument("--max-action-delta", type=float, help="clip each action to this distance from the previous one")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0, help="seconds without a message before the robot is held")
    p.add_argument("--control-grace", type=float, default=15.0,
                   help="seconds a disconnected trainer keeps its claim, to reconnect (others wait meanwhile)")
    p.add_argument("--max-episode-steps", type=int)
    p.add_argument("--events", help="append events (claims, holds, resets; steps with --log-steps) as JSON lines")
    p.add_argument("--log-steps", action="store_true")



def _run(args) -> int:
    from rlweave.robot.server import run

    return run(args)


def add_command(sub) -> None:
    """Registers ``robot-server`` on the ``rlweave`` command's subparsers."""
    s = sub.add_parser("robot-server", help="serve a robot (or a simulated one) to one remote trainer; loopback unless --host, "
                                            "a token off loopback")
    add_arguments(s)
    s.set_defaults(fn=_run)
