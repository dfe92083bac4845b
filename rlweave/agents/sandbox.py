"""Runs model-written Python in an isolated, resource-limited child process (issue #32, item 4).

Why a subprocess with Linux namespaces rather than a Python-level jail: model code is arbitrary, and
only the kernel can reliably deny it the network and the filesystem. Each run gets:

* **no network**: a new network namespace (only a downed loopback);
* **a read-only filesystem** except a private scratch folder: a new mount namespace in which every
  mount is bind-remounted read-only, a size-limited tmpfs mounted on the scratch folder, and a fresh
  ``/proc`` for a new PID namespace (the host's processes are invisible);
* **no way back**: all capabilities are dropped (bounding set, securebits, ``no_new_privs``) before the
  model's code starts, so it cannot remount anything writable;
* **resource limits** (``setrlimit``): CPU seconds, address space, file size, open files, processes;
  as root, ``RLIMIT_NPROC`` is not enforced by the kernel, so a per-run ``pids`` cgroup caps the
  process count when the cgroup filesystem is writable (a fork bomb then fails to fork);
* **a wall-time limit**: the run is its own session and PID namespace; on timeout the session is
  killed and the namespace's init takes every remaining process with it;
* **a clean environment**: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and the names in
  ``env_passthrough``; output is captured up to a bound (head and tail kept).

When namespaces cannot be created (no ``unshare``, no user namespaces), :class:`Sandbox` refuses with
:class:`SandboxUnavailable` unless ``allow_unisolated=True``, which keeps only the limits, the clean
environment and the scratch folder as working directory.

Inside the namespaces, :mod:`rlweave.agents.sandbox_init` (run as a script) does the mounts, then
forks the program, which sets its limits, drops privileges and ``exec`` s the interpreter.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from rlweave.agents.sandbox_init import SETUP_FAILED_EXIT, SETUP_FAILED_MARK

INIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")
NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """Isolation was asked for but this machine cannot provide it; the message says why and what to set."""


@dataclasses.dataclass
class SandboxLimits:
    """Per-run limits. ``cpu_s`` is CPU time, ``wall_s`` real time; ``memory_mb`` bounds the address
    space of each process; ``nproc`` the number of processes (and threads); ``fsize_mb`` each written
    file; ``scratch_mb`` the scratch tmpfs; ``output_chars`` the captured stdout and stderr each."""

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 1024
    nproc: int = 32
    fsize_mb: int = 16
    scratch_mb: int = 64
    nofile: int = 64
    output_chars: int = 8000


@dataclasses.dataclass
class SandboxResult:
    """The outcome of one run. ``exit_code`` is negative for a signal (``-9``: killed);
    ``timed_out`` means the wall limit was hit; ``isolated`` whether namespaces were used."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    wall_s: float
    truncated: bool
    isolated: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def summary(self) -> str:
        """The exit status in words, for the model and for logs."""
        if self.timed_out:
            return f"killed: wall-time limit ({self.wall_s:.1f} s)"
        if self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            hint = {"SIGKILL": " (CPU time or memory limit, or killed)", "SIGXCPU": " (CPU time limit)",
                    "SIGXFSZ": " (file size limit)"}.get(name, "")
            return f"killed by {name}{hint}"
        return f"exit code {self.exit_code}"


class _Capture:
    """Keeps the head and the tail of a stream within a bound, counting what it dropped."""

    def __init__(self, limit_chars: int):
        self.half = max(1, limit_chars // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.dropped:
            return f"{head}\n...[{self.dropped} bytes cut]...\n{tail}"
        return head + tail


# --------------------------------------------------------------------------------------------------
# Host side


def _unshare_argv() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None:
        return None
    argv = [exe, "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
    if os.geteuid() != 0:
        argv[1:1] = ["--user", "--map-root-user"]
    return argv


class _PidsCgroup:
    """A per-run cgroup with ``pids.max``: the process cap that works even for root (v1 or v2)."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> "_PidsCgroup | None":
        for parent in _pids_cgroup_parents():
            path = os.path.join(parent, f"rlweave-sandbox-{uuid.uuid4().hex[:12]}")
            try:
                os.mkdir(path)
            except OSError:
                continue
            try:
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(max_pids))
                return cls(path)
            except OSError:
                cls(path).remove()
        return None

    def remove(self, wait_s: float = 2.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except OSError as exc:  # EBUSY while killed processes are still exiting
                if exc.errno == errno.ENOENT or time.monotonic() > deadline:
                    return
                time.sleep(0.02)


@functools.cache
def _pids_cgroup_parents() -> tuple[str, ...]:
    """Where a pids cgroup can be made: cgroup v1's pids hierarchy, or our own cgroup v2 node."""
    out = []
    try:
        for line in open("/proc/self/cgroup"):
            hid, controllers, rel = line.rstrip("\n").split(":", 2)
            if "pids" in controllers.split(","):
                out.append(os.path.join("/sys/fs/cgroup/pids", rel.lstrip("/")))
            elif hid == "0" and controllers == "":
                node = os.path.join("/sys/fs/cgroup", rel.lstrip("/"))
                ctl = os.path.join(node, "cgroup.subtree_control")
                if os.path.exists(ctl) and "pids" in open(ctl).read().split():
                    out.append(node)
    except OSError:
        pass
    return tuple(p for p in out if os.access(p, os.W_OK))


@functools.cache
def isolation_problem(python: str = sys.executable) -> str | None:
    """None when isolated runs work here (probed once per process by a real sandboxed run), else why not."""
    if sys.platform != "linux":
        return f"namespaces need Linux (this is {sys.platform})"
    if _unshare_argv() is None:
        return "the 'unshare' command (util-linux) is not installed"
    sb = Sandbox(SandboxLimits(cpu_s=5, wall_s=20, output_chars=2000), python=python)
    try:
        res = sb._run_isolated("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), 1)\nexcept OSError:\n    pass\n", None)
    except SandboxUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"unshare failed to start: {exc}"
    if res.exit_code != 0:
        return "creating namespaces failed: " + " ".join((res.stderr or res.stdout).split())[:300]
    return None


class Sandbox:
    """Runs Python source under the isolation and limits described in the module docstring.

    ``env_passthrough`` names host environment variables the code may see (nothing else is
    inherited). ``allow_unisolated`` lets runs proceed without namespaces where they are unavailable.
    """

    def __init__(self, limits: SandboxLimits | None = None, env_passthrough: tuple[str, ...] | list[str] = (),
                 allow_unisolated: bool = False, python: str | None = None):
        self.limits = limits or SandboxLimits()
        self.env_passthrough = tuple(env_passthrough)
        self.allow_unisolated = bool(allow_unisolated)
        self.python = python or sys.executable

    def check(self) -> bool:
        """True when runs will be isolated; raises :class:`SandboxUnavailable` when they cannot be and
        unisolated runs are not allowed. Call before work starts to fail early."""
        problem = isolation_problem(self.python)
        if problem is None:
            return True
        if self.allow_unisolated:
            return False
        raise SandboxUnavailable(f"sandbox isolation unavailable: {problem}; set allow_unisolated=true to run "
                                 "code with resource limits only (no network or filesystem isolation)")

    def run(self, code: str, stdin: str | None = None) -> SandboxResult:
        """Runs ``code`` as a script; never raises for what the code does."""
        if self.check():
            return self._run_isolated(code, stdin)
        return self._run(code, stdin, isolated=False)

    async def arun(self, code: str, stdin: str | None = None) -> SandboxResult:
        import asyncio

        return await asyncio.to_thread(self.run, code, stdin)

    def _run_isolated(self, code: str, stdin: str | None) -> SandboxResult:
        return self._run(code, stdin, isolated=True)

    def _env(self, scratch: str) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
        for name in self.env_passthrough:
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def _run(self, code: str, stdin: str | None, isolated: bool) -> SandboxResult:
        lim = self.limits
        scratch = tempfile.mkdtemp(prefix="rlweave-sandbox-")
        cgroup = _PidsCgroup.create(lim.nproc + 2)  # + our init and the program itself
        try:
            with open(os.path.join(scratch, "main.py"), "w") as f:
                f.write(code)
            spec = {"scratch": scratch, "python": self.python, "isolated": isolated, "limits": dataclasses.asdict(lim),
                    "cgroup": cgroup.path if cgroup else None}
            status_r, status_w = os.pipe()
            try:
                argv = [self.python, "-I", "-S", INIT_SCRIPT, json.dumps(spec), str(status_w)]
                if isolated:
                    argv = (_unshare_argv() or []) + argv
                res = _communicate(argv, self._env(scratch), scratch, stdin, lim, isolated, status_r, status_w)
            finally:
                os.close(status_r)
        finally:
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(scratch, ignore_errors=True)
        if res.exit_code == SETUP_FAILED_EXIT and SETUP_FAILED_MARK in res.stderr:
            raise SandboxUnavailable("sandbox setup failed: " + res.stderr.split(SETUP_FAILED_MARK, 1)[1].strip()[:300])
        return res


def _communicate(argv: list[str], env: dict[str, str], cwd: str, stdin: str | None, lim: SandboxLimits,
                 isolated: bool, status_r: int, status_w: int) -> SandboxResult:
    """Starts the run in its own session, captures bounded output, kills the session at the wall limit.
    The program's exit status comes from the in-namespace init through the ``status`` pipe."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                start_new_session=True, close_fds=True, pass_fds=(status_w,))
    finally:
        os.close(status_w)
    if stdin is not None:  # fed by a thread: a program that does not read must not block us past the limit
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()[: 1 << 20]), daemon=True).start()
    caps = {proc.stdout: _Capture(lim.output_chars), proc.stderr: _Capture(lim.output_chars)}
    sel = selectors.DefaultSelector()
    for stream in caps:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    deadline = start + lim.wall_s
    timed_out = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now > deadline:
                timed_out = proc.poll() is None
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:  # a leftover child holds the pipes
                break
            for key, _ in sel.select(timeout=0.05):
                data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if data:
                    caps[key.fileobj].feed(data)  # type: ignore[index]
                else:
                    sel.unregister(key.fileobj)
    finally:
        _kill_session(proc)
        sel.close()
        for stream in caps:
            stream.close()  # type: ignore[union-attr]
    code = proc.wait()
    os.set_blocking(status_r, False)
    try:
        reported = os.read(status_r, 64).decode().strip()
    except BlockingIOError:
        reported = ""
    if reported:
        code = int(reported)
    elif timed_out:
        code = -signal.SIGKILL  # killed before the init could report
    out, err = caps[proc.stdout], caps[proc.stderr]
    return SandboxResult(stdout=out.text(), stderr=err.text(), exit_code=code, timed_out=timed_out,
                         wall_s=time.monotonic() - start, truncated=bool(out.dropped or err.dropped), isolated=isolated)


def _feed(pipe: Any, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, ValueError, OSError):
        pass


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILLs the run's whole session (its process group); with namespaces, unshare's --kill-child
    then kills the namespace's init, and the kernel every process left in that PID namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
        proc.kill()
