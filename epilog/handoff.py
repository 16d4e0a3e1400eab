"""The epilog handed to the job's sampler.

slurmd starts ``gsrun-node epilog`` in a fresh interpreter on every node after
every job, and the node stays COMPLETING until it exits. The job's sampler
(:mod:`gsrun.epilog.sampler`, started by the prolog) already has the
epilog's modules loaded: it listens on ``<state_dir>/jobs/<id>/epilog.sock``,
and the epilog process only connects, sends its arguments and environment,
and waits. The sampler takes its final sample, writes the node summary and
runs the same steps (:func:`gsrun.epilog.main.run_here`, with the epilog's
environment as ``os.environ``), lets go of its C-state hold, sends back
the exit status and what the epilog would have printed, and
exits; the epilog returns once it has (as when it stopped the sampler by
signal: no process of the job's is left behind the epilog). This module imports ``os`` and
``_socket`` only: it is all the epilog loads when the handoff works.

Who may talk: the job directory is root's (0700), the socket 0600, and both
ends check that the peer is uid 0 (``SO_PEERCRED``). The request is bounded
(:data:`MAX_REQUEST_BYTES`) and the sampler refuses one for another job, and
ignores one whose epilog has already closed the connection (a sampler that
woke up late finds it queued, whole, after the epilog gave up and ran the
steps itself).

Protocol (one connection, ``AF_UNIX`` stream)::

    epilog  -> sampler   b"gsrun-epilog 1\\0" host_root \\0 state_dir \\0 spool_dir \\0 (KEY=VALUE \\0)*  EOF
    sampler -> epilog    b"accepted <budget_s>\\n"  then  b"rc <n>\\n" <the epilog's stderr text>  EOF
                     or  b"refused <why>\\n"

(an empty argument is "not given"). The epilog runs the steps itself (the
way it did before the handoff existed) whenever the handoff cannot happen:
no socket (no sampler: a job whose prolog started none, a sampler that died,
a prolog of an older release), a socket not owned by root, a refusal, no
``accepted`` within :data:`ACCEPT_TIMEOUT_S` (the sampler is wedged in a
poll: the full path SIGTERMs it, then SIGKILLs it), or a sampler that
ended after ``accepted`` without a result (it crashed: every step is
journaled, so running them again is safe). Once accepted, the steps are the
sampler's: if it runs past ``budget_s`` + :data:`RESULT_MARGIN_S` (its own
per-step budgets failed) the epilog exits 1 and slurmd drains the node with
the reason, rather than run a second restore alongside the first.

One epilog of a job runs at a time on a node (:func:`lock_job`, taken by
:func:`run_epilog` before anything else): a second one, run by hand while
slurmd's is handed over, waits for the first instead of taking the busy
sampler for wedged.

The socket is found under ``--state-dir``, else ``$GSRUN_STATE_DIR``, else
the built-in ``paths.state_dir``, before the config is read: a site that
moves its state dir only in the config file gets the full epilog unless its
hooks are given the dir (``GSRUN_STATE_DIR``).
``GSRUN_FAULT_AT`` (tests: kill the epilog at a step boundary) keeps the
steps in the epilog process.
"""

from __future__ import annotations

import _socket as socket
import os
import select
import sys

from gsrun.base import pids
from gsrun.base.fsutil import flock_within
from gsrun.base.ids import is_job_id
from gsrun.base.paths import DEFAULT_STATE_DIR

SOCKET_NAME = "epilog.sock"
LOCK_NAME = "epilog.lock"
# how long a second epilog of the job waits for the first: longer than any epilog's own bound
# (ACCEPT_TIMEOUT_S + timeouts.epilog_budget_s + RESULT_MARGIN_S + the exit waits), so that it
# gives up (exit 1: slurmd drains the node) only on an epilog that is wedged past its own limits
LOCK_WAIT_S = 900.0
MAGIC = b"gsrun-epilog 1"
ACCEPT_TIMEOUT_S = 5.0
EXIT_WAIT_S = 5.0       # the sampler exits right after its result; the epilog waits for that
RESULT_MARGIN_S = 15.0
MAX_REQUEST_BYTES = 1 << 20
MAX_REPLY_BYTES = 1 << 20
_SUN_PATH_MAX = 107     # sockaddr_un.sun_path, less the NUL


def job_dir(environ, state_dir: str | None) -> str | None:
    """``<state_dir>/jobs/<SLURM_JOB_ID>`` as the epilog finds it before any
    config is read; None when the job id is not a Slurm job id."""
    job_id = environ.get("SLURM_JOB_ID")
    if not is_job_id(job_id, array=True):
        return None
    return os.path.join(state_dir or environ.get("GSRUN_STATE_DIR") or DEFAULT_STATE_DIR, "jobs", job_id)


def lock_job(environ, state_dir: str | None, wait_s: float | None = None) -> tuple[int | None, str | None]:
    """One epilog of a job at a time on this node: an exclusive ``flock`` on
    ``<state_dir>/jobs/<id>/epilog.lock`` (root 0600, in the job's root 0700
    directory), waited for up to ``wait_s`` (default :data:`LOCK_WAIT_S`). Without it a second epilog (run
    by hand while slurmd's is handed over) would find the sampler busy, kill
    it after :data:`ACCEPT_TIMEOUT_S` and run the steps alongside the first.
    The one that waited runs after the first as a rerun does. Not the job
    directory itself: the MIG journal's lock is on that (:mod:`gsrun.node.journal`).

    Returns ``(fd, None)``: held until ``fd`` is closed or this process
    exits; ``(None, None)``: no job directory (no prolog state: nothing to
    serialise) or a file system without ``flock``; ``(None, why)``: still held
    after ``wait_s``."""
    jdir = job_dir(environ, state_dir)
    if jdir is None:
        return None, None
    try:
        fd = os.open(os.path.join(jdir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None, None

    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    try:
        if flock_within(fd, wait_s, 0.02):
            return fd, None
        why = f"another epilog of this job still holds {LOCK_NAME} after {wait_s:g} s"
    except OSError:
        why = None
    os.close(fd)
    return None, why


def run_epilog(environ, host_root: str | None = None, state_dir: str | None = None,
               spool_dir: str | None = None) -> int:
    """The epilog of the job in ``environ`` (slurmd's): one at a time per job
    (:func:`lock_job`), handed to the job's sampler when it listens
    (:func:`try_handoff`), else run in this process
    (:func:`gsrun.epilog.main.run_here`). Returns the exit status: 1 when the
    node needs an admin (slurmd drains it), also when another epilog of the
    job holds the lock past :data:`LOCK_WAIT_S` (wedged)."""
    fd, why = lock_job(environ, state_dir)
    if why:
        job = environ.get("SLURM_JOB_ID")
        print(f"gsrun: epilog: job {job}: {why}\nhint: see that epilog's lines in the gsrun log / syslog; "
              f"when it is gone, run 'gsrun-node restore --job {job}'", file=sys.stderr)
        return 1
    try:
        rc, why = try_handoff(environ, host_root, state_dir, spool_dir)
        if rc is None:
            from gsrun.epilog.main import run_here

            rc = run_here(environ, host_root, state_dir, spool_dir, note=why)
        return rc
    finally:
        if fd is not None:
            os.close(fd)


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end (``SO_PEERCRED``)."""
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(cred[0:4], sys.byteorder), int.from_bytes(cred[4:8], sys.byteorder)


def _exited(pid: int, wait_s: float | None = None) -> bool | None:
    """Wait up to ``wait_s`` (default :data:`EXIT_WAIT_S`) for the sampler at
    the other end to exit (it leaves right after sending its result): True when
    it did, False when it is still there, None when that cannot be told."""
    if pid <= 0:        # not visible from here (another PID namespace)
        return None

    return pids.wait_exit(pid, EXIT_WAIT_S if wait_s is None else wait_s)


def _kill(pid: int, wait_s: float = 5.0) -> str:
    """SIGKILL the sampler at the other end of the socket and wait for it to
    exit (:func:`gsrun.base.pids.kill`: through a pidfd, or by PID on kernels
    without pidfds -- the connection it still holds keeps the PID from reuse)."""
    if pid <= 0:        # not visible from here (another PID namespace): os.kill(0) is our own group
        return "not killed: its PID is not visible from here"

    return pids.kill(pid, wait_s)


def _at(sock: socket.socket, op, directory: str) -> None:
    """``op`` (``sock.bind`` or ``sock.connect``) on ``<directory>/epilog.sock``;
    through ``/proc/self/fd/N/`` when the path is longer than ``sun_path``."""
    path = os.path.join(directory, SOCKET_NAME)
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        op(path)
        return
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        op(f"/proc/self/fd/{fd}/{SOCKET_NAME}")
    finally:
        os.close(fd)


def encode_request(environ, host_root: str | None, state_dir: str | None, spool_dir: str | None) -> bytes:
    fields = [MAGIC, *(os.fsencode(x or "") for x in (host_root, state_dir, spool_dir))]
    fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in environ.items()
               if "\0" not in k and "\0" not in v and "=" not in k]
    return b"\0".join(fields) + b"\0"


def decode_request(data: bytes) -> tuple[str | None, str | None, str | None, dict[str, str]]:
    """``(host_root, state_dir, spool_dir, environ)`` of a request.

    Raises:
        ValueError: not a request of this protocol version, or malformed.
    """
    if len(data) > MAX_REQUEST_BYTES or not data.endswith(b"\0"):
        raise ValueError("truncated or oversized request")
    parts = data[:-1].split(b"\0")
    if len(parts) < 4 or parts[0] != MAGIC:
        raise ValueError("not a gsrun epilog request")
    args = [os.fsdecode(p) or None for p in parts[1:4]]
    env = {}
    for p in parts[4:]:
        k, eq, v = p.partition(b"=")
        if not eq or not k:
            raise ValueError("bad environment entry")
        env[os.fsdecode(k)] = os.fsdecode(v)
    return args[0], args[1], args[2], env


def _read_line(sock: socket.socket, buf: bytearray) -> bytes | None:
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def try_handoff(environ, host_root: str | None = None, state_dir: str | None = None,
                spool_dir: str | None = None, err=None) -> tuple[int | None, str | None]:
    """Hand the epilog to the job's sampler.

    Returns ``(rc, None)`` when the sampler ran it (its stderr text already
    written to ``err``, default ``sys.stderr``), ``(None, why)`` when the
    caller must run the steps itself (``why`` is None when there simply is no
    sampler to hand to, else what went wrong, for the log)."""
    err = err or sys.stderr
    if environ.get("GSRUN_FAULT_AT"):
        return None, None
    jdir = job_dir(environ, state_dir)
    if jdir is None:
        return None, None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(ACCEPT_TIMEOUT_S)
        try:
            _at(sock, sock.connect, jdir)
        except OSError:
            return None, None          # no sampler listening
        try:
            pid, uid = peer_cred(sock)
            if uid != 0:
                return None, "the epilog socket is not root's"
            sock.sendall(encode_request(environ, host_root, state_dir, spool_dir))
            sock.shutdown(socket.SHUT_WR)
            buf = bytearray()
            first = _read_line(sock, buf)
        except TimeoutError:
            # wedged (a hung NVML call in its last poll): it must not run the steps
            # alongside ours, so it ends first
            return None, (f"the sampler (pid {pid}) did not take the epilog within {ACCEPT_TIMEOUT_S:g} s: "
                          f"{_kill(pid)}; running the steps here")
        except (OSError, ValueError) as e:
            return None, f"the sampler did not take the epilog ({type(e).__name__}: {e})"
        if first is None:
            return None, "the sampler closed the connection without an answer"
        word, _, rest = first.decode("utf-8", "replace").partition(" ")
        if word != "accepted":
            return None, f"the sampler refused the epilog: {rest or word}"[:300]
        try:
            budget_s = float(rest)
        except ValueError:
            budget_s = 90.0
        sock.settimeout(budget_s + RESULT_MARGIN_S)
        try:
            line = _read_line(sock, buf)
            while line is not None and len(buf) <= MAX_REPLY_BYTES:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            print(f"gsrun: epilog: job {environ.get('SLURM_JOB_ID')}: the job's sampler took the epilog and has "
                  f"not finished it after {budget_s + RESULT_MARGIN_S:g} s\n"
                  "hint: see the job's lines in the gsrun log / syslog; the node may be half restored: "
                  f"run 'gsrun-node restore --job {environ.get('SLURM_JOB_ID')}'", file=err)
            return 1, None
        except OSError as e:
            line = None
            why = f"{type(e).__name__}: {e}"
        else:
            why = "no result"
        if line is None or not line.startswith(b"rc "):
            return None, f"the sampler ended during the epilog ({why}); running the steps here"
        try:
            rc = int(line[3:])
        except ValueError:
            return None, "the sampler sent a bad result; running the steps here"
        text = bytes(buf).decode("utf-8", "replace")
        gone = _exited(pid)
        if gone is not True:    # as before the handoff: the epilog ends after the sampler
            text += (f"gsrun[{environ.get('SLURM_JOB_ID')}]: epilog: the sampler (pid {pid}) had not exited "
                     f"{EXIT_WAIT_S:g} s after the epilog's steps: {_kill(pid)}\n")
        if text:
            err.write(text)
            err.flush()
        return rc, None
    finally:
        sock.close()


class Listener:
    """The sampler's end: a listening socket in the job's state directory,
    polled by the sampler's loop (:meth:`gsrun.node.sampler.Sampler.run`);
    :meth:`accept` keeps the first well-formed request from root for this
    job as :attr:`conn` and :attr:`request`."""

    def __init__(self):
        self.sock = None
        self.conn = None
        self.request = None        # (host_root, state_dir, spool_dir, environ)
        self.job_id = None

    def open(self, directory) -> int | None:
        """Listen on ``<directory>/epilog.sock`` (0600; ``directory`` is
        ``<state_dir>/jobs/<id>``); the fd to poll, or None when it cannot
        (the epilog then stops the sampler by signal)."""
        directory = os.fspath(directory)
        self.job_id = os.path.basename(directory)
        try:
            os.unlink(os.path.join(directory, SOCKET_NAME))
        except FileNotFoundError:
            pass
        except OSError:
            return None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        old = os.umask(0o177)
        try:
            _at(s, s.bind, directory)
            s.listen(4)
        except OSError as e:
            s.close()
            print(f"gsrun: sampler: no epilog socket in {directory} ({e}); the epilog will signal", file=sys.stderr)
            return None
        finally:
            os.umask(old)
        self.sock = s
        return s.fileno()

    def accept(self) -> bool:
        """Take a waiting connection: True when it is root's and carries an
        epilog request for this job (the sampler then stops and serves it);
        otherwise it is answered ``refused`` or just closed, and sampling goes on."""
        try:
            fd, _ = self.sock._accept()
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
        except OSError:
            return False
        why = "not root"
        try:
            if peer_cred(c)[1] == 0 and self.conn is None:
                req = read_request(c)
                if req[3].get("SLURM_JOB_ID") != self.job_id:
                    why = "request for another job"
                    c.sendall(f"refused {why}\n".encode())
                elif _hung_up(c):
                    # queued while this process was stuck in a poll; the epilog that sent it closed
                    # its end (it gave up after ACCEPT_TIMEOUT_S and runs the steps itself)
                    why = "its epilog already gave up on it"
                else:
                    c.settimeout(None)
                    self.conn, self.request = c, req
                    return True
            elif self.conn is not None:
                why = "an epilog is already being served"
        except (OSError, ValueError) as e:
            why = f"bad request ({e})"
        print(f"gsrun: sampler: job {self.job_id}: epilog connection ignored: {why}", file=sys.stderr)
        c.close()
        return False

    def close(self) -> None:
        for s in (self.conn, self.sock):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self.conn = self.sock = None


def _hung_up(conn) -> bool:
    """True when the other end has closed the connection altogether (``POLLHUP``:
    an ``AF_UNIX`` stream reports it only when the peer has shut down both ways,
    not after the epilog's ``SHUT_WR``)."""
    p = select.poll()
    p.register(conn.fileno(), select.POLLHUP)
    return any(ev & select.POLLHUP for _, ev in p.poll(0))


def read_request(conn, timeout_s: float = 5.0):
    """The request on ``conn`` (see :func:`decode_request`), read to EOF.

    Raises:
        ValueError: malformed or larger than :data:`MAX_REQUEST_BYTES`;
        OSError/TimeoutError: the epilog went away or sent nothing."""
    conn.settimeout(timeout_s)
    buf = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
    return decode_request(bytes(buf))
