"""Request latency and throughput of ``rlweave serve`` with concurrent clients: requests batched into
one forward pass (B) against the same server answering one request per pass (U, baseline,
``--max-batch 1``), measured in one run.

  B  batched    --batch-window-ms 2 --max-batch 32 (the defaults)
  U  unbatched  --max-batch 1

The policy is a fresh (untrained) squashed-MLP on Pendulum-v1 with ``--hidden`` units per layer,
saved as a run folder; each side is its own server process. ``--clients`` client processes (a robot
each: own process, own connection, openpi's wire format) each send ``--requests`` observations back
to back. Rounds
alternate the order (B U, U B, ...) after a discarded warm-up. Headline: requests/s, p50/p99 of the
client-side round trip, and the server's mean batch, per side; the throughput ratio B / U.

    rlweave bench serve_latency [--json FILE] [--clients 8] [--requests 200] [--hidden 1024] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # `rlweave bench` loads this file by path
import _common as C  # noqa: E402

SIDES = {"batched": ["--batch-window-ms", "2", "--max-batch", "32"], "unbatched": ["--max-batch", "1"]}


def _run_dir(root: Path, hidden: int) -> Path:
    import gymnasium as gym
    import torch
    from omegaconf import OmegaConf

    from rlweave.config import load_config
    from rlweave.models import build_policy
    from rlweave.models.run_policy import policy_kwargs
    from rlweave.utils.checkpoint import save_checkpoint

    root.mkdir(parents=True, exist_ok=True)
    cfg = load_config("sac-pendulum", [f"run.dir={root}", f"policy.hidden=[{hidden},{hidden}]"])
    (root / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = gym.make(cfg.env.id)
    torch.manual_seed(0)
    policy = build_policy(observation_space=env.observation_space, action_space=env.action_space, chunk=1, **policy_kwargs(cfg))
    save_checkpoint(root, 1, {"actor": {"policy": policy.state_dict()}})
    return root


def _server(run_dir: Path, args: list[str], stats: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "rlweave.cli", "serve", str(run_dir), "--port", "0", "--stats", str(stats), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **C.side_env(1)})
    line = proc.stdout.readline()
    if " at ws://" not in line:
        raise RuntimeError(f"server did not start: {line}{proc.stderr.read()}")
    return proc, line.strip().rsplit(" at ", 1)[1]


def _client(url: str, requests: int, start_at: float, seed: int) -> None:
    """One client process: waits for the common start time, sends ``requests`` observations back
    to back and prints its round trips (ms) as JSON."""
    from websockets.sync.client import connect

    from rlweave.serving.openpi_wire import packb, unpackb

    obs = np.random.default_rng(seed).uniform(-1, 1, (requests, 3)).astype(np.float32)
    with connect(url, compression=None, max_size=None) as conn:
        conn.recv()  # metadata
        time.sleep(max(0.0, start_at - time.time()))
        lat = []
        for o in obs:
            t0 = time.perf_counter()
            conn.send(packb({"observation/state": o}))
            reply = conn.recv()
            if isinstance(reply, str):
                raise RuntimeError(reply)
            unpackb(reply)
            lat.append((time.perf_counter() - t0) * 1000.0)
    print(json.dumps({"lat": lat, "end": time.time()}))


def _clients(url: str, clients: int, requests: int) -> tuple[list[float], float]:
    """Client-side round trips (ms) of every request of ``clients`` client processes (a robot each:
    one Python process's threads would share its interpreter lock), and the round's wall time."""
    start_at = time.time() + 2.0  # all connected and waiting by then
    procs = [subprocess.Popen([sys.executable, __file__, "--client", url, str(requests), str(start_at), str(i)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, **C.side_env(1)}) for i in range(clients)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"a client failed (exit {proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(r["end"] for r in results) - start_at
    return [x for r in results for x in r["lat"]], wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlweave bench serve_latency", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=200, help="per client per round")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--client", nargs=4, help=argparse.SUPPRESS)  # internal: one client process
    args = p.parse_args(argv)
    if args.client:
        _client(args.client[0], int(args.client[1]), float(args.client[2]), int(args.client[3]))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rlweave-serve-bench-"))
    run_dir = _run_dir(tmp / "run", args.hidden)
    servers = {s: _server(run_dir, a, tmp / f"{s}.json") for s, a in SIDES.items()}
    samples: dict[str, list[float]] = {s: [] for s in SIDES}
    walls: dict[str, float] = {s: 0.0 for s in SIDES}
    try:
        for side, (_, url) in servers.items():
            _clients(url, args.clients, 20)  # warm-up, discarded
        for rnd in C.pair_order(list(SIDES), args.repeats):
            for side in rnd:
                lat, wall = _clients(servers[side][1], args.clients, args.requests)
                samples[side] += lat
                walls[side] += wall
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    stats = {}
    for side in SIDES:
        server = json.loads((tmp / f"{side}.json").read_text())
        v = samples[side]
        stats[side] = {"requests": len(v), "requests_per_s": len(v) / walls[side], "p50_ms": float(np.percentile(v, 50)),
                       "p99_ms": float(np.percentile(v, 99)), "server_mean_batch": server["mean_batch"],
                       "server_p50_ms": server["p50_ms"], "server_p99_ms": server["p99_ms"]}
        s = stats[side]
        print(f"{side:>9}: {s['requests_per_s']:.0f} requests/s, round trip p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, "
              f"mean batch {s['server_mean_batch']:.2f}")
    ratio = stats["batched"]["requests_per_s"] / stats["unbatched"]["requests_per_s"]
    print(f"batched / unbatched throughput: {ratio:.2f}x  ({args.clients} clients, hidden {args.hidden}; "
          f"load average {C.load_average()})")
    out = C.report("serve_latency", argv or [], "requests/s and p50/p99 round trip, batched vs one request per pass",
                   {s: {"server_args": a} for s, a in SIDES.items()}, args.repeats)
    out["protocol"]["each_side_in_own_process"] = False  # each side's SERVER is its own process; the clients run here
    out["results"] = {"sides": stats, "throughput_ratio_batched_over_unbatched": ratio, "clients": args.clients,
                      "requests_per_client_per_round": args.requests, "hidden": args.hidden}
    C.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
