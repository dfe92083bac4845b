"""The code sandbox (#32 item 4, Must show): no network, a read-only filesystem outside the scratch folder,
a clean environment, stopped fork bombs, bounded memory, killed infinite loops, and after each of those
the test process carries on and a normal program still runs."""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from rlweave.agents import sandbox as sandbox_mod
from rlweave.agents.sandbox import Sandbox, SandboxLimits, SandboxUnavailable

PROBLEM = sandbox_mod.isolation_problem()
needs_isolation = pytest.mark.skipif(PROBLEM is not None, reason=f"no namespaces here: {PROBLEM}")

LIMITS = SandboxLimits(cpu_s=2, wall_s=5, memory_mb=512, nproc=16, fsize_mb=1, output_chars=2000)


def run(code: str, limits: SandboxLimits = LIMITS, **kw) -> sandbox_mod.SandboxResult:
    return Sandbox(limits, **kw).run(textwrap.dedent(code))


@pytest.fixture(autouse=True)
def still_works_afterwards():
    """After every test: this process is fine and an ordinary program still runs normally."""
    yield
    res = run("print('hello', 6 * 7)", allow_unisolated=PROBLEM is not None)
    assert res.ok and res.stdout == "hello 42\n" and res.stderr == ""


@needs_isolation
def test_no_network_even_to_a_listener_on_this_machine():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=1)
            print("CONNECTED")
        except OSError as exc:
            print("refused:", exc.errno)
        """
    try:
        res = run(code)
        assert res.isolated and res.ok and res.stdout.startswith("refused:"), res
        unisolated = Sandbox(LIMITS)._run(textwrap.dedent(code), None, isolated=False)
        assert unisolated.stdout == "CONNECTED\n"  # the same program reaches it without the namespace
    finally:
        server.close()


@needs_isolation
def test_filesystem_is_read_only_outside_scratch(tmp_path):
    target = tmp_path / "escaped.txt"
    res = run(f"""
        import os
        for path in [{str(target)!r}, "/tmp/rlweave-escaped.txt", os.path.expanduser("~/../escaped.txt")]:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as exc:
                print("denied", exc.errno)
        open("notes.txt", "w").write("scratch is writable")
        print(open("notes.txt").read(), os.getcwd() == os.environ["HOME"])
        """)
    assert res.ok and "WROTE" not in res.stdout, res
    assert res.stdout.count("denied 30") == 3  # EROFS
    assert "scratch is writable True" in res.stdout
    assert not target.exists() and not os.path.exists("/tmp/rlweave-escaped.txt")
    assert os.listdir(tmp_path) == []


@needs_isolation
def test_privileges_are_dropped_so_nothing_can_be_remounted_writable():
    res = run("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mount(None, b"/", None, ctypes.c_ulong(32 | 4096), None)  # MS_REMOUNT | MS_BIND, without MS_RDONLY
        print(rc, ctypes.get_errno() == 1, len([p for p in os.listdir("/proc") if p.isdigit()]))
        """)
    assert res.ok and res.stdout.split()[:2] == ["-1", "True"], res  # EPERM
    assert int(res.stdout.split()[2]) == 2  # a fresh /proc: only the sandbox's init and this program


def test_environment_is_clean_except_named_variables(monkeypatch):
    monkeypatch.setenv("RLWEAVE_TEST_SECRET", "hunter2")
    monkeypatch.setenv("RLWEAVE_TEST_SHARED", "visible")
    code = """
        import os
        print(os.environ.get("RLWEAVE_TEST_SHARED"))
        print(os.environ["RLWEAVE_TEST_SECRET"])
        """
    res = run(code, env_passthrough=("RLWEAVE_TEST_SHARED",), allow_unisolated=PROBLEM is not None)
    assert res.exit_code == 1 and res.stdout == "visible\n" and "KeyError: 'RLWEAVE_TEST_SECRET'" in res.stderr
    assert "hunter2" not in res.stdout + res.stderr


def _pids_capped() -> bool:
    return bool(sandbox_mod._pids_cgroup_parents()) or os.geteuid() != 0


@needs_isolation
@pytest.mark.skipif(not _pids_capped(), reason="root without a writable pids cgroup: RLIMIT_NPROC is not enforced")
def test_fork_bomb_is_stopped():
    limits = SandboxLimits(cpu_s=2, wall_s=3, memory_mb=256, nproc=16)
    res = run("""
        import os, sys
        main, failed = os.getpid(), 0
        while True:
            try:
                os.fork()
            except OSError:
                failed += 1
                if failed == 50 and os.getpid() == main:
                    print("fork refused", flush=True)
                    sys.exit(0)
        """, limits)
    assert "fork refused" in res.stdout or res.timed_out, res
    assert not any(name.startswith("rlweave-sandbox-") for parent in sandbox_mod._pids_cgroup_parents()
                   for name in os.listdir(parent))  # the per-run cgroup is empty and removed


def test_allocation_beyond_the_memory_limit_fails():
    res = run("""
        try:
            block = bytearray(1024 * 1024 * 1024)
            print("ALLOCATED")
        except MemoryError:
            print("MemoryError")
        """, SandboxLimits(cpu_s=2, wall_s=5, memory_mb=256), allow_unisolated=PROBLEM is not None)
    assert res.ok and res.stdout == "MemoryError\n", res


def test_infinite_loop_is_killed_at_the_wall_time_limit():
    res = run("while True:\n    pass\n", SandboxLimits(cpu_s=30, wall_s=1.5), allow_unisolated=PROBLEM is not None)
    assert res.timed_out and not res.ok and res.exit_code < 0
    assert 1.4 < res.wall_s < 10
    assert res.summary().startswith("killed: wall-time limit")


def test_cpu_limit_kills_a_busy_program():
    res = run("while True:\n    pass\n", SandboxLimits(cpu_s=1, wall_s=30), allow_unisolated=PROBLEM is not None)
    assert not res.timed_out and res.exit_code in (-9, -24), res  # SIGKILL (hard limit) or SIGXCPU


def test_sleeping_children_do_not_outlive_the_run():
    res = run("""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        print("parent done")
        """, allow_unisolated=PROBLEM is not None)
    assert res.ok and res.stdout == "parent done\n" and res.wall_s < 5


def test_output_is_bounded_keeping_head_and_tail():
    res = run("print('START'); print('x' * 1_000_000); print('END')", allow_unisolated=PROBLEM is not None)
    assert res.ok and res.truncated and len(res.stdout) < 2200
    assert res.stdout.startswith("START") and res.stdout.rstrip().endswith("END")


def test_file_size_limit():
    res = run("""
        try:
            open("big.bin", "wb").write(b"0" * (4 * 1024 * 1024))
            print("WROTE")
        except OSError as exc:
            print("refused", exc.errno)
        """, allow_unisolated=PROBLEM is not None)
    assert res.ok and res.stdout == "refused 27\n", res  # EFBIG


def test_refuses_without_isolation_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "isolation_problem", lambda python=None: "unshare: operation not permitted")
    with pytest.raises(SandboxUnavailable, match="unshare: operation not permitted; set allow_unisolated=true"):
        Sandbox(LIMITS).run("print(1)")
    res = Sandbox(LIMITS, allow_unisolated=True).run("print(1)")
    assert res.ok and not res.isolated and res.stdout == "1\n"


def test_stdin_is_fed_and_a_broken_setup_is_refused_with_its_reason():
    res = Sandbox(LIMITS, allow_unisolated=PROBLEM is not None).run("import sys; print(sys.stdin.read().upper())", stdin="abc")
    assert res.ok and res.stdout == "ABC\n"
    if PROBLEM is None:  # the probe with this interpreter fails, and says why
        with pytest.raises(SandboxUnavailable, match="sandbox isolation unavailable: .*no-such-python"):
            Sandbox(LIMITS, python="/no-such-python").run("print(1)")
