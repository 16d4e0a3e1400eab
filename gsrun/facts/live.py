"""The running job's files in the shared spool (their one home):

- ``<spool>/jobs/<id>/user-live-<node>.json``: the sampler's live file, read
  by ``gseff`` and ``gsrun --wait`` (:func:`read_live_docs`); root's, the
  job's group, 0440.
- ``<spool>/alerts/{new,done,failed,state}/`` (root 0700): alert requests
  ``<job>.<kind>[-<n>].json`` (a condition, ``warning`` or ``cancel``)
  published once by a sampler (:func:`queue_alert`), mailed by
  :mod:`gsrun.report.alerts`; ``state/`` holds per-user hourly counts.
"""

from __future__ import annotations

import json
from pathlib import Path

from gsrun.base.fsutil import ensure_dir, publish_once, read_spool_json
from gsrun.base.ids import check_job_id, is_node_name

LIVE_VERSION = 1
LIVE_PREFIX = "user-live-"
ALERTS_DIR = "alerts"
ALERT_SUBDIRS = ("new", "done", "failed", "state")
ALERT_KINDS = ("idle", "stuck", "never_used", "warning", "cancel")
MAX_LIVE_BYTES = 1 << 20        # a live file bigger than this is not ours (a few KiB per node)


def read_live_docs(job_dir) -> dict[str, dict]:
    """node -> live doc of each ``user-live-<node>.json`` in ``job_dir`` that
    :func:`gsrun.base.fsutil.read_spool_json` accepts and parses as one."""
    out: dict[str, dict] = {}
    try:
        names = sorted(p.name for p in Path(job_dir).iterdir() if p.name.startswith(LIVE_PREFIX))
    except OSError:
        return out
    for name in names:
        node = name[len(LIVE_PREFIX):-len(".json")] if name.endswith(".json") else ""
        if not is_node_name(node):
            continue
        d = read_spool_json(Path(job_dir) / name, MAX_LIVE_BYTES)
        if isinstance(d, dict) and d.get("kind") == "live" and isinstance(d.get("version"), int) \
                and d["version"] <= LIVE_VERSION and d.get("node") == node and isinstance(d.get("state"), dict):
            out[node] = d
    return out


def alerts_dir(spool_dir) -> Path:
    """``<spool>/alerts/{new,done,failed,state}`` (root 0700).

    Raises:
        NodeError: a planted (symlinked, foreign) directory.
    """
    base = ensure_dir(Path(spool_dir) / ALERTS_DIR, 0o700)
    for sub in ALERT_SUBDIRS:
        ensure_dir(base / sub, 0o700)
    return base


def alert_key(kind: str, n: int = 1) -> str:
    """The request's name part after the job id: ``kind`` for the first
    alert of that kind, ``kind-<n>`` for the n-th (a condition re-armed)."""
    return kind if n <= 1 else f"{kind}-{n}"


def split_alert_key(key: str) -> tuple[str, int] | None:
    """Inverse of :func:`alert_key`: ``(kind, n)``, None when it is not one."""
    kind, _, n = key.partition("-")
    if kind not in ALERT_KINDS or (n and not (n.isdigit() and int(n) >= 2)):
        return None
    return kind, int(n) if n else 1


def alert_count(spool_dir, job_id: str, kind: str) -> int:
    """How many alert requests of ``kind`` the job has had (new, done, failed)."""
    check_job_id(job_id, array=True)
    base = alerts_dir(spool_dir)
    names = set()
    for sub in ("new", "done", "failed"):
        for p in (base / sub).glob(f"{job_id}.{kind}*.json"):
            k = split_alert_key(p.name[len(job_id) + 1:-len(".json")])
            if k is not None and k[0] == kind:
                names.add(k[1])
    return len(names)


def queue_alert(spool_dir, job_id: str, kind: str, request: dict, n: int = 1) -> bool:
    """Publish the alert request ``<spool>/alerts/new/<job>.<key>.json``
    (:func:`alert_key` of ``kind`` and ``n``: the n-th alert of that kind)
    once; False when it exists already (another node, or a restarted
    sampler, was first) or was handled."""
    check_job_id(job_id, array=True)
    if kind not in ALERT_KINDS:
        raise ValueError(f"alert kind {kind!r}")
    base = alerts_dir(spool_dir)
    name = f"{job_id}.{alert_key(kind, n)}.json"
    if any((base / sub / name).exists() for sub in ("done", "failed")):
        return False
    return publish_once(base / "new" / name, (json.dumps(request, sort_keys=True) + "\n").encode())
