"""What the epilog adds to a node summary: when the job ended on the node
and the node settings in force during it. Kept apart from
:mod:`gsrun.report.summary` so that the epilog's own part imports no typed
record.
"""

from __future__ import annotations


def elapsed_s(start_time: float, end_time: float) -> float:
    """Seconds from ``start_time`` to ``end_time`` (epoch s), never negative,
    rounded to ms: the node summary's ``elapsed_s`` (the node's sampled
    span; the job's elapsed time is Slurm's, ``job.elapsed_s``)."""
    return round(float(max(0.0, end_time - start_time)), 3)


def _setting(key: str, value: str | None, state: str, reason: str = "", source: str = "") -> dict:
    """A :class:`~gsrun.report.records.NodeSetting` in its JSON form (same keys,
    same order: tests/pure/test_node_settings.py checks the equality)."""
    return {"key": key, "value": value, "state": state, "reason": reason, "source": source}


# the prolog's tuning actions (gsrun.node.tuning.PlanItem) -> NodeSetting.state; "apply" left
# in a record means the prolog stopped before the write: not attempted
_ACTION_STATE = {"applied": "applied", "unchanged": "unchanged", "reuse": "reused", "refused": "refused",
                 "unsupported": "unsupported", "failed": "failed", "rolled_back": "rolled_back",
                 "skipped": "skipped", "apply": "skipped"}


def node_settings(prolog: dict | None, notes: dict | None = None) -> list[dict] | None:
    """The node settings in force during the job, from the prolog record
    (``prolog-<node>.json``): one :class:`~gsrun.report.records.NodeSetting`
    (its JSON form, built here as a plain dict so that the epilog imports no typed
    record) per tuning item of ``steps.tuning`` (the report of
    :func:`gsrun.node.tuning.prolog_tune`), ``cpu_dma_latency`` when the
    sampler held ``/dev/cpu_dma_latency`` (``holds``), and ``malloc`` when the
    job's request names an allocator (``--malloc``: gsrun-bind preloads it).
    ``notes``: the task notes of the node (:func:`gsrun.facts.task_notes.read_task_notes`):
    ``malloc`` then says what the task got (``applied`` = verified in its
    ``/proc/<pid>/maps``, ``requested`` = preloaded but not verified, with why,
    ``unsupported`` = not found, with where gsrun-bind looked), and a hard
    ``RLIMIT_MEMLOCK`` too low for pinned memory adds ``memlock`` (state
    ``warning``, once per node, naming the node's RDMA devices).
    ``[]``: nothing asked or tuning off; None: no prolog record (unknown). Pure."""
    if not isinstance(prolog, dict) or not prolog:
        return None
    out: list[dict] = []
    tune = (prolog.get("steps") or {}).get("tuning")
    if isinstance(tune, dict):
        for it in tune.get("items") or ():
            if not isinstance(it, dict) or not it.get("key"):
                continue
            state = _ACTION_STATE.get(str(it.get("action")), "skipped")
            out.append(_setting(key=str(it["key"]), value=None if it.get("value") is None else str(it["value"]),
                                   state=state, reason=str(it.get("reason") or ""),
                                   source=str(it.get("source") or "")))
        us = (tune.get("holds") or {}).get("cpu_dma_latency_us")
        if isinstance(us, int) and not isinstance(us, bool):
            out.append(_setting(key="cpu_dma_latency", value=str(us), state="held",
                                   reason="/dev/cpu_dma_latency held open by the job's sampler (us)",
                                   source="request"))
    elif isinstance(tune, str) and tune:
        out.append(_setting(key="tuning", value=None, state="failed", reason=tune))
    malloc = (prolog.get("request") or {}).get("malloc")
    task = (notes or {}).get("malloc") if isinstance(notes, dict) else None
    if isinstance(task, dict) and task.get("name"):
        state = {"verified": "applied", "not found": "unsupported"}.get(task.get("state"), "requested")
        where = f"LD_PRELOAD={task['path']} by gsrun-bind; " if task.get("path") else ""
        out.append(_setting(key="malloc", value=str(task["name"]), state=state,
                            reason=f"{where}{task.get('state')}: {task.get('detail') or ''}".rstrip(": "),
                            source="request"))
    elif isinstance(malloc, str) and malloc:
        out.append(_setting(key="malloc", value=malloc, state="requested",
                            reason="LD_PRELOAD set by gsrun-bind for each task's command when the library is on "
                                   "the node", source="request"))
    ml = (notes or {}).get("memlock") if isinstance(notes, dict) else None
    if isinstance(ml, dict) and ml.get("problem"):
        out.append(_setting(key="memlock", value=None if ml.get("hard") is None else str(ml["hard"]),
                            state="warning", reason=str(ml["problem"]), source="node"))
    return out
