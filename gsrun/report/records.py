"""The summaries and findings as typed records (``gsrun.summary/1``). Pure.

``from_json`` reads every file written so far (a key left out is ABSENT,
unknown keys go to ``extra``: ``from_json(d).to_json() == d``) and refuses
another schema. ``schemas/*.schema.json`` are generated from these classes
(``python -m gsrun.report.records``); field and class docs are their text.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gsrun import SUMMARY_SCHEMA
from gsrun.base.record import ABSENT, Record, extra_field, field, json_schema
from gsrun.facts import sampler_state as ss

SCHEMA_BASE = "https://gsrun.invalid/schemas/"


class FindingCode(str, enum.Enum):
    """Every finding ``code`` :mod:`gsrun.report.findings` emits; the only ones the mail and report test for."""

    NEVER_STARTED = "never_started"
    DEFERRED = "deferred"
    SHORT_JOB = "short_job"
    GPU_LOST = "gpu_lost"
    XID = "xid"
    ECC = "ecc"
    GPU_UNAVAILABLE = "gpu_unavailable"
    NODES_MISSING = "nodes_missing"
    IDLE_GPU = "idle_gpu"
    LOW_SM_ACTIVITY = "low_sm_activity"
    UTIL_NA = "util_na"
    THROTTLE_THERMAL = "throttle_thermal"
    THROTTLE_POWER = "throttle_power"
    THROTTLE_HW_SLOWDOWN = "throttle_hw_slowdown"
    GPU_MEM_LOW = "gpu_mem_low"
    CPU_BOUND = "cpu_bound"
    CPU_ANOMALY = "cpu_anomaly"
    MEM_OVERREQUEST = "mem_overrequest"
    CPU_IDLE = "cpu_idle"
    LOW_GPU_UTIL = "low_gpu_util"
    TIME_LIMIT_HIGH = "time_limit_high"
    # found while the job ran (gsrun.request.waste; the node's sampler state's waste_findings)
    GPU_IDLE = "gpu_idle"
    GPU_STUCK_COLLECTIVE = "gpu_stuck_collective"
    GPU_NEVER_USED = "gpu_never_used"

    def __str__(self) -> str:
        return self.value


Severity = Literal["info", "warn", "alert"]


def _kind_checked(kind: str) -> classmethod:
    """A summary's ``from_json``: :meth:`Record.from_json` after the schema and kind checks.

    Raises:
        ValueError: another schema, not kind ``kind``, or a wrong shape.
    """
    def from_json(cls, d):
        what = f"{kind} summary"
        if not isinstance(d, dict):
            raise ValueError(f"{what}: expected an object, got {type(d).__name__}")
        if d.get("schema") != SUMMARY_SCHEMA:
            raise ValueError(f"{what}: schema {d.get('schema')!r} is not {SUMMARY_SCHEMA!r}")
        if d.get("kind") != kind:
            raise ValueError(f"{what}: kind {d.get('kind')!r}")
        return super(cls, cls).from_json(d)
    return classmethod(from_json)


@dataclass(frozen=True)
class Finding(Record):
    """One plain-language finding with the number behind it."""

    code: FindingCode | str = field("what the finding is about (FindingCode; another text: a newer gsrun's, "
                                    "shown as it is)")
    severity: Severity = field("alert: hardware event; warn: advice that saves much; info: the rest")
    text: str = field("the sentence users read (report, mail)")
    value: Any = field("the number the text is about: percent, seconds, a count, a list (Xid codes, "
                       "node names) or null", ABSENT)
    action: str | None = field("the concrete change for next time, as typed (``--gpus 6``, ``--time 02:00:00``, "
                               "``num_workers``); absent when there is none", optional_key=True)
    extra: dict = extra_field()


@dataclass(frozen=True)
class GpuSummary(Record):
    """One GPU of one node over the job (from the sampler's
    :class:`gsrun.facts.sampler_state.GpuState`)."""

    node: str = field("node name")
    index: int = field("Slurm gres index = /dev/nvidiaN minor number")
    nvml_index: int | None = field("NVML device index; null: no NVML device", ABSENT)
    name: str | None = field("nvmlDeviceGetName", ABSENT)
    uuid: str | None = field("nvmlDeviceGetUUID", ABSENT)
    pci_bus_id: str | None = field("nvmlDeviceGetPciInfo busId", ABSENT)
    mig: bool = field("MIG mode on (no utilization figure: field case 12)", ABSENT)
    status: Literal["ok", "lost", "unavailable", "emulated"] | None = field(
        "ok; lost (GPU_IS_LOST); unavailable (NVML could not start); emulated (gres without NVIDIA device)", ABSENT)
    util_mean_pct: float | None = field("time-weighted mean utilization, % of time a kernel ran "
                                        "(nvmlDeviceGetSamples, else nvmlDeviceGetUtilizationRates)", ABSENT)
    util_na_reason: str | None = field("why util_mean_pct is null (MIG, NVML's reason)", ABSENT)
    util_idle_frac: float | None = field("share (0..1) of the sampled time below 5 % utilization", ABSENT)
    util_gap_s: float | None = field("seconds with no utilization reading (not counted as 0)", ABSENT)
    util_busy_s: float | None = field("integral of utilization over time: seconds the GPU was busy", ABSENT)
    sm_active_mean_pct: float | None = field("mean SM activity % (GPM, nvmlGpmMetricsGet)", ABSENT)
    sm_occupancy_mean_pct: float | None = field("mean SM occupancy % (GPM)", ABSENT)
    tensor_active_mean_pct: float | None = field("mean any-tensor activity % (GPM)", ABSENT)
    dram_bw_mean_pct: float | None = field("mean DRAM bandwidth utilization % (GPM)", ABSENT)
    mem_peak_bytes: int | None = field("GPU memory high water, bytes (nvmlDeviceGetMemoryInfo used)", ABSENT)
    mem_total_bytes: int | None = field("GPU memory total, bytes (nvmlDeviceGetMemoryInfo total)", ABSENT)
    mem_peak_pct: float | None = field("mem_peak_bytes / mem_total_bytes x 100", ABSENT)
    energy_j: float | None = field("energy, J: delta of nvmlDeviceGetTotalEnergyConsumption (mJ) / 1000 over "
                                   "the sampled span, summed across counter resets", ABSENT)
    energy_counter_resets: int = field("times the energy counter went backwards", ABSENT)
    energy_estimated: bool = field("energy_j integrates nvmlDeviceGetPowerUsage samples over the covered time "
                                   "(the energy counter gave no usable reading); absent: from the counter",
                                   ABSENT, optional_key=True)
    mem_source: str | None = field("how mem_peak_bytes was read when not nvmlDeviceGetMemoryInfo_v2: v1 minus "
                                   "the prolog's baseline (mem_baseline_bytes), or v1 alone", ABSENT, optional_key=True)
    mem_baseline_bytes: int | None = field("v1 memory used before the job's processes (prolog), bytes", ABSENT, optional_key=True)
    mem_procs_peak_bytes: int | None = field("high water of the job's own processes' GPU memory, bytes: sum of "
                                             "used_gpu_memory (nvmlDeviceGetComputeRunningProcesses) over the "
                                             "job's PIDs", ABSENT, optional_key=True)
    power_mean_w: float | None = field("mean power, W: energy_j / sampled span (else mean of "
                                       "nvmlDeviceGetPowerUsage)", ABSENT)
    power_max_w: float | None = field("highest nvmlDeviceGetPowerUsage reading, W", ABSENT)
    power_limit_w: float | None = field("enforced power limit, W (nvmlDeviceGetEnforcedPowerLimit at the "
                                        "sampler's start); absent: not reported or an older summary", ABSENT,
                                        optional_key=True)
    temperature_max_c: float | None = field("highest nvmlDeviceGetTemperature reading, deg C", ABSENT)
    sm_clock_mean_mhz: float | None = field("mean SM clock, MHz (nvmlDeviceGetClockInfo)", ABSENT)
    throttle_s: dict[str, float | None] = field(
        "cause (power, thermal, hw_slowdown, sync_boost) -> seconds the clock event reasons "
        "(nvmlDeviceGetCurrentClocksEventReasons) showed it", ABSENT)
    xid: tuple[int, ...] = field("Xid error codes seen, in order", ABSENT)
    ecc_uncorrected: int | None = field("uncorrected ECC errors during the job (volatile count delta)", ABSENT)
    lost_at_s: float | None = field("s after the sampler start when NVML first answered GPU_IS_LOST", ABSENT)
    lost_reason: str | None = field("why the GPU counts as lost", ABSENT)
    covered_s: float | None = field("seconds between the first and the last good poll", ABSENT)
    unsupported: dict[str, str] = field("reading -> NVML's reason it is not available", ABSENT)
    timeline: dict[str, tuple[tuple[float | None, ...], ...]] = field(
        "util_pct, sm_active_pct, mem_used_bytes, power_w -> points [t_s since sampler start, mean, max, n]", ABSENT)
    emulated: bool = field("status is emulated (kept for readers of older summaries)", ABSENT)
    extra: dict = extra_field()


SettingState = Literal["applied", "unchanged", "reused", "refused", "unsupported", "failed", "rolled_back",
                       "skipped", "held", "requested", "warning"]


@dataclass(frozen=True)
class NodeSetting(Record):
    """One node setting as it was during the job on one node: a tuning item of the
    prolog's report (:func:`gsrun.node.tuning.prolog_tune`, kept in the prolog record
    ``prolog-<node>.json``), the ``/dev/cpu_dma_latency`` hold, or the allocator the
    job script preloads (``--malloc``)."""

    key: str = field("setting: a --tune key (governor, swap, swappiness, dirty_ratio, dirty_background_ratio, "
                     "thp, thp_defrag, zone_reclaim_mode, cstate, irq, hugepages), cpu_dma_latency, malloc or memlock")
    value: str | None = field("the value asked (cpu_dma_latency: microseconds held); null: the request itself "
                              "(key request: a request that could not be parsed)")
    state: SettingState = field(
        "applied (written and read back), unchanged (already the value), reused (set by another running job), "
        "refused (reason), unsupported on this node (reason), failed / rolled_back / skipped (a write or verify "
        "failed: every change of the job was put back), held (cpu_dma_latency: the sampler held the file), "
        "requested (malloc: gsrun-bind preloads the library when it is on the node; not verified yet, or why "
        "not), warning (memlock: the task's hard RLIMIT_MEMLOCK is too low for pinned memory)")
    reason: str = field("why (refused, unsupported, failed), or what was done (IRQs, hugepages per node); "
                        "may be empty", "")
    source: str = field("request (the job asked), default (site tuning.defaults), fallback (swap=off unsafe: "
                        "swappiness instead), site (malloc.default), node (memlock: what the node gave the task) "
                        "or empty", "")
    extra: dict = extra_field()


@dataclass(frozen=True)
class SettingsGroup(Record):
    """Nodes of the job whose settings during the job were the same (one report line)."""

    nodes: tuple[str, ...] = field("node names, sorted")
    settings: tuple[NodeSetting, ...] = field("the settings in force on each of them (empty: none changed)")
    extra: dict = extra_field()


@dataclass(frozen=True)
class NodeSummary(Record):
    """One node's summary of the job (the node epilog's ``node-<node>.json``)."""

    schema: str = field("summary schema, gsrun.summary/1")
    kind: Literal["node"] = field("node")
    job_id: str = field("Slurm job id")
    node: str = field("node name")
    start_time: float | None = field("sampler start (else the prolog's time), epoch seconds", ABSENT)
    end_time: float | None = field("epilog time, epoch seconds", ABSENT)
    elapsed_s: float | None = field("the node's sampled span, end_time - start_time, seconds (not the job's "
                                    "elapsed time: that is the job summary's job.elapsed_s)", ABSENT)
    cpus_alloc: int | None = field("cores allocated to the job on this node (SLURM_CPUS_ON_NODE)", ABSENT)
    gres_gpus: tuple[int, ...] = field("gres GPU indices (minor numbers) of the job on this node", ABSENT)
    cpu_time_s: float | None = field("CPU seconds used by the job on this node (cgroup cpu.stat usage_usec / "
                                     "cpuacct.usage, else psutil)", ABSENT)
    cpu_source: str | None = field("where cpu_time_s came from", ABSENT)
    mem_peak_bytes: int | None = field("host memory high water, bytes (cgroup memory.peak / "
                                       "max_usage_in_bytes, else the highest reading)", ABSENT)
    mem_source: str | None = field("where mem_peak_bytes came from", ABSENT)
    gpu_available: bool = field("GPU figures are available (NVML ran and a GPU matched)", ABSENT)
    gpu_reason: str | None = field("why the GPU figures are not available", ABSENT)
    gpus: tuple[GpuSummary, ...] = field("per GPU, in gres order", ABSENT)
    samples: int = field("sampler polls", ABSENT)
    notes: tuple[str, ...] = field("plain-language notes (sampler restarts, gaps, unmatched gres)", ABSENT)
    cpu_timeline: tuple[tuple[float | None, ...], ...] = field(
        "CPU cores busy: points [t_s since sampler start, mean, max, n]; absent without sampler state",
        optional_key=True)
    sampler_stop: str = field("how the epilog stopped the sampler (added by the epilog)", optional_key=True)
    mem_total_bytes: int | None = field("the node's memory, bytes (/proc/meminfo MemTotal; added by the epilog)",
                                        optional_key=True)
    waste: tuple[WasteDetection, ...] = field("waste detections of the node's sampler while the job ran; absent: "
                                              "none", optional_key=True)
    actions: tuple[ss.WasteAction, ...] = field("actions the node's sampler took on them (alert mails, idle "
                                                "cancel), oldest first; absent: none", optional_key=True)
    request: dict[str, Any] | None = field("the job's gsrun request from the prolog record (added by the "
                                           "epilog)", optional_key=True)
    settings: tuple[NodeSetting, ...] | None = field(
        "node settings during the job, from the prolog record's tuning report (added by the epilog; null: no "
        "prolog record, so unknown; absent in summaries written before it was recorded)", optional_key=True)
    extra: dict = extra_field()
    from_json = _kind_checked("node")


@dataclass(frozen=True)
class JobInfo(Record):
    """The job as Slurm records it (``scontrol show job`` in EpilogSlurmctld)."""

    id: str = field("Slurm job id")
    array: str | None = field("array form ARRAYID_TASKID, null when not an array task", ABSENT)
    user: str | None = field("user name", ABSENT)
    name: str | None = field("job name", ABSENT)
    partition: str | None = field("partition", ABSENT)
    state: str | None = field("job state word (COMPLETED, FAILED, CANCELLED ...)", ABSENT)
    exit_code: int | None = field("exit code (128 + signal when killed by one)", ABSENT)
    nodes: tuple[str, ...] = field("node names of the allocation", ABSENT)
    start_time: float | None = field("epoch seconds (StartTime)", ABSENT)
    end_time: float | None = field("epoch seconds (EndTime; else the last node epilog's time)", ABSENT)
    elapsed_s: float | None = field(
        "Slurm's elapsed time of the job, seconds: StartTime to EndTime less any time suspended, as slurmctld "
        "records it (RunTime at EpilogSlurmctld; the figure squeue TimeUsed, sacct Elapsed and the last line of "
        "gsrun --wait show); null: no job record (see sampled_s)", ABSENT)
    sampled_s: float | None = field(
        "only when elapsed_s is null (no job record; a running job's report so far): the span the node "
        "samplers covered, seconds (the earliest sampler start to the last node epilog or poll), the time the "
        "figures are taken over, shown as 'sampled', never as the elapsed time", optional_key=True)
    submit_time: float | None = field("epoch seconds the job was submitted (SubmitTime); absent in "
                                      "summaries written before it was recorded", optional_key=True)
    time_limit_s: float | None = field("time limit, seconds (TimeLimit); null: UNLIMITED or unknown; absent "
                                       "in summaries written before it was recorded", optional_key=True)
    cpus_alloc: int | None = field("cores allocated (AllocTRES cpu)", ABSENT)
    gpus_alloc: int | None = field("GPUs allocated (AllocTRES gres/gpu)", ABSENT)
    mem_req_bytes: int | None = field("memory requested, bytes (AllocTRES mem)", ABSENT)
    mail_user: str | None = field("MailUser", ABSENT)
    mail_type: str | None = field("MailType", ABSENT)
    state_source: str | None = field(
        "where the state came from: slurm (the job record), sacct (slurmdbd, while slurmctld still showed the "
        "job COMPLETING), exit_code (a guess from the exit code while COMPLETING: replaced by Slurm's final state "
        "by the background step as soon as slurmctld has it); absent in summaries written before it was "
        "recorded", optional_key=True)
    pending_reason: str | None = field("why a not-started job waits (Reason; pending report only)", optional_key=True)
    expected_start: float | None = field("epoch seconds Slurm expects a pending job to start (StartTime; pending "
                                         "report only)", optional_key=True)
    extra: dict = extra_field()


@dataclass(frozen=True)
class CpuFigures(Record):
    """CPU efficiency of the job."""

    time_s: float | None = field("CPU seconds of all nodes", ABSENT)
    efficiency_pct: float | None = field("time_s / (cpus_alloc x job.elapsed_s, else job.sampled_s) x 100, "
                                         "clamped to 100", ABSENT)
    anomaly: bool = field("the raw efficiency exceeded 105 % (accounting anomaly)", ABSENT)
    source: str | None = field("where the CPU times came from ('; '-joined per node)", ABSENT)
    extra: dict = extra_field()


@dataclass(frozen=True)
class MemoryFigures(Record):
    """Host memory efficiency of the job."""

    peak_bytes: int | None = field("sum of the nodes' memory high waters, bytes", ABSENT)
    req_bytes: int | None = field("memory requested, bytes", ABSENT)
    efficiency_pct: float | None = field("peak_bytes / req_bytes x 100", ABSENT)
    source: str | None = field("where the peaks came from ('; '-joined per node)", ABSENT)
    extra: dict = extra_field()


@dataclass(frozen=True)
class GpuFigures(Record):
    """GPU figures of the job."""

    available: bool = field("GPU figures are available on at least one node", ABSENT)
    reason: str | None = field("why not ('; '-joined node reasons)", ABSENT)
    count: int = field("GPUs with a summary", ABSENT)
    devices: tuple[GpuSummary, ...] = field("every GPU of every node", ABSENT)
    gpu_hours_alloc: float | None = field("GPUs allocated x job.elapsed_s (else job.sampled_s) / 3600, hours",
                                          ABSENT)
    gpu_hours_used: float | None = field("sum of util_busy_s / 3600 (duty-cycle hours)", ABSENT)
    energy_j: float | None = field("sum of the GPUs' energy_j, J", ABSENT)
    energy_kwh: float | None = field("energy_j / 3.6e6, kWh", ABSENT)
    energy_estimated: bool = field("at least one GPU's energy_j is estimated from power samples", ABSENT, optional_key=True)
    timeline: dict[str, tuple[tuple[float | None, ...], ...]] = field(
        "job-level timeline, only when the devices carry none (more than 16 GPUs): util_pct, sm_active_pct, "
        "mem_used_bytes, power_w -> at most 240 points [t_s since the job start, mean over the GPUs, highest "
        "max, samples, lowest GPU mean] (gsrun.report.summary.JobTimeline)", ABSENT, optional_key=True)
    extra: dict = extra_field()


@dataclass(frozen=True)
class WasteDetection(Record):
    """A waste detection made while the job ran, by the node's sampler
    (:class:`gsrun.request.waste.GpuWatch`; the sampler state's ``waste_findings``)."""

    node: str = field("node name")
    code: str = field("gpu_idle, gpu_stuck_collective or gpu_never_used")
    gpu: str = field("the GPU: Slurm gres index as text")
    since_s: float = field("start of the stretch, s since the node's sampler start (the prolog)")
    detected_s: float = field("poll at which it was detected, s since the node's sampler start")
    until_s: float = field("last poll it still held at, s since the node's sampler start", optional_key=True)
    evidence: dict = field("figures over the stretch (sampler-state schema, WasteFinding.evidence)", factory=dict)
    extra: dict = extra_field()


@dataclass(frozen=True)
class NodeDetail(Record):
    """Per-node CPU/memory figures kept in the job summary (the JS1 blob's source)."""

    node: str = field("node name")
    cpus_alloc: int | None = field("cores allocated on the node", ABSENT)
    cpu_time_s: float | None = field("CPU seconds on the node", ABSENT)
    mem_peak_bytes: int | None = field("host memory high water on the node, bytes", ABSENT)
    elapsed_s: float | None = field("the node summary's elapsed_s (the node's sampled span), seconds", ABSENT)
    gpu_available: bool | None = field("the node's gpu_available", ABSENT)
    gpu_reason: str | None = field("the node's gpu_reason", ABSENT)
    mem_total_bytes: int | None = field("the node's memory, bytes (MemTotal); absent in older summaries",
                                        optional_key=True)
    extra: dict = extra_field()


@dataclass(frozen=True)
class JobSummary(Record):
    """The job's summary (``summary.json``; ``gseff --json``; the JS1 blob is made from it)."""

    schema: str = field("summary schema, gsrun.summary/1")
    kind: Literal["job"] = field("job")
    job: JobInfo = field("the job record")
    cpu: CpuFigures = field("CPU efficiency", ABSENT)
    memory: MemoryFigures = field("host memory efficiency", ABSENT)
    gpu: GpuFigures = field("GPU figures", ABSENT)
    nodes_detail: tuple[NodeDetail, ...] = field("per node, sorted by name", ABSENT)
    nodes_missing: tuple[str, ...] = field("nodes of the job without a node summary", ABSENT)
    node_notes: dict[str, tuple[str, ...]] = field("node -> its notes", ABSENT)
    settings: tuple[SettingsGroup, ...] = field(
        "node settings during the job, nodes with the same settings in one group (largest group first; nodes "
        "whose settings are unknown are in none); absent in summaries written before it was recorded",
        optional_key=True)
    waste: tuple[WasteDetection, ...] = field("waste detections made while the job ran, all nodes (node, then "
                                              "time); absent: none", optional_key=True)
    actions: tuple[ss.WasteAction, ...] = field("actions taken on them while the job ran (alert mails, idle "
                                                "cancel), all nodes, by time; absent: none", optional_key=True)
    findings: tuple[Finding, ...] = field("findings, most important first", ABSENT)
    live: dict[str, Any] = field("a running job's report so far (gseff, never stored): as_of (epoch s), nodes_live, "
                                 "alerts, cancel, findings (gsrun.report.live)", optional_key=True)
    extra: dict = extra_field()
    from_json = _kind_checked("job")


SCHEMAS = {
    "node-summary": (NodeSummary, "gsrun node summary (gsrun.summary/1, kind node)"),
    "job-summary": (JobSummary, "gsrun job summary (gsrun.summary/1, kind job)"),
    "finding": (Finding, "gsrun finding"),
}


def is_mig(dev: GpuSummary) -> bool:
    """A summary's GPU is a MIG instance: marked so, or by NVML name or ``MIG-`` UUID (older files)."""
    return bool(dev.mig) or dev.util_na_reason == "MIG" \
        or "MIG" in str(dev.name or "").upper().split() or str(dev.uuid or "").startswith("MIG-")


def read_record(cls, path, reader):
    """``cls.from_json(reader(path))`` (``reader``: the caller's JSON file reader); None when the file is
    absent, corrupt, or not a ``cls`` of this schema."""
    try:
        return cls.from_json(reader(path))
    except ValueError:
        return None


def all_schemas() -> dict[str, dict]:
    """file stem -> JSON Schema for ``schemas/<stem>.schema.json``, the sampler state's too."""
    out = {stem: json_schema(cls, f"{SCHEMA_BASE}{stem}.schema.json", title)
           for stem, (cls, title) in SCHEMAS.items()}
    out["sampler-state"] = json_schema(ss.SamplerState, ss.SCHEMA_ID,
                                       f"gsrun sampler state (sampler.json, version {ss.STATE_VERSION})")
    return out


def write_schemas(folder) -> list[str]:
    """Write :func:`all_schemas` into ``folder``; returns the paths."""
    paths = []
    for stem, schema in all_schemas().items():
        p = Path(folder) / f"{stem}.schema.json"
        p.write_text(json.dumps(schema, indent=2) + "\n")
        paths.append(str(p))
    return paths


if __name__ == "__main__":   # python -m gsrun.report.records [FOLDER]: regenerate schemas/
    import sys

    print("\n".join(write_schemas(sys.argv[1] if len(sys.argv) > 1 else "schemas")))


__all__ = ["is_mig", "FindingCode", "Finding", "GpuSummary", "NodeSetting", "SettingsGroup", "NodeSummary", "JobInfo", "CpuFigures", "MemoryFigures",
           "GpuFigures", "NodeDetail", "JobSummary", "all_schemas", "read_record", "write_schemas"]
