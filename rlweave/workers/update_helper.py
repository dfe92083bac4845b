"""The actor's part of an off-policy update in a helper process (``actor.update_helper=process``);
also PPO's value loss (:mod:`rlweave.workers.value_part`).

An SAC or RLPD update is two parts that read the same weights and write disjoint gradients
(:class:`~rlweave.algorithms.ActorCriticLoss`), so the learner runs them at the same time. On two
threads of one process they contend for Python's GIL: the forward passes are hundreds of small
operations, and each one hands the GIL back and forth. Measured here (bf16, 256x256 networks,
one update): the critic's part took 2.9 ms and the actor's 2.5 ms alone, 4.1 and 3.9 ms side by
side on two threads, 3.0 and 2.7 ms side by side in two processes.

So the actor's part runs in a process of its own, with no copy of any weight:

* the learner's flat parameter and gradient buffers (:class:`~rlweave.models.flat.FlatParameters`)
  move into shared memory (anonymous ``memfd`` files, inherited by the helper), and the helper
  binds its copies of the modules to the same memory. The optimiser steps in the learner are seen
  by the helper at once, and the gradients its backward pass writes land in the learner's buffers;
* per update the learner copies the batch (with the actor's noise, drawn before the parts start)
  into a shared slot and sends one message; the helper answers with the part's diagnostics
  (``loss_*`` terms and the rest, as floats) once its gradients are written. The learner steps the
  optimisers only after that answer, so the helper never reads half-updated weights.

The numbers are those of the one-thread update, bit for bit: the same operations on the same
values, in one thread each (tested). The helper is a fresh interpreter (``python -m``), not a
``multiprocessing`` child: it neither forks a process that runs threads nor re-imports the
learner's main module. It exits when its socket closes: when the learner closes it, exits or is
killed.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Callable

import torch
from torch import Tensor

from rlweave.models.flat import FlatParameters

__all__ = ["ActorPartProcess", "available", "run_part", "shared_tensor"]


def available() -> bool:
    """Whether this OS has what the helper needs: anonymous shared-memory files (Linux's
    ``memfd_create``). Elsewhere (macOS) the learner runs the part on a thread instead."""
    return hasattr(os, "memfd_create")


def shared_tensor(numel: int, dtype: torch.dtype, fd: int | None = None) -> tuple[Tensor, int]:
    """A 1-D tensor over an anonymous shared-memory file: a new file (``fd=None``), or the file
    ``fd`` another process made. Returns the tensor and the file's descriptor; the mapping lives as
    long as the tensor's storage."""
    nbytes = max(1, numel * torch.empty((), dtype=dtype).element_size())
    if fd is None:
        fd = os.memfd_create("rlweave-learner", os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
    buf = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    return torch.frombuffer(buf, dtype=dtype, count=numel), fd


def run_part(part: Callable[..., dict[str, Tensor]], batch: dict[str, Tensor], nets, options,
             autocast_dtype: torch.dtype | None, device_type: str) -> dict[str, Tensor]:
    """One loss (or part of one) on ``batch`` under the learner's autocast, and the backward pass
    of its ``loss_*`` terms; returns its detached terms and diagnostics. The learner's own update
    and the helper run this same function. Autocast is per thread, so it is entered here."""
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = part(batch, nets, options)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    return {k: v.detach() for k, v in out.items()}


class ActorPartProcess:
    """A helper process that runs ``part(batch, nets, options)`` and its backward pass on request.

    ``nets`` (:class:`~rlweave.algorithms.LearnerNets`): the helper receives the modules the part
    reads (``actor``, ``critic``, ``log_alpha``), whose parameters must all live in ``flats``.
    ``template``: a batch of the shapes and dtypes every later one has. ``autocast_dtype``: the
    learner's ``actor.precision`` (None: float32).
    """

    def __init__(self, nets, flats: list[FlatParameters], part: Callable[..., dict[str, Tensor]], options,
                 autocast_dtype: torch.dtype | None, template: dict[str, Tensor], name: str = "learner"):
        self.name = name
        fds: list[int] = []
        flat_fds = []
        for flat in flats:  # parameters and gradients into shared memory, values kept
            data, data_fd = shared_tensor(flat.flat.numel(), flat.flat.dtype)
            grad, grad_fd = shared_tensor(flat.flat.numel(), flat.flat.dtype)
            flat.adopt(data, grad)
            flat_fds.append((data_fd, grad_fd))
            fds += [data_fd, grad_fd]
        self.slot: dict[str, Tensor] = {}
        slot_spec = {}
        for key, value in template.items():
            t, fd = shared_tensor(value.numel(), value.dtype)
            self.slot[key] = t.view(value.shape)
            slot_spec[key] = (fd, tuple(value.shape), value.dtype)
            fds.append(fd)
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the same rlweave and torch
        self.process = subprocess.Popen([sys.executable, "-m", "rlweave.workers.update_helper", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno(), *fds], env=env)
        theirs.close()
        for fd in fds:  # the mappings keep the memory; the helper holds its own descriptors
            os.close(fd)
        self._conn = Connection(ours.detach())
        # the modules go by value (plain pickle, one stream: they and the flat buffers' parameter
        # lists stay the same objects); the helper rebinds them to the shared memory
        payload = {"actor": nets.actor, "critic": nets.critic, "log_alpha": nets.log_alpha, "flats": flats, "flat_fds": flat_fds,
                   "slot": slot_spec, "part": part, "options": options, "autocast_dtype": autocast_dtype}
        try:
            self._send(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
            self._reply("ready")
        except BaseException:
            self.close()
            raise

    def submit(self, batch: dict[str, Tensor]) -> None:
        """Starts the part on ``batch`` (copied into the shared slot; the call returns at once)."""
        if batch.keys() != self.slot.keys():
            raise ValueError(f"{self.name}: batch keys {sorted(batch)} differ from the helper's {sorted(self.slot)}")
        for key, value in batch.items():
            self.slot[key].copy_(value)
        self._send(b"run")

    def result(self) -> dict[str, Tensor]:
        """Waits until the part's gradients are written; returns its detached terms and diagnostics."""
        return {k: torch.tensor(v) for k, v in self._reply("done")}

    def close(self) -> None:
        if self.process.poll() is None:
            self._conn.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _send(self, message: bytes) -> None:
        try:
            self._conn.send_bytes(message)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._died() from None

    def _reply(self, expected: str):
        try:
            poll_spinning(self._conn)
            kind, body = pickle.loads(self._conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            raise self._died() from None
        if kind == "error":
            raise RuntimeError(f"{self.name}: the actor's part of the update failed in its helper process:\n{body}")
        if kind != expected:
            raise RuntimeError(f"{self.name}: the helper process answered {kind!r} where {expected!r} was due")
        return body

    def _died(self) -> RuntimeError:
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        return RuntimeError(f"{self.name}: the helper process running the actor's part of the update "
                            f"(pid {self.process.pid}) exited with code {code}")


# How long a side polls the socket without sleeping before it blocks. A process that sleeps on a
# socket takes tens of microseconds (more on a busy VM) to wake when the message comes, which is a
# large share of a part that takes a fraction of a millisecond (PPO's value loss on 64x64 MLPs);
# the parts of consecutive updates follow each other within a millisecond or so.
SPIN_S = 0.002


def poll_spinning(conn: Connection, spin_s: float = SPIN_S) -> None:
    """Returns once ``conn`` has a message: polled without sleeping for up to ``spin_s``, then
    blocking."""
    end = time.perf_counter() + spin_s
    while time.perf_counter() < end:
        if conn.poll(0):
            return
    conn.poll(None)


def _serve(conn: Connection) -> None:
    """The helper's loop: binds the shared buffers, then runs the part on each ``run`` message."""
    from rlweave.algorithms import LearnerNets

    torch.set_num_threads(1)  # one core, as the learner's own part
    torch.set_flush_denormal(True)  # as in every worker thread (cluster.hosts)
    try:
        payload = pickle.loads(conn.recv_bytes())
        flats: list[FlatParameters] = payload["flats"]
        for flat, (data_fd, grad_fd) in zip(flats, payload["flat_fds"]):
            n, dtype = flat.flat.numel(), flat.flat.dtype
            flat.adopt(shared_tensor(n, dtype, data_fd)[0], shared_tensor(n, dtype, grad_fd)[0], copy=False)
        slot = {key: shared_tensor(int(torch.Size(shape).numel()), dtype, fd)[0].view(shape)
                for key, (fd, shape, dtype) in payload["slot"].items()}
        nets = LearnerNets(actor=payload["actor"], critic=payload["critic"], log_alpha=payload["log_alpha"])
        part, options, dtype = payload["part"], payload["options"], payload["autocast_dtype"]
        device = "cpu"  # every buffer is a shared-memory mapping: the helper computes on CPU alone
        conn.send_bytes(pickle.dumps(("ready", None)))
    except Exception:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        return
    while True:
        try:
            poll_spinning(conn)  # the next update's request comes soon after this one's reply
            conn.recv_bytes()
        except (EOFError, OSError):
            return  # the learner closed the socket, exited or died
        try:
            reply = ("done", [(k, float(v)) for k, v in run_part(part, slot, nets, options, dtype, device).items()])
        except Exception:
            reply = ("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
