"""Submitting and following a job: the only part of ``gsrun`` that talks to Slurm."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gsrun.base.errors import SlurmError
from gsrun.base.ids import check_job_id
from gsrun.facts.live import read_live_docs
from gsrun.base.log import safe_text
from gsrun.facts.slurm import ENDED_HELD_STATES, TERMINAL_STATES, parse_exit_code, run_slurm, show_job, state_word



def submit(script: str, timeout_s: float = 30.0, cwd: str | None = None) -> str:
    """``sbatch --parsable`` with the script on stdin -> job id.

    Raises:
        SlurmError: sbatch refused the job (its message is the detail).
    """
    argv = ["sbatch", "--parsable"]
    if cwd:
        argv.append(f"--chdir={cwd}")
    cp = run_slurm(argv, timeout_s, input_text=script)
    job_id = cp.stdout.strip().split(";")[0]
    check_job_id(job_id, array=True)
    return job_id


@dataclass
class JobState:
    state: str
    elapsed: str
    exit_code: int
    signal: int
    stdout_path: str | None
    node_list: str
    reason: str = ""


def poll(job_id: str, timeout_s: float = 15.0) -> JobState | None:
    info = show_job(job_id, timeout_s)
    if info is None:
        return None
    state = state_word(info.get("JobState")) or "UNKNOWN"
    ec, sig = parse_exit_code(info.get("ExitCode", "0:0"))
    reason = info.get("Reason", "")
    return JobState(state, info.get("RunTime", ""), ec, sig, info.get("StdOut"), info.get("NodeList", ""),
                    "" if reason in ("None", "(null)") else reason)


def poll_interval(since_change_s: float) -> float:
    """Seconds until the next ``scontrol show job``: 1 s for the first 10 s
    after the job's state changed, then growing by half each time
    (``1 s x 1.5^k``) to at most 30 s, so a job pending for hours costs
    slurmctld two RPCs a minute, not sixty."""
    if since_change_s < 10:
        return 1.0
    return min(30.0, 1.5 ** ((since_change_s - 10) / 10 + 1))


def status_line(job_id: str, st: JobState, waited_s: float) -> str:
    """``gsrun: job 12: pending (Resources) 35 s`` / ``gsrun: job 12: running 00:01:02``
    (record text escaped: :func:`gsrun.base.log.safe_text`)."""
    from dataclasses import astuple

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
           alerts=None) -> int:
    """Follow ``job_id`` to the end: status on stderr (one updating line on a
    TTY; a line per state or pending reason otherwise), the job's stdout
    streamed to ``out`` every ``poll_s``. Slurm is asked with the backoff of
    :func:`poll_interval`; the output file is read between. Returns the
    job's exit code (128+signal when killed by a signal, 1 for
    FAILED/CANCELLED without one).

    ``alerts()``: the job's alert lines so far (:func:`live_alerts`), read
    only when Slurm is asked (the same backoff); each new one is printed once
    on stderr as ``gsrun: job 12: ALERT: ...``.

    Raises:
        SlurmError: the job disappeared from slurmctld without a final state
            for ``max_unknown_s`` (MinJobAge too short and no accounting).
    """
    poller = poller or poll
    told: set[str] = set()
    tty = err.isatty()
    offset = 0
    shown = None
    unknown_since = None
    started = changed = clock()
    next_rpc = started
    st: JobState | None = None
    final: JobState | None = None
    while True:
        now = clock()
        if now >= next_rpc:
            new = poller(job_id)
            if new is None:
                unknown_since = unknown_since or now
                if now - unknown_since > max_unknown_s:
                    raise SlurmError("follow", "job vanished", job_id, hint="check sacct")
            else:
                unknown_since = None
                if st is None or (new.state, new.reason) != (st.state, st.reason):
                    changed = now
                st = new
            next_rpc = now + poll_interval(now - changed)
            if alerts is not None and st is not None and (st.state == "RUNNING" or st.state in TERMINAL_STATES):
                for line in alerts():
                    if line not in told:
                        told.add(line)
                        err.write(("\r\033[K" if tty else "") + f"gsrun: job {job_id}: ALERT: {safe_text(line)}\n")
                        err.flush()
        if st is not None:
            if st.stdout_path:
                offset = _stream(st.stdout_path, offset, out)
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
    if final.stdout_path:
        _stream(final.stdout_path, offset, out)
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
