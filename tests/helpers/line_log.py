"""A stand-in for :class:`gsrun.base.log.JobLog` that keeps every line: call it,
or its ``warn``/``error``, and the text lands in :attr:`LineLog.lines`."""

from __future__ import annotations


class LineLog:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, m):
        self.lines.append(m)

    warn = error = __call__
