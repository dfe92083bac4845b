"""Queries an ``rlweave serve`` server with the real ``openpi_client`` (PyPI ``openpi-client``).

Run under the openpi environment (``.venv-openpi/bin/python``: openpi-client pins numpy < 2, so it
cannot live in rlweave's environment); tests/test_policy_server.py starts the server and compares
the actions written here with the policy evaluated locally. It imports nothing from rlweave.

Usage: python openpi_client_query.py HOST PORT OBS.npy OUT.npz [--api-key KEY] [--clients N]
Each of the N clients (own connection, own thread) sends every N-th observation, all clients
starting together, so the server sees concurrent requests to batch.
"""

import argparse
import json
import threading

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("obs")
    p.add_argument("out")
    p.add_argument("--key", default="observation/state")
    p.add_argument("--api-key", default=None)
    p.add_argument("--clients", type=int, default=1)
    args = p.parse_args()
    obs = np.load(args.obs)
    clients = [WebsocketClientPolicy(args.host, args.port, api_key=args.api_key) for _ in range(args.clients)]
    actions = [None] * len(obs)
    timing = [None] * len(obs)
    barrier = threading.Barrier(args.clients)

    def work(c: int) -> None:
        for i in range(c, len(obs), args.clients):
            barrier.wait()  # the clients send together: requests the server can batch
            reply = clients[c].infer({args.key: obs[i]})
            actions[i], timing[i] = reply["actions"], reply["server_timing"]

    threads = [threading.Thread(target=work, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.savez(args.out, actions=np.stack(actions), batch_size=np.array([t["batch_size"] for t in timing]),
             metadata=json.dumps(clients[0].get_server_metadata()))


if __name__ == "__main__":
    main()
