"""Leftover GPU processes after a job (field case 17, docs/field-cases.md), ended by the epilog.

Workers reparented to init after ``scancel`` can keep ~100 GB per GPU (sglang
#23627). The epilog lists the compute processes on *this job's* GPUs (minor
number -> PCI bus id through NVML or ``/proc/driver/nvidia/gpus``, never by
position: field cases 7, 8), from ``nvmlDeviceGetComputeRunningProcesses``
else :data:`SMI_ARGS` (never ``pmon`` or columns by position: deepops #1315),
ends only the job user's with no sign of another job (field case 18) by
psutil handles, checks again, and reports ``Residual GPU processes`` (the
node drains) while GPU memory is still held.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Callable

import psutil

from gsrun.base.proc import run_bounded
from gsrun.facts.nvml import NvmlUnavailable, index_by_minor, is_na, normalize_bus_id, open_nvml

SMI_ARGS = ("--query-compute-apps=gpu_bus_id,pid,used_memory", "--format=csv,noheader,nounits")
SMI_TIMEOUT_S = 10.0
TERM_WAIT_S = 3.0
KILL_WAIT_S = 3.0
RECHECK_S = 2.0
MIB = 1024 * 1024
_CSV_LINE = re.compile(r"\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*,\s*([0-9]{1,10})\s*,"
                       r"\s*([0-9]{1,12}|\[N/A\]|N/A|\[Not Supported\])\s*")
_JOB_CGROUP = re.compile(r"/job_([0-9]{1,10})(?:/|$)")


@dataclass
class GpuProc:
    """One compute process on a GPU (``bus_id`` ``0000:41:00.0``; ``used_bytes`` None: unknown)."""

    bus_id: str
    pid: int
    used_bytes: int | None


@dataclass
class ProcFacts:
    """Who a process is (psutil): ``exists`` False when it is gone."""

    pid: int
    exists: bool
    uid: int | None = None
    ppid: int | None = None
    name: str | None = None
    env_job_id: str | None = None
    cgroup_job_id: str | None = None


@dataclass
class Decision:
    targets: list[GpuProc] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)   # {pid, bus_id, why}


# ---------------------------------------------------------------- parsing (pure)

def parse_compute_apps_csv(text: str) -> tuple[list[GpuProc], int]:
    """:data:`SMI_ARGS` output (``used_memory`` in MiB) -> (processes, lines
    ignored: headers, ``pmon`` output, messages)."""
    out, ignored = [], 0
    for ln in (text or "").splitlines():
        if not ln.strip():
            continue
        m = _CSV_LINE.fullmatch(ln)
        if not m:
            ignored += 1
            continue
        mem = m.group(3)
        out.append(GpuProc(normalize_bus_id(m.group(1)), int(m.group(2)),
                           int(mem) * MIB if mem.isdigit() else None))
    return out, ignored


def parse_proc_cgroup_job(text: str | None) -> str | None:
    """The Slurm job id in ``/proc/<pid>/cgroup`` (``.../job_4242/step_0/...``), or None."""
    for ln in (text or "").splitlines():
        m = _JOB_CGROUP.search(ln.split(":", 2)[-1])
        if m:
            return m.group(1)
    return None


# ---------------------------------------------------------------- facts

def job_bus_ids(gres_indices: list[int] | None, nv, hostfs) -> tuple[dict[int, str], list[str]]:
    """gres index (minor number) -> PCI bus id, from NVML then procfs; notes for those not found."""
    by_minor: dict[int, str] = {}
    if nv is not None:
        for minor, i in index_by_minor(nv)[0].items():
            bus = nv.get(i, "pci_bus_id")
            if not is_na(bus):
                by_minor[minor] = bus
    if hostfs is not None:
        for bdf in hostfs.listdir("proc/driver/nvidia/gpus"):
            text = hostfs.read(f"proc/driver/nvidia/gpus/{bdf}/information") or ""
            m = re.search(r"^Device Minor:\s*([0-9]{1,4})\s*$", text, re.M)
            if m:
                by_minor.setdefault(int(m.group(1)), normalize_bus_id(bdf))
    out, notes = {}, []
    for g in gres_indices or []:
        if g in by_minor:
            out[g] = by_minor[g]
        else:
            notes.append(f"gres index {g}: no GPU with that minor number")
    return out, notes


def list_nvml(nv, bus_ids: set[str]) -> list[GpuProc] | None:
    """Compute processes on ``bus_ids`` via NVML; None if NVML cannot say for one."""
    out = []
    seen = set()
    for i in range(nv.count()):
        bus = nv.get(i, "pci_bus_id")
        if is_na(bus) or bus not in bus_ids:
            continue
        seen.add(bus)
        ps = nv.get(i, "compute_processes")
        if is_na(ps) or not isinstance(ps, list):
            return None
        for p in ps:
            try:
                used = p.get("used_bytes")
                out.append(GpuProc(bus, int(p["pid"]), None if used is None else int(used)))
            except (KeyError, TypeError, ValueError, AttributeError):
                return None
    return out if seen == bus_ids else None


def list_smi(bus_ids: set[str], timeout_s: float = SMI_TIMEOUT_S, exe: str | None = None
             ) -> tuple[list[GpuProc] | None, str | None]:
    """Compute processes on ``bus_ids`` via nvidia-smi -> (processes or None, why not)."""
    exe = exe or shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi not found"
    try:
        rc, out, err = run_bounded([exe, *SMI_ARGS], timeout_s)
    except OSError as e:
        return None, f"nvidia-smi: {e.strerror or e}"
    if rc is None:
        return None, f"nvidia-smi timed out after {timeout_s:g} s"
    if rc != 0:
        msg = (err or out).strip().splitlines()
        return None, f"nvidia-smi exit {rc}: {msg[0][:200] if msg else ''}".strip()
    procs, _ignored = parse_compute_apps_csv(out)
    return [p for p in procs if p.bus_id in bus_ids], None


def proc_facts(pid: int) -> ProcFacts:
    """psutil facts of ``pid`` (root reads any environment)."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            uid, ppid, name = p.uids().real, p.ppid(), p.name()
        env_job = None
        with suppress(psutil.AccessDenied, psutil.ZombieProcess, OSError):
            env_job = p.environ().get("SLURM_JOB_ID")
        try:
            with open(f"/proc/{pid}/cgroup", errors="replace") as f:
                cg_job = parse_proc_cgroup_job(f.read())
        except OSError:
            cg_job = None
        return ProcFacts(pid, True, uid, ppid, name, env_job, cg_job)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ProcFacts(pid, False)
    except psutil.AccessDenied:
        return ProcFacts(pid, True)


# ---------------------------------------------------------------- decision (pure)

def select_targets(procs: list[GpuProc], bus_ids: set[str], job_id: str, uid: int,
                   facts: dict[int, ProcFacts], protect: set[int] = frozenset(),
                   live_jobs: set[str] | None = None) -> Decision:
    """Which listed processes to end: on ``bus_ids``, of ``uid``, not in another
    job's cgroup, not PID 1 or ``protect``-ed; another ``SLURM_JOB_ID`` (user
    text) protects only a job in ``live_jobs`` (None: always)."""
    d = Decision()
    for p in procs:
        f = facts.get(p.pid)
        why = None
        if p.bus_id not in bus_ids:
            why = "not on this job's GPUs"
        elif p.pid <= 1 or p.pid in protect:
            why = "protected pid"
        elif f is None or not f.exists:
            why = "process gone"
        elif f.uid is None:
            why = "owner unknown"
        elif f.uid != uid:
            why = f"uid {f.uid} is not the job's user"
        elif f.env_job_id is not None and f.env_job_id != job_id \
                and (live_jobs is None or f.env_job_id in live_jobs):
            why = f"belongs to job {f.env_job_id} (SLURM_JOB_ID)"
        elif f.cgroup_job_id is not None and f.cgroup_job_id != job_id:
            why = f"belongs to job {f.cgroup_job_id} (cgroup)"
        if why:
            d.skipped.append({"pid": p.pid, "bus_id": p.bus_id, "why": why})
        else:
            d.targets.append(p)
    return d


# ---------------------------------------------------------------- effects

def end_processes(pids: list[int], uid: int, term_wait_s: float = TERM_WAIT_S,
                  kill_wait_s: float = KILL_WAIT_S) -> dict[int, str]:
    """SIGTERM, wait, SIGKILL, wait, ``uid``'s PIDs only, by psutil handles.
    -> pid -> terminated | killed | gone | survived | skipped."""
    procs, res = [], {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.uids().real != uid:
                res[pid] = "skipped"
                continue
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            res[pid] = "gone"
        except psutil.AccessDenied:
            res[pid] = "skipped"
    for p in procs:
        with suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            p.send_signal(signal.SIGTERM)
    _gone, alive = psutil.wait_procs(procs, timeout=term_wait_s)
    for p in procs:
        res[p.pid] = "terminated"
    for p in alive:
        with suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            p.send_signal(signal.SIGKILL)
            res[p.pid] = "killed"
    _gone, still = psutil.wait_procs(alive, timeout=kill_wait_s)
    for p in still:
        if p.status() != psutil.STATUS_ZOMBIE:
            res[p.pid] = "survived"
    return res


def _still_held(p: GpuProc, job_id: str, live_jobs: set[str] | None = None) -> bool:
    """After the kill: a listed process holds the GPU unless gone with no
    memory, or of another running job (GPU sharing)."""
    f = proc_facts(p.pid)
    if f.exists:
        other = [j for j in (f.cgroup_job_id,) if j is not None and j != job_id]
        if f.env_job_id is not None and f.env_job_id != job_id and (live_jobs is None or f.env_job_id in live_jobs):
            other.append(f.env_job_id)
        return not other
    return p.used_bytes is None or p.used_bytes > 0


def _protected() -> set[int]:
    out, pid = set(), os.getpid()
    try:
        for p in [psutil.Process(pid), *psutil.Process(pid).parents()]:
            out.add(p.pid)
    except Exception:  # noqa: BLE001
        out.add(pid)
    return out


def cleanup(job_id: str, uid: int, gres_indices: list[int] | None, hostfs=None,
            smi_timeout_s: float = SMI_TIMEOUT_S, term_wait_s: float = TERM_WAIT_S,
            kill_wait_s: float = KILL_WAIT_S, recheck_s: float = RECHECK_S,
            log: Callable[[str], None] = print, smi_exe: str | None = None,
            live_jobs: set[str] | None = None, nv=None) -> dict:
    """The epilog step: list, decide, end, re-check. ``nv``: the NVML backend
    (None: opened here). -> ``{"gpus": {gres: bus}, "source", "found",
    "ended": {pid: result}, "skipped", "remaining", "ok", "reason", "notes"}``;
    ``ok`` False when a process still holds a GPU or none could be listed.
    """
    rep: dict = {"gpus": {}, "source": None, "found": [], "ended": {}, "skipped": [], "remaining": [],
                 "ok": True, "reason": None, "notes": []}
    if not gres_indices:
        rep["notes"].append("job has no GPUs on this node (or they are unknown): nothing to check")
        return rep
    own = nv is None
    if own:
        try:
            nv = open_nvml(hostfs)
        except NvmlUnavailable as e:
            rep["notes"].append(str(e))
    try:
        gmap, notes = job_bus_ids(gres_indices, nv, hostfs)
        rep["gpus"], rep["notes"] = {str(k): v for k, v in gmap.items()}, rep["notes"] + notes
        bus_ids = set(gmap.values())
        if not bus_ids:
            return rep

        def listing():
            if nv is not None:
                got = list_nvml(nv, bus_ids)
                if got is not None:
                    return got, "NVML nvmlDeviceGetComputeRunningProcesses"
            got, why = list_smi(bus_ids, smi_timeout_s, smi_exe)
            if got is None:
                rep["notes"].append(why)
                return None, None
            return got, "nvidia-smi --query-compute-apps"

        procs, rep["source"] = listing()
        if procs is None:
            rep["ok"], rep["reason"] = False, "cannot list GPU processes: " + "; ".join(rep["notes"][-1:])
            return rep
        rep["found"] = [asdict(p) for p in procs]
        if not procs:
            return rep
        facts = {p.pid: proc_facts(p.pid) for p in procs}
        dec = select_targets(procs, bus_ids, job_id, uid, facts, _protected(), live_jobs=live_jobs)
        rep["skipped"] = dec.skipped
        if dec.targets:
            pids = sorted({p.pid for p in dec.targets})
            log(f"residual: ending {len(pids)} process(es) of job {job_id} left on its GPUs: {pids}")
            rep["ended"] = {str(k): v for k, v in end_processes(pids, uid, term_wait_s, kill_wait_s).items()}
        deadline = time.monotonic() + recheck_s
        while True:
            again, _src = listing()
            if again is None:
                rep["ok"], rep["reason"] = False, "cannot re-check GPU processes: " + "; ".join(rep["notes"][-1:])
                return rep
            held = [p for p in again if _still_held(p, job_id, live_jobs)]
            if not held or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        rep["remaining"] = [asdict(p) for p in held]
        if held:
            desc = ", ".join(f"pid {p.pid} on {p.bus_id}"
                             + (f" ({p.used_bytes // MIB} MiB)" if p.used_bytes is not None else "")
                             for p in held[:8])
            rep["ok"], rep["reason"] = False, f"Residual GPU processes: {desc}"
        return rep
    finally:
        if own and nv is not None:
            with suppress(Exception):
                nv.close()
