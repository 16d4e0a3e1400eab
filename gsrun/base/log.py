"""Logs admins can use: ``gsrun[<jobid>]: <phase>: ...`` to syslog and stderr
(and to ``$GSRUN_LOG_FILE`` when set, for hosts without a syslog daemon),
with begin/end and durations.

Every line is made safe before it is written: the job id in the tag must be a
plain Slurm job id (else ``?``), control characters (a newline in a hostile
value would forge a second log line) and undecodable bytes are escaped, and a
line is cut at :data:`MAX_LINE` characters.

Fault injection (tests only): ``GSRUN_FAULT_AT=<phase>:<step>[:end]`` makes
:meth:`JobLog.step` SIGKILL its own process at that step boundary (before the
step, or after it with ``:end``), so tests can kill the real prolog/epilog
at every step. slurmd never sets it, and users cannot: the hook environment
comes from slurmd, and SPANK values reach it only with a ``SPANK_`` prefix.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import syslog
import time
from contextlib import contextmanager

MAX_LINE = 4000
_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
FAULT_ENV = "GSRUN_FAULT_AT"


def safe_text(text, limit: int = MAX_LINE) -> str:
    """``text`` on one printable line: control characters and lone
    surrogates (non-UTF-8 bytes decoded with ``surrogateescape``) become
    ``\\xNN``/``\\uNNNN`` escapes; cut at ``limit`` characters."""
    s = _UNSAFE.sub(lambda m: repr(m.group(0))[1:-1], str(text))
    return s if len(s) <= limit else s[:limit] + f"...[{len(s) - limit} more]"


def safe_job_id(job_id) -> str | None:
    """The job id for a log tag, or ``"?"`` when it is not a plain Slurm job id."""
    if job_id is None:
        return None
    return job_id if isinstance(job_id, str) and _JOB_ID.fullmatch(job_id) else "?"


class JobLog:
    def __init__(self, job_id: str | None, phase: str, stream=sys.stderr, use_syslog: bool = True):
        self.job_id = safe_job_id(job_id)
        self.phase = phase
        self.stream = stream
        self.use_syslog = use_syslog
        if use_syslog:
            try:
                syslog.openlog(f"gsrun[{self.job_id}]" if self.job_id else "gsrun", 0, syslog.LOG_DAEMON)
            except Exception:  # noqa: BLE001
                self.use_syslog = False

    def __call__(self, msg: str, level: int = syslog.LOG_INFO) -> None:
        line = safe_text(f"{self.phase}: {msg}")
        if self.use_syslog:
            try:
                syslog.syslog(level, line)
            except Exception:  # noqa: BLE001
                pass
        tag = f"gsrun[{self.job_id}]" if self.job_id else "gsrun"
        try:
            self.stream.write(f"{tag}: {line}\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001
            pass
        path = os.environ.get("GSRUN_LOG_FILE")
        if path:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
                with os.fdopen(fd, "a", errors="backslashreplace") as f:
                    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {tag}: {line}\n")
            except (OSError, ValueError):
                pass

    def warn(self, msg: str) -> None:
        self(msg, syslog.LOG_WARNING)

    def error(self, msg: str) -> None:
        self(msg, syslog.LOG_ERR)

    def _fault(self, name: str) -> None:
        if os.environ.get(FAULT_ENV) == f"{self.phase}:{name}":
            os.kill(os.getpid(), signal.SIGKILL)

    @contextmanager
    def step(self, name: str):
        self._fault(name)
        t0 = time.monotonic()
        self(f"{name}: begin")
        try:
            yield
        except BaseException as e:
            self.error(f"{name}: failed after {time.monotonic() - t0:.3f} s: {e}")
            raise
        self(f"{name}: end ({time.monotonic() - t0:.3f} s)")
        self._fault(f"{name}:end")
