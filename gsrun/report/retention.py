"""Retention of the spool's job directories (``gsrun-node prune``): one goes
once ``accounting.json`` says its summary is ``"stored"`` (or ``--force``).
No lock (the spool may be NFS): a directory changed within :data:`QUIET_S`
is kept; one to drop is renamed to ``jobs/.prune.<id>.<random>``, checked
again, then removed (a write in between puts it back).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from gsrun.base.errors import NodeError
from gsrun.base.fsutil import atomic_write_json, read_json, read_spool_json
from gsrun.base.ids import is_job_id

PHASE = "prune"
QUIET_S = 3600.0
ACCOUNTING_MARK = "accounting.json"   # written by gsrun.epilog.ctld
DAY_S = 86400.0
_ASIDE = ".prune."


@dataclass(frozen=True)
class JobDir:
    """An entry of ``jobs/``: ``kind`` dir/link/other; ``newest_mtime`` of it or its newest entry (epoch s);
    ``stored``: the summary is in ``AdminComment``."""

    name: str
    kind: str
    newest_mtime: float
    stored: bool = False


@dataclass(frozen=True)
class Decision:

    name: str
    action: str
    reason: str
    age_days: float


def plan_prune(entries: list[JobDir], now: float, older_than_days: float, force: bool = False,
               quiet_s: float = QUIET_S) -> list[Decision]:
    """Per entry by name: remove a real job-id directory older than ``older_than_days`` and ``quiet_s``
    whose summary is stored (or ``force``), else keep.

    Raises:
        ValueError: ``older_than_days`` negative.
    """
    if older_than_days < 0:
        raise ValueError("older_than_days must be >= 0")
    out = []
    for e in sorted(entries, key=lambda e: e.name):
        age_s = now - e.newest_mtime
        days = round(age_s / DAY_S, 2)
        action = "keep"
        if not is_job_id(e.name, array=True):
            why = "not a job id"
        elif e.kind != "dir":
            why = f"not a directory ({e.kind}): left alone"
        elif age_s < quiet_s:
            why = f"changed {max(age_s, 0) / 60:.0f} min ago (quiet period {quiet_s / 60:.0f} min)"
        elif age_s < older_than_days * DAY_S:
            why = f"{days:g} days old, younger than {older_than_days:g}"
        elif e.stored:
            action, why = "remove", "summary stored in accounting"
        elif force:
            action, why = "remove", "not in accounting, removed by --force"
        else:
            why = "summary not stored in accounting (use --force)"
        out.append(Decision(e.name, action, why, days))
    return out


def _newest_mtime(path: Path, st: os.stat_result) -> float:
    newest = st.st_mtime
    with suppress(OSError), os.scandir(path) as it:
        for ent in it:
            with suppress(FileNotFoundError):
                newest = max(newest, ent.stat(follow_symlinks=False).st_mtime)
    return newest


def _stored(path: Path) -> bool:
    mark = read_json(path / ACCOUNTING_MARK) or {}
    return mark.get("admin_comment") == "stored"


def _jobs_dir(spool_dir) -> Path:
    jobs = Path(spool_dir) / "jobs"
    try:
        st = os.lstat(jobs)
    except FileNotFoundError:
        raise NodeError(PHASE, "no job directories", f"{jobs} does not exist",
                        hint="check paths.spool_dir (gsrun-node install creates it)") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise NodeError(PHASE, "refusing the jobs directory",
                        f"{jobs} is not a directory owned by uid {os.geteuid()} (planted?)",
                        hint="inspect it; gsrun-node install recreates the spool")
    return jobs


def scan_job_dirs(spool_dir) -> list[JobDir]:
    """Every entry of ``<spool_dir>/jobs/`` but ``.prune.*`` (no link followed).

    Raises:
        NodeError: ``jobs/`` missing, not a directory or not owned by us.
    """
    jobs = _jobs_dir(spool_dir)
    out = []
    with os.scandir(jobs) as it:
        for ent in it:
            if ent.name.startswith(_ASIDE):
                continue
            try:
                st = ent.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                out.append(JobDir(ent.name, "link", st.st_mtime))
            elif not stat.S_ISDIR(st.st_mode):
                out.append(JobDir(ent.name, "other", st.st_mtime))
            else:
                p = jobs / ent.name
                out.append(JobDir(ent.name, "dir", _newest_mtime(p, st), _stored(p)))
    return out


def oldest_age_days(spool_dir, now: float | None = None) -> tuple[int, float | None]:
    """(job directories, the oldest one's age in days or None), for ``gsrun-node doctor``.

    Raises:
        NodeError: as :func:`scan_job_dirs`.
    """
    t = time.time() if now is None else now
    dirs = [e for e in scan_job_dirs(spool_dir) if e.kind == "dir" and is_job_id(e.name, array=True)]
    if not dirs:
        return 0, None
    return len(dirs), (t - min(e.newest_mtime for e in dirs)) / DAY_S


def _remove_one(jobs: Path, name: str, now: float, quiet_s: float) -> str:
    """Rename aside, re-check, remove. -> "removed" / "changed: kept" / "gone"."""
    aside = jobs / f"{_ASIDE}{name}.{secrets.token_hex(4)}"
    try:
        os.rename(jobs / name, aside)
    except FileNotFoundError:
        return "gone"
    st = os.lstat(aside)
    if not stat.S_ISDIR(st.st_mode) or now - _newest_mtime(aside, st) < quiet_s:   # written meanwhile
        if not os.path.lexists(jobs / name):
            with suppress(OSError):
                os.rename(aside, jobs / name)
        return "changed: kept" + ("" if not os.path.lexists(aside) else f" as {aside.name}")
    shutil.rmtree(aside)          # never follows links (fd-based on Linux)
    return "removed"


def prune_job_dirs(spool_dir, older_than_days: float, *, dry_run: bool = False, force: bool = False,
                   now: float | None = None, quiet_s: float = QUIET_S) -> list[dict]:
    """Apply :func:`plan_prune`. -> per entry ``{"job", "action", "reason", "age_days"}``, removals with
    ``"result"``: ``dry run``, ``removed``, ``changed: kept``, ``gone`` or ``error: ...``.

    Raises:
        NodeError: ``jobs/`` missing or planted.
        ValueError: ``older_than_days`` negative.
    """
    t = time.time() if now is None else now
    jobs = _jobs_dir(spool_dir)
    out = []
    for d in plan_prune(scan_job_dirs(spool_dir), t, older_than_days, force, quiet_s):
        row = {"job": d.name, "action": d.action, "reason": d.reason, "age_days": d.age_days}
        if d.action == "remove":
            try:
                row["result"] = "dry run" if dry_run else _remove_one(
                    jobs, d.name, time.time() if now is None else now, quiet_s)
            except OSError as e:
                row["result"] = f"error: {e.strerror or e}"
        out.append(row)
    return out


LAST_RUN = "prune-last.json"


def record_run(spool_dir, rows: list[dict], mails_removed: int, older_than_days: float,
               now: float | None = None) -> None:
    """``<spool>/prune-last.json`` (0644) for ``gsrun-node doctor``: ``{"time": epoch s,
    "older_than_days", "removed", "kept", "errors", "mails_removed"}``.

    Raises:
        OSError: the spool is not writable."""
    removed = sum(1 for r in rows if r.get("result") == "removed")
    errors = sum(1 for r in rows if str(r.get("result", "")).startswith("error"))
    atomic_write_json(Path(spool_dir) / LAST_RUN,
                      {"time": round(time.time() if now is None else now, 3), "older_than_days": older_than_days,
                       "removed": removed, "kept": len(rows) - removed - errors, "errors": errors,
                       "mails_removed": mails_removed}, mode=0o644)


def last_run(spool_dir) -> dict | None:
    """:func:`record_run`'s record (root's file, bounded read), or None."""
    d = read_spool_json(Path(spool_dir) / LAST_RUN, 1 << 16)
    return d if d is not None and isinstance(d.get("time"), (int, float)) else None


__all__ = ["ACCOUNTING_MARK", "LAST_RUN", "record_run", "last_run", "QUIET_S", "JobDir", "Decision", "plan_prune", "scan_job_dirs",
           "prune_job_dirs", "oldest_age_days"]
