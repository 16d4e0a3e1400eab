"""The job's sampler process as the prolog starts it
(``python -m gsrun.epilog.sampler``, same options as
``python -m gsrun.node.sampler``): :mod:`gsrun.node.sampler`'s loop, and
after its final flush the node summary, so the epilog does not compute it.

The epilog runs on every node after every job, in a fresh interpreter: the
typed records of the summary (:mod:`gsrun.report.records`,
:mod:`gsrun.facts.sampler_state`) cost it more than the rest of its work.
This process has them loaded from its start, off the
job's critical path; at SIGTERM it takes its last sample, writes
``sampler.json`` (``done``), then :data:`~gsrun.report.node_end.SAMPLER_SUMMARY_NAME` in the job's state
directory: ``{"pid", "start_time", "nvml_error", "summary"}`` where
``summary`` is :func:`gsrun.report.summary.node_summary` of that final state
with the fields only the epilog knows left to
:func:`gsrun.report.node_end.finish`. The epilog takes it when ``pid`` and
``start_time`` are those of the recorded sampler it found running and stopped
(so the file is that process's last act, written from the state it last
flushed), else computes the summary from ``sampler.json`` itself (an older
prolog's ``gsrun.node.sampler``, a sampler that was killed, crashed or had
already exited, a second sampler of the job).

It also runs the epilog itself when the epilog hands it over
(:mod:`gsrun.epilog.handoff`): it listens on ``epilog.sock`` in the job's
state directory from its start, and a connection from root ends the loop
like SIGTERM does; after the final flush and the summary it runs
:func:`gsrun.epilog.main.run_here` with the epilog's arguments and
environment and sends back the exit status and the epilog's stderr text.
The epilog's modules are imported at this process's start, off the job's
critical path.

Lives with the epilog because the layers keep :mod:`gsrun.node` and
:mod:`gsrun.report` apart (tests/pure/test_import_layers.py).
"""

from __future__ import annotations

import importlib
import os
import sys
import time

from gsrun.base import pids
from gsrun.base.errors import exit_now
from gsrun.base.fsutil import atomic_write_json
from gsrun.epilog import handoff, main as epilog_main
from gsrun.node import sampler
from gsrun.report.node_end import SAMPLER_SUMMARY_NAME
from gsrun.report.summary import node_summary

MODULE = "gsrun.epilog.sampler"
# what the epilog's steps import on their way (lazily in gsrun.epilog.main), loaded at this
# process's start so that the handed-over epilog pays none of it
_EPILOG_MODULES = ("gsrun.node.tuning", "gsrun.node.mps", "gsrun.node.residual", "gsrun.node.mig",
                   "gsrun.report.node_end", "gsrun.base.fsutil")


def write_summary(state: dict, state_dir, write: bool = True) -> dict | None:
    """Write :data:`~gsrun.report.node_end.SAMPLER_SUMMARY_NAME` for the final ``state`` (JSON form) in
    ``state_dir`` and return what was written (``write=False``: only return
    it, for the epilog handed to this process); a failure is reported on
    stderr (the sampler log), leaves no file and returns None: the epilog then
    computes the summary itself."""
    try:
        summ = node_summary(state, {"node": state["node"], "job_id": state["job_id"]}, time.time())
        me = os.getpid()
        pre = {"pid": me, "start_time": pids.start_time(me), "nvml_error": state.get("nvml_error"),
               "summary": summ}
        if write:
            atomic_write_json(os.path.join(state_dir, SAMPLER_SUMMARY_NAME), pre, mode=0o600)
        return pre
    except Exception as e:  # noqa: BLE001 - the epilog has the fallback; the sampler must still exit 0
        print(f"gsrun: sampler: node summary not written ({type(e).__name__}: {e}); "
              "the epilog computes it from sampler.json", file=sys.stderr)
        return None


class _Tee:
    """The handed-over epilog's stderr: the sampler log and the text sent back."""

    def __init__(self, log):
        self.log, self.parts = log, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        try:
            self.log.write(text)
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self.log.flush()
        except (OSError, ValueError):
            pass


def serve_epilog(conn, request, pre: dict | None, before: str = "", release=None) -> None:
    """Run the epilog handed over on ``conn`` (``request``: what
    :meth:`gsrun.epilog.handoff.Listener.accept` read, checked to be root's
    and for this job) and send back its exit status and stderr text
    (:mod:`gsrun.epilog.handoff`). A failure here closes the connection
    without a result, which makes the epilog run the steps itself.
    ``before``: what the sampler did first (final sample, flush, summary), for the log;
    ``release(nvml=False)``: lets go of the C-state hold before the result is sent."""
    host_root, state_dir, spool_dir, env = request
    # the steps see the epilog's environment, as they would in the epilog process
    os.environ.clear()
    os.environ.update(env)
    tee = _Tee(sys.stderr)
    sent = []

    def on_config(budget_s: float) -> None:
        conn.sendall(f"accepted {budget_s:g}\n".encode())
        sent.append(True)

    rc = epilog_main.run_here(env, host_root, state_dir, spool_dir, stream=tee, pre=pre, on_config=on_config,
                              in_sampler=before or "no timing")
    if not sent:
        conn.sendall(b"accepted 0\n")
    if release is not None:
        # the C-state hold ends now; NVML is left to the exit that follows the reply
        # (nvmlShutdown costs 4.7 ms on the H200 and would only delay the epilog)
        release(nvml=False)
    conn.sendall(f"rc {rc}\n".encode() + "".join(tee.parts).encode("utf-8", "replace"))


def main(argv: list[str] | None = None) -> int:
    """``python -m gsrun.epilog.sampler`` with :func:`gsrun.node.sampler.main`'s options."""
    for name in _EPILOG_MODULES:
        importlib.import_module(name)
    listener = handoff.Listener()

    def on_done(state: dict, state_dir, final_ms: dict | None = None, release=None) -> None:
        # handed over: the summary goes to the epilog's steps in this process, no file
        t0 = time.perf_counter()
        pre = write_summary(state, state_dir, write=listener.conn is None)
        if listener.conn is None:
            listener.close()
            return
        ms = dict(final_ms or {}, summary=(time.perf_counter() - t0) * 1000)
        try:
            serve_epilog(listener.conn, listener.request, pre,
                         ", ".join(f"{k.replace('_', ' ')} {v:.1f} ms" for k, v in ms.items()), release)
        except Exception as e:  # noqa: BLE001 - the epilog runs the steps itself on no result
            print(f"gsrun: sampler: job {state.get('job_id')}: handed-over epilog failed "
                  f"({type(e).__name__}: {e})", file=sys.stderr)
        # the epilog returns when this process has exited (it waits on it): go now, without the
        # interpreter's teardown; nothing is left to write
        exit_now(0)

    return sampler.main(argv, on_done=on_done, listener=listener)


if __name__ == "__main__":
    raise SystemExit(main())
