"""Jobs of a time window from Slurm accounting, one at a time (facts): one
``sacct -P -n -X`` per chunk, streamed (:func:`window_jobs`), each line a
:class:`JobRow` and its ``AdminComment`` blob :class:`JobFigures`. A job
belongs to the chunk its ``End`` falls in, so it is reported once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Iterator

from gsrun.base.errors import SlurmError
from gsrun.facts.sacct import epoch_or_none, parse_mem, parse_tres, time_s_or_none, tres_gpus
from gsrun.facts.slurm import DEFAULT_PATH, TERMINAL_STATES, state_word
from gsrun.report.summary import JS1_MARKERS, decode_js1
from gsrun.report.units import as_number

#: AdminComment last: a ``|`` in another tool's comment only spills into the last column.
REPORT_FORMAT: tuple[str, ...] = (
    "JobID", "JobIDRaw", "Cluster", "Partition", "Account", "User", "State", "Submit", "Start", "End",
    "Elapsed", "Timelimit", "AllocCPUS", "AllocTRES", "ReqMem", "NNodes", "NodeList", "AdminComment",
)
REPORT_STATES = ("CA", "CD", "DL", "F", "NF", "OOM", "PR", "TO")
_NAMES = tuple(f.lower() for f in REPORT_FORMAT)
_END = REPORT_FORMAT.index("End")


@dataclass(slots=True)
class JobRow:
    """One job's allocation line (epoch s, s, bytes; None = not given)."""

    job_id: str
    cluster: str
    partition: str
    account: str
    user: str
    state: str
    submit_s: float | None
    start_s: float | None
    end_s: float | None
    elapsed_s: float
    time_limit_s: float | None
    cpus: int
    gpus: int
    gpu_type: str | None            # gres/gpu:<type> in AllocTRES
    mem_req_bytes: int | None       # AllocTRES mem (the job total)
    nnodes: int
    nodes: str
    comment: str


@dataclass(slots=True)
class JobFigures:
    """A ``JS1:`` blob's figures: one GPU list entry per GPU with a figure, host sums over nodes;
    ``sm_active_pct``, ``energy_j``, ``alerts`` from gsrun's section only."""

    source: str
    gpu_util_pct: list[float] = field(default_factory=list)
    gpu_mem_used_bytes: list[int] = field(default_factory=list)
    gpu_mem_total_bytes: list[int] = field(default_factory=list)
    sm_active_pct: float | None = None
    cpu_time_s: float | None = None
    host_mem_used_bytes: int | None = None
    host_mem_req_bytes: int | None = None
    energy_j: float | None = None
    alerts: int = 0


def parse_line(line: str, fmt: tuple[str, ...] = REPORT_FORMAT) -> JobRow | None:
    """One ``sacct`` line of ``fmt``'s columns -> :class:`JobRow`; None for a step, header or short line."""
    names = _NAMES if fmt is REPORT_FORMAT else [f.lower() for f in fmt]
    parts = line.rstrip("\n").split("|", len(names) - 1)
    if len(parts) != len(names):
        return None
    v = dict(zip(names, parts))
    jid = v.get("jobid", "").strip()
    if not jid or "." in jid:
        return None
    tres = parse_tres(v.get("alloctres"))
    gpus = tres_gpus(tres) or 0
    gtype = next((k[len("gres/gpu:"):] for k in tres if k.startswith("gres/gpu:")), None)
    mem = parse_mem(tres["mem"], bare_unit="M").bytes if "mem" in tres else None
    if mem is None and v.get("reqmem"):
        rm = parse_mem(v["reqmem"], bare_unit="M")
        mem = rm.bytes if rm.per is None else None
    cpus = v.get("alloccpus", "").strip()
    nn = v.get("nnodes", "").strip()
    return JobRow(
        job_id=jid, cluster=v.get("cluster", "").strip(), partition=v.get("partition", "").strip(),
        account=v.get("account", "").strip(), user=v.get("user", "").strip(),
        state=state_word(v.get("state", "")) or "", submit_s=epoch_or_none(v.get("submit", "")),
        start_s=epoch_or_none(v.get("start", "")), end_s=epoch_or_none(v.get("end", "")),
        elapsed_s=time_s_or_none(v.get("elapsed", "")) or 0.0, time_limit_s=time_s_or_none(v.get("timelimit", "")),
        cpus=int(cpus) if cpus.isdigit() else 0, gpus=gpus, gpu_type=gtype, mem_req_bytes=mem,
        nnodes=int(nn) if nn.isdigit() else 1, nodes=v.get("nodelist", "").strip(),
        comment=v.get("admincomment", "").strip())


def blob_figures(comment: str) -> tuple[JobFigures | None, str | None]:
    """``(figures, None)``, else ``(None, why)``: ``no blob``, ``jobstats stub`` (a marker),
    ``lowercased`` (Slurm 22.05), ``corrupt``. A reduced blob's min/median/max count as three GPUs."""
    if not comment.startswith("JS1:"):
        return None, ("lowercased" if comment.startswith("js1:") else "no blob")
    if comment in JS1_MARKERS:
        return None, "jobstats stub"
    try:
        blob = decode_js1(comment)
    except ValueError:
        return None, "corrupt"
    if not isinstance(blob, dict) or not isinstance(blob.get("nodes"), dict):
        return None, "corrupt"
    gs = blob.get("gsrun") if isinstance(blob.get("gsrun"), dict) else None
    f = JobFigures(source="gsrun" if gs is not None else "jobstats")
    cpu = used = req = 0.0
    have_cpu = have_mem = False
    for nd in blob["nodes"].values():
        if not isinstance(nd, dict):
            continue
        if (t := as_number(nd.get("total_time"))) is not None:
            cpu += t
            have_cpu = True
        u, r = as_number(nd.get("used_memory")), as_number(nd.get("total_memory"))
        if u is not None and r:
            used += u
            req += r
            have_mem = True
        util = nd.get("gpu_utilization")
        if isinstance(util, dict):
            f.gpu_util_pct.extend(x for x in map(as_number, util.values()) if x is not None)
        gu, gt = nd.get("gpu_used_memory"), nd.get("gpu_total_memory")
        if isinstance(gu, dict) and isinstance(gt, dict):
            for k, u in gu.items():
                u, t = as_number(u), as_number(gt.get(k))
                if u is not None and t:
                    f.gpu_mem_used_bytes.append(int(u))
                    f.gpu_mem_total_bytes.append(int(t))
    if have_cpu:
        f.cpu_time_s = cpu
    if have_mem:
        f.host_mem_used_bytes, f.host_mem_req_bytes = int(used), int(req)
    if gs is not None:
        f.energy_j = as_number(gs.get("energy_j"))
        sm = gs.get("sm_active_pct")
        if isinstance(sm, dict):
            vals = [x for x in map(as_number, sm.values()) if x is not None]
            f.sm_active_pct = sum(vals) / len(vals) if vals else None
        a = as_number(gs.get("alerts"))
        f.alerts = int(a) if a else 0
    return f, None


def chunks(start_s: float, end_s: float, chunk_s: float) -> list[tuple[float, float]]:
    out, t = [], start_s
    while t < end_s:
        out.append((t, min(t + chunk_s, end_s)))
        t += chunk_s
    return out


def _slurm_time(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%dT%H:%M:%S")


def sacct_argv(start_s: float, end_s: float, clusters: Iterable[str] = (), partitions: Iterable[str] = (),
               accounts: Iterable[str] = ()) -> list[str]:
    """One chunk's sacct argv; names checked by :func:`check_names`."""
    argv = ["sacct", "-P", "-n", "-X", "-a", "--format=" + ",".join(REPORT_FORMAT),
            "-S", _slurm_time(start_s), "-E", _slurm_time(end_s), "-s", ",".join(REPORT_STATES)]
    for flag, names in (("-M", clusters), ("-r", partitions), ("-A", accounts)):
        names = list(names)
        if names:
            argv += [flag, ",".join(names)]
    return argv


def check_names(what: str, names: Iterable[str]) -> list[str]:
    """Cluster, partition or account names: ``[A-Za-z0-9_.-]{1,64}`` each.

    Raises:
        SlurmError: any other name (it would reach sacct's argv)."""
    out = []
    for n in names:
        n = n.strip()
        if not n or len(n) > 64 or not all(c.isascii() and (c.isalnum() or c in "_.-") for c in n):
            raise SlurmError("report", f"bad {what} name", repr(n)[:80], hint="letters, digits, _ . - only")
        out.append(n)
    return out


def stream_sacct(argv: list[str], timeout_s: float) -> Iterator[str]:
    """``argv``'s stdout lines as they come, killed after ``timeout_s`` in all.

    Raises:
        SlurmError: sacct missing, failed (no slurmdbd) or timed out.
    """
    exe = shutil.which(argv[0], path=os.environ.get("PATH") or DEFAULT_PATH)
    if exe is None:
        raise SlurmError("report", f"{argv[0]} not found", "Slurm client commands are not on PATH",
                         hint="install slurm-client or put Slurm's bin directory on PATH")
    proc = subprocess.Popen([exe, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", cwd="/", bufsize=1 << 16)
    killed = threading.Event()

    def kill():
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        yield from proc.stdout
        err = proc.stderr.read() if proc.stderr else ""
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
    if killed.is_set():
        raise SlurmError("report", "sacct timed out", f"no full answer in {timeout_s:g} s",
                         hint="is slurmdbd up? a shorter chunk (cluster_report.chunk_h) asks less at once; "
                         "cluster_report.sacct_timeout_s allows more")
    if rc != 0:
        msg = err.strip().splitlines()
        raise SlurmError("report", "sacct failed", msg[-1] if msg else f"exit {rc}",
                         hint="sacct needs slurmdbd accounting (AccountingStorageType=accounting_storage/slurmdbd)")


def window_jobs(start_s: float, end_s: float, chunk_s: float, timeout_s: float, clusters=(), partitions=(),
                accounts=(), lines_of=None) -> Iterator[JobRow]:
    """Every job that ended in ``[start_s, end_s)``, once. ``lines_of(argv)``: the line source
    (default :func:`stream_sacct`)."""
    lines_of = lines_of or (lambda argv: stream_sacct(argv, timeout_s))
    for a, b in chunks(start_s, end_s, chunk_s):
        for line in lines_of(sacct_argv(a, b, clusters, partitions, accounts)):
            parts = line.split("|", _END + 1)
            if len(parts) > _END + 1:      # skip a job another chunk reports before parsing it
                end = epoch_or_none(parts[_END])
                if end is None or not (a <= end < b):
                    continue
            row = parse_line(line)
            if row is not None and row.end_s is not None and a <= row.end_s < b and row.state in TERMINAL_STATES:
                yield row


def parse_since(text: str, now: float | None = None) -> float:
    """``7d``, ``36h``, ``90m`` -> the epoch second that long before ``now``.

    Raises:
        SlurmError: another form."""
    t = text.strip().lower()
    mult = {"d": 86400, "h": 3600, "m": 60, "w": 7 * 86400}.get(t[-1:])
    if mult is None or not t[:-1].isdigit() or int(t[:-1]) <= 0:
        raise SlurmError("report", "bad --since", repr(text)[:40], hint="e.g. 7d, 36h, 90m or 2w")
    return (time.time() if now is None else now) - int(t[:-1]) * mult


def parse_when(text: str) -> float:
    """``2024-05-01`` or ``2024-05-01T12:00[:00]`` (local time) -> epoch seconds.

    Raises:
        SlurmError: another form."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise SlurmError("report", "bad time", repr(text)[:40], hint="e.g. 2024-05-01 or 2024-05-01T12:00") from None
