"""A running job's report from the live node files (``gseff``, the alert mail). Pure.

Each node's live file goes through the finished job's code up to its last
poll; the result has ``job.state`` RUNNING, ``sampled_s`` and a ``live``
section::

    {"as_of": epoch s, "nodes_live": [node], "alerts": [text],
     "cancel": {"action", "reason", "time"} | null, "findings": [detector findings with "node"]}
"""

from __future__ import annotations

from dataclasses import replace

from gsrun.report.records import JobInfo, JobSummary, NodeSummary
from gsrun.report.summary import job_summary, node_record


def live_summary(job_id: str, live: dict[str, dict], finished: list[NodeSummary] | None = None,
                 cfg=None) -> JobSummary | None:
    """From ``live`` (node -> :func:`gsrun.facts.live.read_live_docs` doc) and the final node summaries;
    None without a live doc."""
    done = {n.node for n in finished or ()}
    docs = [d for node, d in sorted(live.items()) if node not in done]
    if not docs:
        return None
    nodes = list(finished or ())
    for d in docs:
        st = d["state"]
        try:
            nodes.append(node_record(st, dict(d.get("job_env") or {}, node=d["node"], job_id=job_id),
                                     float(st.get("last_time") or d["written"])))
        except (ValueError, TypeError, KeyError):
            continue      # a live file of another shape: that node is missing from the view
    if len(nodes) == len(finished or ()):
        return None
    starts = [n.start_time for n in nodes if n.start_time]
    start = min(starts) if starts else None
    env0 = docs[0].get("job_env") or {}
    expected = sorted(set(env0.get("nodelist") or []) | {n.node for n in nodes})
    base = JobInfo(id=job_id, user=env0.get("user"), partition=env0.get("partition"), state="RUNNING",
                   nodes=tuple(expected), start_time=start, end_time=None, elapsed_s=None)
    summary = job_summary(base, nodes, cfg, env0.get("partition"))
    alerts, findings, cancel = [], [], None
    for d in docs:
        alerts += [a for a in d.get("alerts") or () if isinstance(a, str)]
        findings += [dict(f, node=d["node"]) for f in d.get("findings") or () if isinstance(f, dict)]
        c = d.get("cancel")
        if isinstance(c, dict) and (cancel is None or c.get("action") == "cancel"):
            cancel = c
    return replace(summary, live={
        "as_of": max(float(d["written"]) for d in docs), "nodes_live": [d["node"] for d in docs],
        "alerts": alerts, "cancel": cancel, "findings": findings})


def live_text(summary: JobSummary, now: float) -> str:
    """The lines above a running job's report: freshness, alerts, the cancel decision."""
    live = summary.live or {}
    out = []
    as_of = live.get("as_of")
    if isinstance(as_of, (int, float)):
        out.append(f"RUNNING: figures as of {max(0.0, now - as_of):.0f} s ago "
                   f"(live files of {len(live.get('nodes_live') or [])} node(s); the final report follows "
                   "when the job ends)")
    for a in live.get("alerts") or ():
        out.append(f"ALERT: {a}")
    c = live.get("cancel")
    if isinstance(c, dict):
        word = {"report": "would be cancelled (report mode)", "cancel": "cancelled",
                "cancel_failed": "cancel failed"}.get(c.get("action"), str(c.get("action")))
        out.append(f"IDLE CANCEL: {word}: {c.get('reason')}")
    return "\n".join(out) + ("\n" if out else "")
