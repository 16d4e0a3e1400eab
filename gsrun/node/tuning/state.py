"""Where the tuning journal lives, and its one lock.

:mod:`gsrun.node.journal` files under ``<state_dir>/tuning/``: ``lock`` (the
``flock`` of every prolog/epilog/restore), ``jobs/<job_id>.json`` (one per job
here: the set *is* the reference count) and ``baseline.json`` (every area's
prior values, entries ``{key, prior, value, owner, holders}``).
"""

from __future__ import annotations

import os
from pathlib import Path

from gsrun.base.errors import GsrunError, NodeError
from gsrun.base.fsutil import ensure_dir
from gsrun.node.journal import Journal
from gsrun.node.tuning.knob import replaceable


JOURNAL_VERSION = 1
LOCK_TIMEOUT_S = 30.0


class _State:
    """The tuning journals (:mod:`gsrun.node.journal`): ``baseline.json``
    (kind ``tuning``) and ``jobs/<id>.json`` (kind ``tuning-job``) under
    ``<state_dir>/tuning/``, all under the one lock file ``tuning/lock``."""

    def __init__(self, state_dir: str, hostfs=None):
        self.root = Path(state_dir)
        self.dir = self.root / "tuning"
        self.jobs = self.dir / "jobs"
        self.baseline = self.dir / "baseline.json"
        self.lockfile = self.dir / "lock"
        self.hostfs = hostfs

    def ensure(self) -> None:
        try:
            if not self.root.is_dir() or self.root.is_symlink():
                ensure_dir(self.root, 0o755)
            ensure_dir(self.dir, 0o700)
            ensure_dir(self.jobs, 0o700)
        except GsrunError:
            raise
        except OSError as e:
            raise NodeError("tune", "state dir unusable", f"{self.dir}: {e.strerror}",
                            hint="check --state-dir / GSRUN_STATE_DIR (tmpfs, root-writable)") from None

    def journal(self, path: Path) -> Journal:
        kind = "tuning" if path == self.baseline else "tuning-job"
        return Journal(path, kind, hostfs=self.hostfs, lock_path=self.lockfile)

    def job_path(self, job_id: str) -> Path:
        return self.jobs / f"{job_id}.json"

    def live_jobs(self) -> list[str]:
        try:
            names = os.listdir(self.jobs)
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))

    def load_baseline(self) -> dict:
        """``{"version", "boot_id", "entries"}``: the baseline's fields, with
        ``boot_id`` the boot it was written in (journal header; format 1
        kept it in the document)."""
        j = self.journal(self.baseline)
        if not j.exists():
            return {"version": JOURNAL_VERSION, "boot_id": None, "entries": []}
        got = j.load()
        if got is None or not isinstance(got.data.get("entries"), list):
            raise NodeError("tune", "journal unreadable", str(self.baseline),
                            hint="inspect it; the prior values are needed to restore the node")
        got.data["boot_id"] = got.boot_id
        return got.data

    def save_baseline(self, data: dict) -> None:
        if data["entries"]:
            replaceable("_write_json")(self.baseline, {k: v for k, v in data.items() if k != "boot_id"}, self.hostfs)
        else:
            _unlink(self.baseline)

    def lock(self, timeout_s: float = LOCK_TIMEOUT_S):
        return self.journal(self.baseline).lock(timeout_s)


def _write_json(path: Path, obj, hostfs=None) -> None:
    """Write one tuning journal (the boundary test_tuning_crash kills at)."""
    try:
        Journal(path, "tuning" if path.name == "baseline.json" else "tuning-job", hostfs=hostfs).write(obj)
    except OSError as e:
        raise NodeError("tune", "cannot write journal", f"{path}: {e.strerror}",
                        hint="state dir full or read-only?") from None


def _unlink(path: Path, durable: bool = True) -> None:
    Journal(path, "tuning").remove(durable)
