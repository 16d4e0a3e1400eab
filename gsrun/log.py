"""Logs admins can use: ``gsrun[<jobid>]: <phase>: ...`` to syslog and stderr
(and to ``$GSRUN_LOG_FILE`` when set, for hosts without a syslog daemon),
with begin/end and durations."""

from __future__ import annotations

import os
import sys
import syslog
import time
from contextlib import contextmanager


class JobLog:
    def __init__(self, job_id: str | None, phase: str, stream=sys.stderr, use_syslog: bool = True):
        self.job_id = job_id
        self.phase = phase
        self.stream = stream
        self.use_syslog = use_syslog
        if use_syslog:
            try:
                syslog.openlog(f"gsrun[{job_id}]" if job_id else "gsrun", 0, syslog.LOG_DAEMON)
            except Exception:  # noqa: BLE001
                self.use_syslog = False

    def __call__(self, msg: str, level: int = syslog.LOG_INFO) -> None:
        line = f"{self.phase}: {msg}"
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
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
                with os.fdopen(fd, "a") as f:
                    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {tag}: {line}\n")
            except OSError:
                pass

    def warn(self, msg: str) -> None:
        self(msg, syslog.LOG_WARNING)

    def error(self, msg: str) -> None:
        self(msg, syslog.LOG_ERR)

    @contextmanager
    def step(self, name: str):
        t0 = time.monotonic()
        self(f"{name}: begin")
        try:
            yield
        except BaseException as e:
            self.error(f"{name}: failed after {time.monotonic() - t0:.3f} s: {e}")
            raise
        self(f"{name}: end ({time.monotonic() - t0:.3f} s)")
