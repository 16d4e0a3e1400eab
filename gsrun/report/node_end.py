"""The node settings in force during the job, which the epilog adds to a node summary."""

from __future__ import annotations

from gsrun.report.records import NodeSetting


# PlanItem action -> NodeSetting.state ("apply" left: the prolog stopped before the write)
_ACTION_STATE = {"applied": "applied", "unchanged": "unchanged", "reuse": "reused", "refused": "refused",
                 "unsupported": "unsupported", "failed": "failed", "rolled_back": "rolled_back",
                 "skipped": "skipped", "apply": "skipped"}


def node_settings(prolog: dict | None, notes: dict | None = None) -> list[NodeSetting] | None:
    """NodeSettings from the prolog record: tuning items, the ``cpu_dma_latency`` hold, ``malloc``;
    with the task notes (:func:`gsrun.facts.task_notes.read_task_notes`) what malloc the task got and a
    too-low ``memlock``. ``[]``: nothing asked; None: no prolog record."""
    if not isinstance(prolog, dict) or not prolog:
        return None
    out: list[NodeSetting] = []
    tune = (prolog.get("steps") or {}).get("tuning")
    if isinstance(tune, dict):
        for it in tune.get("items") or ():
            if not isinstance(it, dict) or not it.get("key"):
                continue
            state = _ACTION_STATE.get(str(it.get("action")), "skipped")
            out.append(NodeSetting(key=str(it["key"]), value=None if it.get("value") is None else str(it["value"]),
                                   state=state, reason=str(it.get("reason") or ""),
                                   source=str(it.get("source") or "")))
        us = (tune.get("holds") or {}).get("cpu_dma_latency_us")
        if isinstance(us, int) and not isinstance(us, bool):
            out.append(NodeSetting(key="cpu_dma_latency", value=str(us), state="held",
                                   reason="/dev/cpu_dma_latency held open by the job's sampler (us)",
                                   source="request"))
    elif isinstance(tune, str) and tune:
        out.append(NodeSetting(key="tuning", value=None, state="failed", reason=tune))
    malloc = (prolog.get("request") or {}).get("malloc")
    task = (notes or {}).get("malloc") if isinstance(notes, dict) else None
    if isinstance(task, dict) and task.get("name"):
        state = {"verified": "applied", "not found": "unsupported"}.get(task.get("state"), "requested")
        where = f"LD_PRELOAD={task['path']} by gsrun-bind; " if task.get("path") else ""
        out.append(NodeSetting(key="malloc", value=str(task["name"]), state=state,
                               reason=f"{where}{task.get('state')}: {task.get('detail') or ''}".rstrip(": "),
                               source="request"))
    elif isinstance(malloc, str) and malloc:
        out.append(NodeSetting(key="malloc", value=malloc, state="requested",
                               reason="LD_PRELOAD set by gsrun-bind for each task's command when the library is "
                                      "on the node", source="request"))
    ml = (notes or {}).get("memlock") if isinstance(notes, dict) else None
    if isinstance(ml, dict) and ml.get("problem"):
        out.append(NodeSetting(key="memlock", value=None if ml.get("hard") is None else str(ml["hard"]),
                               state="warning", reason=str(ml["problem"]), source="node"))
    return out
