"""Submitting and following a job: the only part of ``gsrun`` that talks to Slurm."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from gsrun.base.errors import SlurmError
from gsrun.base.ids import check_job_id
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


def poll(job_id: str, timeout_s: float = 15.0) -> JobState | None:
    info = show_job(job_id, timeout_s)
    if info is None:
        return None
    state = state_word(info.get("JobState")) or "UNKNOWN"
    ec, sig = parse_exit_code(info.get("ExitCode", "0:0"))
    return JobState(state, info.get("RunTime", ""), ec, sig, info.get("StdOut"), info.get("NodeList", ""))


def follow(job_id: str, out=sys.stdout, err=sys.stderr, poll_s: float = 1.0,
           max_unknown_s: float = 600.0) -> int:
    """Follow ``job_id`` to the end: status on stderr (one updating line on a
    TTY), the job's stdout streamed to ``out``. Returns the job's exit code
    (128+signal when killed by a signal, 1 for FAILED/CANCELLED without one).

    Raises:
        SlurmError: the job disappeared from slurmctld without a final state
            for ``max_unknown_s`` (MinJobAge too short and no accounting).
    """
    tty = err.isatty()
    offset = 0
    last_state = None
    unknown_since = None
    started = time.monotonic()
    final: JobState | None = None
    while True:
        st = poll(job_id)
        if st is None:
            unknown_since = unknown_since or time.monotonic()
            if time.monotonic() - unknown_since > max_unknown_s:
                raise SlurmError("follow", "job vanished", job_id, hint="check sacct")
            time.sleep(poll_s)
            continue
        if st.stdout_path:
            offset = _stream(st.stdout_path, offset, out)
        label = f"gsrun: job {job_id}: {st.state.lower()} {st.elapsed} ({time.monotonic() - started:.0f} s)"
        if tty:
            err.write("\r\033[K" + label)
            err.flush()
        elif st.state != last_state:
            err.write(label + "\n")
            err.flush()
        last_state = st.state
        if st.state in TERMINAL_STATES or st.state in ENDED_HELD_STATES:
            final = st
            break
        time.sleep(poll_s)
    # the last lines may land after the state flips
    time.sleep(0.5)
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
