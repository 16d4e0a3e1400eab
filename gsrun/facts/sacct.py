"""Pure parsers for ``sacct -P -n --format=...`` and seff's CPU/memory
efficiency math, safe for every sacct format seen (field cases 23-26).

Ask sacct for :data:`SACCT_FORMAT`, never with ``-X``: MaxRSS and
TRESUsageInTot live only on steps (case 25). Memory suffixes are binary; a
bare number is MiB for ReqMem/AllocTRES and bytes for MaxRSS/TRESUsageInTot;
ReqMem's ``c``/``n`` (Slurm < 21.08) means per CPU / per node (case 24). A
zero divisor gives ``None`` and a label (``cpu_eff_na``), never seff's 0.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from gsrun.base.errors import SlurmError
from gsrun.facts.slurm import PENDING_STATES, REQUEUE_STATES, RUNNING_STATES, parse_state

#: ``sacct -P -n --format=`` fields; JobName last, so a ``|`` in it spills only there.
SACCT_FORMAT: tuple[str, ...] = (
    "JobID", "JobIDRaw", "State", "ExitCode", "Start", "End", "Elapsed",
    "AllocCPUS", "AllocTRES", "ReqMem", "NNodes", "NTasks",
    "TotalCPU", "UserCPU", "SystemCPU", "MaxRSS", "TRESUsageInTot", "JobName",
)

_FREE_TEXT_FIELDS = ("jobname", "comment", "admincomment", "constraints", "workdir",
                     "submitline")

_UNIT_POW = {"": None, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


# --------------------------------------------------------------------------- scalars

def parse_time_s(text: str | None) -> float | None:
    """Slurm duration ``[D-][HH:]MM:SS[.fff]`` (also ``D-HH[:MM]``) -> seconds;
    ``""``, None, ``INVALID``, ``UNLIMITED``, ``Unknown`` -> None.

    Raises:
        ValueError: no such form (likely a ``--format`` column mismatch).
    """
    if text is None:
        return None
    t = text.strip()
    if not t or t.upper() in ("INVALID", "UNLIMITED", "UNKNOWN", "NONE", "PARTITION_LIMIT"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.(\d{1,6}))?", t)
    if not m:
        m2 = re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?", t)
        if not m2:
            raise ValueError(f"not a Slurm time [D-][HH:]MM:SS[.fff]: {text!r}")
        d, h, mi = (int(x or 0) for x in m2.groups())
        return float(d * 86400 + h * 3600 + mi * 60)
    d, h, mi, s, frac = m.groups()
    if d is not None and h is None:
        if frac:
            raise ValueError(f"not a Slurm time [D-][HH:]MM:SS[.fff]: {text!r}")
        h, mi, s = mi, s, "0"                       # D-HH:MM
    whole = int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi) * 60 + int(s)
    if frac:
        us = int(frac.ljust(6, "0"))
        return (whole * 1_000_000 + us) / 1_000_000
    return float(whole)


@dataclass(frozen=True)
class MemValue:
    """A sacct memory string: ``bytes`` (None: missing), ``per`` ``"cpu"``,
    ``"node"`` or None (a total), ``warning`` for a stripped unknown suffix."""

    bytes: int | None
    per: str | None = None
    warning: str | None = None


def time_s_or_none(text: str | None) -> float | None:
    """:func:`parse_time_s`, with None also for text of no such form."""
    try:
        return parse_time_s(text)
    except ValueError:
        return None


def epoch_or_none(text: str | None) -> float | None:
    """A Slurm timestamp (``2024-05-01T12:00:00``, local time) -> epoch s; None for
    ``Unknown``, ``None``, ``(null)``, empty or any other text."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp() if text else None
    except (ValueError, OverflowError, OSError):      # not a timestamp, or outside the platform's range
        return None


def parse_mem(text: str | None, bare_unit: str = "M") -> MemValue:
    """``"1.50Gn"`` -> 1.5 GiB per node, ``"1Me"`` -> 1 MiB with a warning,
    ``""`` -> missing; ``bare_unit``: a suffix-less number's unit (``"M"``
    requests, ``""`` usage). Never raises: garbage is ``bytes=None`` + warning."""
    if text is None:
        return MemValue(None)
    t = text.strip()
    if not t:
        return MemValue(None)
    m = re.fullmatch(r"(\d+(?:\.\d*)?)([KMGTPE]?)([A-Za-z]?)", t)
    if not m:
        return MemValue(None, None, f"unparsable memory value {text!r} ignored")
    num, unit, qual = m.groups()
    warning = None
    per = None
    if qual == "c":
        per = "cpu"
    elif qual == "n":
        per = "node"
    elif qual:
        warning = f"unknown memory suffix {qual!r} in {text!r} stripped"
    pow_ = _UNIT_POW[unit] if unit else _UNIT_POW[bare_unit]
    mult = 1 if pow_ is None else 1024 ** pow_
    value = round(float(num) * mult) if "." in num else int(num) * mult
    return MemValue(value, per, warning)


def parse_tres(text: str | None) -> dict[str, str]:
    """``"cpu=8,mem=32G,gres/gpu=4"`` -> ``{"cpu": "8", ...}``; values stay
    strings (TRESUsageInTot ``cpu=`` is a time)."""
    out: dict[str, str] = {}
    if not text:
        return out
    for tok in text.strip().split(","):
        if "=" not in tok:
            continue
        k, v = tok.split("=", 1)
        k = k.strip()
        if k:
            out[k] = v.strip()
    return out


def tres_gpus(tres: dict[str, str]) -> int | None:
    """``gres/gpu=4``, else the sum of typed ``gres/gpu:h100=4``; None if none."""
    if "gres/gpu" in tres:
        return _int_or_none(tres["gres/gpu"])
    typed = [_int_or_none(v) for k, v in tres.items() if k.startswith("gres/gpu:")]
    typed = [v for v in typed if v is not None]
    return sum(typed) if typed else None


def _int_or_none(text: str | None) -> int | None:
    t = (text or "").strip()
    if not t:
        return None
    try:
        return int(t)
    except ValueError:
        try:
            return int(float(t))
        except ValueError:
            return None


# --------------------------------------------------------------------------- rows

@dataclass
class SacctRow:
    """One sacct line: ``job_id`` without the step, ``step`` ``""`` for the job
    line. Seconds and bytes; None = absent or empty."""

    job_id: str
    step: str
    job_id_raw: str | None = None
    state: str | None = None          # first word: "CANCELLED" of "CANCELLED by 1000"
    cancelled_by: int | None = None
    exit_code: str | None = None
    start: str | None = None
    end: str | None = None
    elapsed_s: float | None = None
    alloc_cpus: int | None = None
    alloc_tres: dict[str, str] = field(default_factory=dict)
    req_mem: MemValue = field(default_factory=lambda: MemValue(None))
    nnodes: int | None = None
    ntasks: int | None = None
    total_cpu_s: float | None = None
    user_cpu_s: float | None = None
    system_cpu_s: float | None = None
    max_rss_bytes: int | None = None
    tres_usage_in_tot: dict[str, str] = field(default_factory=dict)
    job_name: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def is_job_line(self) -> bool:
        return self.step == ""


def _norm_fmt(fmt) -> list[str]:
    if isinstance(fmt, str):
        fmt = fmt.split(",")
    out = []
    for f in fmt:
        f = f.strip().split("%", 1)[0].lower()   # "JobName%30" -> "jobname"
        if f:
            out.append(f)
    return out


def parse_sacct(text: str, fmt=SACCT_FORMAT) -> list[SacctRow]:
    """``sacct -P -n`` (or ``-p``) output -> rows; ``fmt``: the ``--format``
    list given (``%width`` ignored), with JobID.

    Raises:
        SlurmError: a line with another column count (sacct ran with another
            ``--format``), or ``fmt`` without JobID.
    """
    names = _norm_fmt(fmt)
    if "jobid" not in names:
        raise SlurmError("sacct", "format has no JobID", ",".join(names),
                         hint="pass the same --format list that sacct was given")
    n = len(names)
    free = next((i for i, nm in enumerate(names) if nm in _FREE_TEXT_FIELDS), None)
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) == n + 1 and parts[-1] == "":
            parts = parts[:-1]                      # sacct -p trailing delimiter
        if len(parts) > n and free is not None:
            extra = len(parts) - n                  # a '|' inside a job name
            parts = (parts[:free] + ["|".join(parts[free:free + extra + 1])]
                     + parts[free + extra + 1:])
        if len(parts) != n:
            raise SlurmError("sacct", "unexpected number of columns",
                             f"line {lineno} has {len(parts)}, format has {n}: {line[:200]!r}",
                             hint="pass the same --format list that sacct was given")
        rows.append(_row(dict(zip(names, parts))))
    return rows


def _row(v: dict[str, str]) -> SacctRow:
    jid = v["jobid"].strip()
    base, _, step = jid.partition(".")
    r = SacctRow(job_id=base, step=step)
    w = r.warnings

    def time_field(name):
        if name not in v:
            return None
        try:
            return parse_time_s(v[name])
        except ValueError as e:
            w.append(f"{name}: {e}")
            return None

    def int_field(name):
        if name not in v or not v[name].strip():
            return None
        x = _int_or_none(v[name])
        if x is None:
            w.append(f"{name}: not a number: {v[name]!r}")
        return x

    r.job_id_raw = v.get("jobidraw", "").strip() or None
    if r.job_id_raw:
        r.job_id_raw = r.job_id_raw.partition(".")[0]
    state, by = parse_state(v.get("state"))
    if state:
        r.state, r.cancelled_by = state, by
    r.exit_code = v.get("exitcode", "").strip() or None
    r.start = v.get("start", "").strip() or None
    r.end = v.get("end", "").strip() or None
    r.elapsed_s = time_field("elapsed")
    r.alloc_cpus = int_field("alloccpus")
    r.alloc_tres = parse_tres(v.get("alloctres"))
    r.req_mem = parse_mem(v.get("reqmem"), bare_unit="M")
    if r.req_mem.warning:
        w.append(f"ReqMem: {r.req_mem.warning}")
    r.nnodes, r.ntasks = int_field("nnodes"), int_field("ntasks")
    r.total_cpu_s, r.user_cpu_s, r.system_cpu_s = map(time_field, ("totalcpu", "usercpu", "systemcpu"))
    rss = parse_mem(v.get("maxrss"), bare_unit="")
    if rss.warning:
        w.append(f"MaxRSS: {rss.warning}")
    r.max_rss_bytes = rss.bytes
    r.tres_usage_in_tot = parse_tres(v.get("tresusageintot"))
    r.job_name = v.get("jobname")
    return r


# --------------------------------------------------------------------------- job

@dataclass
class SacctJob:
    """A job's rows: the job line (None if sacct printed only steps) and its steps."""

    job_id: str
    job: SacctRow | None
    steps: list[SacctRow]


def group_jobs(rows: list[SacctRow]) -> list[SacctJob]:
    """Group rows by JobID (before the ``.``), in first-seen order."""
    jobs: dict[str, SacctJob] = {}
    for r in rows:
        j = jobs.setdefault(r.job_id, SacctJob(r.job_id, None, []))
        if r.is_job_line:
            if j.job is None:
                j.job = r
        else:
            j.steps.append(r)
    return list(jobs.values())


@dataclass
class JobEfficiency:
    """seff-style CPU/memory efficiency of one job from sacct.

    job_id: as users know it (``"15053872_1491"`` for an array task);
    job_id_raw: JobIDRaw (``"15055386"``) when sacct gave it.
    outcome: ``"finished"``, ``"cancelled_before_start"``, ``"not_started"``,
        ``"pending"``, ``"requeued"``, ``"running"``; deferred is True for the
        last three (write the summary later / mark it requeued).
    cpu_time_s: CPU seconds used (sum over steps; see cpu_time_source).
    cpu_eff_pct: cpu_time_s / (alloc_cpus x elapsed_s) x 100, clamped to
        100 (cpu_anomaly then True); None with cpu_eff_na saying why.
    mem_peak_bytes: max over steps of TRESUsageInTot mem (sum of the tasks'
        peaks), else MaxRSS x NTasks (mem_peak_estimated True), else MaxRSS.
    mem_req_bytes: AllocTRES mem (job total), else ReqMem resolved with the
        c/n qualifier x AllocCPUS / NNodes.
    mem_eff_pct: mem_peak_bytes / mem_req_bytes x 100; None with mem_eff_na.
    notes: human-readable labels and warnings, in the order found.
    """

    job_id: str
    job_id_raw: str | None = None
    state: str | None = None
    cancelled_by: int | None = None
    outcome: str = "finished"
    deferred: bool = False
    elapsed_s: float | None = None
    alloc_cpus: int | None = None
    alloc_gpus: int | None = None
    nodes: int | None = None
    cpu_time_s: float | None = None
    cpu_time_source: str | None = None
    cpu_eff_pct: float | None = None
    cpu_eff_na: str | None = None
    cpu_anomaly: bool = False
    mem_peak_bytes: int | None = None
    mem_peak_source: str | None = None
    mem_peak_estimated: bool = False
    mem_req_bytes: int | None = None
    mem_eff_pct: float | None = None
    mem_eff_na: str | None = None
    notes: list[str] = field(default_factory=list)


def cpu_efficiency(cpu_time_s: float | None, alloc_cpus: int | None,
                   elapsed_s: float | None) -> tuple[float | None, str | None, bool]:
    """``cpu_time_s / (alloc_cpus x elapsed_s) x 100`` -> (pct, na_label, anomaly):
    ``(None, label, False)`` for a missing or zero divisor, ``(100.0, label,
    True)`` above 100 % (field case 26)."""
    if cpu_time_s is None:
        return None, "N/A: no CPU time in accounting", False
    if not alloc_cpus:
        return None, f"N/A: no CPUs allocated (AllocCPUS={alloc_cpus})", False
    if not elapsed_s:
        return None, f"N/A: no run time (Elapsed={elapsed_s})", False
    pct = cpu_time_s / (alloc_cpus * elapsed_s) * 100.0
    if pct > 100.0:
        return 100.0, (f"accounting anomaly: CPU time {cpu_time_s:.0f} s exceeds "
                       f"AllocCPUS x Elapsed = {alloc_cpus * elapsed_s:.0f} s "
                       f"({pct:.0f}%), clamped to 100%"), True
    return pct, None, False


def _step_cpu_s(r: SacctRow) -> tuple[float | None, str | None]:
    """CPU seconds of one row and where they came from."""
    if r.total_cpu_s:
        return r.total_cpu_s, "TotalCPU"
    tres_cpu = r.tres_usage_in_tot.get("cpu")
    if tres_cpu:
        try:
            t = parse_time_s(tres_cpu)
        except ValueError:
            r.warnings.append(f"TRESUsageInTot cpu: not a time: {tres_cpu!r}")
            t = None
        if t is not None and (t > 0 or r.total_cpu_s is None):
            return t, "TRESUsageInTot cpu"
    if r.user_cpu_s is not None or r.system_cpu_s is not None:
        return (r.user_cpu_s or 0.0) + (r.system_cpu_s or 0.0), "UserCPU+SystemCPU"
    if r.total_cpu_s is not None:
        return r.total_cpu_s, "TotalCPU"
    return None, None


def _row_mem_peak(r: SacctRow) -> tuple[int | None, str | None, bool]:
    """(bytes, source, estimated) for one row."""
    mem = r.tres_usage_in_tot.get("mem")
    if mem:
        mv = parse_mem(mem, bare_unit="")
        if mv.warning:
            r.warnings.append(f"TRESUsageInTot mem: {mv.warning}")
        if mv.bytes is not None:
            return mv.bytes, "TRESUsageInTot mem", False
    if r.max_rss_bytes is None:
        return None, None, False
    if r.ntasks and r.ntasks > 1:
        return r.max_rss_bytes * r.ntasks, "MaxRSS x NTasks", True
    return r.max_rss_bytes, "MaxRSS", False


def _started(job: SacctRow) -> bool:
    if job.start is not None:
        return job.start.upper() not in ("UNKNOWN", "NONE")
    return bool(job.elapsed_s) or bool(job.alloc_cpus)


def job_efficiency(j: SacctJob) -> JobEfficiency:
    """CPU and memory efficiency of one grouped job; never raises."""
    head = j.job or (j.steps[0] if j.steps else None)
    e = JobEfficiency(job_id=j.job_id)
    notes = e.notes
    if head is None:
        notes.append("no sacct rows")
        return e
    if j.job is None:
        notes.append("no job line in sacct output; allocation taken from step "
                     f"{head.job_id}.{head.step}")
    for r in ([j.job] if j.job else []) + j.steps:
        for w in r.warnings:
            notes.append(f"warning: {r.job_id}{'.' + r.step if r.step else ''}: {w}")

    e.job_id_raw = head.job_id_raw
    e.state = head.state
    e.cancelled_by = head.cancelled_by
    e.elapsed_s = head.elapsed_s
    if e.elapsed_s is None and j.steps:
        el = [s.elapsed_s for s in j.steps if s.elapsed_s is not None]
        e.elapsed_s = max(el) if el else None
    tres = head.alloc_tres
    e.alloc_cpus = head.alloc_cpus if head.alloc_cpus is not None else _int_or_none(tres.get("cpu"))
    e.alloc_gpus = tres_gpus(tres)
    e.nodes = head.nnodes if head.nnodes is not None else _int_or_none(tres.get("node"))

    # outcome
    state = e.state or ""
    if state in PENDING_STATES:
        e.outcome, e.deferred = "pending", True
    elif state in REQUEUE_STATES:
        e.outcome, e.deferred = "requeued", True
    elif state in RUNNING_STATES:
        e.outcome, e.deferred = "running", True
    elif not _started(head):
        e.outcome = "cancelled_before_start" if state == "CANCELLED" else "not_started"
    if e.deferred:
        notes.append(f"job is {state}: summary deferred")
    elif e.outcome == "cancelled_before_start":
        notes.append("cancelled before start: no efficiency to report")
    elif e.outcome == "not_started":
        notes.append("job never ran (no CPUs allocated, no run time)")

    _cpu_part(j, e)
    _mem_part(j, e, head)
    return e


def _cpu_part(j: SacctJob, e: JobEfficiency) -> None:
    notes = e.notes
    cpu, srcs = 0.0, set()
    for s in j.steps:
        t, src = _step_cpu_s(s)
        if t is not None:
            cpu += t
            srcs.add(src)
    if srcs:
        e.cpu_time_s = cpu
        e.cpu_time_source = "sum over steps of " + "/".join(sorted(srcs))
    elif j.job is not None:
        e.cpu_time_s, src = _step_cpu_s(j.job)
        e.cpu_time_source = f"job line {src}" if src else None
    pct, label, anomaly = cpu_efficiency(e.cpu_time_s, e.alloc_cpus, e.elapsed_s)
    e.cpu_eff_pct, e.cpu_eff_na, e.cpu_anomaly = pct, (None if anomaly else label), anomaly
    if label:
        notes.append(("CPU efficiency " if not anomaly else "") + label)
    # the job line disagreeing impossibly with its steps (field case 26, docs/field-cases.md)
    if srcs and j.job is not None and e.alloc_cpus and e.elapsed_s:
        jt, jsrc = _step_cpu_s(j.job)
        if jt is not None and jt > e.alloc_cpus * e.elapsed_s * 1.0 + 1e-9:
            notes.append(f"accounting anomaly: the job line's {jsrc} ({jt:.0f} s) exceeds "
                         f"AllocCPUS x Elapsed ({e.alloc_cpus * e.elapsed_s:.0f} s); "
                         "used the sum over steps")
    # multi-node job whose steps cover fewer nodes (field case 26, docs/field-cases.md)
    if e.nodes and e.nodes > 1 and j.steps:
        covered = max((s.nnodes or 0) for s in j.steps)
        if 0 < covered < e.nodes:
            notes.append(f"only {covered} of {e.nodes} nodes have accounted steps: work "
                         "started outside srun (mpirun over ssh) is invisible to "
                         "accounting, so CPU efficiency is a lower bound")


def _mem_part(j: SacctJob, e: JobEfficiency, head: SacctRow) -> None:
    notes = e.notes
    best = (None, None, False)
    for s in j.steps:
        b = _row_mem_peak(s)
        if b[0] is not None and (best[0] is None or b[0] > best[0]):
            best = b
    if best[0] is None and j.job is not None:
        best = _row_mem_peak(j.job)
    e.mem_peak_bytes, e.mem_peak_source, e.mem_peak_estimated = best
    if e.mem_peak_estimated:
        notes.append("memory peak estimated as MaxRSS x NTasks (TRESUsageInTot mem absent)")
    if j.steps and all(s.ntasks is None for s in j.steps) and best[1] == "MaxRSS":
        notes.append("memory peak is the largest single task's MaxRSS (NTasks unknown)")

    # requested memory
    alloc_mem = head.alloc_tres.get("mem")
    if alloc_mem:
        mv = parse_mem(alloc_mem, bare_unit="M")
        if mv.warning:
            notes.append(f"warning: AllocTRES mem: {mv.warning}")
        e.mem_req_bytes = mv.bytes
    if e.mem_req_bytes is None and head.req_mem.bytes is not None:
        rm = head.req_mem
        # ReqMem per CPU or per node: times the count, which must be known
        per = {"cpu": (e.alloc_cpus, "CPU", "AllocCPUS"), "node": (e.nodes, "node", "NNodes")}.get(rm.per)
        if per is None:
            e.mem_req_bytes = rm.bytes
        elif per[0] is not None:
            e.mem_req_bytes = rm.bytes * per[0]
        else:
            notes.append(f"ReqMem is per {per[1]} but {per[2]} is unknown")
    if e.mem_peak_bytes is None:
        e.mem_eff_na = "N/A: no memory peak in accounting (MaxRSS empty)"
    elif not e.mem_req_bytes:
        e.mem_eff_na = f"N/A: no memory allocated (mem={e.mem_req_bytes})"
    else:
        e.mem_eff_pct = e.mem_peak_bytes / e.mem_req_bytes * 100.0
    if e.mem_eff_na:
        notes.append("memory efficiency " + e.mem_eff_na)


def efficiency_from_sacct(text: str, fmt=SACCT_FORMAT, jobid: str | None = None) -> JobEfficiency:
    """Efficiency of one job (JobID or JobIDRaw ``jobid``; None: the only one) from sacct output.

    Raises:
        SlurmError: empty output (job too old for the accounting database, a
            wrong cluster, or slurmdbd not configured), the job not in the text,
            or several jobs and no jobid; plus :func:`parse_sacct` errors.
    """
    jobs = group_jobs(parse_sacct(text, fmt))
    if not jobs:
        raise SlurmError("sacct", "no accounting record", f"job {jobid or '?'}",
                         hint="the job may be older than the accounting database keeps, "
                              "or on another cluster (sacct -M)")
    if jobid is None:
        if len(jobs) > 1:
            raise SlurmError("sacct", "several jobs in output",
                             ", ".join(j.job_id for j in jobs[:5]), hint="pass jobid")
        return job_efficiency(jobs[0])
    jobid = str(jobid).strip()
    for j in jobs:
        raw = (j.job or j.steps[0]).job_id_raw
        if jobid in (j.job_id, raw):
            return job_efficiency(j)
    raise SlurmError("sacct", "job not in output", jobid,
                     hint="for an array task use ARRAYID_TASK (e.g. 123_4) or the raw job id")
