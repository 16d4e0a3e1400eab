"""Files of jobs gone from the node: the Prometheus textfiles and live files they left.

What an epilog that never ran left, removed by the next prolog. Whether a job
still exists here is decided from root-owned state only
(``<state_dir>/jobs/<id>/`` with ``monitor.json`` or ``sampler.json``), never
from the swept files, whose names can be planted; no link is followed. Live
files are looked for only in the spool directories of the jobs with state on
this node (a job's merge on the controller removes every node's live file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gsrun.base.fsutil import unlink_names
from gsrun.base.ids import is_job_id, is_node_name
from gsrun.facts.live import LIVE_PREFIX
from gsrun.node.metrics_textfile import file_job
from gsrun.node.monitor import JOB_FILE as MONITOR_JOB_FILE


@dataclass(frozen=True, slots=True)
class StateJob:
    """One job directory of the state dir; ``sampler_alive`` None: never sampled yet."""

    job_id: str
    sampler_alive: bool | None


def read_state_jobs(state_dir) -> dict[str, StateJob]:
    """job id -> :class:`StateJob` for every root-owned job directory in
    ``<state_dir>/jobs/`` (none when it is missing)."""
    base = Path(state_dir) / "jobs"
    out: dict[str, StateJob] = {}
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        if not is_job_id(name, array=True):
            continue
        try:
            st = os.lstat(base / name)
        except OSError:
            continue
        if st.st_uid != 0 and os.geteuid() == 0:
            continue
        if not (st.st_mode & 0o170000 == 0o040000):
            continue
        if os.path.lexists(base / name / MONITOR_JOB_FILE):
            state = True        # the node monitor samples it (its epilog has not ended it)
        elif os.path.lexists(base / name / "sampler.json"):
            state = False       # sampled, and its sampling ended (or was never taken up again)
        else:
            state = None        # a prolog in progress
        out[name] = StateJob(name, state)
    return out


def gone_jobs(candidates, state_jobs: dict[str, StateJob], current_job_id: str | None) -> list[str]:
    """The ids among ``candidates`` gone from the node, sorted. Pure; a prolog
    in progress and ``current_job_id`` are kept."""
    out = set()
    for j in candidates:
        if j == current_job_id:
            continue
        sj = state_jobs.get(j)
        if sj is None or sj.sampler_alive is False:
            out.add(j)
    return sorted(out)


def sweep(state_dir, spool_dir, node: str, textfile_dir: str | None, current_job_id: str | None
          ) -> dict[str, list[str]]:
    """Remove the textfiles (and temp files) and this node's live files of the
    jobs :func:`gone_jobs` names. -> ``{"prom": [names], "live": [job ids]}``.

    Raises:
        OSError: a directory cannot be listed or a file removed (permissions, read-only).
    """
    state = read_state_jobs(state_dir)
    removed: dict[str, list[str]] = {"prom": [], "live": []}
    if textfile_dir:
        try:
            names = os.listdir(textfile_dir)
        except FileNotFoundError:
            names = []
        by_job: dict[str, list[str]] = {}
        for n in names:
            j = file_job(n)
            if j is not None:
                by_job.setdefault(j, []).append(n)
        gone = set(gone_jobs(by_job, state, current_job_id))
        removed["prom"] = sorted(unlink_names(textfile_dir, lambda n: file_job(n) in gone))
    if is_node_name(node):
        # the node's own gone jobs only, never a listing of the shared spool (every job of the cluster's
        # retention); a live file whose job left no state here (a reboot) goes with EpilogSlurmctld's merge
        for j in gone_jobs(state, state, current_job_id):
            if unlink_names(Path(spool_dir) / "jobs" / j, (f"{LIVE_PREFIX}{node}.json",)):
                removed["live"].append(j)
    return removed


__all__ = ["StateJob", "read_state_jobs", "gone_jobs", "sweep"]
