"""Node and job efficiency summaries (schema ``gsrun.summary/1``) and the JS1 blob. Pure.

Units are in the names; None means N/A, never 0; each GPU figure's NVML
source is its field doc in :class:`~gsrun.report.records.GpuSummary`.
Job level, over :func:`~gsrun.report.findings.run_time_s` (Slurm's elapsed,
else the samplers' span): CPU efficiency = CPU s / (cores x run time), clamped
to 100 (``anomaly`` above 105 %); memory = sum of node high waters / request;
GPU-hours allocated = GPUs x run time; used = sum of ``util_busy_s`` / 3600.

JS1 blob (``AdminComment``; Princeton jobstats' ``report_job_json`` layout,
read by jobstats and reportseff; GPU keys are ``/dev/nvidiaN`` minors)::

    {"gpus": <GPUs allocated>, "total_time": <int: run time, s>,
     "nodes": {"<node>": {"cpus", "total_time": <CPU s>, "used_memory", "total_memory": <bytes>,
               "gpu_utilization": {"<minor>": <mean %>},
               "gpu_used_memory" / "gpu_total_memory": {"<minor>": <bytes>}}},
     "gsrun": {"schema", "cpu_eff_pct", "energy_j", "sm_active_pct" / "tensor_active_pct": {"node:minor": pct},
               "lost": {"node:minor": lost_at_s}, "energy_estimated": true (if any), "alerts": <int, if any>}}
"""

from __future__ import annotations

import base64
import gzip
import json
import statistics
from dataclasses import replace
from typing import Iterable

from gsrun import SUMMARY_SCHEMA
from gsrun.base.record import ABSENT, known, or_none
from gsrun.facts.aggregate import Counter, Metric
from gsrun.facts.sacct import epoch_or_none, parse_tres, time_s_or_none, tres_gpus
from gsrun.facts.sampler_state import GpuState, SamplerState
from gsrun.facts.slurm import state_word
from gsrun.report.findings import finding_records, real_gpus, run_time_s
from gsrun.report.records import (CpuFigures, GpuFigures, GpuSummary, JobInfo, JobSummary, MemoryFigures, NodeDetail,
                                  NodeSummary, SettingsGroup, WasteDetection)

IDLE_UTIL_PCT = 5.0      # util_idle_frac: share of time below this (a sampler threshold)


def _metric(g: GpuState, key: str) -> Metric:
    m = g.metrics.get(key)
    return Metric.from_dict(m.to_json() if m is not None else {})


def _sum(xs) -> float | None:
    xs = [x for x in xs if known(x)]
    return sum(xs) if xs else None


def _r(x, nd=1):
    return None if x is None else round(float(x), nd)


def gpu_record(g: GpuState, node: str, nvml_error: str | None = None) -> GpuSummary:
    """One GPU's :class:`~gsrun.report.records.GpuSummary` from its sampler state."""
    ref = g.ref
    util = _metric(g, "util_pct")
    sm = _metric(g, "sm_active_pct")
    tensor = _metric(g, "tensor_active_pct")
    mem = _metric(g, "mem_used_bytes")
    power = _metric(g, "power_w")
    energy = Counter.from_dict(g.energy.to_json())
    energy_estimated = False
    if energy.first is not None and energy.span_s is not None and energy.span_s > 0:
        energy_j = energy.total / 1000.0
    elif power.weight_s > 0:
        energy_j = power.wsum          # W x s = J over the covered time
        energy_estimated = True
    else:
        energy_j = None                # no reading: unknown, never 0
    first, last_ok = g.first_s, g.last_ok_s
    covered_s = (last_ok - first) if first is not None and last_ok is not None else None
    span = energy.span_s
    power_mean = energy_j / span if energy_j is not None and not energy_estimated and span and span > 0 \
        else power.mean
    ecc = None if g.ecc_uncorrected_last is None else int(g.ecc_uncorrected_last - (g.ecc_uncorrected_first or 0))
    unsupported = dict(g.unsupported)
    if g.lost_at_s is not None:
        status = "lost"
    elif ref.nvml_index is None:
        status = "unavailable" if nvml_error else "emulated"
    else:
        status = "ok"
    util_na = None
    if util.mean is None and status in ("ok", "lost"):
        util_na = "MIG" if ref.mig else (unsupported.get("utilization")
                                         or unsupported.get("util_samples") or "no reading")
    mem_total = ref.mem_total_bytes
    mem_peak = None if mem.max is None else int(mem.max)
    procs = _metric(g, "mem_procs_bytes")
    mem_src = g.mem_source if isinstance(g.mem_source, str) else None
    base = g.mem_baseline_bytes if isinstance(g.mem_baseline_bytes, int) else None
    v1 = mem_src is not None and "v2" not in mem_src
    return GpuSummary(
        node=node,
        index=ref.gres_index,
        nvml_index=ref.nvml_index,
        name=ref.name,
        uuid=ref.uuid,
        pci_bus_id=ref.pci_bus_id,
        mig=bool(ref.mig),
        status=status,
        util_mean_pct=_r(util.mean),
        util_na_reason=util_na,
        util_idle_frac=_r(None if util.weight_s <= 0 else 1.0 - (util.frac_above(IDLE_UTIL_PCT) or 0.0), 3),
        util_gap_s=_r(util.gap_s),
        util_busy_s=_r(util.wsum / 100.0 if util.weight_s > 0 else None),
        sm_active_mean_pct=_r(sm.mean),
        sm_occupancy_mean_pct=_r(_metric(g, "sm_occupancy_pct").mean),
        tensor_active_mean_pct=_r(tensor.mean),
        dram_bw_mean_pct=_r(_metric(g, "dram_bw_pct").mean),
        mem_peak_bytes=mem_peak,
        mem_total_bytes=mem_total,
        mem_peak_pct=_r(100.0 * mem_peak / mem_total if mem_peak is not None and mem_total else None),
        energy_j=_r(energy_j),
        energy_counter_resets=energy.resets,
        energy_estimated=True if energy_estimated else ABSENT,
        mem_source=mem_src if v1 else ABSENT,
        mem_baseline_bytes=base if v1 and base is not None else ABSENT,
        mem_procs_peak_bytes=int(procs.max) if procs.max is not None else ABSENT,
        power_mean_w=_r(power_mean),
        power_max_w=_r(power.max),
        power_limit_w=_r(ref.power_limit_w) if isinstance(ref.power_limit_w, (int, float)) else ABSENT,
        temperature_max_c=_r(_metric(g, "temperature_c").max),
        sm_clock_mean_mhz=_r(_metric(g, "sm_clock_mhz").mean, 0),
        throttle_s={k: _r(v) for k, v in g.throttle_s.items()},
        xid=g.xid,
        ecc_uncorrected=ecc,
        lost_at_s=g.lost_at_s,
        lost_reason=g.lost_reason,
        covered_s=_r(covered_s),
        unsupported=unsupported,
        timeline={k: v.points for k, v in g.timeline.items()},
        emulated=status == "emulated",
    )


def node_record(state: SamplerState | dict | None, job_env: dict, end_time: float) -> NodeSummary:
    """The epilog's summary of one node. ``state``: ``sampler.json`` (None:
    no sampler ran); ``job_env``: :mod:`gsrun.facts.jobenv`; ``end_time``: epoch s.

    Raises:
        ValueError: ``state`` is not a sampler state.
    """
    node = job_env["node"]
    if state is None:
        start = job_env.get("prolog_time") or end_time
        return NodeSummary(
            schema=SUMMARY_SCHEMA, kind="node", job_id=job_env["job_id"], node=node,
            start_time=start, end_time=end_time, elapsed_s=_r(end_time - start, 3),
            cpus_alloc=job_env.get("cpus_on_node"), gres_gpus=job_env.get("gpus") or [],
            cpu_time_s=None, cpu_source=None, mem_peak_bytes=None, mem_source=None,
            gpu_available=False, gpu_reason="no sampler state (sampler did not run)",
            gpus=[], samples=0, notes=["no sampler state"])
    st = state if isinstance(state, SamplerState) else SamplerState.from_json(state)
    nvml_error = st.nvml_error
    gpus = [gpu_record(g, node, nvml_error) for g in st.gpus]
    real = [g for g in gpus if g.status in ("ok", "lost")]
    reason = nvml_error or ("no NVIDIA device matches the job's gres (emulated GPUs)" if gpus and not real else None)
    notes = list(st.notes)
    if st.gap_s:
        notes.append(f"sampler not running for {st.gap_s:.0f} s (counted as gap, not as 0)")
    elif not gpus:
        reason = "job has no GPUs on this node"
    return NodeSummary(
        schema=SUMMARY_SCHEMA, kind="node", job_id=st.job_id, node=node,
        start_time=st.start_time, end_time=end_time, elapsed_s=round(float(max(0.0, end_time - st.start_time)), 3),
        cpus_alloc=job_env.get("cpus_on_node"), gres_gpus=job_env.get("gpus") or [],
        cpu_time_s=_r(st.cpu.time_s, 3), cpu_source=st.cpu.source,
        mem_peak_bytes=None if st.mem.peak_bytes is None else int(st.mem.peak_bytes),
        mem_source=st.mem.source,
        gpu_available=bool(real) and not nvml_error, gpu_reason=reason,
        gpus=gpus, samples=st.samples, notes=notes,
        cpu_timeline=st.cpu_timeline.points,
        waste=tuple(WasteDetection(node=node, code=w.code, gpu=w.gpu, since_s=w.since_s, detected_s=w.detected_s,
                                   evidence=w.evidence, until_s=w.until_s) for w in st.waste_findings or ()) or ABSENT,
        actions=tuple(st.actions or ()) or ABSENT,
    )


def settings_groups(nodes: Iterable[NodeSummary]) -> list[SettingsGroup]:
    """Nodes with the same ``settings`` grouped, largest group first; nodes with unknown settings in none."""
    by: dict[tuple, list[str]] = {}
    for n in nodes:
        if known(n.settings):
            by.setdefault(tuple(n.settings), []).append(n.node)
    groups = sorted(by.items(), key=lambda g: (-len(g[1]), min(g[1])))
    return [SettingsGroup(nodes=tuple(sorted(names)), settings=st) for st, names in groups]


KEEP_GPU_TIMELINES = 16     # up to this many GPUs the job summary keeps each GPU's timeline
JOB_TIMELINE_POINTS = 240   # at most this many buckets per metric in the job-level timeline
JOB_TIMELINE_METRICS = ("util_pct", "sm_active_pct", "mem_used_bytes", "power_w")


class JobTimeline:
    """Every GPU's points (``[t_s, mean, max, n]``) pooled into at most
    ``max_points`` buckets per metric, the width doubling when more are
    needed. :meth:`to_json`: metric -> ``[t_s since the job start, weighted
    mean, highest max, samples, lowest GPU mean]``."""

    def __init__(self, width_s: float = 60.0, max_points: int = JOB_TIMELINE_POINTS) -> None:
        self.width_s = float(width_s)
        self.max_points = max_points
        self.series: dict[str, dict[int, list[float]]] = {}

    def add_gpu(self, timeline: dict, offset_s: float = 0.0) -> None:
        for key in JOB_TIMELINE_METRICS:
            for p in timeline.get(key) or ():
                if p[1] is None:
                    continue
                self._add(key, max(0.0, offset_s + p[0]), p[1], p[2] if p[2] is not None else p[1],
                          p[3] if len(p) > 3 and p[3] else 1)

    def _add(self, key: str, t_s: float, mean: float, top: float, n: int) -> None:
        idx = int(t_s // self.width_s)
        while idx >= self.max_points:
            self._coarsen()
            idx = int(t_s // self.width_s)
        _merge(self.series.setdefault(key, {}), idx, [mean * n, n, top, mean])

    def _coarsen(self) -> None:
        self.width_s *= 2
        for key, buckets in self.series.items():
            merged: dict[int, list[float]] = {}
            for i, b in buckets.items():
                _merge(merged, i // 2, b)
            self.series[key] = merged

    def to_json(self) -> dict:
        return {key: [[round(i * self.width_s, 1), _sig(b[0] / b[1]), _sig(b[2]), int(b[1]), _sig(b[3])]
                      for i, b in sorted(buckets.items())]
                for key, buckets in self.series.items() if buckets}


def _merge(buckets: dict[int, list[float]], idx: int, b: list[float]) -> None:
    """Add ``b`` ([sum of means x n, n, highest max, lowest mean]) into ``buckets[idx]``."""
    m = buckets.get(idx)
    buckets[idx] = list(b) if m is None else [m[0] + b[0], m[1] + b[1], max(m[2], b[2]), min(m[3], b[3])]


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def job_summary(job: JobInfo, nodes: Iterable[NodeSummary], cfg=None, partition: str | None = None,
                timeline: JobTimeline | None = None) -> JobSummary:
    """The job summary, findings filled. ``job``: Slurm's record (any field but ``id`` unknown: filled
    from the nodes where they have it); ``nodes``: :func:`node_record` results. Above
    :data:`KEEP_GPU_TIMELINES` GPUs (or with ``timeline``, filled by :func:`strip_timelines`) the
    devices' timelines go to ``gpu.timeline``."""
    nodes = sorted(nodes, key=lambda n: n.node)
    seen = {n.node for n in nodes}
    expected = list(job.nodes or ()) or sorted(seen)
    missing = [n for n in expected if n not in seen]
    start = or_none(job.start_time) or min((t for n in nodes if known(t := n.start_time)), default=None)
    end = or_none(job.end_time) or max((t for n in nodes if known(t := n.end_time)), default=None)
    elapsed = or_none(job.elapsed_s)        # Slurm's (RunTime), None without a job record
    sampled = None
    if elapsed is None:
        starts = [n.start_time for n in nodes if known(n.start_time)]
        ends = [n.end_time for n in nodes if known(n.end_time)]
        sampled = max(0.0, max(ends) - min(starts)) if starts and ends else None
    run_s = elapsed if elapsed is not None else sampled
    cpu_time = _sum(n.cpu_time_s for n in nodes)
    cpus_alloc = or_none(job.cpus_alloc)
    if cpus_alloc is None:
        cpus_alloc = _sum(n.cpus_alloc or None for n in nodes)
    cpu_eff = cpu_raw = None
    if cpu_time is not None and cpus_alloc and run_s:
        cpu_raw = 100.0 * cpu_time / (cpus_alloc * run_s)
        cpu_eff = min(100.0, cpu_raw)
    mem_peak = _sum(n.mem_peak_bytes for n in nodes)
    mem_req = or_none(job.mem_req_bytes)
    mem_eff = 100.0 * mem_peak / mem_req if mem_peak is not None and mem_req else None
    gpus = [g for n in nodes for g in n.gpus or ()]
    if len(gpus) > KEEP_GPU_TIMELINES or timeline is not None:
        if timeline is None:
            timeline = JobTimeline()
        gpus = []
        for n in nodes:
            off = (n.start_time - start) if start is not None and n.start_time else 0.0
            for g in n.gpus or ():
                if g.timeline:
                    timeline.add_gpu(g.timeline, off)
                    g = replace(g, timeline=ABSENT)
                gpus.append(g)
    real = real_gpus(gpus)
    reasons = sorted({n.gpu_reason for n in nodes if n.gpu_reason})
    gpus_alloc = or_none(job.gpus_alloc) or len(gpus) or sum(len(n.gres_gpus or ()) for n in nodes)
    gpu_hours_alloc = gpus_alloc * run_s / 3600.0 if run_s is not None else None
    busy = [g.util_busy_s for g in real if known(g.util_busy_s)]
    gpu_hours_used = sum(busy) / 3600.0 if busy else None
    energy_j = _sum(g.energy_j for g in real)
    estimated = any(g.energy_estimated for g in real if known(g.energy_j))
    per_node = tuple(NodeDetail(node=n.node, cpus_alloc=or_none(n.cpus_alloc), cpu_time_s=or_none(n.cpu_time_s),
                                mem_peak_bytes=or_none(n.mem_peak_bytes), elapsed_s=or_none(n.elapsed_s),
                                gpu_available=or_none(n.gpu_available), gpu_reason=or_none(n.gpu_reason),
                                mem_total_bytes=n.mem_total_bytes) for n in nodes)
    summary = JobSummary(
        schema=SUMMARY_SCHEMA, kind="job",
        job=JobInfo(
            id=job.id, array=or_none(job.array), user=or_none(job.user), name=or_none(job.name),
            partition=or_none(job.partition), state=or_none(job.state), exit_code=or_none(job.exit_code),
            nodes=tuple(expected), start_time=start, end_time=end, elapsed_s=_r(elapsed, 3),
            sampled_s=_r(sampled, 3) if sampled is not None else ABSENT,
            cpus_alloc=cpus_alloc, gpus_alloc=gpus_alloc, mem_req_bytes=mem_req,
            mail_user=or_none(job.mail_user), mail_type=or_none(job.mail_type), submit_time=job.submit_time,
            time_limit_s=job.time_limit_s, state_source=job.state_source),
        cpu=CpuFigures(time_s=_r(cpu_time, 3), efficiency_pct=_r(cpu_eff),
                       anomaly=cpu_raw is not None and cpu_raw > 105.0,
                       source="; ".join(sorted({n.cpu_source for n in nodes if n.cpu_source})) or None),
        memory=MemoryFigures(peak_bytes=mem_peak, req_bytes=mem_req, efficiency_pct=_r(mem_eff),
                             source="; ".join(sorted({n.mem_source for n in nodes if n.mem_source})) or None),
        gpu=GpuFigures(available=bool(real) and any(n.gpu_available for n in nodes),
                       reason="; ".join(reasons) or None, count=len(gpus), devices=tuple(gpus),
                       gpu_hours_alloc=_r(gpu_hours_alloc, 4), gpu_hours_used=_r(gpu_hours_used, 4),
                       energy_j=_r(energy_j), energy_kwh=_r(None if energy_j is None else energy_j / 3.6e6, 6),
                       energy_estimated=True if estimated else ABSENT,
                       timeline=timeline.to_json() if timeline is not None else ABSENT),
        nodes_detail=per_node,
        nodes_missing=tuple(missing),
        node_notes={n.node: tuple(n.notes) for n in nodes if n.notes},
        settings=tuple(settings_groups(nodes)) or ABSENT,
        waste=tuple(w for n in nodes for w in n.waste or ()) or ABSENT,
        actions=tuple(sorted((a for n in nodes for a in n.actions or ()), key=lambda a: (a.time, a.node))) or ABSENT,
    )
    return replace(summary, findings=tuple(finding_records(summary, cfg, partition)))


def strip_timelines(node: NodeSummary, acc: JobTimeline, t0: float | None) -> NodeSummary:
    """``node`` with its GPU timelines moved into ``acc`` (offset by its start after ``t0``, epoch s) and
    without its ``cpu_timeline``."""
    off = (node.start_time or 0.0) - t0 if t0 is not None and node.start_time else 0.0
    for g in node.gpus or ():
        if g.timeline:
            acc.add_gpu(g.timeline, off)
    gpus = tuple(replace(g, timeline=ABSENT) for g in node.gpus) if node.gpus else node.gpus
    return replace(node, gpus=gpus, cpu_timeline=ABSENT)


JS1_MAX_CHARS = 32768     # a 64-node 8-GPU job's full blob is ~13.6 k (tests/pure/test_js1_accounting.py)
JS1_CAP_MAX = 49152       # under valid_js1's 60000, MAX_ARG_BYTES and MySQL TEXT (65535 bytes)
# jobstats' markers (Jobstats.report_job_json): a run under 2 x SAMPLING_PERIOD (30 s), no node figures
JS1_SHORT, JS1_NONE = "JS1:Short", "JS1:None"
JS1_MARKERS = (JS1_SHORT, JS1_NONE)
JS1_SHORT_S = 2 * 30
JS1_GROUPS = (512, 256, 128, 64, 32, 16, 8, 4, 2, 1)   # node groups tried, in order, when per-node does not fit


def _js1_nodes(summary: JobSummary) -> tuple[list[tuple[str, dict, list[GpuSummary]]], dict[str, list[str]]]:
    """Per node by name: (name, CPU/memory keys, its GPUs); node -> keys written as 0 because unknown."""
    detail = summary.nodes_detail or ()
    total_cpus = sum(n.cpus_alloc or 0 for n in detail)
    mem_req = summary.job.mem_req_bytes
    gpus_of: dict[str, list[GpuSummary]] = {}
    for g in summary.gpu.devices or ():
        if ("ok" if g.status is ABSENT else g.status) in ("ok", "lost"):
            gpus_of.setdefault(g.node, []).append(g)
    out, unknown = [], {}
    for n in sorted(detail, key=lambda n: str(n.node)):   # the same blob whatever order the merge saw
        cpus = or_none(n.cpus_alloc)
        if mem_req:      # the job's memory limit on the node (Slurm's mem is the job total)
            share = (cpus / total_cpus) if cpus and total_cpus else 1.0 / len(detail)
            total = int(mem_req * share)
        else:            # no memory limit: the node's memory
            total = n.mem_total_bytes or 0
        d = {"cpus": int(cpus) if cpus else 1, "total_time": round(float(n.cpu_time_s or 0.0), 1),
             "used_memory": int(n.mem_peak_bytes or 0), "total_memory": int(total)}
        miss = [k for k, v in (("cpus", cpus), ("total_time", n.cpu_time_s), ("used_memory", n.mem_peak_bytes),
                               ("total_memory", total or None)) if not known(v)]
        if miss:
            unknown[n.node] = miss
        out.append((n.node, d, sorted(gpus_of.get(n.node, []), key=lambda g: int(g.index))))
    return out, unknown


def _gpu_mem(gpus: list[GpuSummary]) -> dict[str, tuple[int, int]]:
    """GPU minor -> (memory high water, total) bytes, for GPUs with both figures."""
    return {str(g.index): (int(g.mem_peak_bytes), int(g.mem_total_bytes)) for g in gpus
            if known(g.mem_peak_bytes) and g.mem_total_bytes}


def _gpu_keys(gpus: list[GpuSummary], has_gpus: bool, mem_pair: bool, reduce: bool) -> dict:
    """jobstats' per-node GPU keys: ``gpu_utilization`` ``{}`` for a GPU job
    without figures ("unknown" to jobstats); the memory pair on every node
    when any node has it (jobstats needs it everywhere), else left out
    (jobstats says "JSON is malformed" rather than invent a number).
    ``reduce``: ``min``/``median``/``max`` instead of one key per minor."""
    d: dict = {}
    util = {str(g.index): g.util_mean_pct for g in gpus if known(g.util_mean_pct)}
    mem = _gpu_mem(gpus)
    if reduce and len(util) > 3:
        vals = list(util.values())
        util = {"min": min(vals), "median": round(statistics.median(vals), 1), "max": max(vals)}
    if reduce and len(mem) > 3:
        by_frac = sorted(mem.values(), key=lambda um: (um[0] / um[1], um))
        mem = {"min": by_frac[0], "median": by_frac[len(by_frac) // 2], "max": by_frac[-1]}
    if util or has_gpus:
        d["gpu_utilization"] = util
    if mem or mem_pair:
        d["gpu_used_memory"] = {k: v[0] for k, v in mem.items()}
        d["gpu_total_memory"] = {k: v[1] for k, v in mem.items()}
    return d


def _group(members: list[tuple[str, dict, list[GpuSummary]]]) -> tuple[str, dict, list[GpuSummary]]:
    """Several nodes as one jobstats node: CPU/memory keys summed, GPUs pooled."""
    first, last = members[0][0], members[-1][0]
    name = first if len(members) == 1 else f"{first}..{last} ({len(members)} nodes)"
    d = {k: sum(m[1][k] for m in members) for k in ("cpus", "used_memory", "total_memory")}
    d["total_time"] = round(sum(m[1]["total_time"] for m in members), 1)
    return name, d, [g for m in members for g in m[2]]


def _encode(blob: dict) -> str:
    raw = json.dumps(blob, separators=(",", ":"), sort_keys=True).encode("ascii")
    return "JS1:" + base64.b64encode(gzip.compress(raw, mtime=0)).decode("ascii")


def js1_blob(summary: JobSummary, max_chars: int = JS1_MAX_CHARS) -> str | None:
    """The blob (module doc), at most ``max_chars`` long; None without run time or node figures.

    Every node has the four CPU/memory keys (jobstats needs them): unknown
    ones are 0 and listed in ``gsrun.unknown``. ``total_memory``: the job's
    request split by cores (AllocTRES ``mem`` is the job total), else
    MemTotal. Too long: GPUs reduced to min/median/max, then consecutive
    nodes pooled as ``first..last (N nodes)`` (sums stay exact), said in
    ``gsrun.reduced`` (``"gpus"`` / ``"nodes:<groups>"``).
    """
    elapsed = run_time_s(summary.job)
    if not elapsed or elapsed <= 0 or not summary.nodes_detail:
        return None
    nodes, unknown = _js1_nodes(summary)
    gpu = summary.gpu
    gpus_alloc = int(summary.job.gpus_alloc or gpu.count or 0)
    gsrun = {"schema": summary.schema, "cpu_eff_pct": or_none(summary.cpu.efficiency_pct), "energy_j": or_none(gpu.energy_j),
             **({"energy_estimated": True} if gpu.energy_estimated else {}),
             **({"alerts": len(summary.waste)} if summary.waste else {})}
    per_gpu = {out: {f"{g.node}:{g.index}": v for g in gpu.devices or () if known(v := get(g))}
               for out, get in (("sm_active_pct", lambda g: g.sm_active_mean_pct),
                                ("tensor_active_pct", lambda g: g.tensor_active_mean_pct),
                                ("lost", lambda g: g.lost_at_s))}
    if unknown:
        gsrun["unknown"] = unknown

    has_util = gpus_alloc > 0 or any(known(g.util_mean_pct) for _, _, gs in nodes for g in gs)
    mem_pair = any(_gpu_mem(gs) for _, _, gs in nodes)

    def blob(entries, reduce: bool, reduced: str | None) -> dict:
        out = {n: dict(d, **_gpu_keys(gs, has_util, mem_pair, reduce)) for n, d, gs in entries}
        extra = dict(gsrun, **per_gpu) if reduced is None else dict(gsrun, reduced=reduced, lost_count=len(
            per_gpu["lost"]))
        if reduced is not None and "unknown" in extra and len(unknown) > 8:
            extra["unknown"] = {"nodes": len(unknown)}
        return {"gpus": gpus_alloc, "nodes": out, "total_time": int(round(elapsed)), "gsrun": extra}

    for reduce, reduced in ((False, None), (True, "gpus")):
        text = _encode(blob(nodes, reduce, reduced))
        if len(text) <= max_chars:
            return text
    for g in JS1_GROUPS:
        if g >= len(nodes):
            continue
        size = -(-len(nodes) // g)
        groups = [_group(nodes[i:i + size]) for i in range(0, len(nodes), size)]
        text = _encode(blob(groups, True, f"nodes:{len(groups)}"))
        if len(text) <= max_chars:
            return text
    return text     # one pooled node always fits: 4 numbers, 3 GPU keys


def js1_comment(summary: JobSummary, max_chars: int = JS1_MAX_CHARS, short_s: float = JS1_SHORT_S) -> str:
    """``AdminComment``, as jobstats' ``report_job_json`` decides: :data:`JS1_SHORT` under ``short_s``,
    :data:`JS1_NONE` without a blob, else the blob."""
    elapsed = run_time_s(summary.job)
    if elapsed is not None and elapsed < short_s:
        return JS1_SHORT
    return js1_blob(summary, max_chars) or JS1_NONE


def decode_js1(text: str) -> dict:
    """Inverse of :func:`js1_blob`.

    Raises:
        ValueError: not a ``JS1:`` blob, a marker, or corrupt (truncated, another tool's).
    """
    if not text.startswith("JS1:"):
        raise ValueError("not a JS1 blob")
    if text in JS1_MARKERS:
        raise ValueError(f"{text} is jobstats' marker for a job without figures, not a blob")
    try:
        return json.loads(gzip.decompress(base64.b64decode(text[4:], validate=True)))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"corrupt JS1 blob: {e}") from None


def pending_summary(rec: dict[str, str], cfg=None) -> JobSummary:
    """A not-started job's report (never stored) from ``scontrol show job``: the summary's shape without
    figures, what it asked for, ``Reason``, the expected ``StartTime`` and the finding why it waits."""
    def val(k):
        v = rec.get(k)
        return None if v in (None, "", "(null)", "None", "N/A", "Unknown") else v

    tres = parse_tres(val("ReqTRES") or val("TRES") or "")
    gpus = tres_gpus(tres) or 0
    cpus = val("NumCPUs")
    job = JobInfo(id=rec.get("JobId"), name=val("JobName"), user=(val("UserId") or "").split("(")[0] or None,
                  partition=val("Partition"), state=state_word(rec.get("JobState")) or "PENDING", nodes=(),
                  cpus_alloc=int(cpus) if cpus and cpus.isdigit() else None, gpus_alloc=gpus,
                  submit_time=epoch_or_none(val("SubmitTime")), time_limit_s=time_s_or_none(val("TimeLimit")),
                  elapsed_s=0.0, pending_reason=val("Reason"), expected_start=epoch_or_none(val("StartTime")))
    summary = JobSummary(schema=SUMMARY_SCHEMA, kind="job", job=job,
                         cpu=CpuFigures(efficiency_pct=None, time_s=None, anomaly=False),
                         memory=MemoryFigures(efficiency_pct=None, peak_bytes=None, req_bytes=None),
                         gpu=GpuFigures(available=True, count=gpus, devices=(), reason=None))
    return replace(summary, findings=tuple(finding_records(summary, cfg, job.partition)))
