"""Per-job GPU metrics through node_exporter's textfile collector.

With ``[metrics] textfile_dir`` set, the sampler writes
``<textfile_dir>/gsrun_job_<jobid>.prom`` (:data:`gsrun.node.metrics.JOB_SERIES`
per GPU, gauges the mean since the previous write) at each flush and the
epilog removes it. Atomic (the temp name does not end in ``.prom``), mode
``metrics.textfile_mode``, group ``metrics.textfile_group``, not fsync'd.
"""

from __future__ import annotations

import os
import pwd
import re
import sys

from prometheus_client import CollectorRegistry, generate_latest

from gsrun.base.fsutil import atomic_write, unlink_names
from gsrun.base.ids import JOB_ID_RE, check_job_id
from gsrun.node.metrics import JOB_SERIES, WINDOW_TEXTFILE, Sample, families, job_readings, job_samples

FILE_PREFIX = "gsrun_job_"
FILE_SUFFIX = ".prom"
FILE_MODE = 0o640     # metrics.textfile_mode's default
_OUR_FILE = re.compile(rf"{FILE_PREFIX}({JOB_ID_RE.pattern}){re.escape(FILE_SUFFIX)}")
# atomic_write's temp name: ".<name>.<pid>.<8 hex>"
_OUR_TEMP = re.compile(rf"\.{FILE_PREFIX}({JOB_ID_RE.pattern}){re.escape(FILE_SUFFIX)}\.[0-9]+\.[0-9a-f]{{8}}")
_WARNED: set[str] = set()


def file_name(job_id: str) -> str:
    """``"4242"`` -> ``"gsrun_job_4242.prom"``. Raises InputError for a
    job id that is not digits (the name is built only from a checked id)."""
    return f"{FILE_PREFIX}{check_job_id(job_id, phase='metrics')}{FILE_SUFFIX}"


def file_job(name: str) -> str | None:
    """The job id of exactly ``gsrun_job_<digits>.prom`` or atomic_write's temp
    file of one (``.gsrun_job_<digits>.prom.<pid>.<hex>``), else None."""
    m = _OUR_FILE.fullmatch(name) or _OUR_TEMP.fullmatch(name)
    return m.group(1) if m else None


def is_our_file(name: str, job_id: str | None = None) -> bool:
    """True for a name :func:`file_job` knows, of ``job_id`` when given."""
    j = file_job(name)
    return j is not None and (job_id is None or j == job_id)


def build_samples(state: dict, user: str | None, marks: dict | None = None) -> tuple[list[Sample], dict]:
    """The series of a sampler's live ``state`` since ``marks`` -> (samples,
    the next marks) (:func:`gsrun.node.metrics.job_readings`). Pure. ``user``
    None: no ``user`` label."""
    readings, new_marks = job_readings(state, user, marks)
    return job_samples(readings, str(state["node"]), user_label=user is not None), new_marks


def render(samples: list[Sample]) -> bytes:
    """The Prometheus text exposition of ``samples`` (``prometheus_client``:
    its escaping of label values and float format). Families with no sample
    are not written."""
    fams = families(samples, JOB_SERIES, WINDOW_TEXTFILE)

    class _Fixed:
        def collect(self):
            return fams

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed())
    return generate_latest(registry)


def user_label(uid: int | None) -> str:
    """The job user's name for the ``user`` label (``pwd``), else the uid as
    digits (as :func:`gsrun.facts.jobenv.job_from_env` does), else ``""``."""
    if uid is None:
        return ""

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OSError):
        return str(uid)


class TextfileExporter:
    """The sampler's export hook: ``exporter(state)`` writes the job's
    ``.prom`` file (group ``gid`` when root). ``user`` None: no ``user`` label.
    Never raises: a failed write is one stderr warning per cause."""

    def __init__(self, directory: str, job_id: str, user: str | None, mode: int = FILE_MODE,
                 gid: int | None = None):
        self.directory = directory
        self.path = os.path.join(directory, file_name(job_id))
        self.user = user
        self.mode = mode
        self.gid = gid if os.geteuid() == 0 else None
        self.marks: dict = {}

    def __call__(self, state: dict) -> bool:
        try:
            samples, marks = build_samples(state, self.user, self.marks)
            atomic_write(self.path, render(samples), self.mode, gid=self.gid, durable=False)
        except Exception as e:  # noqa: BLE001 - the job's figures matter more than the export
            _warn_once(f"{type(e).__name__}:{getattr(e, 'errno', '')}",
                       f"gsrun: sampler: metrics: cannot write {self.path}: {e}\n"
                       "hint: check [metrics] textfile_dir (it must exist; node_exporter's "
                       "--collector.textfile.directory)")
            return False
        self.marks = marks
        return True


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        print(msg, file=sys.stderr, flush=True)


def exporter_from_config(cfg, job_id: str, uid: int | None) -> TextfileExporter | None:
    """The job's exporter per the ``metrics.*`` settings, or None without ``textfile_dir``."""
    d = cfg["metrics.textfile_dir"]
    if not d:
        return None
    user = user_label(uid) if cfg["metrics.user_label"] else None
    return TextfileExporter(d, job_id, user, int(cfg["metrics.textfile_mode"], 8),
                            textfile_gid(d, cfg["metrics.textfile_group"]))


def textfile_gid(directory: str, group: str) -> int | None:
    """The gid of the ``.prom`` files: ``group``'s (a name or digits), else
    ``directory``'s, else None (root's group)."""
    if group:
        if group.isdigit():
            return int(group)
        import grp

        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            _warn_once(f"group:{group}", f"gsrun: sampler: metrics: unknown group {group!r}: .prom files keep "
                       "root's group\nhint: set [metrics] textfile_group to node_exporter's group")
            return None
    try:
        return os.stat(directory).st_gid
    except OSError:
        return None


def remove_job_file(directory: str, job_id: str) -> list[str]:
    """Remove the job's ``.prom`` file and its temp files (:func:`is_our_file`;
    no link followed). Idempotent. -> names removed.

    Raises:
        OSError: the directory cannot be listed or a file removed (permissions, read-only)."""
    check_job_id(job_id, phase="metrics")
    return sorted(unlink_names(directory, lambda name: is_our_file(name, job_id)))
