"""Remote-step latency of a robot served by ``rlweave robot-server``: over a veth pair into another
network namespace (the robot on "another machine") against the same server on loopback in this
namespace (baseline), measured in one run.

  V  veth      the server runs in its own network namespace (``ip netns``), reached at 10.79.250.2
               through a veth pair; token required (not loopback)
  L  loopback  baseline: the same server command on 127.0.0.1 in this namespace

Both sides are the same trainer-side env (``RemoteRobotEnv``) stepping a simulated Pendulum with
random actions, no learning. Rounds alternate the order (V L, L V, ...) after a discarded warm-up
round; each round steps ``--steps`` decisions per side. Headline: p50 and p99 of the per-step round
trip (request sent to reply decoded) per side, over all rounds, and the ratio of the medians.
Needs root and ``ip netns``.

    rlweave bench robot_link [--json FILE] [--steps 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

NS, HOST_IF, ROBOT_IF, SUBNET = "rlwbench", "rlwbh0", "rlwbr0", "10.79.250"


def _ip(*args: str, ns: str | None = None) -> None:
    subprocess.run((["ip", "netns", "exec", ns] if ns else []) + ["ip", *args], check=True, capture_output=True)


def _netns_up() -> None:
    subprocess.run(["ip", "netns", "add", NS], check=True, capture_output=True)
    _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", ROBOT_IF)
    _ip("link", "set", ROBOT_IF, "netns", NS)
    _ip("addr", "add", f"{SUBNET}.1/24", "dev", HOST_IF)
    _ip("link", "set", HOST_IF, "up")
    _ip("addr", "add", f"{SUBNET}.2/24", "dev", ROBOT_IF, ns=NS)
    _ip("link", "set", ROBOT_IF, "up", ns=NS)
    _ip("link", "set", "lo", "up", ns=NS)


def _netns_down() -> None:
    subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def _server(host: str, port: int, token_file: str, ns: str | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlweave.robot.server", "--sim", "Pendulum-v1", "--host", host, "--port", str(port),
           "--token-file", token_file]
    proc = subprocess.Popen((["ip", "netns", "exec", ns] if ns else []) + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "robot server:" not in line:
        raise RuntimeError(f"robot server did not start: {line}{proc.stderr.read()}")
    return proc


def _steps(address: str, token_file: str, n: int) -> list[float]:
    from rlweave.robot.client import RemoteRobotEnv

    env = RemoteRobotEnv(address, token_file=token_file)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(n):
        if env.step(rng.uniform(-2, 2, size=1).astype(np.float32))[3]:
            env.reset()
    samples = list(env.latencies.samples)
    env.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlweave bench robot_link", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        print("robot_link: needs `ip netns` (root with CAP_NET_ADMIN)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="rlweave-robot-link-"))
    token = tmp / "token"
    token.write_text(secrets.token_urlsafe(24))
    _netns_down()
    _netns_up()
    servers = []
    try:
        servers.append(_server(f"{SUBNET}.2", 8765, str(token), NS))
        servers.append(_server("127.0.0.1", 18765, str(token), None))
        sides = {"veth": f"{SUBNET}.2:8765", "loopback": "127.0.0.1:18765"}
        _steps(sides["veth"], str(token), 200), _steps(sides["loopback"], str(token), 200)  # warm-up, discarded
        samples: dict[str, list[float]] = {s: [] for s in sides}
        for rnd in C.pair_order(list(sides), args.repeats):
            for side in rnd:
                samples[side] += _steps(sides[side], str(token), args.steps)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(10)
        _netns_down()
    stats = {s: {"n": len(v), "p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99))} for s, v in samples.items()}
    for s, st in stats.items():
        print(f"{s:>8}: remote-step latency p50 {st['p50_ms']:.3f} ms, p99 {st['p99_ms']:.3f} ms (n={st['n']})")
    ratio = stats["veth"]["p50_ms"] / stats["loopback"]["p50_ms"]
    print(f"veth / loopback p50: {ratio:.2f}x  (load average {C.load_average()})")
    out = C.report("robot_link", argv or [], "p50/p99 remote-step latency over veth vs loopback",
                   {"veth": {"address": sides["veth"], "netns": NS}, "loopback": {"address": sides["loopback"]}}, args.repeats)
    out["protocol"]["each_side_in_own_process"] = False  # each side's SERVER is its own process; the client steps here
    out["results"] = {"latency": stats, "p50_ratio_veth_over_loopback": ratio, "steps_per_round": args.steps}
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
