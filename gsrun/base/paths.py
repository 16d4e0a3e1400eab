"""Where gsrun keeps things (site config ``paths.*``), created with the right
owner and mode: ``<state_dir>/jobs/<id>/`` root 0700; ``<spool_dir>/jobs/``
root 0711 (no listing), ``<spool_dir>/jobs/<id>/`` root 0755 with root-only
records and the user's group-readable ``user-*.json`` copies.

A job id is a path component only after :func:`gsrun.base.ids.check_job_id`.
Something planted at ``.../jobs/<id>`` is moved aside for a fresh root-owned
directory (logged); planted shared parents are refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from gsrun.base.fsutil import ensure_dir
from gsrun.base.ids import check_job_id

# the defaults of paths.* in the config's settings: the daemon finds its socket before any config
DEFAULT_STATE_DIR = "/run/gsrun"
DEFAULT_SPOOL_DIR = "/var/spool/gsrun"
DEFAULT_MPS_DIR = "/run/gsrun/mps"
#: the node daemon's socket in the state directory (:func:`gsrun.daemon.server.default_socket`;
#: the SPANK plugin has ``<DEFAULT_STATE_DIR>/<this>`` built in)
DAEMON_SOCKET_NAME = "daemon.sock"


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
        return self.state_dir / "jobs" / check_job_id(job_id, array=True)

    def spool_job(self, job_id: str) -> Path:
        return self.spool_dir / "jobs" / check_job_id(job_id, array=True)

    def make_state_job(self, job_id: str, log=None) -> Path:
        """Create (or check) ``<state_dir>/jobs/<id>/`` root 0700.

        Raises:
            NodeError: ``<state_dir>`` or ``<state_dir>/jobs`` is planted or foreign.
        """
        _makedirs_root(self.state_dir, 0o755)
        ensure_dir(self.state_dir / "jobs", 0o700)
        return ensure_dir(self.state_job(job_id), 0o700, replace_planted=True, log=log)

    def make_spool_job(self, job_id: str, log=None, gid: int | None = None) -> Path:
        """Create (or check) ``<spool_dir>/jobs/<id>/``: root, the job's group
        ``gid``, 0750; without ``gid`` root:root 0711.

        Raises:
            NodeError: ``<spool_dir>`` or ``<spool_dir>/jobs`` is planted or foreign.
        """
        _makedirs_root(self.spool_dir, 0o755)
        ensure_dir(self.spool_dir / "jobs", 0o711)
        return ensure_dir(self.spool_job(job_id), 0o711 if gid is None else 0o750, 0, gid or 0,
                          replace_planted=True, log=log)


def _makedirs_root(path: Path, mode: int) -> None:
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o755, exist_ok=True)
    ensure_dir(path, mode)
