"""The fields of a node summary that only the epilog knows: when the job
ended on the node and what it was given there.

:func:`gsrun.report.summary.node_record` computes a node summary from the
sampler state and the job's context; the job's sampler computes the same at
its final flush (:mod:`gsrun.epilog.sampler`) before the epilog has run, so
the epilog completes it with :func:`finish`. Kept apart from
:mod:`gsrun.report.summary` so that the epilog's usual path imports no typed
record (issue 24: the epilog's wall against the interpreter floor).
"""

from __future__ import annotations

# in the job's state dir: the summary the sampler wrote at its final flush (gsrun.epilog.sampler)
SAMPLER_SUMMARY_NAME = "node-summary.json"


def elapsed_s(start_time: float, end_time: float) -> float:
    """Seconds from ``start_time`` to ``end_time`` (epoch s), never negative,
    rounded to ms: the node summary's ``elapsed_s``."""
    return round(float(max(0.0, end_time - start_time)), 3)


def finish(summary: dict, job_env: dict, end_time: float) -> dict:
    """Set, in place, the fields of a node summary (JSON form, from a sampler
    state) that come from the epilog: ``end_time`` (epoch s), ``elapsed_s``,
    ``cpus_alloc`` (``job_env["cpus_on_node"]``, None when unknown) and
    ``gres_gpus`` (``job_env["gpus"]``, [] when none). ``job_env`` is
    :meth:`gsrun.facts.jobenv.JobEnv.to_dict`'s shape. Returns ``summary``:
    equal to ``node_summary(state, job_env, end_time)`` for the state it was
    computed from."""
    summary["end_time"] = end_time
    summary["elapsed_s"] = elapsed_s(summary["start_time"], end_time)
    summary["cpus_alloc"] = job_env.get("cpus_on_node")
    summary["gres_gpus"] = job_env.get("gpus") or []
    return summary
