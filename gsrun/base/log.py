"""Logs admins can use: ``gsrun[<jobid>]: <phase>: ...`` to syslog and stderr
(and ``$GSRUN_LOG_FILE`` when set), with begin/end and durations.

Every line is made safe: a job id that is not plain becomes ``?``, control
characters (a forged second line) and bad bytes are escaped, lines are cut at
:data:`MAX_LINE`. A message's ``gsrun: <what>:`` header loses ``gsrun: `` (and
``<what>`` when it is the log's phase): ``gsrun[42]: prolog: tune: ...``.
"""

from __future__ import annotations

import os
import re
import sys
import syslog
import time
from contextlib import suppress

from gsrun.base.ids import is_job_id

MAX_LINE = 4000
# C0, DEL, C1 (\x9b is CSI on a VT220), line and paragraph separators, the bidi
# marks, overrides and isolates (the set the mail's clean_line drops), lone surrogates
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ERR_HEADER = re.compile(r"(^|: )gsrun: ([A-Za-z][\w+.-]*): ")


def safe_text(text, limit: int = MAX_LINE) -> str:
    """``text`` on one printable line: control characters (C0, DEL, C1),
    line separators, bidi marks, overrides and isolates (U+202A-U+202E,
    U+2066-U+2069, ...) and lone surrogates (non-UTF-8 bytes decoded with
    ``surrogateescape``) become ``\\xNN``/``\\uNNNN`` escapes; cut at
    ``limit`` characters."""
    s = str(text)
    if not (s.isascii() and s.isprintable()):   # printable ASCII has nothing to escape
        s = re.sub(_UNSAFE, lambda m: repr(m.group(0))[1:-1], s)
    return s if len(s) <= limit else s[:limit] + f"...[{len(s) - limit} more]"


_KEPT = frozenset((int, float, bool, type(None)))     # JSON values escape_strings keeps as they are


def escape_strings(obj, limit: int = 4096):
    """A copy of the JSON tree ``obj`` with every string (keys too) passed
    through :func:`safe_text`: what a text report built from job records
    shows a terminal, where an ESC sequence or a right-to-left override in a
    job name would otherwise act on the reader's screen. Other values are
    kept. Pure."""
    t = type(obj)
    if t in _KEPT:
        return obj
    if isinstance(obj, str):
        return safe_text(obj, limit)
    if isinstance(obj, dict):
        return {escape_strings(k, limit): escape_strings(v, limit) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [escape_strings(v, limit) for v in obj]
    return obj


def safe_job_id(job_id) -> str | None:
    """The job id for a log tag, or ``"?"`` when it is not a plain Slurm job id."""
    if job_id is None:
        return None
    return job_id if is_job_id(job_id, array=True) else "?"


class JobLog:
    """``log(msg)``: one line to syslog (LOG_DAEMON, tag ``gsrun[<job>]``),
    ``stream`` (None: not written) and ``$GSRUN_LOG_FILE``."""

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

    def tidy(self, msg) -> str:
        """``msg`` without the ``gsrun: `` (and own phase) of an embedded
        error header (module doc)."""
        msg = str(msg)
        if "gsrun: " not in msg:
            return msg

        return re.sub(_ERR_HEADER, lambda m: m.group(1) + ("" if m.group(2) == self.phase
                                                          else m.group(2) + ": "), msg)

    def __call__(self, msg: str, level: int = syslog.LOG_INFO) -> None:
        line = safe_text(f"{self.phase}: {self.tidy(msg)}")
        if self.use_syslog:
            with suppress(Exception):
                syslog.syslog(level, line)
        tag = f"gsrun[{self.job_id}]" if self.job_id else "gsrun"
        with suppress(Exception):
            if self.stream is not None:
                self.stream.write(f"{tag}: {line}\n")
                self.stream.flush()
        path = os.environ.get("GSRUN_LOG_FILE")
        if path:
            with suppress(OSError, ValueError):
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
                with os.fdopen(fd, "a", errors="backslashreplace") as f:
                    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {tag}: {line}\n")

    def warn(self, msg: str) -> None:
        self(msg, syslog.LOG_WARNING)

    def error(self, msg: str) -> None:
        self(msg, syslog.LOG_ERR)
