"""``rlweave serve``: a run's policy over websocket in the openpi client protocol. The real
``openpi-client`` package (in its own environment, .venv-openpi) gets the same actions as the policy
evaluated locally; concurrent clients are batched; malformed requests get an error reply and the
server keeps serving; the token, the size limit and the latency statistics work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlweave.config import load_config
from rlweave.models import build_policy
from rlweave.models.inputs import policy_input
from rlweave.models.run_policy import load_run_policy, policy_kwargs
from rlweave.serving.openpi_wire import WireError, packb, unpackb
from rlweave.serving.served_policy import RequestError, observation_fields, parse_request
from rlweave.utils.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
OPENPI_PYTHON = ROOT / ".venv-openpi" / "bin" / "python"
TOKEN = "serve-test-token-0123456789"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder as a trained sac-pendulum run leaves it (config.yaml, one checkpoint)."""
    path = tmp_path_factory.mktemp("served")
    cfg = load_config("sac-pendulum", [f"run.dir={path}"])
    (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = gym.make(cfg.env.id)
    torch.manual_seed(3)
    policy = build_policy(observation_space=env.observation_space, action_space=env.action_space, chunk=1,
                          **policy_kwargs(cfg))
    save_checkpoint(path, 1, {"actor": {"policy": policy.state_dict()}})
    return path


class _Server:
    """``rlweave serve`` in a subprocess, stopped with SIGINT (as a user does)."""

    def __init__(self, run_dir: Path, *args: str):
        self.stats = run_dir / f"stats{os.getpid()}.json"
        cmd = [sys.executable, "-m", "rlweave.cli", "serve", str(run_dir), "--port", "0", "--stats", str(self.stats), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = self.proc.stdout.readline()
        if " at ws://" not in line and " at wss://" not in line:
            self.proc.kill()
            raise AssertionError(f"server did not start: {line}{self.proc.stderr.read()}")
        self.url = line.strip().rsplit(" at ", 1)[1]
        self.port = int(self.url.rsplit(":", 1)[1])

    def stop(self) -> tuple[dict, str]:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return json.loads(self.stats.read_text()), err


def _local_actions(run_dir: Path, obs: np.ndarray) -> np.ndarray:
    run = load_run_policy(run_dir)
    with torch.inference_mode():
        action, _, _ = run.policy.act(policy_input(obs), deterministic=True)
    return run.policy.env_action(action).numpy()


def _openpi_env_or_skip() -> Path:
    if OPENPI_PYTHON.exists():
        return OPENPI_PYTHON
    if os.environ.get("CI") == "true":
        pytest.fail(".venv-openpi is missing under CI: scripts/setup.sh openpi must create it (.ci/run does)")
    pytest.skip(".venv-openpi is missing: bash scripts/setup.sh openpi creates it")


def test_openpi_client_gets_the_local_actions_and_concurrent_clients_are_batched(run_dir, tmp_path):
    python = _openpi_env_or_skip()
    obs = np.stack([gym.spaces.Box(-1, 1, (3,), np.float32).sample() for _ in range(16)]).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    server = _Server(run_dir, "--token", TOKEN, "--batch-window-ms", "300")
    try:
        out = subprocess.run([str(python), str(ROOT / "tests" / "openpi_client_query.py"), "127.0.0.1", str(server.port),
                              str(tmp_path / "obs.npy"), str(tmp_path / "out.npz"), "--api-key", TOKEN, "--clients", "4"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
    finally:
        stats, log = server.stop()
    got = np.load(tmp_path / "out.npz")
    metadata = json.loads(str(got["metadata"]))
    assert metadata["observation"] == {"observation/state": {"shape": [3], "dtype": "float32"}}
    assert metadata["action"]["shape"] == [1, 1] and metadata["checkpoint"] == "iter_00000001"
    np.testing.assert_allclose(got["actions"], _local_actions(run_dir, obs), rtol=1e-5, atol=1e-6)
    assert got["actions"].shape == (16, 1, 1)
    assert got["batch_size"].max() > 1 and stats["max_batch"] > 1  # 4 clients sending together share passes
    assert stats["requests"] == 16 and stats["errors"] == 0 and stats["p50_ms"] <= stats["p99_ms"]
    assert "p50" in log and "p99" in log


def test_malformed_requests_get_errors_and_the_server_goes_on(run_dir):
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    server = _Server(run_dir, "--token", TOKEN, "--max-message-mb", "0.01")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with pytest.raises(InvalidStatus, match="401"):
            connect(server.url, additional_headers={"Authorization": "Bearer wrong-token-wrong-token"})
        with connect(server.url, additional_headers=auth) as ws:
            assert unpackb(ws.recv())["observation"]["observation/state"]["shape"] == [3]
            bad = [b"\xc1not msgpack", "a text frame", packb({"observation/stat": np.zeros(3, np.float32)}),
                   packb({"observation/state": np.zeros(4, np.float32)}),
                   packb({"observation/state": np.array(["a", "b", "c"])}), packb({"observation/state": True}),
                   packb({"observation/state": np.zeros(3, np.float32), "extra": 1}), packb([1, 2, 3]),
                   packb({"observation/state": np.array([np.nan, 0, 0], np.float32)})]
            for message in bad:
                ws.send(message)
                reply = ws.recv()
                assert isinstance(reply, str) and reply.startswith("rlweave serve: bad request:"), reply
            ws.send(packb({"__ctrl__": "episode_start", "__task__": "swing up"}))  # newer openpi clients' control messages
            assert unpackb(ws.recv()) == {"__ack__": "episode_start"}
            ws.send(packb({"observation/state": np.array([1.0, 0.0, 0.5])}))  # float64 is cast: served
            reply = unpackb(ws.recv())
            np.testing.assert_allclose(reply["actions"], _local_actions(run_dir, np.array([[1.0, 0.0, 0.5]], np.float32))[0],
                                       rtol=1e-5, atol=1e-6)
            assert reply["server_timing"]["batch_size"] == 1 and reply["server_timing"]["infer_ms"] > 0
        with connect(server.url, additional_headers=auth) as ws:  # over the size limit: closed with 1009
            ws.recv()
            ws.send(packb({"observation/state": np.zeros(5000, np.float32)}))
            with pytest.raises(ConnectionClosed):
                ws.recv()
    finally:
        stats, _ = server.stop()
    assert stats["requests"] == 1 and stats["errors"] == len(bad)
    assert stats["refusals"]["wrong_token"] == 1 and stats["refusals"]["malformed"] == len(bad)
    assert stats["refusals"]["oversize"] == 1


def test_tls_serves_over_wss(run_dir, tmp_path):
    """--tls-cert/--tls-key: wss:// (a self-signed certificate for 127.0.0.1, trusted by the
    client); a client without the certificate cannot connect."""
    import ssl

    from websockets.sync.client import connect

    if subprocess.run(["sh", "-c", "command -v openssl"], capture_output=True).returncode:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = _Server(run_dir, "--tls-cert", str(cert), "--tls-key", str(key), "--token", TOKEN)
    try:
        assert server.url.startswith("wss://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        with connect(server.url, ssl=trusted, additional_headers={"Authorization": f"Api-Key {TOKEN}"}) as ws:
            assert unpackb(ws.recv())["action"]["shape"] == [1, 1]
            ws.send(packb({"observation/state": np.zeros(3, np.float32)}))
            assert unpackb(ws.recv())["actions"].shape == (1, 1)
        with pytest.raises(ssl.SSLError):
            connect(server.url, ssl=ssl.create_default_context())  # an untrusted certificate
    finally:
        stats, _ = server.stop()
    assert stats["requests"] == 1


def test_wire_format_and_request_contract():
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    back = unpackb(packb({"a": x, "s": np.float32(1.5), "t": "text"}))
    assert back["a"].dtype == np.int16 and np.array_equal(back["a"], x) and back["s"] == np.float32(1.5)
    bad = packb({"a": x})
    with pytest.raises(WireError, match="do not make shape"):
        unpackb(bad.replace(b"\x92\x02\x03", b"\x92\x03\x03"))  # shape [3, 3] for 6 values
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                             "state": gym.spaces.Box(-1, 1, (4,), np.float32),
                             "instruction": gym.spaces.Box(0, 255, (16,), np.uint8)})
    fields = {f.key: f for f in observation_fields(space)}
    assert sorted(fields) == ["observation/image", "observation/state", "prompt"]
    row = fields["prompt"].parse("push the cube")
    assert row.dtype == np.uint8 and bytes(row[:13]) == b"push the cube" and not row[13:].any()
    with pytest.raises(RequestError, match="'observation/image': expected dtype uint8"):
        fields["observation/image"].parse(np.zeros((8, 8, 3), np.float32))
    with pytest.raises(RequestError, match="'prompt'.*longer than 16"):
        fields["prompt"].parse("x" * 40)
    # the simulator's privileged state is optional (a robot has none; models ignore it): zeros when left out
    space = gym.spaces.Dict({**space.spaces, "privileged": gym.spaces.Box(-np.inf, np.inf, (7,), np.float32)})
    row = parse_request(observation_fields(space), {"observation/image": np.zeros((8, 8, 3), np.uint8),
                                                    "observation/state": np.ones(4), "prompt": "go"})
    assert sorted(row) == ["image", "instruction", "privileged", "state"] and not row["privileged"].any()
    with pytest.raises(RequestError, match=r"missing key\(s\) \['observation/state'\]"):
        parse_request(observation_fields(space), {"observation/image": np.zeros((8, 8, 3), np.uint8), "prompt": "go"})


def test_default_bind_is_loopback_and_a_missing_token_is_refused(run_dir):
    """``rlweave serve`` with no --host listens on loopback alone; with a token, a client that
    presents none is refused (401) before any data, and counted."""
    import socket

    from helpers import other_local_address
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    addr, cleanup = other_local_address()
    server = _Server(run_dir, "--token", TOKEN)
    try:
        assert server.url.startswith("ws://127.0.0.1:")
        with pytest.raises(OSError):
            socket.create_connection((addr, server.port), timeout=2).close()
        with pytest.raises(InvalidStatus, match="401"):
            connect(server.url)
    finally:
        stats, _ = server.stop()
        cleanup()
    assert stats["refusals"]["missing_token"] == 1 and stats["requests"] == 0
