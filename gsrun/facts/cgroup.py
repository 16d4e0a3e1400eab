"""Facts from the job's cgroup: CPU time, memory, cpuset, PIDs; read-only,
through :class:`gsrun.facts.hostfs.HostFS` (fakes: ``tests/data/cgroup/``).

Field case 22: the hierarchy comes from ``/proc/self/mountinfo``. Files:
v2 ``cpu.stat`` usage_usec (µs), ``memory.current``, ``memory.peak`` (newer
kernels), ``cpuset.cpus.effective``; v1 ``cpuacct.usage`` (ns, *cpuacct*
mount), ``memory.usage_in_bytes``, ``memory.max_usage_in_bytes``,
``cpuset.effective_cpus``. Job directories: v2
``<mount>/system.slice/slurmstepd.scope/job_J`` (else a bounded search), v1
``<controller mount>/slurm/uid_U/job_J``.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from gsrun.base.cpulist import parse_cpulist
from gsrun.base.errors import InputError
from gsrun.base.ids import check_job_id
from gsrun.facts.hostfs import HostFS

V1_CONTROLLERS = frozenset({
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids", "blkio",
    "net_cls", "net_prio", "perf_event", "hugetlb", "rdma", "misc",
})

SEARCH_MAX_DEPTH = 4
SEARCH_MAX_DIRS = 4000
PIDS_MAX = 100_000
PIDS_MAX_DIRS = 10_000


# --------------------------------------------------------------------------- mounts

@dataclass(frozen=True)
class CgroupMounts:
    """The cgroup mounts: ``version`` 1 when any controller is on a v1 mount
    (hybrid too), 2 for unified, None for none; ``v2`` (mount point, root),
    also in hybrid mode; ``v1`` controller -> (mount point, root)."""

    version: int | None
    v2: tuple[str, str] | None = None
    v1: dict[str, tuple[str, str]] = field(default_factory=dict)


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text: str | None) -> CgroupMounts:
    """``/proc/self/mountinfo`` text -> :class:`CgroupMounts`; odd lines skipped."""
    v2 = None
    v1: dict[str, tuple[str, str]] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        if sep < 6 or len(parts) < sep + 3:
            continue
        root, mnt = _unescape(parts[3]), _unescape(parts[4])
        fstype, superopts = parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else ""
        if fstype == "cgroup2":
            if v2 is None:
                v2 = (mnt, root)
        elif fstype == "cgroup":
            for opt in superopts.split(","):
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = (mnt, root)
    version = 1 if v1 else (2 if v2 else None)
    return CgroupMounts(version, v2, v1)


def read_mounts(hostfs: HostFS) -> CgroupMounts:
    return parse_mountinfo(hostfs.read("proc/self/mountinfo"))


# --------------------------------------------------------------------------- job dir

@dataclass(frozen=True)
class JobCgroup:
    """The job's cgroup directories (HostFS-relative): v2 one for all; v1 one
    per controller, None where Slurm made none; ``pids_dir`` for ``cgroup.procs``."""

    version: int
    job_id: str
    uid: int | None
    cpu_dir: str | None = None
    memory_dir: str | None = None
    cpuset_dir: str | None = None
    devices_dir: str | None = None
    pids_dir: str | None = None


def _rel(path: str) -> str:
    return path.lstrip("/")


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def _is_dir(hostfs: HostFS, rel: str) -> bool:
    try:
        return hostfs.path(rel).is_dir()
    except (OSError, InputError):
        return False


def _check_ids(job_id, uid) -> str:
    jid = check_job_id(str(job_id), phase="cgroup")
    if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool) or uid < 0):
        raise InputError("cgroup", "bad uid", repr(uid))
    return jid


def _search(hostfs: HostFS, start: str, name: str, max_depth: int = SEARCH_MAX_DEPTH,
            max_dirs: int = SEARCH_MAX_DIRS) -> str | None:
    """Bounded breadth-first search for a directory ``name`` under ``start``,
    not into other jobs' ``job_*`` / ``step_*`` dirs."""
    queue = deque([(start, 0)])
    seen = 0
    while queue:
        d, depth = queue.popleft()
        seen += 1
        if seen > max_dirs:
            return None
        for entry in hostfs.listdir(d):
            sub = _join(d, entry)
            if entry == name and _is_dir(hostfs, sub):
                return sub
        if depth + 1 >= max_depth:
            continue
        for entry in hostfs.listdir(d):
            if entry.startswith(("job_", "step_", "task_")) or entry.startswith("cgroup."):
                continue
            sub = _join(d, entry)
            if _is_dir(hostfs, sub):
                queue.append((sub, depth + 1))
    return None


def _v1_job_dir(hostfs: HostFS, mount: str, job: str, uid: int | None) -> str | None:
    base = _join(_rel(mount), "slurm")
    if uid is not None:
        d = _join(base, f"uid_{uid}", f"job_{job}")
        return d if _is_dir(hostfs, d) else None
    for entry in hostfs.listdir(base):
        if entry.startswith("uid_") and entry[4:].isdigit():
            d = _join(base, entry, f"job_{job}")
            if _is_dir(hostfs, d):
                return d
    return None


def find_job_cgroup(hostfs: HostFS, job_id: str, uid: int | None = None,
                    mounts: CgroupMounts | None = None) -> JobCgroup | None:
    """The job's cgroup (module doc; any ``uid_*`` when ``uid`` is None);
    None when there is none (job not here, no cgroups, a wrong host root).

    Raises:
        InputError: ``job_id`` not a plain number (an array id ``123_4`` --
            pass the raw id), or a negative uid.
    """
    job = _check_ids(job_id, uid)
    mounts = mounts or read_mounts(hostfs)
    if mounts.version == 2 and mounts.v2:
        mnt = _rel(mounts.v2[0])
        d = _join(mnt, "system.slice", "slurmstepd.scope", f"job_{job}")
        if mounts.v2[1].rstrip("/").endswith(f"/job_{job}"):
            d = mnt                    # a cgroup namespace rooted at the job dir
        elif not _is_dir(hostfs, d):
            d = _search(hostfs, mnt, f"job_{job}")
        if d is None:
            return None
        return JobCgroup(2, job, uid, d, d, d, d, d)
    if mounts.version == 1:
        dirs = {c: _v1_job_dir(hostfs, m, job, uid) for c, (m, _root) in mounts.v1.items()
                if c in ("cpuacct", "memory", "cpuset", "devices", "freezer")}
        if not any(dirs.values()):
            return None
        uid_found = uid
        if uid_found is None:
            for d in dirs.values():
                if d:
                    m = re.search(r"/uid_(\d+)/job_", "/" + d)
                    uid_found = int(m.group(1)) if m else None
                    break
        pids = next((dirs.get(c) for c in ("freezer", "cpuacct", "memory", "cpuset", "devices")
                     if dirs.get(c)), None)
        return JobCgroup(1, job, uid_found, dirs.get("cpuacct"), dirs.get("memory"),
                         dirs.get("cpuset"), dirs.get("devices"), pids)
    return None


# --------------------------------------------------------------------------- usage

@dataclass
class CgroupUsage:
    """A job's resource use now: CPU seconds of every process ever in the
    cgroup, memory with page cache, the peak (None without a peak file: sample
    or use sacct); ``source`` ``"cgroup2:<dir>"``/``"cgroup1:<dir>"``; ``notes``
    why a value is None."""

    cpu_time_s: float | None
    mem_current_bytes: int | None
    mem_peak_bytes: int | None
    source: str
    notes: list[str] = field(default_factory=list)


def _cpu_stat_usage_usec(text: str | None) -> int | None:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == "usage_usec" and v.strip().isdigit():
            return int(v.strip())
    return None


def read_usage(hostfs: HostFS, jcg: JobCgroup) -> CgroupUsage:
    """CPU time and memory of ``jcg``; a missing value is None with a note."""
    notes: list[str] = []
    cpu_s = cur = peak = None
    if jcg.version == 2:
        d = jcg.cpu_dir
        usec = _cpu_stat_usage_usec(hostfs.read(_join(d, "cpu.stat")))
        cpu_s = usec / 1e6 if usec is not None else None
        if cpu_s is None:
            notes.append(f"no usage_usec in /{d}/cpu.stat")
        cur = hostfs.read_int(_join(d, "memory.current"))
        peak = hostfs.read_int(_join(d, "memory.peak"))
        if peak is None:
            notes.append("no memory.peak (kernel too old): sample memory.current "
                         "or use sacct for the peak")
        source = f"cgroup2:/{d}"
    else:
        if jcg.cpu_dir:
            ns = hostfs.read_int(_join(jcg.cpu_dir, "cpuacct.usage"))
            cpu_s = ns / 1e9 if ns is not None else None
            if cpu_s is None:
                notes.append(f"no /{jcg.cpu_dir}/cpuacct.usage")
        else:
            notes.append("job not in the cpuacct hierarchy")
        if jcg.memory_dir:
            cur = hostfs.read_int(_join(jcg.memory_dir, "memory.usage_in_bytes"))
            peak = hostfs.read_int(_join(jcg.memory_dir, "memory.max_usage_in_bytes"))
            if peak is None:
                notes.append("no memory.max_usage_in_bytes: sample memory.usage_in_bytes "
                             "or use sacct for the peak")
        else:
            notes.append("job not in the memory hierarchy (ConstrainRAMSpace off?)")
        source = f"cgroup1:/{jcg.cpu_dir or jcg.memory_dir or jcg.pids_dir}"
    return CgroupUsage(cpu_s, cur, peak, source, notes)


def read_cpuset(hostfs: HostFS, jcg: JobCgroup) -> list[int] | None:
    """The job's effective CPUs (else ``cpuset.cpus``); None when unreadable.

    Raises:
        InputError: a cpuset file that is not a CPU list (a corrupt fake tree).
    """
    if not jcg.cpuset_dir:
        return None
    names = (("cpuset.cpus.effective", "cpuset.cpus") if jcg.version == 2
             else ("cpuset.effective_cpus", "cpuset.cpus"))
    for name in names:
        text = hostfs.read(_join(jcg.cpuset_dir, name))
        if text is not None and text.strip():
            return parse_cpulist(text)
    return None


def read_pids(hostfs: HostFS, jcg: JobCgroup, max_pids: int = PIDS_MAX,
              max_dirs: int = PIDS_MAX_DIRS) -> list[int]:
    """The PIDs of the job dir's and its sub-cgroups' ``cgroup.procs``, sorted, bounded."""
    if not jcg.pids_dir:
        return []
    pids: set[int] = set()
    queue = deque([jcg.pids_dir])
    dirs = 0
    while queue and dirs < max_dirs and len(pids) < max_pids:
        d = queue.popleft()
        dirs += 1
        for line in (hostfs.read(_join(d, "cgroup.procs")) or "").splitlines():
            line = line.strip()
            if line.isdigit():
                pids.add(int(line))
                if len(pids) >= max_pids:
                    break
        for entry in hostfs.listdir(d):
            if entry.startswith(("cgroup.", "cpu.", "memory.", "cpuset.", "io.", "pids.")):
                continue               # controller files, not sub-cgroups
            sub = _join(d, entry)
            if _is_dir(hostfs, sub):
                queue.append(sub)
    return sorted(pids)

