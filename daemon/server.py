"""The node daemon: one root process per node that runs every Slurm hook
(docs/DEVELOPING.md draws the processes and sockets).

Trust: a peer of the daemon's own uid (``SO_PEERCRED``) on a socket only that
user can open, running only a hook command of this installation
(:func:`hook_args`); anything else is refused (``E``). Requests are bounded by
:data:`MAX_REQUEST_BYTES`, :data:`MAX_ARGS` and :data:`REQUEST_TIMEOUT_S`.
With ``--ctld-user`` the controller's door ``ctld.sock`` (0660, that user's
group) takes from that user or root only ``epilog-ctld`` and ``@ping``; the
request's ``--spool-dir`` and all but its ``SLURM_*`` facts are dropped
(:func:`ctld_env`). ``epilog-ctld`` is answered at once and its merge forked
(:func:`_merge_child`), at most :data:`MAX_MERGES` at once, then queued (up to
:data:`MAX_PENDING_MERGES`). A changed gsrun module (inode, mtime, size) gets
``F`` (try again) and the daemon re-executes once idle.

Protocol (Unix stream socket, integers big-endian):

* client -> daemon, one message with ``SCM_RIGHTS`` carrying fds 0, 1, 2:
  ``u32 length`` then NUL-terminated fields ``"GSH1"``, the umask in octal,
  ``argc``, the arguments, then ``NAME=VALUE`` entries (:func:`encode_request`);
* daemon -> client: ``F`` (re-executing: try again), ``E`` and a line (refused:
  why) or ``R`` (ready); the client answers ``G`` (go) or ``H`` (go, and it
  sends ``K`` after ``X``) within 2 s, else nothing starts. Then ``S`` from
  the forked child before anything else (a close before ``S``: nothing ran),
  and ``X`` with the ``i32`` wait status, from the child as it exits or, for
  an ``H`` client, answers early (an epilog, once the node is restored), else
  from the daemon as it reaps the child; ``K`` (kept): the rest of the hook is
  the daemon's, for at most :data:`REPORT_LIMIT_S`. The hook's process group
  is killed when the daemon reaps it (as slurmd does when a hook ends) or
  when the client goes away without ``K`` (slurmd past ``PrologEpilogTimeout``).
* ``["@ping"]`` (no descriptors): one JSON line (:meth:`NodeDaemon.status`).
* ``["@bind"]`` (no descriptors) with slurmstepd's :data:`STEPD_ENV`, then
  ``["@step", ...]`` with the job's environment: the step's plan
  (:func:`_bind_child`), limited to :data:`BIND_CPU_S` CPU and
  :data:`BIND_PLAN_S` wall seconds.
"""

from __future__ import annotations

import array
from collections import deque
from contextlib import suppress
import gc
import importlib
import json
import os
import pwd
import resource
import select
import selectors
import signal
import socket
import stat
import sys
import time

import gsrun
from gsrun.base import record, unixsock
from gsrun.base.errors import NodeError, exit_now, flush_std
from gsrun.base.ids import is_digits
from gsrun.base.paths import DAEMON_SOCKET_NAME, DEFAULT_STATE_DIR
from gsrun.epilog.ctld_start import merge_command
from gsrun.admin.node_entry import HOOK_BOOTSTRAP, parse_hook_args, run_hook

MAGIC = "GSH1"
MAX_REQUEST_BYTES = 1 << 20     # an environment of ~1 MiB: far above slurmd's (a few KiB)
MAX_ARGS = 32
REQUEST_TIMEOUT_S = 2.0         # a client sends its request in one message, at once
MAX_MERGES = 12                 # EpilogSlurmctld merges running at once (forked: a few MB each of their own)
MAX_PENDING_MERGES = 2048       # merges waiting for a slot (a few KiB each: argv and the hook's environment)
READY, GO, GO_HANDOVER, STARTED, AGAIN, REFUSED, EXITED, KEPT = b"R", b"G", b"H", b"S", b"F", b"E", b"X", b"K"
REPORT_LIMIT_S = 3660.0         # a hook's life after its answer: the longest timeouts.epilog_budget_s, and a minute
SOCKET_NAME = DAEMON_SOCKET_NAME
MONITOR_BACKOFF_S = 10.0        # a node monitor that lived less than this is started again after it
MONITOR_STOP_S = 10.0           # a stopping monitor's final flush of every job
PING_REQUEST = "@ping"
# What a hook imports, loaded once by the daemon (a test checks no child imports more).
PRELOAD = ("gsrun.admin.node_entry", "gsrun.prolog.main", "gsrun.epilog.main",
           "gsrun.epilog.ctld_start", "gsrun.epilog.ctld", "gsrun.node.tuning", "gsrun.node.journal",
           "gsrun.node.steps", "gsrun.node.mps", "gsrun.node.residual", "gsrun.node.mig",
           "gsrun.request.config", "gsrun.request.job",
           "gsrun.report.node_end", "gsrun.report.summary", "gsrun.facts.nvml", "gsrun.node.monitor", "json", "pathlib",
           "subprocess", "shutil", "tomllib", "datetime", "traceback", "fcntl", "select", "socket",
           # the SPANK plugin's step plans (_bind_child)
           "gsrun.spank_py.hooks", "gsrun.bind.plan", "gsrun.facts.topology", "gsrun.base.cpulist")


class BadRequest(ValueError):
    """A request that is not what :func:`encode_request` writes."""


class NoRequest(BadRequest):
    """A connection closed before its first byte (a daemon probing the socket): nothing to log."""


def default_socket(state_dir: str | None = None) -> str:
    """``<state dir>/daemon.sock`` (``--state-dir``, else ``GSRUN_STATE_DIR``, else the default)."""
    return os.path.join(state_dir or os.environ.get("GSRUN_STATE_DIR") or DEFAULT_STATE_DIR, SOCKET_NAME)


def encode_request(argv: list[str], env: dict[str, str], umask: int) -> bytes:
    """The request bytes (length prefix included) the C client sends. Pure."""
    fields = [MAGIC, format(umask, "o"), str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = b"".join(os.fsencode(f) + b"\0" for f in fields)
    return len(body).to_bytes(4, "big") + body


def parse_request(body: bytes) -> tuple[list[str], dict[str, str], int]:
    """The request body (after the length) -> ``(argv, env, umask)``. Pure.

    Raises:
        BadRequest: another protocol version (another gsrun release's client),
            a field count or umask out of range, an environment entry without ``=``.
    """
    if not body.endswith(b"\0"):
        raise BadRequest("unterminated field")
    fields = [os.fsdecode(f) for f in body[:-1].split(b"\0")]
    if len(fields) < 4 or fields[0] != MAGIC:
        raise BadRequest(f"not a {MAGIC} request")
    um, argc = fields[1], fields[2]
    if not (um and len(um) <= 4 and all(c in "01234567" for c in um)) or int(um, 8) > 0o777:
        raise BadRequest(f"umask {um[:8]!r}")
    if not (argc.isdigit() and 1 <= int(argc) <= MAX_ARGS) or len(fields) < 3 + int(argc):
        raise BadRequest(f"argc {argc[:8]!r}")
    n = int(argc)
    argv = fields[3:3 + n]
    env: dict[str, str] = {}
    for entry in fields[3 + n:]:
        k, eq, v = entry.partition("=")
        if not eq or not k:
            raise BadRequest("environment entry without a name")
        env.setdefault(k, v)        # the first wins, as getenv(3) finds it
    return argv, env, int(um, 8)


def hook_args(argv: list[str], python: str, site_dir: str, gsrun_node: str | None = None) -> list[str] | None:
    """The hook's own arguments (``["prolog", "--state-dir", "/x"]``) when
    ``argv`` is ``[python, "-I", "-S", "-c", HOOK_BOOTSTRAP, site_dir, hook,
    options...]`` with the daemon's interpreter and site (real paths) or this
    installation's ``gsrun-node hook options...``, with options
    :func:`~gsrun.admin.node_entry.parse_hook_args` takes; else None."""
    if not argv:
        return None
    if gsrun_node and len(argv) >= 2 and os.path.realpath(argv[0]) == os.path.realpath(gsrun_node):
        rest = argv[1:]
    elif len(argv) < 7 or argv[1:5] != ["-I", "-S", "-c", HOOK_BOOTSTRAP]:
        return None
    elif os.path.realpath(argv[0]) != os.path.realpath(python) or os.path.realpath(argv[5]) != site_dir:
        return None
    else:
        rest = argv[6:]
    return rest if parse_hook_args(rest) is not None else None


def loaded_files() -> dict[str, tuple[int, int, int]]:
    """``{path: (inode, mtime_ns, size)}`` of every gsrun module loaded now."""
    out = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and (name == "gsrun" or name.startswith("gsrun.")):
            try:
                st = os.stat(f)
            except OSError:
                continue
            out[f] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def changed(files: dict[str, tuple[int, int, int]]) -> str | None:
    """The first of ``files`` that is gone or differs from its recorded stat, or None."""
    for f, key in files.items():
        try:
            st = os.stat(f)
        except OSError:
            return f
        if (st.st_ino, st.st_mtime_ns, st.st_size) != key:
            return f
    return None


def join_client(pid: int, proc: str = "/proc", cgroup_fs: str = "/sys/fs/cgroup") -> list[str]:
    """Move the calling process into the cgroup (v2: ``0::PATH`` of
    ``/proc/PID/cgroup``) and CPU affinity of the client ``pid`` (slurmd), so
    slurmd's limits and CoreSpec hold. Best effort: -> what failed."""
    notes = []

    def v2_path(who: str) -> str | None:
        with open(f"{proc}/{who}/cgroup", encoding="utf-8", errors="replace") as f:
            return next((ln[3:] for ln in f.read(65536).splitlines() if ln.startswith("0::")), None)

    try:
        if os.path.exists(os.path.join(cgroup_fs, "cgroup.controllers")):
            path = v2_path(str(int(pid)))
            if path and path.startswith("/") and "/.." not in path and path != v2_path("self"):
                with open(os.path.join(cgroup_fs, path.lstrip("/"), "cgroup.procs"), "w") as f:
                    f.write("0")
    except OSError as e:
        notes.append(f"cgroup of the hook's client {pid}: {e.strerror or e}")
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(pid))
    except OSError as e:
        notes.append(f"CPU affinity of the hook's client {pid}: {e.strerror or e}")
    return notes


def _read_request(conn, nfds: int | None = 3, timeout_s: float = REQUEST_TIMEOUT_S
                  ) -> tuple[list[str], dict[str, str], int, list[int]]:
    """Read one request carrying ``nfds`` descriptors (None: 0 or 3) ->
    (argv, env, umask, fds), all of it within ``timeout_s`` (one deadline, not
    one per read).

    Raises:
        NoRequest: the peer closed before its first byte.
        BadRequest: a short, oversized or malformed request, or the wrong
            number of descriptors.
        TimeoutError: the request did not arrive within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    fds = array.array("i")
    buf = bytearray()
    need = None
    try:
        while need is None or len(buf) < need:
            want = 65536 if need is None else min(65536, need - len(buf))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"request not complete within {timeout_s:g} s")
            conn.settimeout(left)
            data, anc, _flags, _addr = conn.recvmsg(want, socket.CMSG_SPACE(3 * fds.itemsize))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            if not data:
                break
            buf += data
            if need is None and len(buf) >= 4:
                need = 4 + int.from_bytes(buf[:4], "big")
                if need > MAX_REQUEST_BYTES:
                    break
        if need is None or len(buf) != need or len(fds) not in ((0, 3) if nfds is None else (nfds,)):
            if not buf and not fds:
                raise NoRequest("no request")
            raise BadRequest("short request" if need is None or len(buf) < need else
                             f"request over {MAX_REQUEST_BYTES} bytes" if need > MAX_REQUEST_BYTES else
                             f"{len(fds)} descriptors, not {nfds if nfds is not None else '0 or 3'}")
        return (*parse_request(bytes(buf[4:])), list(fds))
    except BaseException:
        _close(fds)
        raise


BIND_REQUEST = "@bind"       # the SPANK plugin's request for a step's plan (see _bind_child)
BIND_WAIT_S = 120.0          # from slurmstepd's init_post_opt to its user_init (the request's second part)
# slurmstepd's variables the plugin sends with @bind (GSRUN_CONFIG: $GSRUN_CONFIG or plugstack config=)
STEPD_ENV = ("GSRUN_HOST_ROOT", "GSRUN_STATE_DIR", "GSRUN_CONFIG", "SLURM_CONF")
BIND_CPU_S = 5               # CPU seconds a plan may use (RLIMIT_CPU; a plan takes ~10 ms)
BIND_PLAN_S = 10             # wall seconds from the step's request to its answer (SIGALRM ends it)
MAX_PLAN_BYTES = 16 << 20    # the most a plan may take: what the plugin reads (gsrun_spank.c GS_MAX_PLAN_BYTES)


def _bind_child(conn, stepd_env: dict[str, str]) -> None:
    """In a child forked for one slurmstepd: wait for ``["@step", CPUS, MEMS, JOB_ID, STEP_ID, MPS, BIND,
    PLUGSTACK_BIND, NTASKS]`` and the job environment (CPUS/MEMS: slurmstepd's affinity and ``Mems_allowed_list``;
    MPS/BIND ``-`` or ``=VALUE``; NTASKS: the step's tasks on this node, the plan's ranks), answer
    :func:`~gsrun.spank_py.hooks.format_actions`'s text or ``error WHY`` (the step runs unbound). Never returns."""
    try:
        _fresh_signals()
        resource.setrlimit(resource.RLIMIT_CPU, (BIND_CPU_S, BIND_CPU_S))
        _close_from(3, keep=(conn.fileno(),))
        os.chdir("/")
        os.environ.clear()
        os.environ.update({k: v for k, v in stepd_env.items() if k in STEPD_ENV and k != "GSRUN_CONFIG"})
        try:
            argv, job_env, _um, _fds = _read_request(conn, nfds=0, timeout_s=BIND_WAIT_S)
            signal.alarm(BIND_PLAN_S)       # SIG_DFL: the process ends
            if (len(argv) != 9 or argv[0] != "@step" or not all(is_digits(argv[i]) for i in (3, 4, 8))
                    or any(a != "-" and not a.startswith("=") for a in argv[5:7])):
                raise BadRequest("not a step request" + (" (gsrun_spank.so is older than this daemon: gsrun-node spank "
                                                         "build && gsrun-node spank install)" if len(argv) == 8 else ""))
            from gsrun.base.cpulist import parse_cpulist
            from gsrun.spank_py.hooks import format_actions, step_actions

            cpus = parse_cpulist(argv[1]) if argv[1] else None
            mems = parse_cpulist(argv[2]) if argv[2] else None
            actions, notes, others = step_actions(
                job_env, stepd_env.get("GSRUN_HOST_ROOT"), cpus, mems, stepd_env.get("GSRUN_CONFIG"),
                job_id=argv[3], step_id=int(argv[4]), mps_opt=None if argv[5] == "-" else argv[5][1:],
                bind_opt=None if argv[6] == "-" else argv[6][1:], plugstack_bind=argv[7], local_tasks=int(argv[8]))
            text = format_actions(actions, notes, others)
            if (n := len(text.encode("utf-8", "surrogateescape"))) >= MAX_PLAN_BYTES:
                raise ValueError(f"a plan of {n} bytes: the plugin reads at most {MAX_PLAN_BYTES - 1}")
        except Exception as e:  # noqa: BLE001 - the plugin runs the step unbound and says why
            text = "error " + f"{type(e).__name__}: {e}".replace("\n", " ") + "\n"
        conn.settimeout(5.0)
        conn.sendall(text.encode("utf-8", "surrogateescape"))
    except BaseException:   # noqa: BLE001 - never back into the daemon's loop
        pass
    finally:
        os._exit(0)


def _fresh_signals(sigint=None) -> None:
    """Signals as a fresh interpreter's, whatever the daemon inherited (``nohup``, ``&``): SIGPIPE and
    SIGXFSZ ignored, SIGINT at ``sigint``, all else at its default; no wakeup fd, none blocked."""
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ}:
        with suppress(OSError, ValueError):     # the C library's own real-time signals
            signal.signal(sig, signal.SIG_DFL)
    if sigint is not None:
        signal.signal(signal.SIGINT, sigint)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _close_from(low: int, keep: tuple[int, ...] = ()) -> None:
    """Close every descriptor >= ``low`` but those in ``keep`` (those listed in /proc/self/fd)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(low, 1024))
    for fd in fds:
        if fd >= low and fd not in keep:
            with suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def _child(args: list[str], env: dict[str, str], umask: int, fds: list[int], conn,
           client_pid: int | None = None, handover: bool = False) -> None:
    """In the forked child: send ``S``, become what slurmd's hook process would be (:func:`join_client`,
    :func:`_become`), run the hook (which, for a ``handover`` client, may :func:`_answer` before it
    ends); then answer unless it did, ``_exit``."""
    rc = 70
    answered: list[int] = []
    try:
        conn.setblocking(True)
        conn.sendall(STARTED)
        notes = join_client(client_pid) if client_pid else []
        log_fd = os.dup(2)      # the daemon's log: what the hook prints after its answer
        _become(fds, umask, env, keep=(conn.fileno(), log_fd))   # the client's connection: X at the end
        for note in notes:
            os.write(2, f"gsrun: daemon: {note}\n".encode())
        rc = run_hook(parse_hook_args(args),
                      answer=(lambda status: answered.append(_answer(conn, status, log_fd))) if handover else None)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - never back into the daemon's loop
        with suppress(OSError):
            os.write(2, f"gsrun: daemon: hook failed in the daemon's child: {e!r}\n".encode())
        rc = 0          # a bug of ours must not drain the node (as node_entry.run_hook)
    finally:
        if not answered:
            _answer(conn, rc)
        os._exit(rc & 0xFF)     # never back into the caller


def _answer(conn, rc: int, log_fd: int | None = None) -> int:
    """The hook's status ``rc`` to its client: flush, 0-1 on ``/dev/null``, 2 on ``log_fd`` or ``/dev/null``
    (slurmd's pipe ends with the client, not with this process), ``X`` and ``rc`` as a wait status -> ``rc``."""
    flush_std()
    with suppress(OSError):
        null = os.open("/dev/null", os.O_RDWR)
        for fd, to in ((0, null), (1, null), (2, null if log_fd is None else log_fd)):
            os.dup2(to, fd)
    with suppress(OSError):
        conn.sendall(EXITED + ((rc & 0xFF) << 8).to_bytes(4, "big", signed=True))
    return rc


def _become(fds: list[int], umask: int, env: dict[str, str], keep: tuple[int, ...] = ()) -> None:
    """Make this forked child what a fresh process would be: its own session,
    signals as a fresh interpreter's, ``fds`` as 0-2 and no other descriptor
    but ``keep`` (close-on-exec), ``umask``, cwd ``/``, exactly ``env``."""
    import fcntl

    os.setsid()
    _fresh_signals(signal.default_int_handler)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in fds]  # none of them is 0-2 while moved
    for i, fd in enumerate(high):
        os.dup2(fd, i)
    _close_from(3, keep=keep)
    os.umask(umask)
    os.chdir("/")
    os.environ.clear()
    os.environ.update(env)
    time.tzset()


def _merge_child(argv: list[str], env: dict[str, str], umask: int) -> None:
    """In the forked child: the merge command line ``argv`` (``python -P -s -m
    gsrun.epilog.ctld finish JOBID ...``) run as that process would run it
    (:func:`_become`, 0-2 on ``/dev/null``)."""
    rc = 70
    try:
        _become([os.open("/dev/null", os.O_RDWR)] * 3, umask, env)
        from gsrun.epilog import ctld

        rc = ctld._main(argv[argv.index("-m") + 2:])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - never back into the daemon's loop
        rc = 1
    finally:
        exit_now(rc)


CTLD_SOCKET_NAME = "ctld.sock"     # the controller's door, beside the daemon's own socket
_CTLD_DROP = ("SLURM_CONF",)


def ctld_env(env: dict[str, str], own: dict[str, str]) -> dict[str, str]:
    """A request's environment through the controller's door: ``env``'s
    ``SLURM_*`` job facts (less ``SLURM_CONF``), all else from the daemon's ``own``."""
    out = {k: v for k, v in own.items() if not k.startswith("SLURM_") or k in _CTLD_DROP}
    out.update((k, v) for k, v in env.items() if k.startswith("SLURM_") and k not in _CTLD_DROP)
    return out


def _merge_of(args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
    """The merge to start for ``epilog-ctld`` with a good job id, else None (a child runs the hook)."""
    if args[0] != "epilog-ctld":
        return None

    a = parse_hook_args(args, env)
    return merge_command(env, a["spool_dir"]) if a is not None else None


class NodeDaemon:
    """One node's daemon: :meth:`serve` until SIGTERM/SIGINT (waiting for its
    hooks); SIGHUP re-executes it, as a changed module does."""

    def __init__(self, socket_path: str, log=None, monitor: dict | None = None, ctld_user: str | None = None):
        self.socket_path = socket_path
        # the controller's door: (user name, socket path), its listener and file id
        self.ctld = (ctld_user, os.path.join(os.path.dirname(socket_path), CTLD_SOCKET_NAME)) if ctld_user else None
        self.ctld_uid: int | None = None
        self.ctld_listener = None
        self.ctld_socket_id: tuple[int, int] | None = None
        # gsrun.node.monitor.run's arguments, None: no monitor
        self.monitor_args = monitor
        self.monitor: tuple[int, int, float] | None = None     # (pidfd, pid, start monotonic)
        self.monitor_due: float | None = None                  # when to start it again (monotonic)
        self.log = log or (lambda msg: print(f"gsrun: daemon: {msg}", file=sys.stderr, flush=True))
        self.python = sys.executable

        self.site_dir = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(gsrun.__file__))))
        # this installation's console script (a venv's bin/, beside its interpreter)
        node = os.path.join(os.path.dirname(self.python), "gsrun-node")
        self.gsrun_node = node if os.path.isfile(node) else None
        self.sel = selectors.DefaultSelector()
        self.running: dict[int, tuple[object, int]] = {}   # pidfd -> (conn, pid)
        self.merges: set[int] = set()       # the pidfds of self.running that are merges
        self.plans: set[int] = set()        # the pidfds of self.running that are step plans
        self.report_due: dict[int, float] = {}  # pidfd -> when a hook that answered is killed (monotonic)
        self.pending: deque = deque()       # merges waiting for a slot: (argv, env, umask)
        self.stopping = False
        self.reexec = False
        self.files: dict[str, tuple[int, int, int]] = {}
        self.served = 0
        self.started = int(time.time())

    # -- setup -------------------------------------------------------------------
    def preload(self) -> list[str]:
        """Import :data:`PRELOAD`, build the records' loading plans; -> what failed (logged, not fatal)."""
        bad = []
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 - a missing optional module costs only speed
                bad.append(f"{name} ({e!r})")
        try:    # the records' loading plans, built once here rather than in every child (~4 ms of an epilog)
            record.prepare_loaders()
        except Exception as e:  # noqa: BLE001 - a child builds what it needs
            bad.append(f"record loading plans ({e!r})")
        self.files = loaded_files()

        gc.collect()
        gc.freeze()     # children do not touch (copy) the preloaded objects' pages for GC
        return bad

    def bind(self):
        """Listen on :attr:`socket_path` (mode 0600, renamed into place).

        Raises:
            NodeError: the directory is missing or writable by another user, a
                non-socket at the path, or another daemon serving it.
        """
        unixsock.check_dir(self.socket_path, "daemon",
                           "create the node's state directory first (the prolog does; or "
                           "--socket in an existing root-owned directory)",
                           "chown root and chmod go-w it, or choose another --socket")
        try:
            old = os.lstat(self.socket_path)
            if not stat.S_ISSOCK(old.st_mode):
                raise NodeError("daemon", "socket", f"{self.socket_path} exists and is not a socket",
                                hint="remove it or choose another --socket")
        except FileNotFoundError:
            pass
        else:
            # a live daemon there keeps it (a stale socket is replaced)
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                probe.settimeout(1.0)
                probe.connect(self.socket_path)
            except OSError:
                pass
            else:
                raise NodeError("daemon", "socket", f"{self.socket_path}: another daemon is serving it",
                                hint="stop that one first (systemctl stop gsrun-daemon), or choose another "
                                     "--socket")
            finally:
                probe.close()
        s, self.socket_id = unixsock.bind_private(self.socket_path, 128)
        self.listener = s
        self.sel.register(s, 1, "accept")
        if self.ctld:
            self._bind_ctld()
        return s

    def _bind_ctld(self) -> None:
        """``ctld.sock`` beside the daemon's socket, 0660, ``--ctld-user``'s primary group.

        Raises:
            NodeError: no such user (slurm.conf's SlurmUser and the unit disagree).
        """
        user, path = self.ctld
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise NodeError("daemon", "--ctld-user", f"{user}: no such user",
                            hint="it is slurm.conf's SlurmUser: run gsrun-node install again after changing it")
        self.ctld_uid = pw.pw_uid
        s, self.ctld_socket_id = unixsock.bind_private(path, 128)
        os.chown(path, 0, pw.pw_gid)
        os.chmod(path, 0o660)
        self.ctld_listener = s
        self.sel.register(s, 1, "accept-ctld")
        self.log(f"EpilogSlurmctld of {user} (uid {pw.pw_uid}) on {path}")

    # -- loop ----------------------------------------------------------------------
    def serve(self) -> int:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        self.sel.register(wake_r, 1, "signal")
        caught: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda n, _f: caught.append(n))
        self.log(f"serving {self.socket_path} (pid {os.getpid()}, {len(self.files)} gsrun modules loaded)")
        if self.monitor_args is not None:
            self._start_monitor()
        while True:
            for sig in caught:
                if sig == signal.SIGHUP:
                    self.reexec = True
                self._stop_listening()
            caught.clear()
            if (self.stopping or self.reexec) and not self.running and not self.pending:
                break
            if self.monitor_due is not None and time.monotonic() >= self.monitor_due and not self.stopping:
                self._start_monitor()
            timeout = None if not self.stopping else 1.0
            for due in (None if self.stopping else self.monitor_due, *self.report_due.values()):
                if due is not None:
                    timeout = max(0.0, min(60.0 if timeout is None else timeout, due - time.monotonic()))
            self._kill_overdue()
            for key, _ev in self.sel.select(timeout=timeout):
                if key.data == "signal":
                    with suppress(BlockingIOError):
                        while wake_r.recv(64):
                            pass
                elif key.data in ("accept", "accept-ctld"):
                    self._accept(key.fileobj, key.data == "accept-ctld")
                elif key.data == "child":
                    self._reap(key.fileobj)
                elif key.data == "monitor":
                    self._monitor_ended()
                else:
                    self._client_readable(key.fileobj, key.data)
        signal.set_wakeup_fd(-1)
        self._stop_monitor()
        if self.reexec:
            self.log(f"re-executing ({self.served} hooks served)")
            flush_std()
            os.execv(self.python, getattr(sys, "orig_argv", None) or [self.python, *sys.argv])
        self.log(f"stopped ({self.served} hooks served)")
        return 0

    def status(self, stale: str | None = None) -> dict:
        """What ``@ping`` answers: ``started`` in Unix seconds, ``running`` hooks,
        plans and merges now, ``stale`` a changed module (re-executing), ``monitor_pid``
        None while no monitor runs."""
        return {"pid": os.getpid(), "version": gsrun.__version__, "started": self.started,
                "served": self.served, "running": len(self.running) + len(self.pending), "socket": self.socket_path,
                "stale": stale, "monitor_pid": self.monitor[1] if self.monitor else None}

    # -- the node monitor (gsrun.node.monitor) -------------------------------------------
    def _start_monitor(self) -> None:
        """Fork the node monitor, the one process that opens NVML (never the
        daemon: hooks fork from it)."""
        self.monitor_due = None
        try:
            pid = _fork()
        except OSError as e:
            self.log(f"cannot start the node monitor: {e}; trying again in {MONITOR_BACKOFF_S:g} s")
            self.monitor_due = time.monotonic() + MONITOR_BACKOFF_S
            return
        if pid == 0:
            rc = 70
            try:
                signal.set_wakeup_fd(-1)
                _fresh_signals()
                if getattr(self, "listener", None) is not None:
                    self.listener.close()
                self.sel.close()
                from gsrun.node import monitor

                rc = monitor.run(**self.monitor_args)
            except BaseException as e:  # noqa: BLE001 - the daemon logs the exit and starts another
                print(f"gsrun: monitor: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            finally:
                os._exit(rc)
        pidfd = os.pidfd_open(pid)
        self.sel.register(pidfd, 1, "monitor")
        self.monitor = (pidfd, pid, time.monotonic())

    def _drop_monitor(self) -> tuple[int, int, float]:
        """Stop watching the monitor -> (pidfd, now closed, pid, start monotonic)."""
        pidfd, pid, started = self.monitor
        with suppress(KeyError, ValueError):
            self.sel.unregister(pidfd)
        os.close(pidfd)
        self.monitor = None
        return pidfd, pid, started

    def _monitor_ended(self) -> None:
        _, pid, started = self._drop_monitor()
        status = _wait(pid)
        if self.stopping or self.reexec:
            return
        lived = time.monotonic() - started
        delay = 0.0 if lived >= MONITOR_BACKOFF_S else MONITOR_BACKOFF_S
        self.log(f"node monitor {pid} ended (wait status {status}) after {lived:.1f} s: "
                 f"starting another{f' in {delay:g} s' if delay else ''}")
        self.monitor_due = time.monotonic() + delay

    def _stop_monitor(self) -> None:
        """SIGTERM the monitor (it flushes every job), SIGKILL past :data:`MONITOR_STOP_S`."""
        if self.monitor is None:
            return
        pidfd, pid, _ = self.monitor
        with suppress(OSError, ChildProcessError):
            os.kill(pid, signal.SIGTERM)
            if not select.select([pidfd], [], [], MONITOR_STOP_S)[0]:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self._drop_monitor()

    def _stop_listening(self) -> None:
        if getattr(self, "listener", None) is None:
            return
        self.stopping = True
        for pidfd in self.plans:    # a plan may wait BIND_WAIT_S for its step: that step keeps Slurm's binding
            os.kill(self.running[pidfd][1], signal.SIGKILL)
        doors = [(self.listener, self.socket_path, self.socket_id)]
        if self.ctld_listener is not None:
            doors.append((self.ctld_listener, self.ctld[1], self.ctld_socket_id))
        for listener, path, file_id in doors:
            self.sel.unregister(listener)
            with suppress(OSError):
                # ours only: a newer daemon may have renamed its socket over the path already
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == file_id:
                    os.unlink(path)
            listener.close()
        self.listener = self.ctld_listener = None

    def _accept(self, listener, ctld: bool = False) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.log(f"accept: {e}")
            return
        try:
            self._handle(conn, ctld)
        except NoRequest:
            conn.close()
        except Exception as e:  # noqa: BLE001 - one bad client never stops the daemon
            self.log(f"request refused: {e}")
            _refuse(conn, f"bad request: {e}")

    def _handle(self, conn, ctld: bool = False) -> None:
        client_pid, uid = unixsock.peer(conn)
        if uid != os.geteuid() and not (ctld and uid == self.ctld_uid):
            self.log(f"refused a client of uid {uid}")
            conn.close()
            return
        argv, env, umask, fds = _read_request(conn, nfds=None)
        args = hook_args(argv, self.python, self.site_dir, self.gsrun_node)     # None for bind and ping
        if ctld and argv != [PING_REQUEST]:
            if args is None or args[0] != "epilog-ctld":
                _close(fds)
                self.log(f"refused on the controller's door (uid {uid}): {argv[:1] + argv[5:7]}")
                _refuse(conn, "only EpilogSlurmctld is served on this socket")
                return
            args = args[:1]     # the hook, without the client's --spool-dir
            env = ctld_env(env, dict(os.environ))
        if argv in ([BIND_REQUEST], [PING_REQUEST]):
            _close(fds)
            stale = self._stale()
            if argv == [PING_REQUEST]:
                _last_word(conn, (json.dumps(self.status(stale)) + "\n").encode())
            elif stale or self.stopping:
                conn.close()        # the plugin says the daemon is re-executing; the step runs unbound
            else:
                self._start_bind(conn, env)
            return
        try:
            if len(fds) != 3:
                raise BadRequest(f"{len(fds)} descriptors, not 3")
            if args is None:
                self.log(f"refused a command that is not a hook of this installation: {argv[:3]}")
                _refuse(conn, "not a hook of this installation (" + " ".join(argv[:1] + argv[5:7])[:200] + ")")
                return
            if self._stale() or self.stopping:
                _last_word(conn, AGAIN)
                return
            # a client that does not answer "go" in time has given up: nothing starts
            conn.settimeout(REQUEST_TIMEOUT_S)
            conn.sendall(READY)
            go = conn.recv(1)
            if go not in (GO, GO_HANDOVER):
                conn.close()
                return
            merge = _merge_of(args, env)
            if merge is not None:
                # answered at once (slurmctld holds the job COMPLETING until then), merge forked after
                conn.sendall(STARTED + EXITED + (0).to_bytes(4, "big", signed=True))
                conn.close()
                self.served += 1
                self._start_detached(*merge, umask)
                return
            pid = _fork()
            if pid == 0:
                try:
                    _child(args, env, umask, fds, conn, client_pid, go == GO_HANDOVER)     # never returns
                finally:
                    os._exit(70)    # whatever happens, the child never runs the daemon's loop
        finally:
            _close(fds)
        self.served += 1
        # the hook runs: no answer from here (the client would read it before the child's "S")
        try:
            self._watch(conn, pid)
        except Exception as e:  # noqa: BLE001 - out of descriptors (EMFILE), epoll watches (ENOSPC)
            self.log(f"hook {pid} started but cannot be watched ({e!r}): waiting for it before the next")
            _send_exit(conn, _wait(pid))

    def _stale(self) -> str | None:
        """The first loaded module changed since the start (then stop listening
        and re-execute once idle), or None."""
        stale = changed(self.files)
        if stale and not self.reexec:
            self.log(f"{stale} changed since the daemon started: re-executing")
            self.reexec = True
            self._stop_listening()
        return stale

    def _watch(self, conn, pid: int) -> int:
        """Track the running child ``pid`` (its pidfd) and its client ``conn`` (None: a plan or merge, no client)."""
        pidfd = os.pidfd_open(pid)
        try:
            self.sel.register(pidfd, 1, "child")
            try:
                if conn is not None:
                    self.sel.register(conn, 1, pidfd)
                    conn.setblocking(False)
            except BaseException:
                self.sel.unregister(pidfd)
                raise
        except BaseException:
            os.close(pidfd)
            raise
        self.running[pidfd] = (conn, pid)
        return pidfd

    def _start_bind(self, conn, stepd_env: dict[str, str]) -> None:
        """Fork :func:`_bind_child` for one slurmstepd's plugin (it answers on ``conn``); the loop reaps it."""
        try:
            pid = _fork()
        except OSError as e:
            self.log(f"cannot serve a step's plan: {e}")
            conn.close()        # the plugin logs it; the tasks keep Slurm's binding
            return
        if pid == 0:
            _bind_child(conn, stepd_env)    # never returns
        conn.close()
        self.served += 1
        try:
            self.plans.add(self._watch(None, pid))
        except Exception as e:  # noqa: BLE001 - as for a hook, but a plan may wait BIND_WAIT_S for its step
            self.log(f"plan {pid} cannot be watched ({e!r}): ended, the step keeps Slurm's binding")
            os.kill(pid, signal.SIGKILL)
            _wait(pid)

    def _start_detached(self, argv: list[str], env: dict[str, str], umask: int) -> None:
        """Fork :func:`_merge_child` for ``argv``, or queue it while :data:`MAX_MERGES` run."""
        if len(self.merges) >= MAX_MERGES:
            if len(self.pending) >= MAX_PENDING_MERGES:
                self.log(f"{MAX_PENDING_MERGES} merges waiting already: not starting {' '.join(argv[4:6])}")
                return
            self.pending.append((argv, env, umask))
            return
        try:
            pid = _fork()
        except OSError as e:
            self.log(f"cannot start {' '.join(argv[4:6])}: {e}")
            return
        if pid == 0:
            _merge_child(argv, env, umask)     # never returns
        self.merges.add(self._watch(None, pid))

    def _client_readable(self, conn, pidfd: int) -> None:
        entry = self.running.get(pidfd)
        if entry is None or entry[0] is not conn:
            return      # the hook was reaped earlier in this round (its X sent, conn closed)
        try:
            data = conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and KEPT not in data:
            return      # nothing else is expected from a client now
        self.sel.unregister(conn)
        self.running[pidfd] = (None, entry[1])
        conn.close()
        if data:        # K: the client has the status; the hook goes on alone, for REPORT_LIMIT_S
            self.report_due[pidfd] = time.monotonic() + REPORT_LIMIT_S
            return
        _kill_hook(entry[1])    # the client is gone (done, or killed by slurmd: PrologEpilogTimeout)

    def _kill_overdue(self) -> None:
        """SIGKILL a hook alive :data:`REPORT_LIMIT_S` after its answer (stuck on a dead NFS server: no alarm ends it)."""
        for pidfd, due in list(self.report_due.items()):
            if time.monotonic() >= due:
                pid = self.running[pidfd][1]
                del self.report_due[pidfd]
                self.log(f"hook {pid} still running {REPORT_LIMIT_S:g} s after its answer: killed")
                _kill_hook(pid)

    def _reap(self, pidfd: int) -> None:
        conn, pid = self.running.pop(pidfd)
        self.report_due.pop(pidfd, None)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        with suppress(OSError):     # what the hook left in its group, as slurmd's killpg after a hook
            os.killpg(pid, signal.SIGKILL)
        status = _wait(pid)
        self.plans.discard(pidfd)
        if pidfd in self.merges:
            self.merges.discard(pidfd)
            while self.pending and len(self.merges) < MAX_MERGES:
                self._start_detached(*self.pending.popleft())
        if conn is None:
            return
        self.sel.unregister(conn)
        _send_exit(conn, status)


def _fork() -> int:
    """``os.fork()`` after flushing stdout and stderr (no buffered line printed twice)."""
    flush_std()
    return os.fork()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _wait(pid: int) -> int:
    """``waitpid(pid)`` -> its wait status (0 when it was reaped already)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _kill_hook(pid: int) -> None:
    """SIGKILL the hook's process group, and the child alone when not yet past its ``setsid()``."""
    for kill in (os.killpg, os.kill):
        with suppress(OSError):
            kill(pid, signal.SIGKILL)


def _refuse(conn, why: str) -> None:
    """Answer ``E`` and ``why`` (one line; the client prints it and fails), then close ``conn``."""
    _last_word(conn, REFUSED + " ".join(why.split())[:400].encode("utf-8", "replace") + b"\n")


def _send_exit(conn, status: int) -> None:
    """Send the client ``X`` and the hook's wait status (unread after the hook's own), close ``conn``."""
    _last_word(conn, EXITED + status.to_bytes(4, "big", signed=True))


def _last_word(conn, data: bytes) -> None:
    """Send ``data`` (blocking, within 0.5 s; a client gone is no error), then close ``conn``."""
    with suppress(OSError):
        conn.settimeout(0.5)
        conn.sendall(data)
    conn.close()


def run(socket_path: str | None = None, state_dir: str | None = None, host_root: str | None = None,
        monitor: bool = True, node_name: str | None = None, metrics_port: int | None = None,
        ctld_user: str | None = None) -> int:
    """``gsrun-node daemon run``: preload, listen, serve until SIGTERM. -> exit status.

    Raises:
        NodeError: the socket cannot be made (:meth:`NodeDaemon.bind`), or this
            kernel has no ``pidfd_open`` (Linux < 5.3).
    """
    if not hasattr(os, "pidfd_open"):
        raise NodeError("daemon", "kernel", "os.pidfd_open is missing (Linux >= 5.3, Python >= 3.9)",
                        hint="gsrun's node side needs Linux 5.3 or later")

    # a SIGHUP while the modules load (right after a re-exec) must not end the daemon
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for fd in (0, 1, 2):    # started with one closed: a received descriptor must not take its number
        try:
            os.fstat(fd)
        except OSError:
            os.open("/dev/null", os.O_RDWR)
    daemon = NodeDaemon(socket_path or default_socket(state_dir),
                        monitor={"host_root": host_root, "state_dir": state_dir, "node_name": node_name,
                                 "metrics_port": metrics_port} if monitor else None, ctld_user=ctld_user)
    bad = daemon.preload()
    if bad:
        daemon.log("not preloaded (children import them): " + ", ".join(bad))
    daemon.bind()
    return daemon.serve()


def ping(socket_path: str, timeout_s: float = 2.0) -> dict:
    """Ask the daemon on ``socket_path`` for :meth:`NodeDaemon.status`.

    Raises:
        NodeError: nothing listens, another user's listener, or no answer in ``timeout_s``.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout_s)
        try:
            s.connect(socket_path)
        except OSError as e:
            raise NodeError("daemon", "not running", f"{socket_path}: {e.strerror or e}",
                            hint="systemctl start gsrun-daemon (journalctl -u gsrun-daemon says why it stopped)") from e
        if unixsock.peer(s)[1] != os.geteuid():
            raise NodeError("daemon", "socket", f"{socket_path}: served by another user",
                            hint="only root's daemon serves the hooks; remove the socket and restart gsrun-daemon")
        s.sendall(encode_request([PING_REQUEST], {}, 0o022))
        buf = b""
        try:
            while not buf.endswith(b"\n") and len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except OSError as e:
            raise NodeError("daemon", "no answer", f"{socket_path}: {e}",
                            hint="the daemon is busy or wedged: journalctl -u gsrun-daemon; systemctl restart "
                                 "gsrun-daemon") from e
        try:
            return json.loads(buf)
        except ValueError as e:
            raise NodeError("daemon", "no answer", f"{socket_path}: {buf[:80]!r}",
                            hint="the daemon is re-executing after an upgrade: try again in a second") from e
    finally:
        s.close()
