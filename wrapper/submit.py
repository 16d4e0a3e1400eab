"""Submitting and following a job: the only part of ``gsrun`` that talks to Slurm."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gsrun.base.errors import SlurmError
from gsrun.base.ids import check_job_id
from gsrun.base.log import safe_text
from gsrun.facts.live import read_live_docs
from gsrun.facts.slurm import (ENDED_HELD_STATES, TERMINAL_STATES, accounting_argv, job_record_argv,
                               parse_accounting, parse_exit_code, parse_job_record, parse_parsable, parse_queue,
                               parse_queue_exit, queue_argv, run_slurm, state_word)
import stat
from dataclasses import astuple
import random
import zlib
from gsrun.base.fsutil import read_own_file
from gsrun.base.fsutil import atomic_write, flock_within


def submit(script: str, timeout_s: float = 30.0, cwd: str | None = None, args=(),
           env=None) -> tuple[str, str | None]:
    """``sbatch --parsable [ARGS]`` with the script on stdin -> ``(job id,
    cluster or None)`` (``id;cluster`` with ``-M``). ``args`` go on the command
    line (they win over the environment and the script's ``#SBATCH`` lines);
    ``env`` is sbatch's environment (None: this process's).

    Raises:
        SlurmError: sbatch refused the job (its message is the detail).
    """
    argv = ["sbatch", "--parsable", *args]
    if cwd:
        argv.append(f"--chdir={cwd}")
    cp = run_slurm(argv, timeout_s, input_text=script, env=env)
    return parse_parsable(cp.stdout)


@dataclass
class JobState:
    """One look at a job: ``state`` the base state word (``RUNNING``,
    ``COMPLETED``...), ``elapsed`` Slurm's ``[D-][H:]M:S`` (squeue TimeUsed or
    sacct Elapsed), ``exit_code``/``signal`` of the batch script (0 while it
    runs), ``stdout_path`` the job's output file (None when not known: sacct),
    ``node_list`` a Slurm hostlist, ``reason`` why it pends ("" for none)."""

    state: str
    elapsed: str
    exit_code: int
    signal: int
    stdout_path: str | None
    node_list: str
    reason: str = ""


#: seconds a shared ``squeue`` answer serves other waiters (the shortest poll interval)
SHARED_FRESH_S = 3.0
#: seconds between polls: the first ``POLL_FIRST_S`` after a change, growing to ``POLL_CAP_S``
POLL_FIRST_S = 3.0
POLL_CAP_S = 60.0
#: seconds without any answer from Slurm after which ``--wait`` gives up (the job may still run)
GIVE_UP_S = 1800.0


class Watcher:
    """One job as ``gsrun --wait`` sees it: :meth:`poll` asks the shared
    ``squeue --me`` (:func:`gsrun.facts.slurm.queue_argv`) while the
    controller holds the job, ``sacct`` once it has aged out.

    The waiters of one user on one host share the ``squeue``: its answer is
    kept in ``<cache_dir>/queue-<key>.txt`` (a directory of the user's own,
    mode 0700) with the wall time it was taken; a waiter uses an answer at
    most :data:`SHARED_FRESH_S` old (one without its job only when taken after
    ``since``, the job's submission), else it takes the lock file beside it
    and asks once for all. Every Slurm
    command goes through :meth:`run` (tests replace it)."""

    def __init__(self, job_id: str, cluster: str | None = None, cache_dir: str | None = None,
                 wall=time.time, since: float | None = None):
        self.job_id = check_job_id(job_id, array=True)
        self.cluster = cluster
        self.wall = wall
        self.since = wall() if since is None else since
        self.cache_dir = cache_dir if cache_dir is not None else _cache_dir()
        self.aged_out = False
        self.timeout_s = 30.0
        self.stdout_path: str | None = None     # from the job record, when squeue's has patterns

    def run(self, argv: list[str]) -> str:
        """stdout of one Slurm command.

        Raises:
            SlurmError: it failed or timed out (its last stderr line is the detail)."""
        return run_slurm(argv, self.timeout_s).stdout

    def _cache_path(self) -> str | None:
        if not self.cache_dir:
            return None

        key = zlib.crc32(f"{self.cluster or ''}|{os.environ.get('SLURM_CONF', '')}".encode())
        return os.path.join(self.cache_dir, f"queue-{key:08x}.txt")

    def _cached(self, path: str, after: float) -> tuple[float, str] | None:
        data = read_own_file(path, 16 << 20)
        if not data:
            return None
        head, _, body = data.decode(errors="replace").partition("\n")
        try:
            taken = float(head.split()[1]) if head.startswith("gsrun-queue ") else 0.0
        except (IndexError, ValueError):
            return None
        now = self.wall()
        return (taken, body) if after <= taken <= now and now - taken < SHARED_FRESH_S else None

    def queue(self, after: float = 0.0) -> tuple[float, str]:
        """The user's ``squeue`` answer: the shared one when at most
        :data:`SHARED_FRESH_S` old and taken at or after wall time ``after``,
        else asked now (and shared) -> ``(wall time taken, squeue's stdout)``.

        Raises:
            SlurmError: squeue failed."""
        path = self._cache_path()
        if path is None:
            taken = self.wall()
            return taken, self.run(queue_argv(self.cluster))
        body = self._cached(path, after)
        if body is not None:
            return body

        try:
            lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            taken = self.wall()
            return taken, self.run(queue_argv(self.cluster))
        try:
            flock_within(lock, 35.0, 0.05)
            body = self._cached(path, after)   # another waiter asked while this one waited for the lock
            if body is not None:
                return body
            taken = self.wall()
            body = self.run(queue_argv(self.cluster))
            try:
                atomic_write(path, f"gsrun-queue {taken:.3f}\n{body}", 0o600, durable=False)
            except OSError:
                pass
            return taken, body
        finally:
            os.close(lock)

    def _stdout(self, path: str, state: str) -> str | None:
        """The job's output file. squeue prints ``%j``-style patterns as given
        (22.05; 24.11 without ``--expand-patterns``, an option 22.05 lacks):
        such a path is read once from the job record, which has them expanded
        (one ``scontrol --local -o show job`` per job, once it has started)."""
        if "%" not in path:
            return path or None
        if self.stdout_path is None and state != "PENDING":
            argv = job_record_argv(self.job_id)
            if self.cluster:
                argv[1:2] = ["-M", self.cluster]
            rec = parse_job_record(self.run(argv), self.job_id) or {}
            self.stdout_path = rec.get("StdOut") or ""
        return self.stdout_path or None

    def poll(self) -> JobState | None:
        """The job's state; None while Slurm does not know it yet (``sacct``
        empty: slurmdbd is behind).

        Raises:
            SlurmError: a query failed (the caller retries)."""
        if not self.aged_out:
            taken, body = self.queue()
            rec = parse_queue(body).get(self.job_id)
            if rec is None and taken < self.since:    # an answer from before the job was submitted
                rec = parse_queue(self.queue(after=self.since)[1]).get(self.job_id)
            if rec is not None:
                ec, sig = parse_queue_exit(rec.get("exit_code", ""))
                reason = rec.get("Reason", "")
                state = state_word(rec.get("State")) or "UNKNOWN"
                return JobState(state, rec.get("TimeUsed", ""), ec, sig, self._stdout(rec.get("StdOut", ""), state),
                                rec.get("NodeList", ""), "" if reason in ("None", "(null)") else reason)
            self.aged_out = True            # not in the controller any more: accounting has it
        acct = parse_accounting(self.run(accounting_argv(self.job_id, self.cluster)), self.job_id)
        if acct is None:
            return None
        ec, sig = parse_exit_code(acct.get("ExitCode", "0:0"))
        return JobState(state_word(acct.get("State")) or "UNKNOWN", acct.get("Elapsed", ""), ec, sig, None,
                        acct.get("NodeList", ""))


def _cache_dir() -> str | None:
    """A directory of this user's own (0700, not a link) for the shared
    ``squeue`` answer: ``$XDG_RUNTIME_DIR/gsrun``, else ``/tmp/gsrun-<uid>``;
    None when neither can be made safe (then every waiter asks itself)."""

    uid = os.geteuid()
    run = os.environ.get("XDG_RUNTIME_DIR")
    for d in ((os.path.join(run, "gsrun"),) if run else ()) + (f"/tmp/gsrun-{uid}",):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
            return d
    return None


def poll(job_id: str, cluster: str | None = None) -> JobState | None:
    """One look at ``job_id`` through a :class:`Watcher` (no shared state kept)."""
    return Watcher(job_id, cluster, since=0.0).poll()


def poll_interval(since_change_s: float) -> float:
    """Seconds until the next poll: :data:`POLL_FIRST_S` (3 s) for the first
    15 s after the job's state changed, then growing by half every 15 s
    (``3 s x 1.5^k``) to at most :data:`POLL_CAP_S` (60 s). The waiter adds
    +-20 % jitter (:func:`follow`), and the waiters of one user share one
    ``squeue`` (:class:`Watcher`)."""
    if since_change_s < 15:
        return POLL_FIRST_S
    return min(POLL_CAP_S, POLL_FIRST_S * 1.5 ** ((since_change_s - 15) / 15 + 1))


def retry_interval(failures: int) -> float:
    """Seconds before asking again after ``failures`` failed queries in a row:
    2, 4, 8 ... capped at :data:`POLL_CAP_S` (jitter added by :func:`follow`)."""
    return min(POLL_CAP_S, 2.0 ** max(1, failures))


def status_line(job_id: str, st: JobState, waited_s: float) -> str:
    """``gsrun: job 12: pending (Resources) 35 s`` / ``gsrun: job 12: running 00:01:02``
    (record text escaped: :func:`gsrun.base.log.safe_text`)."""

    st = JobState(*(safe_text(v) if isinstance(v, str) else v for v in astuple(st)))
    state = st.state.lower()
    if st.state == "PENDING":
        why = f" ({st.reason})" if st.reason else ""
        return f"gsrun: job {job_id}: pending{why}, waited {waited_s:.0f} s"
    return f"gsrun: job {job_id}: {state} {st.elapsed}".rstrip()


def live_alerts(spool_dir, job_id: str) -> list[str]:
    """The alert lines of a running job from its live node files in the
    spool (``<spool>/jobs/<id>/user-live-<node>.json``, readable by the
    job's user: :mod:`gsrun.facts.live`); [] when the spool is not visible
    from here. File reads only: no Slurm RPC."""
    lines: list[str] = []
    try:
        docs = read_live_docs(Path(spool_dir) / "jobs" / check_job_id(job_id, array=True))
    except Exception:  # noqa: BLE001 - no spool here: no alert line, the job is followed as before
        return lines
    for node in sorted(docs):
        lines += [a for a in docs[node].get("alerts") or () if isinstance(a, str)]
    return lines


def follow(job_id: str, out=sys.stdout, err=sys.stderr, poll_s: float = 1.0,
           max_unknown_s: float = 600.0, poller=None, clock=time.monotonic, sleep=time.sleep,
           alerts=None, cluster: str | None = None, give_up_s: float = GIVE_UP_S, jitter=None) -> int:
    """Follow ``job_id`` to the end: status on stderr (one updating line on a
    TTY; a line per state or pending reason otherwise), the job's stdout
    streamed to ``out`` every ``poll_s``. Slurm is asked through
    ``poller(job_id)`` (default: a :class:`Watcher` on ``cluster``) with the
    backoff of :func:`poll_interval` times ``jitter()`` (default: uniform
    0.8-1.2); the output file is read between. Returns the job's exit code
    (128+signal when killed by a signal, 1 for FAILED/CANCELLED without one).

    A failed query (a timeout, ``Socket timed out``, ``Unable to contact
    slurm controller``, a rate-limit answer, a killed command) is retried
    after :func:`retry_interval`; the first of a run of failures is said once
    on stderr, and the recovery too. The job may still run meanwhile, so
    following goes on until Slurm has not answered for ``give_up_s``.

    ``alerts()``: the job's alert lines so far (:func:`live_alerts`), read
    only when Slurm is asked (the same backoff); each new one is printed once
    on stderr as ``gsrun: job 12: ALERT: ...``.

    Raises:
        SlurmError: no answer from Slurm for ``give_up_s`` (the job may still
            run: the hint says how to look), or the job unknown to both the
            controller and accounting for ``max_unknown_s``.
    """
    if poller is None:
        watcher = Watcher(job_id, cluster)
        poller = lambda _job: watcher.poll()      # noqa: E731
    if jitter is None:
        jitter = partial(random.uniform, 0.8, 1.2)
    look = f"squeue {'-M ' + cluster + ' ' if cluster else ''}-j {job_id}; sacct {'-M ' + cluster + ' ' if cluster else ''}-j {job_id}"
    told: set[str] = set()
    tty = err.isatty()
    offset = 0
    shown = None
    unknown_since = None
    started = changed = clock()
    answered = started
    failures = 0
    next_rpc = started
    st: JobState | None = None
    final: JobState | None = None
    path: str | None = None
    while True:
        now = clock()
        if now >= next_rpc:
            try:
                new = poller(job_id)
            except SlurmError as e:
                failures += 1
                if failures == 1:
                    err.write(("\r\033[K" if tty else "") + f"gsrun: wait: job {job_id}: Slurm did not answer "
                              f"({e.detail or e.what}); asking again with backoff for up to {give_up_s:.0f} s\n")
                    err.flush()
                if now - answered >= give_up_s:
                    raise SlurmError("wait", f"no answer from Slurm for {now - answered:.0f} s",
                                     f"job {job_id} may still be running", hint=f"look with: {look}") from None
                next_rpc = now + retry_interval(failures) * jitter()
                sleep(poll_s)
                continue
            answered = now
            if failures:
                err.write(("\r\033[K" if tty else "") + f"gsrun: wait: job {job_id}: Slurm answers again "
                          f"(after {failures} failed queries)\n")
                err.flush()
                failures = 0
            if new is None:
                unknown_since = unknown_since or now
                if now - unknown_since > max_unknown_s:
                    raise SlurmError("wait", "job unknown to Slurm", f"job {job_id}: not in the queue nor in "
                                     f"accounting for {max_unknown_s:.0f} s", hint=f"look with: {look}")
            else:
                unknown_since = None
                if st is None or (new.state, new.reason) != (st.state, st.reason):
                    changed = now
                st = new
            next_rpc = now + poll_interval(now - changed) * jitter()
            if alerts is not None and st is not None and (st.state == "RUNNING" or st.state in TERMINAL_STATES):
                for line in alerts():
                    if line not in told:
                        told.add(line)
                        err.write(("\r\033[K" if tty else "") + f"gsrun: job {job_id}: ALERT: {safe_text(line)}\n")
                        err.flush()
        if st is not None:
            path = st.stdout_path or path     # sacct has no path: the queue's one stays
            if path:
                offset = _stream(path, offset, out)
            label = status_line(job_id, st, now - started)
            key = (st.state, st.reason)
            if tty:
                err.write("\r\033[K" + label)
                err.flush()
            elif key != shown:
                err.write(label + "\n")
                err.flush()
            shown = key
            if st.state in TERMINAL_STATES or st.state in ENDED_HELD_STATES:
                final = st
                break
        sleep(poll_s)
    # the last lines may land after the state flips
    sleep(0.5)
    if path:
        _stream(path, offset, out)
    if tty:
        err.write("\n")
    if final.signal:
        return 128 + final.signal
    if final.exit_code:
        return final.exit_code
    return 0 if final.state == "COMPLETED" else 1


def _stream(path: str, offset: int, out) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return offset
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        out.write(data.decode(errors="replace"))
        out.flush()
    return offset + len(data)
