"""Per-job GPU metrics for the site's Prometheus, through node_exporter's
textfile collector (``--collector.textfile.directory``).

When the site sets ``[metrics] textfile_dir``, the sampler writes
``<textfile_dir>/gsrun_job_<jobid>.prom`` at each state flush
(``sampler.flush_s``) and the epilog removes it. The file is the Prometheus
text format, built by ``prometheus_client`` and written atomically (a temp
file in the same directory, then ``rename``; mode ``metrics.textfile_mode``,
default 0640, group ``metrics.textfile_group``, default the directory's group:
node_exporter reads it through the group, other local users do not): node_exporter never
reads half a file (no ``fsync``: the file is rewritten every flush and
worth nothing after a crash). The temp file's name (``.gsrun_job_<jobid>.prom.<pid>.<hex>``)
does not end in ``.prom``, so the collector never reads it either.

Series, per GPU of the job on this node (labels ``job_id``, ``user`` --
left out with ``metrics.user_label = false`` --, ``node``, ``gpu`` = Slurm gres index, ``uuid`` = NVML UUID, and
``mig_instance`` = the MIG device UUID only where the sampled device is a MIG
instance); at most :data:`SERIES_PER_GPU` (7) of them, no per-process or
per-step label:

==================================  =======  ====================================================
name                                type     value
==================================  =======  ====================================================
``gsrun_gpu_utilization_ratio``     gauge    busy share 0-1 (``nvmlDeviceGetSamples`` / ``UtilizationRates``)
``gsrun_gpu_sm_active_ratio``       gauge    GPM SM activity 0-1 (Hopper and later)
``gsrun_gpu_tensor_active_ratio``   gauge    GPM tensor-core activity 0-1
``gsrun_gpu_memory_used_bytes``     gauge    ``nvmlDeviceGetMemoryInfo`` used, bytes
``gsrun_gpu_power_watts``           gauge    ``nvmlDeviceGetPowerUsage`` / 1000
``gsrun_gpu_energy_joules_total``   counter  ``nvmlDeviceGetTotalEnergyConsumption`` since the job started, J
``gsrun_gpu_idle``                  gauge    1 while the idle detector holds the GPU idle, else 0
==================================  =======  ====================================================

Gauges are the time-weighted mean over the window since the previous write
(one flush interval; the sampler's own aggregates, :class:`gsrun.facts.aggregate.Metric`,
differenced), so a scrape every 15-60 s sees every poll folded in, not one
point reading. A value that is unknown in the window (N/A, not supported,
MIG utilization: field case 12, a lost GPU) is left out, never written as 0.
The idle flag comes from the sampler's idle detector (``state["watch"]``);
it is left out when there is no detector state for the GPU.
"""

from __future__ import annotations

import os
import pwd
import re
import sys
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gsrun.base.fsutil import atomic_write, unlink_names
from gsrun.base.ids import JOB_ID_RE, check_job_id

FILE_PREFIX = "gsrun_job_"
FILE_SUFFIX = ".prom"
FILE_MODE = 0o640     # metrics.textfile_mode's default
_OUR_FILE = re.compile(rf"{FILE_PREFIX}({JOB_ID_RE.pattern}){re.escape(FILE_SUFFIX)}")
# atomic_write's temp name: ".<name>.<pid>.<8 hex>"
_OUR_TEMP = re.compile(rf"\.{FILE_PREFIX}({JOB_ID_RE.pattern}){re.escape(FILE_SUFFIX)}\.[0-9]+\.[0-9a-f]{{8}}")

# (family name, help, sampler metric key, divisor to the family's unit: % -> ratio)
GAUGES = (
    ("gsrun_gpu_utilization_ratio", "GPU busy share 0-1 (NVML utilization), mean over the last sampler flush window",
     "util_pct", 100.0),
    ("gsrun_gpu_sm_active_ratio", "GPM SM activity 0-1, mean over the last sampler flush window",
     "sm_active_pct", 100.0),
    ("gsrun_gpu_tensor_active_ratio", "GPM tensor-core activity 0-1, mean over the last sampler flush window",
     "tensor_active_pct", 100.0),
    ("gsrun_gpu_memory_used_bytes", "GPU memory used in bytes (NVML), mean over the last sampler flush window",
     "mem_used_bytes", 1.0),
    ("gsrun_gpu_power_watts", "GPU power draw in watts (NVML), mean over the last sampler flush window",
     "power_w", 1.0),
)
ENERGY = ("gsrun_gpu_energy_joules", "GPU energy in joules since the job started on this node "
          "(NVML energy counter)")
IDLE = ("gsrun_gpu_idle", "1 while gsrun's idle detector holds the GPU idle, else 0")
SERIES_PER_GPU = len(GAUGES) + 2
_WARNED: set[str] = set()


class Sample(NamedTuple):
    """One series: family name (as exposed, ``_total`` included for counters), labels, value."""

    family: str
    labels: dict
    value: float


def file_name(job_id: str) -> str:
    """``"4242"`` -> ``"gsrun_job_4242.prom"``. Raises InputError for a
    job id that is not digits (the name is built only from a checked id)."""
    return f"{FILE_PREFIX}{check_job_id(job_id, phase='metrics')}{FILE_SUFFIX}"


def is_our_file(name: str, job_id: str | None = None) -> bool:
    """True for exactly ``gsrun_job_<digits>.prom`` or atomic_write's temp file
    of one (``.gsrun_job_<digits>.prom.<pid>.<hex>``), of ``job_id`` when given."""
    m = _OUR_FILE.fullmatch(name) or _OUR_TEMP.fullmatch(name)
    return m is not None and (job_id is None or m.group(1) == job_id)


def _marks(metric) -> tuple[int, float, float, float]:
    return (metric.n, metric.weight_s, metric.wsum, metric.vsum)


def window_mean(now: tuple, before: tuple | None) -> float | None:
    """Mean of a :class:`~gsrun.facts.aggregate.Metric` between two marks
    ``(n, weight_s, wsum, vsum)``: time-weighted when the window carried
    time, the plain mean of its values otherwise (a first poll), None when no
    value came in the window."""
    n0, w0, ws0, vs0 = before or (0, 0.0, 0.0, 0.0)
    n, w, ws, vs = now
    if n < n0:            # a state that went back (sampler restarted from an older file)
        n0, w0, ws0, vs0 = 0, 0.0, 0.0, 0.0
    if n - n0 <= 0:
        return None
    if w - w0 > 1e-9:
        return (ws - ws0) / (w - w0)
    return (vs - vs0) / (n - n0)


def tidy(v: float) -> float:
    """``v`` to 12 significant digits: the float noise of a time-weighted mean
    (123.45599999999999 W) goes, every byte count below 1 TB stays exact."""
    return float(f"{v:.12g}")


def _watch_of(state: dict, gres_index: int, i: int):
    """The idle detector's watch for a GPU: ``state["watch"]`` keyed by the
    gres index (as text or int) or a list parallel to ``state["gpus"]``; a
    :class:`GpuWatch` or its JSON form. None when absent."""
    watch = state.get("watch")
    if isinstance(watch, dict):
        return watch.get(str(gres_index), watch.get(gres_index))
    if isinstance(watch, (list, tuple)) and i < len(watch):
        return watch[i]
    return None


def idle_flag(state: dict, gres_index: int, i: int) -> float | None:
    """1.0 while the detector has an idle stretch open (``idle_since_s`` not
    None), 0.0 when not, None when there is no detector state for the GPU."""
    w = _watch_of(state, gres_index, i)
    if w is None:
        return None
    if isinstance(w, dict):
        if "idle_since_s" not in w:
            return None
        since = w["idle_since_s"]
    else:
        since = getattr(w, "idle_since_s", None)
        if since is None and not hasattr(w, "idle_since_s"):
            return None
    return 1.0 if since is not None else 0.0


def gpu_labels(job_id: str, user: str | None, node: str, ref: dict) -> dict:
    """The labels of one GPU's series. ``user`` None: no ``user`` label
    (``metrics.user_label = false``). ``mig_instance`` only for a MIG device
    (its UUID is ``MIG-...``); ``uuid`` left out when NVML gave none."""
    labels = {"job_id": job_id, "user": user, "node": node, "gpu": str(ref.get("gres_index"))}
    if user is None:
        del labels["user"]
    uuid = ref.get("uuid")
    if uuid:
        labels["uuid"] = str(uuid)
        if ref.get("mig") and str(uuid).startswith("MIG-"):
            labels["mig_instance"] = str(uuid)
    return labels


def build_samples(state: dict, user: str, marks: dict | None = None) -> tuple[list[Sample], dict]:
    """The series for the sampler's live ``state`` (objects inside, as
    :class:`gsrun.node.sampler.Sampler` holds it). Pure.

    ``marks``: what the previous call returned (``{gres_index: {metric key:
    (n, weight_s, wsum, vsum)}}``; None or ``{}`` on the first call: the
    window is the whole job so far). Returns the samples (families in the
    order of :data:`GAUGES`, then energy and idle; GPUs in state order) and
    the marks for the next call."""
    job_id, node = str(state["job_id"]), str(state["node"])
    marks = marks or {}
    new_marks: dict = {}
    by_family: dict[str, list[Sample]] = {}
    for i, g in enumerate(state["gpus"]):
        ref = g["ref"]
        gi = ref.get("gres_index")
        labels = gpu_labels(job_id, user, node, ref)
        before = marks.get(gi, {})
        cur = {}
        for fam, _help, key, per in GAUGES:
            m = g["metrics"].get(key)
            if m is None:
                continue
            cur[key] = _marks(m)
            v = window_mean(cur[key], before.get(key))
            if v is not None:
                by_family.setdefault(fam, []).append(Sample(fam, labels, tidy(v / per)))
        new_marks[gi] = cur
        energy = g.get("energy")
        if energy is not None and energy.first is not None:
            name = ENERGY[0] + "_total"
            by_family.setdefault(name, []).append(Sample(name, labels, tidy(energy.total / 1000.0)))
        if g.get("lost_at_s") is None:
            flag = idle_flag(state, gi, i)
            if flag is not None:
                by_family.setdefault(IDLE[0], []).append(Sample(IDLE[0], labels, flag))
    order = [f[0] for f in GAUGES] + [ENERGY[0] + "_total", IDLE[0]]
    return [s for fam in order for s in by_family.get(fam, [])], new_marks


def render(samples: list[Sample]) -> bytes:
    """The Prometheus text exposition of ``samples`` (``prometheus_client``:
    its escaping of label values and float format). Families with no sample
    are not written."""
    families = []
    for fam, help_text, *_ in GAUGES:
        families.append(GaugeMetricFamily(fam, help_text))
    families.append(CounterMetricFamily(ENERGY[0], ENERGY[1]))
    families.append(GaugeMetricFamily(IDLE[0], IDLE[1]))
    by_name = {f.name + ("_total" if f.type == "counter" else ""): f for f in families}
    for s in samples:
        by_name[s.family].add_sample(s.family, dict(s.labels), s.value)

    class _Fixed:
        def collect(self):
            return [f for f in families if f.samples]

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
    """The sampler's export hook: ``exporter(state)`` at each flush writes
    ``<directory>/gsrun_job_<jobid>.prom`` (atomic, ``mode``, group ``gid``
    when root and not None). ``user`` None: no ``user`` label. It never raises:
    a write that fails (directory missing, disk full, read-only) is one
    warning on the sampler's stderr (``sampler.log``) per cause, and the
    sampler carries on."""

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
    """The exporter for this job when ``metrics.textfile_dir`` is set, else
    None: mode ``metrics.textfile_mode``, group ``metrics.textfile_group``
    (else the directory's group: :func:`textfile_gid`), the ``user`` label
    unless ``metrics.user_label`` is false."""
    d = cfg["metrics.textfile_dir"]
    if not d:
        return None
    user = user_label(uid) if cfg["metrics.user_label"] else None
    return TextfileExporter(d, job_id, user, int(cfg["metrics.textfile_mode"], 8),
                            textfile_gid(d, cfg["metrics.textfile_group"]))


def textfile_gid(directory: str, group: str) -> int | None:
    """The gid the ``.prom`` files get: ``group``'s (a name or digits), else
    the group of ``directory`` (node_exporter's textfile directory); None
    when neither is known (the file keeps root's group: a warning at write
    time is not needed, node_exporter as root still reads it)."""
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
    """Remove this job's ``.prom`` file and any temp file of it left by a
    killed sampler from ``directory``: only names matching our exact pattern
    for ``job_id`` (:func:`is_our_file`), never following a symlinked
    directory (``O_NOFOLLOW``, then names relative to it). Idempotent: no
    file, or no directory, is no error. Returns the names removed.

    Raises:
        OSError: the directory cannot be listed or a file cannot be removed
            (permissions, read-only file system)."""
    check_job_id(job_id, phase="metrics")
    return sorted(unlink_names(directory, lambda name: is_our_file(name, job_id)))
