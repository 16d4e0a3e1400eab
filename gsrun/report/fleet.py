"""The cluster's view over a time window (pure): accounting rows and blob
figures (:mod:`gsrun.report.fleet_source`) folded one job at a time into
per-user / account / partition sums and bounded top-N heaps, then ranked
:class:`Table` s and per-user digests. Sources: GPU-hours = AllocTRES
``gres/gpu`` x Elapsed; utilization, GPU memory and host memory from the
blob (gsrun's ``sm_active_pct``, ``energy_j``); cores / memory per GPU
against the partition's node share (``sinfo``, or the site's config); MIG
fit and smaller model: :func:`mig_fit`, :meth:`FleetReport._model_rows`;
fragmentation: more nodes than ceil(GPUs / GPUs per node); time limit used
= Elapsed / Timelimit of completed jobs. docs/ADMIN.md explains each table.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, field, fields

from gsrun.report.fleet_source import JobFigures, JobRow
from gsrun.request.mig_layout import parse_layout

GIB = 1 << 30
MIB = 1 << 20

#: (lowest GPU memory GiB, [(profile, compute slices, memory MiB)]), largest first: the H200's from NVML
#: (tests/data/nvml/h200-mig.json), H100/A100 80GB and A100 40GB from NVIDIA's MIG user guide.
MIG_PROFILES: tuple[tuple[float, tuple[tuple[str, int, int], ...]], ...] = (
    (120.0, (("1g.18gb", 1, 16384), ("1g.35gb", 1, 33280), ("2g.35gb", 2, 33280), ("3g.71gb", 3, 71424),
             ("4g.71gb", 4, 71424), ("7g.141gb", 7, 143360))),
    (70.0, (("1g.10gb", 1, 9856), ("1g.20gb", 1, 19968), ("2g.20gb", 2, 19968), ("3g.40gb", 3, 40192),
            ("4g.40gb", 4, 40192), ("7g.80gb", 7, 80384))),
    (35.0, (("1g.5gb", 1, 4864), ("1g.10gb", 1, 9984), ("2g.10gb", 2, 9984), ("3g.20gb", 3, 19968),
            ("4g.20gb", 4, 19968), ("7g.40gb", 7, 40192))),
)
COMPUTE_SLICES = 7
for _lo, _profiles in MIG_PROFILES:       # every name is a valid layout term (gsrun --mig takes it)
    parse_layout("+".join(p[0] for p in _profiles))


def mig_fit(mem_peak_bytes: float, mem_total_bytes: float, compute_pct: float,
            headroom_pct: float) -> str | None:
    """The smallest MIG profile of that GPU holding the memory peak and compute share with
    ``headroom_pct`` to spare; None when only the whole GPU does or no class matches."""
    total_gib = mem_total_bytes / GIB
    table = next((p for lo, p in MIG_PROFILES if total_gib >= lo), None)
    if table is None or total_gib > 200:
        return None
    k = 1.0 + headroom_pct / 100.0
    for name, slices, mem_mib in sorted(table, key=lambda p: (p[1], p[2])):
        if slices >= COMPUTE_SLICES:
            return None
        if mem_mib * MIB >= mem_peak_bytes * k and slices / COMPUTE_SLICES * 100.0 >= compute_pct * k:
            return name
    return None


@dataclass(frozen=True)
class NodeShare:
    """A partition's smallest GPU node as ``sinfo`` says: cores, memory bytes, GPUs."""

    cores: int
    mem_bytes: int
    gpus: int

    @property
    def cores_per_gpu(self) -> float:
        return self.cores / self.gpus

    @property
    def mem_per_gpu_bytes(self) -> float:
        return self.mem_bytes / self.gpus


def parse_sinfo_models(text: str) -> list[str]:
    """``sinfo -h -N -o %P|%c|%m|%G`` -> the gres GPU types (``gpu:a100:4`` -> ``a100``), sorted."""
    out = set()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        for g in parts[3].split(","):
            bits = g.split("(", 1)[0].split(":")
            if len(bits) == 3 and bits[0] == "gpu" and bits[1]:
                out.add(bits[1])
    return sorted(out)


def parse_sinfo_nodes(text: str) -> dict[str, NodeShare]:
    """``sinfo -h -N -o %P|%c|%m|%G`` (``%m`` MiB; ``%G`` like ``gpu:h200:8(S:0-1),...``) -> partition ->
    :class:`NodeShare` of its GPU node with the fewest cores per GPU."""
    out: dict[str, NodeShare] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        part, cores, mem, gres = parts
        gpus = 0
        for g in gres.split(","):
            g = g.split("(", 1)[0]
            if g.startswith("gpu:"):
                last = g.rsplit(":", 1)[-1]
                gpus += int(last) if last.isdigit() else 0
        if not gpus or not cores.strip().isdigit() or not mem.strip().rstrip("+").isdigit():
            continue
        share = NodeShare(int(cores), int(mem.strip().rstrip("+")) * MIB, gpus)
        part = part.strip().rstrip("*")
        old = out.get(part)
        if old is None or share.cores_per_gpu < old.cores_per_gpu:
            out[part] = share
    return out


@dataclass(frozen=True)
class Thresholds:
    """The report's thresholds (site config; :func:`thresholds_from_config` names the keys)."""

    zero_util_pct: float = 0.0
    low_util_pct: float = 25.0
    low_sm_pct: float = 25.0
    min_gpu_hours: float = 1.0
    mem_overrequest_pct: float = 25.0
    time_limit_used_pct: float = 25.0
    mig_headroom_pct: float = 20.0
    cores_per_gpu: float = 0.0          # 0: the node's share from sinfo
    mem_per_gpu_gib: float = 0.0        # 0: the node's share from sinfo
    top: int = 20


def thresholds_from_config(cfg) -> Thresholds:
    """From ``cluster_report.*`` and the ``findings.*`` thresholds of the same meaning."""
    keys = {"low_util_pct": "findings.low_util_warn_pct", "low_sm_pct": "findings.low_sm_activity_pct",
            "mem_overrequest_pct": "findings.mem_overrequest_pct",
            "time_limit_used_pct": "findings.time_limit_used_pct"}
    return Thresholds(**{f.name: (int if f.name == "top" else float)(cfg[keys.get(f.name, "cluster_report." + f.name)])
                         for f in fields(Thresholds)})


@dataclass
class Table:
    """One ranked table: ``rows`` of unrounded values under ``columns``; ``jobs`` considered, ``no_figures``
    of them without the figures it needs."""

    key: str
    title: str
    columns: list[str]
    rows: list[list]
    thresholds: dict
    jobs: int
    no_figures: int
    notes: list[str] = field(default_factory=list)


@dataclass
class _Who:
    """Per user (or account) sums."""

    jobs: int = 0
    gpu_jobs: int = 0
    gpu_h: float = 0.0
    cpu_h: float = 0.0
    zero_gpu_h: float = 0.0
    zero_jobs: int = 0
    zero_ids: list = field(default_factory=list)
    alerts: int = 0
    util_gpu_h: float = 0.0
    util_w: float = 0.0
    sm_gpu_h: float = 0.0
    sm_w: float = 0.0
    over_gpu_h: float = 0.0
    over_cores_jobs: int = 0
    max_cores_per_gpu: float = 0.0
    over_mem_jobs: int = 0
    max_mem_per_gpu: float = 0.0
    host_used: float = 0.0
    host_req: float = 0.0
    low_host_jobs: int = 0
    mig_jobs: int = 0
    mig_gpu_h: float = 0.0
    mig_profiles: dict = field(default_factory=dict)
    mig_ids: list = field(default_factory=list)
    tl_jobs: int = 0
    tl_elapsed_s: float = 0.0
    tl_limit_s: float = 0.0
    tl_unused_gpu_h: float = 0.0
    energy_j: float = 0.0
    energy_jobs: int = 0
    energy_gpu_h: float = 0.0
    users: set = field(default_factory=set)


IDS_KEPT = 5          # job ids kept per user and table (the rest counted)


def _id_key(job_id: str) -> tuple:
    """Job ids in numeric order (``4104_7`` after ``4104``)."""
    return tuple(int(p) if p.isdigit() else 0 for p in job_id.replace("_", ".").split("."))


def _keep(ids: list, job_id: str) -> None:
    if len(ids) < IDS_KEPT:
        ids.append(job_id)


class _Top:
    """The ``n`` largest items by key, in bounded memory."""

    def __init__(self, n: int):
        self.n, self.heap, self.seq = n, [], 0

    def add(self, key: float, item) -> None:
        self.seq += 1
        entry = (key, -self.seq, item)
        if len(self.heap) < self.n:
            heapq.heappush(self.heap, entry)
        elif entry > self.heap[0]:
            heapq.heapreplace(self.heap, entry)

    def items(self) -> list:
        return [e[2] for e in sorted(self.heap, reverse=True)]


@dataclass
class UserDigest:
    """What one user's digest says (jobs that ended after the user's last digest)."""

    user: str
    jobs: int = 0
    gpu_h: float = 0.0
    last_end_s: float = 0.0
    zero: list = field(default_factory=list)        # [job id, GPU-hours at 0 %]
    zero_more: int = 0
    low: list = field(default_factory=list)         # [job id, util %, SM % or None, GPU-hours]
    low_more: int = 0
    over: list = field(default_factory=list)        # [job id, cores/GPU, share, mem GiB/GPU, share GiB]
    over_more: int = 0
    mig: list = field(default_factory=list)         # [job id, profile, GPU mem peak GiB, compute %]
    mig_more: int = 0
    time_limit: list = field(default_factory=list)  # [job id, elapsed s, limit s]
    time_limit_more: int = 0
    energy_kwh: float = 0.0

    def findings(self) -> int:
        return sum(len(getattr(self, k)) + getattr(self, k + "_more") for k in DIGEST_LISTS)


DIGEST_JOBS_KEPT = 10
DIGEST_LISTS = ("zero", "low", "over", "mig", "time_limit")


def _dkeep(d: UserDigest, name: str, item: list) -> None:
    lst = getattr(d, name)
    if len(lst) < DIGEST_JOBS_KEPT:
        lst.append(item)
    else:
        setattr(d, name + "_more", getattr(d, name + "_more") + 1)


@dataclass
class _ModelFit:
    """Jobs of one user and GPU model whose memory need rounds up to the same GiB."""

    jobs: int = 0
    gpu_h: float = 0.0
    ids: list = field(default_factory=list)


class FleetReport:
    """Folds jobs into the tables. ``shares``: partition -> :class:`NodeShare`; ``models``: sinfo's gres
    types; ``digest_after``: user -> epoch s after which a job enters the digest."""

    def __init__(self, th: Thresholds, shares: dict[str, NodeShare] | None = None,
                 digest_after: dict[str, float] | None = None, digests: bool = False,
                 models: list[str] | None = None):
        self.th = th
        self.sinfo_models = list(models or [])
        self.model_mem: dict[tuple[str, str], int] = {}      # (cluster, model) -> GPU memory total, bytes
        self.model_fit: dict[tuple[str, str, str, int], _ModelFit] = {}   # (cluster, model, user, GiB needed)
        self.model_no_figures = 0
        self.shares = shares or {}
        self.digest_after = digest_after or {}
        self.want_digests = digests
        self.users: dict[str, _Who] = {}
        self.accounts: dict[str, _Who] = {}
        self.partitions: dict[str, _Who] = {}
        self.clusters: set[str] = set()
        self.jobs = 0
        self.gpu_jobs = 0
        self.gpu_no_figures = 0
        self.no_figures_why: dict[str, int] = {}
        self.no_share = 0
        self.no_time_limit = 0
        self.no_energy = 0
        self.mig_no_figures = 0
        self.frag = _Top(th.top)
        self.most_gpus = _Top(th.top)
        self.queued = _Top(th.top)
        self.no_submit = 0
        self.frag_jobs = 0
        self.multinode = 0
        self.frag_no_share = 0
        self.tl_considered = 0
        self.digest: dict[str, UserDigest] = {}

    def _share(self, partition: str) -> tuple[float | None, float | None, int | None]:
        s = self.shares.get(partition)
        cpg = self.th.cores_per_gpu or (s.cores_per_gpu if s else None)
        mpg = self.th.mem_per_gpu_gib * GIB if self.th.mem_per_gpu_gib else (s.mem_per_gpu_bytes if s else None)
        return cpg, mpg, (s.gpus if s else None)

    def add(self, job: JobRow, figs: JobFigures | None, why: str | None = None) -> None:
        """Fold one job (``figs`` None: its blob gave nothing; ``why`` says why)."""
        th = self.th
        self.jobs += 1
        self.clusters.add(job.cluster)
        el_h = job.elapsed_s / 3600.0
        gpu_h = job.gpus * el_h
        cpu_h = job.cpus * el_h
        u, a, p = (d.get(k) or d.setdefault(k, _Who()) for d, k in ((self.users, job.user),
                   (self.accounts, job.account), (self.partitions, job.partition)))
        for w in (u, a, p):
            w.jobs += 1
            w.gpu_h += gpu_h
            w.cpu_h += cpu_h
        a.users.add(job.user)
        p.users.add(job.user)
        if job.submit_s is not None and job.start_s is not None:
            self.queued.add(job.start_s - job.submit_s, [job.job_id, job.user, job.account, job.partition,
                                                         job.gpus, job.start_s - job.submit_s])
        elif job.submit_s is None:
            self.no_submit += 1
        if job.gpus <= 0:
            return
        self.gpu_jobs += 1
        for w in (u, a, p):
            w.gpu_jobs += 1
        self.most_gpus.add(job.gpus + gpu_h / 1e9, [job.job_id, job.user, job.account, job.partition, job.gpus,
                                                   job.nnodes, gpu_h])
        d = None
        if self.want_digests and (job.end_s or 0) > self.digest_after.get(job.user, float("-inf")):
            d = self.digest.get(job.user) or self.digest.setdefault(job.user, UserDigest(job.user))
            d.jobs += 1
            d.gpu_h += gpu_h
            d.last_end_s = max(d.last_end_s, job.end_s or 0.0)
        cpg, mpg, gpn = self._share(job.partition)

        # sacct-only figures: fragmentation, time limits, allocation per GPU
        if job.nnodes > 1:
            self.multinode += 1
            if gpn:
                need = math.ceil(job.gpus / gpn)
                if job.nnodes > need:
                    self.frag_jobs += 1
                    self.frag.add(gpu_h, [job.job_id, job.user, job.account, job.partition, job.gpus, job.nnodes,
                                          need, gpu_h])
            else:
                self.frag_no_share += 1
        if job.state == "COMPLETED":
            self.tl_considered += 1
            if job.time_limit_s:
                u.tl_jobs += 1
                u.tl_elapsed_s += job.elapsed_s
                u.tl_limit_s += job.time_limit_s
                u.tl_unused_gpu_h += job.gpus * max(0.0, job.time_limit_s - job.elapsed_s) / 3600.0
                if d is not None and job.elapsed_s < job.time_limit_s * th.time_limit_used_pct / 100.0:
                    _dkeep(d, "time_limit", [job.job_id, job.elapsed_s, job.time_limit_s])
            else:
                self.no_time_limit += 1
        over = False
        if cpg is None or mpg is None:
            self.no_share += 1
        else:
            c = job.cpus / job.gpus
            m = (job.mem_req_bytes or 0) / job.gpus
            u.max_cores_per_gpu = max(u.max_cores_per_gpu, c)
            u.max_mem_per_gpu = max(u.max_mem_per_gpu, m)
            if c > cpg + 1e-9:
                u.over_cores_jobs += 1
                over = True
            if job.mem_req_bytes and m > mpg + 1:
                u.over_mem_jobs += 1
                over = True
            if over:
                u.over_gpu_h += gpu_h
                if d is not None:
                    _dkeep(d, "over", [job.job_id, c, cpg, m / GIB, mpg / GIB])

        if figs is None:
            self.gpu_no_figures += 1
            self.no_figures_why[why or "no blob"] = self.no_figures_why.get(why or "no blob", 0) + 1
            self.no_energy += 1
            self.mig_no_figures += 1
            return
        u.alerts += figs.alerts
        if figs.host_mem_used_bytes is not None and figs.host_mem_req_bytes:
            u.host_used += figs.host_mem_used_bytes
            u.host_req += figs.host_mem_req_bytes
            if figs.host_mem_used_bytes < figs.host_mem_req_bytes * th.mem_overrequest_pct / 100.0:
                u.low_host_jobs += 1
        util = figs.gpu_util_pct
        if util:
            zero = sum(1 for x in util if x <= th.zero_util_pct) / len(util)
            mean = sum(util) / len(util)
            for w in (u, a):
                w.util_gpu_h += gpu_h
                w.util_w += mean * gpu_h
                if zero:
                    w.zero_gpu_h += zero * gpu_h
                    w.zero_jobs += 1
                    _keep(w.zero_ids, job.job_id)
            if figs.sm_active_pct is not None:
                u.sm_gpu_h += gpu_h
                u.sm_w += figs.sm_active_pct * gpu_h
            if d is not None:
                if zero:
                    _dkeep(d, "zero", [job.job_id, zero * gpu_h])
                elif gpu_h >= th.min_gpu_hours and (mean < th.low_util_pct or (
                        figs.sm_active_pct is not None and figs.sm_active_pct < th.low_sm_pct)):
                    _dkeep(d, "low", [job.job_id, mean, figs.sm_active_pct, gpu_h])
        else:
            self.mig_no_figures += 1
        if figs.energy_j is not None:
            for w in (u, a):
                w.energy_j += figs.energy_j
                w.energy_jobs += 1
                w.energy_gpu_h += gpu_h
            if d is not None:
                d.energy_kwh += figs.energy_j / 3.6e6
        else:
            self.no_energy += 1
        if util and figs.gpu_mem_used_bytes and len(figs.gpu_mem_used_bytes) == len(figs.gpu_mem_total_bytes):
            peak = max(figs.gpu_mem_used_bytes)
            compute = figs.sm_active_pct if figs.sm_active_pct is not None else max(util)
            prof = mig_fit(peak, min(figs.gpu_mem_total_bytes), compute, th.mig_headroom_pct)
            if prof is not None:
                u.mig_jobs += 1
                u.mig_gpu_h += gpu_h
                u.mig_profiles[prof] = u.mig_profiles.get(prof, 0) + 1
                _keep(u.mig_ids, job.job_id)
                if d is not None:
                    _dkeep(d, "mig", [job.job_id, prof, peak / GIB, compute])
        elif util:
            self.mig_no_figures += 1
        self._model(job, figs, gpu_h)

    def _model(self, job: JobRow, figs: JobFigures, gpu_h: float) -> None:
        """Record the model's memory and, for low compute, the job's need in whole GiB."""
        util, used, total = figs.gpu_util_pct, figs.gpu_mem_used_bytes, figs.gpu_mem_total_bytes
        if not (job.gpu_type and util and used and len(used) == len(total)):
            self.model_no_figures += 1
            return
        key = (job.cluster, job.gpu_type)
        if max(total) > self.model_mem.get(key, 0):
            self.model_mem[key] = max(total)
        compute = figs.sm_active_pct if figs.sm_active_pct is not None else max(util)
        if compute >= self.th.low_sm_pct:
            return
        need = math.ceil(max(used) * (1.0 + self.th.mig_headroom_pct / 100.0) / GIB)
        f = self.model_fit.setdefault((job.cluster, job.gpu_type, job.user, need), _ModelFit())
        f.jobs += 1
        f.gpu_h += gpu_h
        _keep(f.ids, job.job_id)

    def _model_rows(self) -> list[list]:
        """``[user, model, smaller model, jobs, GPU-h, job ids]`` by GPU-hours: the smaller model is the
        cluster's model with the least memory that holds the need."""
        rows: dict[tuple[str, str, str], _ModelFit] = {}
        for (cluster, model, user, need), f in self.model_fit.items():
            own = self.model_mem[(cluster, model)]
            smaller = [(mem, m) for (c, m), mem in self.model_mem.items()
                       if c == cluster and mem < own and mem >= need * GIB]
            if not smaller:
                continue
            to = min(smaller)[1]
            r = rows.get((user, model, to)) or rows.setdefault((user, model, to), _ModelFit())
            r.jobs += f.jobs
            r.gpu_h += f.gpu_h
            for i in f.ids:
                _keep(r.ids, i)
        out = sorted(rows.items(), key=lambda kv: (-kv[1].gpu_h, kv[0]))[:self.th.top]
        return [[u, m, to, f.jobs, f.gpu_h, self._ids(sorted(f.ids, key=_id_key), f.jobs)]
                for (u, m, to), f in out]

    def _model_notes(self) -> list[str]:
        seen = sorted(self.model_mem.items())
        notes = ["GPU models: " + (", ".join(f"{m} ({mem / GIB:.0f} GiB)" for (_, m), mem in seen) or "none seen")]
        unseen = [m for m in self.sinfo_models if m not in {k[1] for k in self.model_mem}]
        if unseen:
            notes.append("models sinfo names without a job with figures (memory unknown): " + ", ".join(unseen))
        return notes

    def _ids(self, ids: list, n: int) -> str:
        return ",".join(ids) + (f" +{n - len(ids)}" if n > len(ids) else "")

    def tables(self) -> list[Table]:
        """Every table, in the order an admin reads them."""
        th, top = self.th, self.th.top
        nf = self.gpu_no_figures
        out = []

        def ranked(d: dict, key, keep, row, limit=top):
            items = [(k, w) for k, w in d.items() if keep(w)]
            items.sort(key=lambda kw: (-key(kw[1]), kw[0]))
            return [row(k, w) for k, w in items[:limit]]

        for who, d in (("user", self.users), ("account", self.accounts)):
            out.append(Table(
                f"zero_util_{who}", f"GPU-hours at 0 % utilization per {who}",
                [who, "GPU-h at 0%", "GPU-h", "share", "jobs at 0%", "job ids", "alerts"],
                ranked(d, lambda w: w.zero_gpu_h, lambda w: w.zero_gpu_h > 0,
                       lambda k, w: [k, w.zero_gpu_h, w.gpu_h, 100.0 * w.zero_gpu_h / w.gpu_h if w.gpu_h else None,
                                     w.zero_jobs, self._ids(w.zero_ids, w.zero_jobs), w.alerts]),
                {"zero_util_pct": th.zero_util_pct}, self.gpu_jobs, nf))
        out.append(Table(
            "low_efficiency", "Low GPU efficiency per user (GPU-hours-weighted)",
            ["user", "GPU-h", "util", "SM active", "jobs"],
            ranked(self.users, lambda w: w.util_gpu_h,
                   lambda w: w.util_gpu_h >= th.min_gpu_hours and (
                       w.util_w / w.util_gpu_h < th.low_util_pct
                       or (w.sm_gpu_h > 0 and w.sm_w / w.sm_gpu_h < th.low_sm_pct)),
                   lambda k, w: [k, w.util_gpu_h, w.util_w / w.util_gpu_h,
                                 w.sm_w / w.sm_gpu_h if w.sm_gpu_h else None, w.gpu_jobs]),
            {"low_util_pct": th.low_util_pct, "low_sm_pct": th.low_sm_pct, "min_gpu_hours": th.min_gpu_hours},
            self.gpu_jobs, nf))
        out.append(Table(
            "over_allocation", "Over-allocation per GPU per user (CPU cores, CPU memory, host memory used)",
            ["user", "GPU-h over", "jobs >cores", "max cores/GPU", "jobs >mem", "max mem/GPU GiB", "host mem used",
             "jobs <used"],
            ranked(self.users, lambda w: w.over_gpu_h,
                   lambda w: w.over_cores_jobs or w.over_mem_jobs or w.low_host_jobs,
                   lambda k, w: [k, w.over_gpu_h, w.over_cores_jobs, w.max_cores_per_gpu, w.over_mem_jobs,
                                 w.max_mem_per_gpu / GIB, 100.0 * w.host_used / w.host_req if w.host_req else None,
                                 w.low_host_jobs]),
            {"cores_per_gpu": th.cores_per_gpu or "node share (sinfo)",
             "mem_per_gpu_gib": th.mem_per_gpu_gib or "node share (sinfo)",
             "mem_overrequest_pct": th.mem_overrequest_pct},
            self.gpu_jobs, nf, [f"{self.no_share} GPU jobs in partitions without a known node share"]
            if self.no_share else []))
        out.append(Table(
            "mig_fit", "Jobs a MIG slice of the same GPU would have served, per user",
            ["user", "jobs", "GPU-h", "profiles", "job ids"],
            ranked(self.users, lambda w: w.mig_gpu_h, lambda w: w.mig_jobs,
                   lambda k, w: [k, w.mig_jobs, w.mig_gpu_h,
                                 " ".join(f"{n}x{p}" for p, n in sorted(w.mig_profiles.items(),
                                                                        key=lambda pn: (-pn[1], pn[0]))),
                                 self._ids(w.mig_ids, w.mig_jobs)]),
            {"mig_headroom_pct": th.mig_headroom_pct}, self.gpu_jobs, self.mig_no_figures))
        out.append(Table(
            "model_fit", "Jobs a smaller GPU model of the cluster would have served, per user",
            ["user", "model", "smaller model", "jobs", "GPU-h", "job ids"], self._model_rows(),
            {"low_sm_pct": th.low_sm_pct, "mig_headroom_pct": th.mig_headroom_pct},
            self.gpu_jobs, self.gpu_no_figures + self.model_no_figures, self._model_notes()))
        out.append(Table(
            "fragmentation", "Multinode GPU fragmentation (more nodes than the GPUs need)",
            ["job", "user", "account", "partition", "GPUs", "nodes", "nodes needed", "GPU-h"],
            self.frag.items(), {"gpus_per_node": "node (sinfo)"}, self.multinode,
            self.frag_no_share,
            [f"{self.frag_jobs} of {self.multinode} multinode GPU jobs fragmented"]))
        out.append(Table(
            "time_limits", "Time limits far beyond run times (completed GPU jobs), per user",
            ["user", "jobs", "limit used", "GPU-h unused", "mean run", "mean limit"],
            ranked(self.users, lambda w: w.tl_unused_gpu_h,
                   lambda w: w.tl_jobs and w.tl_elapsed_s < w.tl_limit_s * th.time_limit_used_pct / 100.0
                   and w.tl_unused_gpu_h >= th.min_gpu_hours,
                   lambda k, w: [k, w.tl_jobs, 100.0 * w.tl_elapsed_s / w.tl_limit_s, w.tl_unused_gpu_h,
                                 w.tl_elapsed_s / w.tl_jobs, w.tl_limit_s / w.tl_jobs]),
            {"time_limit_used_pct": th.time_limit_used_pct, "min_gpu_hours": th.min_gpu_hours},
            self.tl_considered, self.no_time_limit))
        for who, d in (("user", self.users), ("account", self.accounts)):
            out.append(Table(
                f"energy_{who}", f"GPU energy per {who}",
                [who, "kWh", "GPU-h", "Wh per GPU-h", "jobs"],
                ranked(d, lambda w: w.energy_j, lambda w: w.energy_jobs,
                       lambda k, w: [k, w.energy_j / 3.6e6, w.energy_gpu_h,
                                     w.energy_j / 3600.0 / w.energy_gpu_h if w.energy_gpu_h else None,
                                     w.energy_jobs]),
                {}, self.gpu_jobs, self.no_energy))
        for who, d in (("partition", self.partitions), ("account", self.accounts)):
            out.append(Table(
                f"usage_{who}", f"Usage per {who}",
                [who, "jobs", "GPU jobs", "GPU-h", "CPU-h", "users"],
                ranked(d, lambda w: w.gpu_h, lambda w: True,
                       lambda k, w: [k, w.jobs, w.gpu_jobs, w.gpu_h, w.cpu_h, len(w.users)], limit=10 ** 9),
                {}, self.jobs, 0))
        out.append(Table("most_gpus", "Jobs with the most GPUs",
                         ["job", "user", "account", "partition", "GPUs", "nodes", "GPU-h"],
                         self.most_gpus.items(), {}, self.gpu_jobs, 0))
        out.append(Table("longest_queued", "Longest queued jobs",
                         ["job", "user", "account", "partition", "GPUs", "queued"],
                         self.queued.items(), {}, self.jobs, self.no_submit))
        return out

    def digests(self) -> list[UserDigest]:
        """Per-user digests with at least one finding, by user name."""
        return [d for _, d in sorted(self.digest.items()) if d.findings()]

    def to_json(self) -> dict:
        return {"jobs": self.jobs, "gpu_jobs": self.gpu_jobs, "gpu_jobs_no_figures": self.gpu_no_figures,
                "no_figures_why": dict(sorted(self.no_figures_why.items())),
                "tables": [asdict(t) for t in self.tables()]}
