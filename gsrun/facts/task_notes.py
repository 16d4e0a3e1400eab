"""What the job's task saw on one node: ``<spool>/jobs/<id>/task-<node>/bind.json``,
written by local rank 0's ``gsrun-bind`` as the job's user, read by the
epilog as untrusted input (every key optional)::

    {"memlock": {"soft": int, "hard": int | null (null: unlimited),
                 "problem": str | null, "rdma": [str]},
     "malloc": {"name": "jemalloc"|"tcmalloc", "state": "verified"|"not verified"|"not found",
                "path": str | null, "detail": str}}

The reader keeps only these keys and allow-listed values, strings cut to
:data:`MAX_TEXT`, from at most :data:`MAX_BYTES` owned by the job's user.
"""

from __future__ import annotations

import json
import os

from gsrun.base.fsutil import read_bounded
from gsrun.base.ids import is_job_id, is_node_name

NOTES_NAME = "bind.json"
MAX_BYTES = 8192
MAX_TEXT = 400
MALLOC_STATES = ("verified", "not verified", "not found")


def task_dir(spool_dir: str, job_id: str | None, node: str | None) -> str | None:
    """``<spool>/jobs/<id>/task-<node>`` for a plain job id and node name, else None."""
    if not is_job_id(job_id) or not is_node_name(node):
        return None
    return os.path.join(spool_dir, "jobs", job_id, f"task-{node}")


def _text(v) -> str | None:
    if not isinstance(v, str):
        return None
    return "".join(c if c.isprintable() else "?" for c in v[:MAX_TEXT])


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 else None


def clean_notes(raw) -> dict:
    """The allow-listed part of a notes object (see the module doc). Pure."""
    out: dict = {}
    if not isinstance(raw, dict):
        return out
    ml = raw.get("memlock")
    if isinstance(ml, dict):
        rdma = ml.get("rdma") if isinstance(ml.get("rdma"), list) else []
        out["memlock"] = {"soft": _int(ml.get("soft")), "hard": _int(ml.get("hard")),
                          "problem": _text(ml.get("problem")),
                          "rdma": [t for t in (_text(x) for x in rdma[:16]) if t]}
    mc = raw.get("malloc")
    if isinstance(mc, dict) and mc.get("name") in ("jemalloc", "tcmalloc") and mc.get("state") in MALLOC_STATES:
        out["malloc"] = {"name": mc["name"], "state": mc["state"], "path": _text(mc.get("path")),
                         "detail": _text(mc.get("detail")) or ""}
    return out


def read_task_notes(spool_dir: str, job_id: str, node: str, uid: int) -> dict | None:
    """The cleaned notes of the job's task on ``node`` (:func:`clean_notes`),
    None when there are none (no task ran gsrun-bind, or the file is not a
    regular file of ``uid`` of at most :data:`MAX_BYTES`)."""
    d = task_dir(spool_dir, job_id, node)
    if d is None:
        return None
    raw = read_bounded(os.path.join(d, NOTES_NAME), MAX_BYTES, (uid,))
    if raw is None:
        return None
    try:
        return clean_notes(json.loads(raw.decode()))
    except (ValueError, UnicodeDecodeError):
        return None
