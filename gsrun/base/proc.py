"""The one way gsrun runs an external command: list argv (no shell), its own
session, a timeout, and on timeout the whole process group killed -- a
wrapper script's ``sleep`` child too, so a wedged tool (field case 20,
docs/field-cases.md) never outlives the hook that called it
(:func:`run_bounded`); a child left running on its own (EpilogSlurmctld's
merge) is started by :func:`spawn_detached`."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress

# the working directory of every child root code starts: never the caller's (/tmp, a checkout)
ROOT_CWD = "/"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Always passed on when set: locale and where gsrun finds its config, dirs and Slurm.
CHILD_ENV_BASE = ("PATH", "LANG", "LC_ALL", "GSRUN_CONFIG", "SLURM_CONF")
# the PYTHON* variables a child may inherit; every other one (PYTHONPATH, PYTHONWARNINGS...) is dropped
_PY_ENV_OK = frozenset({"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONIOENCODING"})


def root_python(*args: str, python: str | None = None) -> list[str]:
    """``[python, "-P", "-s", *args]`` for a child Python of root code: no
    working directory on ``sys.path``, no user site (with
    :func:`root_child_env` and ``cwd=ROOT_CWD``)."""
    return [python or sys.executable, "-P", "-s", *args]


def root_child_env(keep: Iterable[str] = (), base: Mapping[str, str] | None = None,
                   extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The minimal environment of a child of root code: :data:`CHILD_ENV_BASE`
    and ``keep`` from ``base``, then ``extra``; ``PATH`` defaults to
    :data:`SAFE_PATH`; no ``PYTHON*`` but the harmless ones, even from ``extra``."""
    src = os.environ if base is None else base
    env = {k: src[k] for k in (*CHILD_ENV_BASE, *keep, *_PY_ENV_OK) if k in src}
    env.update(extra or {})
    env = {k: v for k, v in env.items() if not k.startswith("PYTHON") or k in _PY_ENV_OK}
    env.setdefault("PATH", SAFE_PATH)
    return env


def spawn_detached(argv: list[str], env: dict, log_fd: int | None = None) -> int:
    """Start ``argv`` detached (``os.posix_spawn``: ``subprocess`` costs the
    prolog ~8 ms of imports): exactly ``env``, stdin ``/dev/null``, output to
    ``log_fd`` (None: ``/dev/null``), a new session, :data:`ROOT_CWD`, no
    other descriptor, default SIGPIPE/SIGXFSZ. Returns the PID, not waited for.

    Raises:
        OSError: the program cannot be started (not found, not executable).
    """
    if log_fd is None:
        out = [(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, 1, 2)]
        log_fd = 3           # nothing to keep below
    else:
        out = None
    if log_fd < 3:          # dup2 onto itself would leave close-on-exec set
        log_fd = fcntl.fcntl(log_fd, fcntl.F_DUPFD_CLOEXEC, 3)
        own = log_fd
    else:
        own = None
    _no_inherit_from(3)
    try:
        here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        here = None         # no way back: the caller's directory is gone
    try:
        os.chdir(ROOT_CWD)  # posix_spawn has no chdir action in Python; ours is given back below
        return os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
                              file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                            *(out or [(os.POSIX_SPAWN_DUP2, log_fd, 1),
                                                      (os.POSIX_SPAWN_DUP2, log_fd, 2)])])
    finally:
        if here is not None:
            os.fchdir(here)
            os.close(here)
        if own is not None:
            os.close(own)


def _no_inherit_from(low: int) -> None:
    """Mark every open descriptor >= ``low`` close-on-exec (those slurmd or a
    caller left inheritable; Python's own already are)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(low, 1024)
    for fd in fds:
        if fd >= low:
            with suppress(OSError):         # closed meanwhile (the listing's own descriptor)
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)


def run_bounded(argv: Sequence[str], timeout_s: float, input_text: str | None = None,
                env: Mapping[str, str] | None = None, cwd: str = ROOT_CWD) -> tuple[int | None, str, str]:
    """Run ``argv`` with ``timeout_s`` in ``cwd`` (default ``/``) -> (exit
    status or None on timeout, stdout, stderr), decoded with ``replace``.

    Raises:
        OSError: the program cannot be started (not found, not executable).
    """
    p = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         close_fds=True, cwd=cwd, env=dict(env) if env is not None else None)
    data = input_text.encode("utf-8", "surrogateescape") if input_text is not None else None
    try:
        out, err = p.communicate(input=data, timeout=timeout_s)
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    except BaseException as e:
        with suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        if not isinstance(e, subprocess.TimeoutExpired):   # the caller's own alarm: never leave it running
            p.wait()
            raise
        try:
            out, err = p.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return None, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")
