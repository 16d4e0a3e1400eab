"""Processes by PID, read from ``/proc`` without psutil (the epilog's hot path).

- :func:`start_time`: a process's start, epoch seconds, the same figure as
  ``psutil.Process.create_time()`` (``/proc/<pid>/stat`` field 22, clock
  ticks since boot, + ``btime`` of ``/proc/stat``), so a PID recorded with
  psutil is recognised here and a reused PID is not;
- :func:`stop`: SIGTERM a process and wait for it to *exit* -- through a
  pidfd (``pidfd_open``, Linux >= 5.3), which turns readable when the
  process has exited, zombie or not: a detached child that slurmd's PID 1
  has not reaped yet counts as gone. Without pidfds (older
  kernels, ``ENOSYS``), ``/proc/<pid>/stat`` is polled every 10 ms and a
  zombie (``Z``) counts as gone too;
- :func:`wait_exit`, :func:`kill`: the same wait, and SIGKILL then that wait,
  for a process known by a live tie to it (the epilog's socket to its sampler);
- :func:`scan`: PIDs whose command line matches, owned by a uid.

Only the real ``/proc`` (processes are not part of a recorded host root).
"""

from __future__ import annotations

import os
import select
import time

import _signal as signal   # the C module: signal.py's enums (enum, functools) cost the epilog ~6 ms

POLL_S = 0.01       # the /proc fallback's poll period
_BOOT_TIME: float | None = None
_CLK_TCK: int | None = None


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` fields from the state on (``[state, ppid, ...]``:
    field N of proc(5) is item N - 3), None when the process is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return raw[raw.rfind(b")") + 2:].decode("ascii", "replace").split()


def _boot_time() -> float:
    global _BOOT_TIME
    if _BOOT_TIME is None:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    _BOOT_TIME = float(line.split()[1])
                    break
            else:
                raise OSError("no btime in /proc/stat")
    return _BOOT_TIME


def start_time(pid: int) -> float | None:
    """Start of ``pid``, epoch seconds (as ``psutil.Process.create_time()``),
    None when there is no such process (or /proc is unreadable)."""
    global _CLK_TCK
    f = _stat_fields(pid)
    if not f or len(f) < 20:
        return None
    try:
        if _CLK_TCK is None:
            _CLK_TCK = os.sysconf("SC_CLK_TCK")
        return int(f[19]) / _CLK_TCK + _boot_time()
    except (OSError, ValueError):
        return None


def is_same(pid: int, create_time: float | None, tolerance_s: float = 0.5) -> bool:
    """``pid`` exists, is not a zombie, and started at ``create_time``
    (None: any start time): it is still the process that was recorded."""
    f = _stat_fields(pid)
    if not f or f[0] in ("Z", "X"):
        return False
    if create_time is None:
        return True
    t = start_time(pid)
    return t is not None and abs(t - create_time) < tolerance_s


def _exited(pid: int) -> bool:
    f = _stat_fields(pid)
    return not f or f[0] in ("Z", "X")


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):   # Python < 3.9, kernel < 5.3 (ENOSYS), gone (ESRCH)
        return None


def _wait_readable(fd: int, timeout_s: float) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0, int(timeout_s * 1000))))


def _send(fd: int | None, pid: int, sig: int) -> None:
    """``sig`` through the pidfd when there is one (never reaches a reused PID), else by PID."""
    if fd is not None:
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


def _wait(fd: int | None, pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``pid`` to exit: its pidfd ``fd`` turning
    readable, else ``/proc`` polled every :data:`POLL_S` (a zombie counts as gone)."""
    if fd is not None:
        return _wait_readable(fd, timeout_s)
    deadline = time.monotonic() + timeout_s
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def wait_exit(pid: int, timeout_s: float) -> bool:
    """True when ``pid`` has exited (zombie or gone) within ``timeout_s``."""
    fd = _pidfd(pid)
    try:
        return _wait(fd, pid, timeout_s)
    finally:
        if fd is not None:
            os.close(fd)


def kill(pid: int, timeout_s: float = 5.0) -> str:
    """SIGKILL ``pid`` (through its pidfd where there is one) and wait up to
    ``timeout_s`` for it to exit. Returns ``"killed"``, ``"already gone"``,
    ``"still there after SIGKILL + <timeout_s> s"`` or ``"kill failed: <why>"``.
    For a process known by a live tie to it (the sampler at the other end of a
    socket), not by a recorded start time: see :func:`stop` for those."""
    fd = _pidfd(pid)
    try:
        try:
            _send(fd, pid, signal.SIGKILL)
        except ProcessLookupError:
            return "already gone"
        except OSError as e:
            return f"kill failed: {e}"
        return "killed" if _wait(fd, pid, timeout_s) else f"still there after SIGKILL + {timeout_s:g} s"
    finally:
        if fd is not None:
            os.close(fd)


def stop(pid: int, create_time: float | None, timeout_s: float = 5.0) -> str:
    """SIGTERM ``pid`` when it is still the recorded process
    (:func:`is_same`), wait up to ``timeout_s`` for it to exit, then SIGKILL.

    Returns ``"not running"``, ``"stopped"`` (exited within the time) or
    ``"killed"``. The signal goes through the pidfd where there is one, so
    it can never reach a process that reused the PID meanwhile. Raises
    ``PermissionError`` when the process is not ours to signal."""
    fd = _pidfd(pid)
    try:
        # identity checked after the pidfd pins the PID: no reuse race from here on
        if not is_same(pid, create_time):
            return "not running"
        try:
            _send(fd, pid, signal.SIGTERM)
        except ProcessLookupError:
            return "stopped"
        if _wait(fd, pid, timeout_s):
            return "stopped"
        try:
            _send(fd, pid, signal.SIGKILL)
        except ProcessLookupError:
            return "stopped"
        return "killed"
    finally:
        if fd is not None:
            os.close(fd)


def scan(match, uid: int) -> list[tuple[int, float | None]]:
    """``[(pid, start_time)]`` of the processes owned by ``uid`` (the owner of
    ``/proc/<pid>``: its effective uid) whose argv (a list of str) satisfies ``match(argv)``;
    zombies and this process are left out. Unreadable entries are skipped."""
    out = []
    me = os.getpid()
    try:
        entries = os.scandir("/proc")
    except OSError:
        return out
    with entries:
        for e in entries:
            if not e.name.isdigit() or int(e.name) == me:
                continue
            try:
                if e.stat().st_uid != uid:
                    continue
                with open(f"/proc/{e.name}/cmdline", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if not raw:
                continue   # kernel thread or zombie
            argv = raw.rstrip(b"\0").decode("utf-8", "surrogateescape").split("\0")
            if match(argv):
                pid = int(e.name)
                if not _exited(pid):
                    out.append((pid, start_time(pid)))
    return out
