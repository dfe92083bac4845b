"""The sandbox's init: runs inside the new namespaces as ``python -I -S sandbox_init.py SPEC STATUS_FD``.

Kept apart from :mod:`rlweave.agents.sandbox` and on the standard library's smallest part (``os``,
``sys``, ``json``, ``ctypes``, ``resource``, ``errno``) because it starts once per sandboxed run:
every import here is paid by every call of the ``python`` tool. See the sandbox module for the
isolation it sets up and why.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import sys

SETUP_FAILED_EXIT = 125
SETUP_FAILED_MARK = "rlweave-sandbox-setup-failed:"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME, _MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_FLAG_OF_OPTION = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
                   "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}
_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 24, 28, 38
_SECUREBITS_LOCKED_NOROOT = 0x2F | 0xC0  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE (+locks)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) for every mount, from /proc/self/mountinfo."""
    out = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")  # octal escapes such as \040 for a space
        flags = 0
        for opt in fields[5].split(","):
            flags |= _FLAG_OF_OPTION.get(opt, 0)
        out.append((point, flags))
    return out


def _make_read_only(libc: ctypes.CDLL) -> None:
    for point, flags in _mount_points():
        try:
            _mount(libc, None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES) or point == "/":  # hidden by another mount
                raise


def _drop_privileges(libc: ctypes.CDLL) -> None:
    """Empties the capability sets for good, so nothing can remount, mount, or regain root powers."""
    if os.geteuid() == 0 and libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS_LOCKED_NOROOT, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS) failed")
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _tasks_of_uid(uid: int) -> int:
    """Threads the user runs now: what ``RLIMIT_NPROC`` counts outside a user namespace of our own."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return n


def _set_limits(lim: dict, isolated: bool) -> None:
    """The run's rlimits. ``RLIMIT_NPROC`` counts the user's tasks in its user namespace: in ours only the
    run's, unisolated every task of the user, so there the limit is the user's current count plus ``nproc``."""
    mb = 1 << 20
    cpu = max(1, int(round(lim["cpu_s"])))
    nproc = lim["nproc"] if isolated or os.getuid() == 0 else lim["nproc"] + _tasks_of_uid(os.getuid())
    for res, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1),
                            (resource.RLIMIT_AS, lim["memory_mb"] * mb, lim["memory_mb"] * mb),
                            (resource.RLIMIT_FSIZE, lim["fsize_mb"] * mb, lim["fsize_mb"] * mb),
                            (resource.RLIMIT_NOFILE, lim["nofile"], lim["nofile"]),
                            (resource.RLIMIT_NPROC, nproc, nproc),
                            (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(res, (soft, hard))


def _boot(spec: dict, status_fd: int) -> None:
    """In the namespaces: join the pids cgroup, read-only mounts and scratch tmpfs; then fork the model's
    program (limits, privileges dropped, ``exec``) and stay as the namespace's init until it exits.

    Why an init of our own rather than ``exec``-ing the program as PID 1: a namespace's init ignores
    signals it has no handler for (so ``SIGXCPU`` or a program's own ``kill`` would do nothing), and
    the program's exit status (a signal included) must reach the host intact: it is written to
    ``status_fd`` as one line.
    """
    os.set_inheritable(status_fd, False)
    scratch, lim = spec["scratch"], spec["limits"]
    code = open(os.path.join(scratch, "main.py")).read()
    if spec.get("cgroup"):
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
            f.write("0")  # this process; everything it starts stays in the cgroup
    libc = _libc()
    if spec["isolated"]:
        _make_read_only(libc)
        _mount(libc, "tmpfs", scratch, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={lim['scratch_mb']}m,mode=0777")
        with open(os.path.join(scratch, "main.py"), "w") as f:
            f.write(code)
    child = os.fork()
    if child == 0:
        try:
            _set_limits(lim, spec["isolated"])
            if spec["isolated"]:
                _drop_privileges(libc)
            os.chdir(scratch)
            os.execve(spec["python"], [spec["python"], "-I", "main.py"], dict(os.environ))
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"{SETUP_FAILED_MARK} {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED_EXIT)
    while True:  # reap orphans (we are init) until the program itself exits
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    code_ = os.waitstatus_to_exitcode(status)
    os.write(status_fd, f"{code_}\n".encode())
    os._exit(0)


if __name__ == "__main__":
    try:
        _boot(json.loads(sys.argv[1]), int(sys.argv[2]))
    except Exception as exc:  # noqa: BLE001 - the host reads this line and refuses to run unisolated
        sys.stderr.write(f"{SETUP_FAILED_MARK} {type(exc).__name__}: {exc}\n")
        sys.exit(SETUP_FAILED_EXIT)
