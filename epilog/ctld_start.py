"""EpilogSlurmctld's own process: check the job id, start the merge
(``python -m gsrun.epilog.ctld finish JOBID``) detached, exit; the merge runs
here only when that cannot start. slurmctld holds the job's nodes COMPLETING
until this exits (``tests/bench/bench_srun_b2b.py``), so it imports little.
"""

from __future__ import annotations

from gsrun.base.ids import is_job_id
from gsrun.base.proc import root_child_env, root_python, spawn_detached
from gsrun.epilog.ctld import _job_and_log


def merge_command(environ, spool_dir: str | None = None,
                  wait_s: float = 30.0) -> tuple[list[str], dict[str, str]] | None:
    """``(argv, env)`` of the detached merge (``environ`` less ``PYTHON*``); None for a bad job id. Pure
    (the node daemon starts the same command)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not is_job_id(job_id, array=True):
        return None
    argv = root_python("-m", "gsrun.epilog.ctld", "finish", job_id, "--wait-s", f"{float(wait_s):g}")
    if spool_dir:
        argv += ["--spool-dir", spool_dir]
    return argv, root_child_env(tuple(environ), base=environ)


def detach(environ, spool_dir: str | None = None, wait_s: float = 30.0) -> int:
    """Start :func:`merge_command` and return 0 at once (a bad job id is logged)."""
    cmd = merge_command(environ, spool_dir, wait_s)
    if cmd is None:
        _job_and_log(environ)          # logs why, the usual way
        return 0
    argv, env = cmd
    try:
        spawn_detached(argv, env)
    except OSError as e:
        from gsrun.epilog import ctld

        ctld._job_and_log(environ)[1].warn(f"cannot start the merge in the background ({e}): merging here")
        return ctld.run(environ, spool_dir, wait_s)
    return 0
