"""The sampler's state file (``<state_dir>/<job>/sampler.json``) as typed
records (pure), written by :mod:`gsrun.node.sampler` and read by a restarted
sampler and the epilog. Versioned by :data:`STATE_VERSION`; schema
``schemas/sampler-state.schema.json`` is generated from these classes. A
GPU's ``*_s`` times are seconds since ``start_time`` (epoch seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

from gsrun.base.record import Record, extra_field, field

STATE_VERSION = 2
SCHEMA_ID = "https://gsrun.invalid/schemas/sampler-state.schema.json"


@dataclass(frozen=True)
class GpuRef(Record):
    """A job GPU as the sampler knows it. ``gres_index`` is Slurm's index
    (the ``/dev/nvidiaN`` minor number); ``nvml_index`` is NVML's, found by
    matching the minor number (never by position: field cases 7 and 8,
    docs/field-cases.md).
    ``mig``: MIG mode is on (``nvmlDeviceGetMigMode`` current = 1), so the
    device has no utilization figure (field case 12). ``gpm``: GPM metrics
    are supported (``nvmlGpmQueryDeviceSupport``; Hopper and later)."""

    gres_index: int = field("Slurm gres index = /dev/nvidiaN minor number")
    nvml_index: int | None = field("NVML device index; null: no NVML device matches (emulated gres, lost, "
                                   "NVML down)")
    uuid: str | None = field("nvmlDeviceGetUUID", None)
    pci_bus_id: str | None = field("nvmlDeviceGetPciInfo busId", None)
    name: str | None = field("nvmlDeviceGetName", None)
    mem_total_bytes: int | None = field("nvmlDeviceGetMemoryInfo total, bytes", None)
    mig: bool = field("MIG mode on (nvmlDeviceGetMigMode current = 1, or a MIG name/UUID)", False)
    gpm: bool = field("GPM metrics supported (nvmlGpmQueryDeviceSupport)", False)
    lost: bool = field("NVML answered GPU_IS_LOST already when the sampler started", False)
    power_limit_w: float = field("enforced power limit at the sampler's start, W "
                                 "(nvmlDeviceGetEnforcedPowerLimit mW / 1000); absent: not reported", optional_key=True)


@dataclass(frozen=True)
class MetricState(Record):
    """One metric's running aggregate (:class:`gsrun.facts.aggregate.Metric`):
    values weighted by the seconds they stood for; N/A readings count as
    ``gap_s``, never as 0."""

    thresholds: tuple[float, ...] = field("values (metric unit) for which above_s counts time at or above", ())
    hist_edges: tuple[float, ...] = field("histogram bucket edges (metric unit)", ())
    n: int = field("number of values", 0)
    weight_s: float = field("seconds covered by values", 0.0)
    wsum: float = field("sum of value x seconds (mean = wsum / weight_s)", 0.0)
    min: float | None = field("smallest value (metric unit)", None)
    max: float | None = field("largest value (metric unit)", None)
    gap_s: float = field("seconds with no value (N/A readings)", 0.0)
    vsum: float = field("plain sum of values", 0.0)
    above_s: dict[str, float] = field("threshold (as text) -> seconds at or above it", factory=dict)
    hist_s: tuple[float, ...] = field("seconds per histogram bucket", ())
    extra: dict = extra_field()


@dataclass(frozen=True)
class TimelineState(Record):
    """A bounded downsampled series (:class:`gsrun.facts.aggregate.Timeline`)."""

    max_points: int = field("most buckets kept", 1000)
    bucket_n: int = field("raw points per bucket now", 1)
    points: tuple[tuple[float | None, ...], ...] = field(
        "buckets [t_s since sampler start, mean, max, number of raw points] (value in the metric's unit)", ())
    extra: dict = extra_field()


@dataclass(frozen=True)
class CounterState(Record):
    """A hardware counter that may reset (:class:`gsrun.facts.aggregate.Counter`):
    NVML's energy counter, ``nvmlDeviceGetTotalEnergyConsumption`` in mJ."""

    first: float | None = field("first reading (mJ)", None)
    last: float | None = field("last reading (mJ)", None)
    total: float = field("sum of the deltas across resets (mJ)", 0.0)
    resets: int = field("times the counter went backwards (driver reload, GPU reset)", 0)
    t_first_s: float | None = field("when first was read, s since sampler start", None)
    t_last_s: float | None = field("when last was read, s since sampler start", None)
    extra: dict = extra_field()


@dataclass(frozen=True)
class GpuState(Record):
    """One GPU's aggregates. ``metrics`` keys: util_pct (nvmlDeviceGetSamples /
    nvmlDeviceGetUtilizationRates), mem_used_bytes (nvmlDeviceGetMemoryInfo),
    power_w (nvmlDeviceGetPowerUsage / 1000), sm_clock_mhz, temperature_c,
    pcie_tx_bytes_s, pcie_rx_bytes_s, nvlink_tx_bytes_s, nvlink_rx_bytes_s
    (nvmlDeviceGetFieldValues NVLink data counters of all links, per second
    between polls), the GPM metrics sm_active_pct,
    sm_occupancy_pct, tensor_active_pct, dram_bw_pct (nvmlGpmMetricsGet), and
    mem_procs_bytes (sum of used_gpu_memory of nvmlDeviceGetComputeRunningProcesses
    over the job's PIDs)."""

    ref: GpuRef = field("the device")
    metrics: dict[str, MetricState] = field("metric name (unit in the name) -> aggregate", factory=dict)
    timeline: dict[str, TimelineState] = field(
        "util_pct, sm_active_pct, mem_used_bytes, power_w -> timeline", factory=dict)
    energy: CounterState = field("energy counter (mJ)", factory=CounterState)
    throttle_s: dict[str, float] = field(
        "cause (power, thermal, hw_slowdown, sync_boost) -> seconds the clock event reasons "
        "(nvmlDeviceGetCurrentClocksEventReasons) showed it", factory=dict)
    xid: tuple[int, ...] = field("Xid error codes seen (NVML event set), in order", ())
    ecc_uncorrected_first: int | None = field("first volatile uncorrected ECC count", None)
    ecc_uncorrected_last: int | None = field("last volatile uncorrected ECC count", None)
    first_s: float | None = field("first poll with any value, s since sampler start", None)
    last_ok_s: float | None = field("last poll with any value, s since sampler start", None)
    lost_at_s: float | None = field("first poll answering GPU_IS_LOST (NVML code 15), s since sampler start",
                                    None)
    lost_reason: str | None = field("why the GPU counts as lost", None)
    unsupported: dict[str, str] = field("reading -> NVML's reason it is not available (Not Supported, ...)",
                                        factory=dict)
    last_sample_us: int | None = field("newest nvmlDeviceGetSamples timestamp seen (us); null: no baseline", None)
    not_polled: tuple[str, ...] = field("readings that answered NOT_SUPPORTED (NVML code 3): not polled again "
                                        "for this job", optional_key=True)
    mem_baseline_bytes: int | None = field("v1 nvmlDeviceGetMemoryInfo used before the job's processes (read by "
                                           "the prolog), subtracted from mem_used_bytes; null: v2 or none", optional_key=True)
    mem_source: str | None = field("how mem_used_bytes was read: nvmlDeviceGetMemoryInfo_v2, v1 minus the "
                                   "prolog's baseline, or v1 alone", optional_key=True)
    nvlink_prev: dict | None = field("the last NVLink data counter reading {t_s, tx_kib, rx_kib} (KiB of all "
                                     "links, nvmlDeviceGetFieldValues), the baseline of the next poll's rate",
                                     optional_key=True)
    extra: dict = extra_field()


@dataclass(frozen=True)
class CpuState(Record):
    """The job's CPU time on the node: cgroup ``cpu.stat`` usage_usec (v2) /
    ``cpuacct.usage`` (v1), else the job's processes (psutil)."""

    time_s: float | None = field("CPU seconds used by the job on this node", None)
    source: str | None = field("where time_s came from (cgroup path, psutil)", None)
    extra: dict = extra_field()


@dataclass(frozen=True)
class MemState(Record):
    """The job's host memory on the node: cgroup ``memory.current`` /
    ``memory.peak`` (v2), ``memory.usage_in_bytes`` / ``memory.max_usage_in_bytes``
    (v1), else the RSS sum of its processes."""

    current_bytes: int | float | None = field("last reading, bytes", None)
    peak_bytes: int | float | None = field("high water, bytes (memory.peak, else the highest reading)", None)
    source: str | None = field("where the figures came from", None)
    sampled: MetricState = field("aggregate of the current readings (bytes)", factory=MetricState)
    extra: dict = extra_field()


@dataclass(frozen=True)
class WasteFinding(Record):
    """A waste detection while the job ran (:class:`gsrun.request.waste.GpuWatch`)."""

    code: str = field("gpu_idle, gpu_stuck_collective or gpu_never_used")
    gpu: str = field("the GPU: Slurm gres index as text")
    since_s: float = field("start of the stretch, s since sampler start")
    detected_s: float = field("poll at which the stretch reached its threshold, s since sampler start")
    until_s: float = field("last poll the detection still held at, s since sampler start; absent: only at "
                           "detected_s", optional_key=True)
    evidence: dict = field("figures over the stretch: minutes, polls, util_max_pct, util_mean_pct, "
                           "sm_active_max_pct, tensor_active_max_pct, power_mean_w, power_max_w, power_idle_w, "
                           "power_idle_source (given | min_seen), job_processes, ever_used, basis (signals "
                           "used), limits (what the GPU cannot tell); a stuck detection also signals (gpm | "
                           "nvml_counters) and, without GPM, power_limit_w, link_max_kbs, pcie_max_kbs, "
                           "nvlink_max_kbs (null: not read) and text (the signals in one line)", factory=dict)
    extra: dict = extra_field()


#: what :class:`WasteAction` ``action`` may say
WASTE_ACTIONS = ("alert_mailed", "cancel_warned", "cancel_requested", "cancel_done", "cancel_failed",
                 "cancel_report")


@dataclass(frozen=True)
class WasteAction(Record):
    """An action the job's sampler took on a waste detection while the job
    ran (:mod:`gsrun.node.live`)."""

    time: float = field("when, epoch seconds (the sampler's clock)")
    node: str = field("the node whose sampler took it")
    action: str = field("alert_mailed (the alert's mail request queued in the mail spool; gsrun-node mail "
                        "flush delivers it, with retries), cancel_warned (the warning before an idle cancel: "
                        "live file, and a mail request with idle.alert_mail), cancel_requested (scancel about "
                        "to run), cancel_done (scancel accepted), cancel_failed (scancel refused or timed "
                        "out), cancel_report (report mode: what would have been cancelled)")
    kind: str | None = field("the alert condition (idle, stuck, never_used); null for a cancel action", None)
    detail: str = field("plain language: the alert's lines, the cancel's reason, scancel's answer", "")
    extra: dict = extra_field()


@dataclass(frozen=True)
class SamplerState(Record):
    """The sampler's state file (``sampler.json``), version :data:`STATE_VERSION`."""

    version: int = field("state format version (STATE_VERSION)")
    job_id: str = field("Slurm job id")
    node: str = field("node name")
    start_time: float = field("sampler start, epoch seconds")
    last_time: float = field("last poll, epoch seconds", 0.0)
    interval_s: float = field("poll interval (sampler.interval_s), seconds", 0.0)
    samples: int = field("polls taken", 0)
    gap_s: float = field("seconds the sampler was not running (restart, stopped VM)", 0.0)
    nvml_error: str | None = field("why NVML could not start (null: it did)", None)
    notes: tuple[str, ...] = field("plain-language notes for the summary", ())
    gpus: tuple[GpuState, ...] = field("the job's GPUs on this node, in gres order", ())
    cpu: CpuState = field("CPU time", factory=CpuState)
    mem: MemState = field("host memory", factory=MemState)
    cpu_timeline: TimelineState = field("CPU cores busy over time", factory=TimelineState)
    done: bool = field("true in the final state written when the sampler stopped", False)
    watch: tuple[dict, ...] = field("per GPU, the waste detector's state (gsrun.request.waste.GpuWatch.to_json), "
                                    "in gres order", optional_key=True)
    waste_findings: tuple[WasteFinding, ...] = field("waste detections so far, oldest first (the newest 64)",
                                                     optional_key=True)
    waste_findings_dropped: int = field("older waste detections left out of waste_findings", optional_key=True)
    actions: tuple[WasteAction, ...] = field("actions taken on waste detections (alert mails, idle cancel), "
                                             "oldest first (the newest 32)", optional_key=True)
    extra: dict = extra_field()

    @classmethod
    def from_json(cls, d):
        """The state from ``sampler.json``. Accepts every version up to
        :data:`STATE_VERSION` whose keys it knows (missing keys take their
        defaults, unknown ones are kept in ``extra``).

        Raises:
            ValueError: not an object, a newer version, or a wrong shape.
        """
        if isinstance(d, dict) and isinstance(d.get("version"), int) and d["version"] > STATE_VERSION:
            raise ValueError(f"sampler state version {d['version']} is newer than {STATE_VERSION}")
        return super().from_json(d)


__all__ = ["STATE_VERSION", "GpuRef", "MetricState", "TimelineState", "CounterState", "GpuState", "CpuState",
           "MemState", "WasteFinding", "WasteAction", "WASTE_ACTIONS", "SamplerState"]
