"""``--wait``'s status line: on a terminal one line redrawn in place and
cleared before the job's output, an alert or a warning, so no output line
ever carries the status; on a pipe one line per state change and no
carriage return. A real pty (``pty.openpty``) and a real pipe."""

from __future__ import annotations

import io
import os
import pty
import tty

from gsrun.wrapper.submit import JobState, follow_to_end

JOB = "7"


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: ``\\r`` returns to the line's
    start, ``\\x1b[K`` clears to its end, ``\\n`` ends it."""
    lines: list[str] = []
    cur: list[str] = []
    col = 0
    i = 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        c = raw[i]
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
        i += 1
    if cur:
        lines.append("".join(cur))
    return lines


def _drain(fd: int) -> str:
    """Everything written to the pty so far (one read may return only a part)."""
    import select

    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


def _run(out, err, tmp_path) -> int:
    """A job that pends, runs (printing two lines, a warning among them, and
    raising one alert), then completes; fake clock, output file written as
    the job goes."""
    log = tmp_path / "slurm-7.out"
    log.write_text("")
    t = [0.0]
    calls = [0]

    def poller(_job):
        calls[0] += 1
        n = calls[0]
        if n == 1:
            return JobState("PENDING", "0:00", 0, 0, str(log), "", "Resources")
        if n == 2:
            log.write_text("step 1\ngsrun: bind: warning: gpu01: something\n")
            return JobState("RUNNING", "00:00:01", 0, 0, str(log), "gpu01")
        if n == 3:
            with open(log, "a") as f:
                f.write("step 2\n")
            return JobState("RUNNING", "00:00:04", 0, 0, str(log), "gpu01")
        return JobState("COMPLETED", "00:00:05", 0, 0, str(log), "gpu01")

    def alerts():
        return ["GPU 0 on gpu01 idle since 10:02:03 (6.0 min)"] if calls[0] >= 3 else []

    return follow_to_end(JOB, out=out, err=err, poller=poller, clock=lambda: t[0],
                  sleep=lambda s: t.__setitem__(0, t[0] + s), jitter=lambda: 1.0, alerts=alerts).rc


def test_tty_status_line_is_cleared_before_any_other_output(tmp_path):
    master, slave = pty.openpty()
    tty.setraw(slave)                       # no \n -> \r\n: the bytes as gsrun wrote them
    term = os.fdopen(slave, "w", buffering=1)
    try:
        assert _run(term, term, tmp_path) == 0
        term.flush()
        raw = _drain(master)
    finally:
        term.close()
        os.close(master)
    assert "\r\x1b[Kgsrun: job 7: pending (Resources), waited" in raw
    assert "\r\x1b[Kgsrun: job 7: running 00:00:01" in raw
    assert _screen(raw) == [
        "step 1",
        "gsrun: bind: warning: gpu01: something",
        "gsrun: job 7: ALERT: GPU 0 on gpu01 idle since 10:02:03 (6.0 min)",
        "step 2",
    ], raw      # the final state is the exit line's (gsrun.wrapper.submit.exit_line), not a status line


def test_pipe_gets_one_status_line_per_change_and_no_carriage_return(tmp_path):
    (r_out, w_out), (r_err, w_err) = os.pipe(), os.pipe()
    with os.fdopen(w_out, "w") as out, os.fdopen(w_err, "w") as err:
        assert _run(out, err, tmp_path) == 0
    with os.fdopen(r_out) as f:
        output = f.read()
    with os.fdopen(r_err) as f:
        status = f.read()
    assert "\r" not in status and "\x1b" not in status
    assert status.splitlines() == [
        "gsrun: job 7: pending (Resources), waited 0 s",
        "gsrun: job 7: running 00:00:01",
        "gsrun: job 7: ALERT: GPU 0 on gpu01 idle since 10:02:03 (6.0 min)",
        "gsrun: job 7: completed 00:00:05",
    ]
    assert output == "step 1\ngsrun: bind: warning: gpu01: something\nstep 2\n"


def test_the_exit_line_names_the_first_failing_rank_its_node_code_and_output(tmp_path):
    """Rank 1 exits 1; srun then ends the others with SIGTERM (exit 143, the
    batch script's code): --wait exits 1 and says where, in gseff's time format."""
    from gsrun.wrapper.submit import exit_line, follow_to_end

    log = tmp_path / "slurm-8.out"
    log.write_text("")
    t = [0.0]
    calls = [0]

    def poller(_job):
        calls[0] += 1
        if calls[0] == 1:
            log.write_text("step 1\nTraceback (most recent call last):\nValueError: bad batch\nsrun: error: gp")
            return JobState("RUNNING", "00:00:09", 0, 0, str(log), "gpu[01-02]")
        with open(log, "a") as f:
            f.write("u02: task 1: Exited with exit code 1\nsrun: error: gpu01: tasks 0,2-3: Terminated\n"
                    "srun: error: gpu02: tasks 4-7: Exited with exit code 143\n")
        return JobState("FAILED", "00:00:14", 143, 0, str(log), "gpu[01-02]")

    ended = follow_to_end("8", out=io.StringIO(), err=io.StringIO(), poller=poller, clock=lambda: t[0],
                          sleep=lambda s: t.__setitem__(0, t[0] + s), jitter=lambda: 1.0)
    assert (ended.rc, ended.state, ended.failed) == (1, "FAILED", ("gpu02", 1, 1, "Exited with exit code 1"))
    assert exit_line("8", ended) == (f"gsrun: job 8: FAILED after 00:00:14; rank 1 on gpu02 failed first: exit "
                                     f"code 1; output: {log}; report: gseff 8")
    ok = type(ended)(0, "COMPLETED", "1-02:03:04", "/home/a/out", None)
    assert exit_line("9", ok) == "gsrun: job 9: COMPLETED after 1-02:03:04; output: /home/a/out; report: gseff 9"
    killed = type(ended)(137, "FAILED", "00:01", None, ("gpu01", 3, None, "Killed"))
    assert exit_line("9", killed) == "gsrun: job 9: FAILED after 00:00:01; rank 3 on gpu01 failed first: Killed; " \
                                     "report: gseff 9"
