"""The job's sampler process as the prolog starts it
(``python -m gsrun.epilog.sampler``, same options as
``python -m gsrun.node.sampler``): :mod:`gsrun.node.sampler`'s loop, and
after its final flush the node summary, so the epilog does not compute it.

The epilog runs on every node after every job, in a fresh interpreter: the
typed records of the summary (:mod:`gsrun.report.records`,
:mod:`gsrun.facts.sampler_state`) cost it more than the rest of its work
(issue 24, item 1). This process has them loaded from its start, off the
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

Lives with the epilog because the layers keep :mod:`gsrun.node` and
:mod:`gsrun.report` apart (tests/pure/test_import_layers.py).
"""

from __future__ import annotations

import os
import sys
import time

from gsrun.base import pids
from gsrun.base.fsutil import atomic_write_json
from gsrun.node import sampler
from gsrun.report.node_end import SAMPLER_SUMMARY_NAME
from gsrun.report.summary import node_summary   # loaded now: the final flush must not wait for it

MODULE = "gsrun.epilog.sampler"


def write_summary(state: dict, state_dir) -> None:
    """Write :data:`~gsrun.report.node_end.SAMPLER_SUMMARY_NAME` for the final ``state`` (JSON form) in
    ``state_dir``; a failure is reported on stderr (the sampler log) and
    leaves no file: the epilog then computes the summary itself."""
    try:
        summ = node_summary(state, {"node": state["node"], "job_id": state["job_id"]}, time.time())
        me = os.getpid()
        atomic_write_json(os.path.join(state_dir, SAMPLER_SUMMARY_NAME),
                          {"pid": me, "start_time": pids.start_time(me), "nvml_error": state.get("nvml_error"),
                           "summary": summ}, mode=0o600)
    except Exception as e:  # noqa: BLE001 - the epilog has the fallback; the sampler must still exit 0
        print(f"gsrun: sampler: node summary not written ({type(e).__name__}: {e}); "
              "the epilog computes it from sampler.json", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m gsrun.epilog.sampler`` with :func:`gsrun.node.sampler.main`'s options."""
    return sampler.main(argv, on_done=write_summary)


if __name__ == "__main__":
    raise SystemExit(main())
