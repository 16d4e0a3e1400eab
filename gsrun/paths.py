"""Where gsrun keeps things (from the site config ``paths.*``), and the
directories created with the right owner and mode.

- ``<state_dir>/jobs/<id>/`` root 0700: sampler state and pid, journals.
- ``<spool_dir>/jobs/`` root 0711 (no listing); ``<spool_dir>/jobs/<id>/``
  root 0755; inside, root-only (0600) node/prolog records and the job summary,
  plus ``user-*.json`` copies owned by the job's user (0400): only that user
  and root can read a job's figures.
"""

from __future__ import annotations

import os
from pathlib import Path

from .fsutil import ensure_dir
from .slurm import validate_job_id


class Paths:
    def __init__(self, state_dir: str, spool_dir: str, mps_dir: str):
        self.state_dir = Path(state_dir)
        self.spool_dir = Path(spool_dir)
        self.mps_dir = Path(mps_dir)

    @classmethod
    def from_config(cls, cfg, state_dir: str | None = None, spool_dir: str | None = None) -> "Paths":
        return cls(state_dir or os.environ.get("GSRUN_STATE_DIR") or cfg["paths.state_dir"],
                   spool_dir or os.environ.get("GSRUN_SPOOL_DIR") or cfg["paths.spool_dir"],
                   cfg["paths.mps_dir"])

    def state_job(self, job_id: str) -> Path:
        return self.state_dir / "jobs" / validate_job_id(job_id)

    def spool_job(self, job_id: str) -> Path:
        return self.spool_dir / "jobs" / validate_job_id(job_id)

    def make_state_job(self, job_id: str) -> Path:
        _makedirs_root(self.state_dir, 0o755)
        ensure_dir(self.state_dir / "jobs", 0o700)
        return ensure_dir(self.state_job(job_id), 0o700)

    def make_spool_job(self, job_id: str) -> Path:
        _makedirs_root(self.spool_dir, 0o755)
        ensure_dir(self.spool_dir / "jobs", 0o711)
        return ensure_dir(self.spool_job(job_id), 0o755)


def _makedirs_root(path: Path, mode: int) -> None:
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o755, exist_ok=True)
    ensure_dir(path, mode)
