"""Submitting and following a job: the only part of ``gsrun`` that talks to Slurm."""

from __future__ import annotations

import os
import random
import signal
import stat
import sys
import time
import zlib
from contextlib import suppress
from dataclasses import astuple, dataclass
from functools import partial
from pathlib import Path
from typing import TextIO

from gsrun.base.errors import SlurmError
from gsrun.base.ids import check_job_id
from gsrun.base.log import safe_text
from gsrun.facts.live import read_live_docs
from gsrun.facts.slurm import (ENDED_HELD_STATES, PENDING_STATES, TERMINAL_STATES, accounting_argv, job_record_argv,
                               parse_accounting, parse_exit_code, parse_job_record, parse_parsable, parse_queue,
                               parse_queue_exit, parse_srun_task_end, pending_for_good, pending_hint, queue_argv,
                               run_slurm, state_word)
from gsrun.facts.sacct import time_s_or_none
from gsrun.report.units import fmt_duration_s
from gsrun.base.fsutil import atomic_write, flock_within, read_own_file


def submit(script: str, timeout_s: float = 30.0, cwd: str | None = None, args=(),
           env=None) -> tuple[str, str | None]:
    """``sbatch --parsable [ARGS]`` with the script on stdin -> ``(job id,
    cluster or None)``; ``env`` None: this process's.

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
    """One look at a job: ``state`` the base state word, ``elapsed`` ``[D-][H:]M:S``
    (squeue TimeUsed, else sacct Elapsed), ``exit_code``/``signal`` of the
    batch script, ``stdout_path`` None when unknown (sacct), ``reason`` why it pends."""

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
    """One job as ``gsrun --wait`` sees it: the shared ``squeue --me`` while
    the controller holds it, ``sacct`` once aged out. One user's waiters on a
    host share the squeue answer (``<cache_dir>/queue-<key>.txt``, 0700 dir,
    at most :data:`SHARED_FRESH_S` old, one asks under a lock). Every Slurm
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
        """stdout of one Slurm command. Raises SlurmError: failed or timed out."""
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
        """``(wall time taken, squeue's stdout)``: the shared answer when fresh
        and taken at or after ``after``, else asked now (and shared).

        Raises:
            SlurmError: squeue failed."""
        path = self._cache_path()
        ask = lambda: (self.wall(), self.run(queue_argv(self.cluster)))       # noqa: E731
        if path is None:
            return ask()
        body = self._cached(path, after)
        if body is not None:
            return body
        try:
            lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return ask()
        try:
            flock_within(lock, 35.0, 0.05)
            body = self._cached(path, after)   # another waiter asked while this one waited for the lock
            if body is not None:
                return body
            taken, body = ask()
            with suppress(OSError):
                atomic_write(path, f"gsrun-queue {taken:.3f}\n{body}", 0o600, durable=False)
            return taken, body
        finally:
            os.close(lock)

    def _stdout(self, path: str, state: str) -> str | None:
        """The job's output file; a ``%j``-style pattern (squeue does not expand
        them on 22.05) is read once from the job record after it started."""
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
        """The job's state; None while Slurm does not know it yet (slurmdbd behind).

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
    """``$XDG_RUNTIME_DIR/gsrun``, else ``/tmp/gsrun-<uid>``, when this user's
    own (0700, not a link); None when neither can be made safe."""

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


def poll_interval(since_change_s: float) -> float:
    """Seconds until the next poll: 3 s for 15 s after the state changed, then
    x1.5 every 15 s, at most :data:`POLL_CAP_S`."""
    if since_change_s < 15:
        return POLL_FIRST_S
    return min(POLL_CAP_S, POLL_FIRST_S * 1.5 ** ((since_change_s - 15) / 15 + 1))


def retry_interval(failures: int) -> float:
    """Seconds before asking again after ``failures`` in a row: 2, 4, 8 ... at most :data:`POLL_CAP_S`."""
    return min(POLL_CAP_S, 2.0 ** max(1, failures))


def status_line(job_id: str, st: JobState, waited_s: float) -> str:
    """``gsrun: job 12: pending (Resources) 35 s`` / ``gsrun: job 12: running 00:01:02``."""

    st = JobState(*(safe_text(v) if isinstance(v, str) else v for v in astuple(st)))
    state = st.state.lower()
    if st.state == "PENDING":
        why = f" ({st.reason})" if st.reason else ""
        return f"gsrun: job {job_id}: pending{why}, waited {waited_s:.0f} s"
    secs = time_s_or_none(st.elapsed)
    shown = fmt_duration_s(secs, "clock") if secs is not None else st.elapsed
    return f"gsrun: job {job_id}: {state} {shown}".rstrip()


#: a second Ctrl-C within this many seconds of the first cancels the job (as srun does)
CANCEL_WINDOW_S = 1.0
#: exit status of ``gsrun --wait`` after a Ctrl-C cancelled the job (128 + SIGINT)
INTERRUPTED_RC = 130


@dataclass
class StatusLine:
    """The status of ``--wait`` on ``err``: on a terminal one line drawn in
    place and cleared before other output; otherwise one line per change."""

    err: TextIO
    tty: bool
    drawn: bool = False

    def show(self, label: str, changed: bool) -> None:
        if self.tty:
            self.err.write("\r\033[K" + label)
            self.drawn = True
        elif changed:
            self.err.write(label + "\n")
        self.err.flush()

    def clear(self) -> None:
        if self.drawn:
            self.err.write("\r\033[K")
            self.err.flush()
            self.drawn = False

    def say(self, text: str) -> None:
        self.clear()
        self.err.write(text + "\n")
        self.err.flush()


def cancel_job(job_id: str, cluster: str | None = None, timeout_s: float = 15.0) -> str | None:
    """``scancel [-M CLUSTER] JOB``; None when it worked, else why not (text)."""
    argv = ["scancel", *(["-M", cluster] if cluster else []), job_id]
    try:
        run_slurm(argv, timeout_s=timeout_s)
    except SlurmError as e:
        return f"{e.what}: {e.detail}"
    return None


def live_alerts(spool_dir, job_id: str) -> list[str]:
    """The alert lines of a running job from its live node files in the
    spool (:mod:`gsrun.facts.live`); [] when the spool is not visible here."""
    lines: list[str] = []
    try:
        docs = read_live_docs(Path(spool_dir) / "jobs" / check_job_id(job_id, array=True))
    except Exception:  # noqa: BLE001 - no spool here: no alert line, the job is followed as before
        return lines
    for node in sorted(docs):
        lines += [a for a in docs[node].get("alerts") or () if isinstance(a, str)]
    return lines


@dataclass
class Ended:
    """How a followed job ended: ``rc`` of ``gsrun --wait``; ``state`` None
    after a Ctrl-C cancel; ``failed``: the first task srun reported ending
    badly (:func:`gsrun.facts.slurm.parse_srun_task_end`), None if none."""

    rc: int
    state: str | None = None
    elapsed: str = ""
    stdout_path: str | None = None
    failed: tuple | None = None


class _SrunLines:
    """Finds srun's first report of a task that ended badly in streamed output."""

    def __init__(self):
        self.carry = ""
        self.first: tuple | None = None

    def __call__(self, text: str) -> None:
        if self.first is not None:
            return
        lines = (self.carry + text).split("\n")
        self.carry = lines.pop()[-4096:]
        for ln in lines:
            hit = parse_srun_task_end(ln)
            if hit and (hit[2] is None or hit[2] != 0):
                self.first = hit
                return


def exit_line(job_id: str, ended: Ended) -> str:
    """The last line of ``gsrun --wait``: final state, elapsed, the first rank
    that failed, the output file and the report command."""
    state = safe_text(ended.state or "CANCELLED")
    secs = time_s_or_none(ended.elapsed)
    line = f"gsrun: job {job_id}: {state}" + (f" after {fmt_duration_s(secs, 'clock')}" if secs is not None else "")
    if ended.failed:
        node, rank, code, what = (safe_text(x) if isinstance(x, str) else x for x in ended.failed)
        line += (f"; rank {rank} on {node} failed first: exit code {code}" if code is not None
                 else f"; rank {rank} on {node} failed first: {what}")
    elif ended.rc:
        line += f"; exit code {ended.rc}"
    if ended.stdout_path:
        line += f"; output: {safe_text(ended.stdout_path)}"
    return line + f"; report: gseff {job_id}"


def follow_to_end(job_id: str, out=sys.stdout, err=sys.stderr, poll_s: float = 1.0,
                  max_unknown_s: float = 600.0, poller=None, clock=time.monotonic, sleep=time.sleep,
                  alerts=None, cluster: str | None = None, give_up_s: float = GIVE_UP_S, jitter=None,
                  cancel=cancel_job) -> Ended:
    """Follow ``job_id`` to the end: status on stderr (:class:`StatusLine`),
    its stdout streamed to ``out`` every ``poll_s``; Slurm asked through
    ``poller(job_id)`` (default a :class:`Watcher`) at :func:`poll_interval`
    x ``jitter()``, a failed query retried after :func:`retry_interval`
    (said once, and the recovery). New ``alerts()`` lines and pending reasons
    that will not change by themselves are said once. ``rc`` is the exit code
    of the first task srun reported failing (srun ends the others with
    SIGTERM: the script's own is then 143), else the job's (128+signal; 1 for
    FAILED/CANCELLED without one). A second Ctrl-C within
    :data:`CANCEL_WINDOW_S` runs ``cancel(job_id, cluster)`` and returns
    :data:`INTERRUPTED_RC`.

    Raises:
        SlurmError: no answer from Slurm for ``give_up_s`` (the job may still
            run: the hint says how to look), or the job unknown to both the
            controller and accounting for ``max_unknown_s``.
    """
    presses: list[float] = []       # wall-clock times of Ctrl-C, appended by the handler
    try:
        previous = signal.signal(signal.SIGINT, lambda _sig, _frame: presses.append(time.monotonic()))
    except ValueError:              # not the main thread: Ctrl-C is the caller's
        previous = None
    try:
        return _follow(job_id, out, err, poll_s, max_unknown_s, poller, clock, sleep, alerts, cluster,
                       give_up_s, jitter, cancel, presses)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _follow(job_id, out, err, poll_s, max_unknown_s, poller, clock, sleep, alerts, cluster, give_up_s, jitter,
            cancel, presses: list[float]) -> int:
    """:func:`follow_to_end`'s loop; ``presses``: Ctrl-C times (monotonic), appended by its handler."""
    if poller is None:
        watcher = Watcher(job_id, cluster)
        poller = lambda _job: watcher.poll()      # noqa: E731
    if jitter is None:
        jitter = partial(random.uniform, 0.8, 1.2)
    m = f"-M {cluster} " if cluster else ""
    look = f"squeue {m}-j {job_id}; sacct {m}-j {job_id}"
    told: set[str] = set()
    told_reasons: set[str] = set()      # pending reasons that will not change, said once each
    status = StatusLine(err, err.isatty())
    offset = 0
    at_line_start = True            # the job's output so far ends a line: the status may be drawn
    shown = None
    unknown_since = None
    started = changed = clock()
    answered = started
    failures = 0
    next_rpc = started
    st: JobState | None = None
    final: JobState | None = None
    path: str | None = None
    seen = 0                        # Ctrl-C presses handled
    srun_lines = _SrunLines()
    first_press: float | None = None

    def interrupted() -> bool:
        nonlocal seen, first_press
        while seen < len(presses):
            t = presses[seen]
            seen += 1
            if first_press is not None and t - first_press <= CANCEL_WINDOW_S:
                why = cancel(job_id, cluster)
                if why is None:
                    status.say(f"gsrun: wait: job {job_id}: cancelled (scancel {m}{job_id})")
                else:
                    status.say(f"gsrun: wait: job {job_id}: scancel failed: {why}\n"
                               f"hint: the job may still run: scancel {m}{job_id}")
                return True
            first_press = t
            status.say(f"gsrun: wait: job {job_id} still runs; scancel {m}{job_id} to stop it "
                       f"(Ctrl-C again within {CANCEL_WINDOW_S:g} s cancels it)")
        return False

    while True:
        if interrupted():
            return Ended(INTERRUPTED_RC, None, st.elapsed if st else "", path, srun_lines.first)
        now = clock()
        if now >= next_rpc:
            before = len(presses)
            try:
                new = poller(job_id)
            except SlurmError as e:
                if len(presses) != before:      # Ctrl-C on a terminal reaches squeue too: not Slurm's fault
                    next_rpc = now
                    continue
                failures += 1
                if failures == 1:
                    status.say(f"gsrun: wait: job {job_id}: Slurm did not answer "
                               f"({e.detail or e.what}); asking again with backoff for up to {give_up_s:.0f} s")
                if now - answered >= give_up_s:
                    status.clear()
                    raise SlurmError("wait", f"no answer from Slurm for {now - answered:.0f} s",
                                     f"job {job_id} may still be running", hint=f"look with: {look}") from None
                next_rpc = now + retry_interval(failures) * jitter()
                sleep(poll_s)
                continue
            answered = now
            if failures:
                status.say(f"gsrun: wait: job {job_id}: Slurm answers again (after {failures} failed queries)")
                failures = 0
            if new is None:
                unknown_since = unknown_since or now
                if now - unknown_since > max_unknown_s:
                    status.clear()
                    raise SlurmError("wait", "job unknown to Slurm", f"job {job_id}: not in the queue nor in "
                                     f"accounting for {max_unknown_s:.0f} s", hint=f"look with: {look}")
            else:
                unknown_since = None
                if st is None or (new.state, new.reason) != (st.state, st.reason):
                    changed = now
                st = new
                meaning = pending_for_good(st.reason) if st.state in PENDING_STATES else None
                if meaning and st.reason not in told_reasons:
                    told_reasons.add(st.reason)
                    status.say(f"gsrun: wait: job {job_id}: pending ({safe_text(st.reason)}) for good: {meaning}; "
                               f"it will not start as it is\nhint: {pending_hint(job_id, cluster)}")
            next_rpc = now + poll_interval(now - changed) * jitter()
            if alerts is not None and st is not None and (st.state == "RUNNING" or st.state in TERMINAL_STATES):
                for line in alerts():
                    if line not in told:
                        told.add(line)
                        status.say(f"gsrun: job {job_id}: ALERT: {safe_text(line)}")
        if st is not None:
            path = st.stdout_path or path     # sacct has no path: the queue's one stays
            if path:
                offset, at_line_start = _stream(path, offset, out, status.clear, at_line_start, srun_lines)
            key = (st.state, st.reason)
            if at_line_start or not status.tty:
                status.show(status_line(job_id, st, now - started), key != shown)
                shown = key
            if st.state in TERMINAL_STATES or st.state in ENDED_HELD_STATES:
                final = st
                break
        sleep(poll_s)
    # the last lines may land after the state flips
    sleep(0.5)
    if path:
        _stream(path, offset, out, status.clear, at_line_start, srun_lines)
    status.clear()                      # the exit line says the final state
    failed = srun_lines.first
    if failed and failed[2]:
        rc = failed[2]
    elif final.signal:
        rc = 128 + final.signal
    elif final.exit_code:
        rc = final.exit_code
    else:
        rc = 0 if final.state == "COMPLETED" else 1
    return Ended(rc, final.state, final.elapsed, path, failed)


def _stream(path: str, offset: int, out, before_output, at_line_start: bool, watch=None) -> tuple[int, bool]:
    """Copy ``path`` past ``offset`` to ``out`` (``before_output()`` first,
    ``watch(text)`` too) -> (new offset, whether the output ends a line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return offset, at_line_start
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        before_output()
        text = data.decode(errors="replace")
        if watch is not None:
            watch(text)
        out.write(text)
        out.flush()
    return offset + len(data), (data.endswith(b"\n") if data else at_line_start)
