"""The one way gsrun runs an external command: list argv (no shell), its own
session, a timeout, and on timeout the whole process group killed -- a
wrapper script's ``sleep`` child too, so a wedged tool (field case 20,
docs/field-cases.md) never outlives the hook that called it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence


def run_bounded(argv: Sequence[str], timeout_s: float, input_text: str | None = None,
                env: Mapping[str, str] | None = None) -> tuple[int | None, str, str]:
    """Run ``argv`` with ``timeout_s``. Returns (exit status, or None on
    timeout; stdout; stderr). Text is decoded with ``errors="replace"`` and
    ``input_text`` encoded with ``surrogateescape`` (non-UTF-8 arguments from
    ``os.fsdecode`` survive).

    Raises:
        OSError: the program cannot be started (not found, not executable).
    """
    p = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         close_fds=True, env=dict(env) if env is not None else None)
    data = input_text.encode("utf-8", "surrogateescape") if input_text is not None else None
    try:
        out, err = p.communicate(input=data, timeout=timeout_s)
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        if not isinstance(e, subprocess.TimeoutExpired):   # the caller's own alarm: never leave it running
            p.wait()
            raise
        try:
            out, err = p.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return None, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")
