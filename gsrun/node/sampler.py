"""A job's GPU/CPU sampler on one node: the node monitor keeps one per job.

Each ``sampler.interval_s``, per GPU through :mod:`gsrun.facts.nvml`:
utilization (``nvmlDeviceGetSamples`` since the last poll, else
``nvmlDeviceGetUtilizationRates``), memory used (``nvmlDeviceGetMemoryInfo``
v2; v1 minus the baseline before the job), the job's processes' GPU memory
(``nvmlDeviceGetComputeRunningProcesses``), power, energy, SM clock,
temperature, throttle reasons, PCIe and NVLink throughput, uncorrected ECC,
Xids and GPM (Hopper); the job's CPU and memory from its cgroup, else psutil.
State is O(1) in job length; ``sampler.json`` (:mod:`gsrun.facts.sampler_state`)
is rewritten every ``sampler.flush_s``. A lost GPU, missing driver or
unsupported metric is recorded, never a crash; NOT_SUPPORTED is not polled again.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import suppress

import psutil

from gsrun.base.fsutil import atomic_write, read_json
from gsrun.facts import cgroup
from gsrun.facts.aggregate import Counter, HIST_EDGES_PCT, Metric, Timeline
from gsrun.facts.nvml import GPU_IS_LOST, NA, NOT_SUPPORTED, NvmlUnavailable, index_by_minor, is_na, open_nvml
from gsrun.facts.sampler_state import GpuRef, STATE_VERSION
from gsrun.request.waste import GAP_FACTOR, GpuWatch, IdleConfig

# NVML clock event (throttle) reason bits -> cause (nvmlClocksEventReason*)
THROTTLE_CAUSES = {"power": 0x4 | 0x80,        # SwPowerCap | HwPowerBrakeSlowdown
                   "thermal": 0x20 | 0x40,     # SwThermalSlowdown | HwThermalSlowdown
                   "hw_slowdown": 0x8,         # HwSlowdown
                   "sync_boost": 0x10}         # SyncBoost
GPM_KEYS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct")   # GPM's, as they are
GPU_METRICS = ("util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz", "temperature_c", "pcie_tx_bytes_s",
               "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", *GPM_KEYS, "mem_procs_bytes")
OPTIONAL_METRICS = ("mem_procs_bytes", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s")   # in the state file once read
TIMELINE_METRICS = ("util_pct", "sm_active_pct", "mem_used_bytes", "power_w")
UTIL_THRESHOLDS_PCT = (5.0, 50.0)   # util_pct: time at or above these (idle = below 5 %)
WASTE_FINDINGS_MAX = 64            # detections kept in the state (older ones counted in waste_findings_dropped)
STRETCH_CARRY_S = 30.0              # a waste stretch rides over a pause this long at least (restart, stall, clock step)
GPU_READ_KEYS = ("memory", "power_mw", "energy_mj", "sm_clock_mhz", "temperature_c",
                 "throttle_reasons", "pcie_tx_kbs", "pcie_rx_kbs", "nvlink_kib", "ecc_uncorrected", "xid_events",
                 "compute_processes")
PCIE_KEYS = ("pcie_tx_kbs", "pcie_rx_kbs")
MEM_V2 = "nvmlDeviceGetMemoryInfo_v2"
MEM_V1_BASELINE = "nvmlDeviceGetMemoryInfo v1 minus the prolog's baseline"


def resolve_gpus(nv, gres_indices: list[int]) -> tuple[list[GpuRef], list[str]]:
    """Slurm gres indices (minor numbers) -> (NVML refs, notes for those with no device)."""
    by_minor, lost = index_by_minor(nv)
    refs, notes = [], []
    unmatched = [g for g in gres_indices if g not in by_minor]
    for g in gres_indices:
        idx = by_minor.get(g)
        if idx is None:
            # a GPU_IS_LOST device has no minor number: unmatched GPUs count as lost
            # (field case 16, docs/field-cases.md)
            is_lost = 0 < len(unmatched) <= lost
            refs.append(GpuRef(g, None, lost=is_lost))
            notes.append(f"gres index {g}: " + ("its GPU answers GPU_IS_LOST (fallen off the bus?)" if is_lost
                                                 else "matches no NVML device minor number"))
            continue
        mem = nv.get(idx, "memory")
        mig = nv.get(idx, "mig_mode")
        gpm = nv.get(idx, "gpm_supported")
        name = _v(nv.get(idx, "name"))
        uuid = _v(nv.get(idx, "uuid"))
        is_mig = (isinstance(mig, (list, tuple)) and bool(mig) and mig[0] == 1) \
            or " MIG " in f" {name or ''} " or str(uuid or "").startswith("MIG-")
        limit_mw = nv.get(idx, "power_limit_mw")
        limit = {"power_limit_w": limit_mw / 1000.0} if isinstance(limit_mw, (int, float)) and limit_mw > 0 else {}
        refs.append(GpuRef(g, idx, uuid, _v(nv.get(idx, "pci_bus_id")), name,
                           None if is_na(mem) else int(mem["total"]), bool(is_mig),
                           (not is_na(gpm)) and bool(gpm) and not is_mig, **limit))
    return refs, notes


def _v(x):
    return None if is_na(x) else x


def new_gpu_state(ref: GpuRef, timeline_points: int, mem_baseline_bytes: int | None = None) -> dict:
    """A GPU's live state, aggregates as objects (:func:`state_to_json`)."""
    return {
        "ref": ref.to_json(),     # a key not known (power_limit_w) is left out
        "metrics": {k: Metric(UTIL_THRESHOLDS_PCT if k == "util_pct" else (),
                              HIST_EDGES_PCT if k.endswith("_pct") else ())
                    for k in GPU_METRICS},
        "timeline": {k: Timeline(timeline_points) for k in TIMELINE_METRICS},
        "energy": Counter(),
        "throttle_s": {k: 0.0 for k in THROTTLE_CAUSES},
        "xid": [],
        "ecc_uncorrected_first": None,
        "ecc_uncorrected_last": None,
        "first_s": None,          # job-relative time of the first poll with any value
        "last_ok_s": None,        # ... of the last such poll
        "lost_at_s": 0.0 if ref.lost else None,   # first poll answering GPU_IS_LOST (NVML code 15)
        "lost_reason": "GPU is lost (at sampler start)" if ref.lost else None,
        "unsupported": {},        # key -> NVML's reason (Not Supported, ...)
        "last_sample_us": None,   # newest nvmlDeviceGetSamples timestamp seen (None: no baseline yet)
        "not_polled": [],         # readings that answered NOT_SUPPORTED: not polled again this job
        "mem_baseline_bytes": mem_baseline_bytes,
        "mem_source": None,       # MEM_V2 / MEM_V1_BASELINE (None: v1 alone, as read)
        "nvlink_prev": None,      # last NVLink counter reading {t_s, tx_kib, rx_kib} (None: no baseline)
    }


def new_state(job_id: str, node: str, refs: list[GpuRef], nvml_error: str | None, notes: list[str],
              t0: float, interval_s: float, timeline_points: int,
              mem_baseline: dict[int, int] | None = None) -> dict:
    """The sampler's live state (objects inside; :func:`state_to_json` for disk)."""
    mem_baseline = mem_baseline or {}
    return {
        "version": STATE_VERSION, "job_id": job_id, "node": node, "start_time": t0, "last_time": t0,
        "interval_s": interval_s, "samples": 0, "gap_s": 0.0, "nvml_error": nvml_error, "notes": notes,
        "gpus": [new_gpu_state(r, timeline_points, mem_baseline.get(r.gres_index)) for r in refs],
        "cpu": {"time_s": None, "source": None},
        "mem": {"current_bytes": None, "peak_bytes": None, "source": None, "sampled": Metric()},
        "cpu_timeline": Timeline(timeline_points),
        "done": False,
    }


def state_to_json(state: dict, timelines: bool = True) -> dict:
    """The live state as JSON-able dicts (``sampler.json``). ``timelines=False``
    leaves placeholders (``"@@TL<i>@@"``, ``"@@TLcpu@@"``): for readers that drop them."""
    out = dict(state)
    out["gpus"] = []
    for i, g in enumerate(state["gpus"]):
        d = dict(g)
        d["metrics"] = {k: m.to_dict() for k, m in g["metrics"].items()}
        d["timeline"] = {k: t.to_dict() for k, t in g["timeline"].items()} if timelines else f"@@TL{i}@@"
        d["energy"] = g["energy"].to_dict()
        d["throttle_s"] = dict(g["throttle_s"])
        d["unsupported"] = dict(g["unsupported"])
        d["xid"] = list(g["xid"])
        # written only when they say something (a state without them is as older samplers wrote)
        for k in ("not_polled", "mem_baseline_bytes", "mem_source", "nvlink_prev"):
            if not d.get(k):
                d.pop(k, None)
        if "not_polled" in d:
            d["not_polled"] = list(d["not_polled"])
        for k in OPTIONAL_METRICS:      # never read (no NVLink, PIDs unknown): left out, as before they existed
            if not g["metrics"].get(k, Metric()).n:
                d["metrics"].pop(k, None)
        out["gpus"].append(d)
    out["mem"] = dict(state["mem"], sampled=state["mem"]["sampled"].to_dict())
    out["cpu"] = dict(state["cpu"])
    out["cpu_timeline"] = state["cpu_timeline"].to_dict() if timelines else "@@TLcpu@@"
    out["notes"] = list(state["notes"])
    if "watch" in state:
        out["watch"] = [w.to_json() if hasattr(w, "to_json") else dict(w) for w in state["watch"]]
        out["waste_findings"] = [dict(f) for f in state.get("waste_findings", [])]
    return out


def state_from_json(d: dict, idle_cfg=None) -> dict:
    """Inverse of :func:`state_to_json`; the GPU watches run with ``idle_cfg``."""
    st = dict(d)
    st["gpus"] = []
    for g in d["gpus"]:
        x = dict(g)
        x["metrics"] = {k: Metric.from_dict(v) for k, v in g["metrics"].items()}
        x["timeline"] = {k: Timeline.from_dict(v) for k, v in g["timeline"].items()}
        x["energy"] = Counter.from_dict(g["energy"])
        x.setdefault("not_polled", [])
        for k in ("mem_baseline_bytes", "mem_source", "nvlink_prev"):
            x.setdefault(k, None)
        st["gpus"].append(x)
    st["mem"] = dict(d["mem"], sampled=Metric.from_dict(d["mem"]["sampled"]))
    st["cpu_timeline"] = Timeline.from_dict(d["cpu_timeline"])
    st["notes"] = list(d.get("notes", []))
    if isinstance(d.get("watch"), list):
        cfg = idle_cfg or IdleConfig()
        try:
            st["watch"] = [GpuWatch.from_json(w, cfg) for w in d["watch"]]
        except (ValueError, TypeError, KeyError):
            st.pop("watch")      # a broken watch state: the watches start afresh
        st["waste_findings"] = [f for f in d.get("waste_findings") or [] if isinstance(f, dict)]
    return st


def read_gpu(nv, ref: GpuRef, since_us: int | None, skip=(), first: bool = False) -> dict:
    """One poll of one GPU -> raw readings (values or NA); ``skip`` keys answer
    NA("Not Supported") without a call. With GPM, :data:`PCIE_KEYS` come from
    its metrics (the interval's mean), else from ``nvmlDeviceGetPcieThroughput``
    (blocks ~20 ms per call). A job's ``first`` poll only sets GPM's baseline
    (its interval began before the job) and reads no PCIe figures."""
    i = ref.nvml_index
    gone = NA("Not Supported", NOT_SUPPORTED)

    def get(k, **kw):
        return gone if k in skip else nv.get(i, k, **kw)
    gpm, leave_out = get("gpm") if ref.gpm else None, ()
    if first and isinstance(gpm, dict):
        gpm, leave_out = NA("first GPM sample", None), PCIE_KEYS
    pcie = {k: gpm[k] for k in PCIE_KEYS if isinstance(gpm, dict) and not is_na(gpm.get(k, gone))}
    r = {k: pcie[k] if k in pcie else get(k) for k in GPU_READ_KEYS if k in pcie or k not in leave_out}
    if ref.gpm:
        r["gpm"] = gpm
    r["util_samples"] = get("util_samples", since_us=since_us or 0)
    if is_na(r["util_samples"]):
        r["utilization"] = get("utilization")
    return r


def _lost(r: dict) -> NA | None:
    return next((v for v in r.values() if is_na(v) and v.code == GPU_IS_LOST), None)


def stretch_gap_s(interval_s: float) -> float:
    """The longest pause (s) the waste detector's stretches ride over: 2 polls, :data:`STRETCH_CARRY_S` at least."""
    return max(GAP_FACTOR * interval_s, STRETCH_CARRY_S)


def update_gpu(g: dict, r: dict, t_rel_s: float, dt_s: float, gap_s: float = 0.0,
               job_pids: set[int] | None = None) -> dict | None:
    """Fold one poll's readings into a GPU's live state. Pure.

    ``dt_s``: seconds the readings stand for (0 on the first poll);
    ``gap_s``: seconds before that with no poll (gap time, never 0). Units: %,
    bytes, W (``power_mw`` / 1000), mJ, bytes/s (``pcie_*_kbs`` x 1024), MHz,
    degrees C. ``mem_used_bytes``: v2's ``used`` (the dict has ``reserved``),
    else v1's minus ``g["mem_baseline_bytes"]`` (at least 0);
    ``mem_procs_bytes``: ``used_bytes`` of the compute processes in
    ``job_pids`` (None: a gap).

    Returns the :data:`GPU_METRICS` figures (None where unknown) and
    ``job_gpu_pids`` (the job's PIDs on the GPU, sorted, or None) for the waste
    detector; None for a lost GPU.
    """
    if g["lost_at_s"] is not None:
        return None
    lost = _lost(r)
    if lost is not None:
        # field case 16 (docs/field-cases.md): the statistics cover only the time before
        g["lost_at_s"] = t_rel_s
        g["lost_reason"] = lost.reason
        return None
    m = g["metrics"]
    unsupported = g["unsupported"]

    def num(key, scale=1.0):
        v = r.get(key)
        if v is None:
            return None
        if is_na(v):
            unsupported[key] = v.reason
            return None
        try:
            return float(v) * scale
        except (TypeError, ValueError):
            unsupported[key] = f"unexpected value {v!r}"
            return None

    # utilization: the mean of the driver's samples since the last poll, one per timestamp;
    # the first poll only sets the baseline (the buffer holds samples from before the job)
    util = None
    samples = r.get("util_samples")
    if isinstance(samples, list):
        baseline = g["last_sample_us"]
        fresh = [s for s in samples if isinstance(s, (list, tuple)) and len(s) == 2
                 and (baseline is None or s[0] > baseline)]
        if fresh:
            g["last_sample_us"] = max(int(s[0]) for s in fresh)
            if baseline is not None:
                by_ts = {int(s[0]): float(s[1]) for s in fresh}
                util = sum(by_ts.values()) / len(by_ts)
        elif baseline is None:
            g["last_sample_us"] = 0
    else:
        u = r.get("utilization")
        if is_na(u):
            unsupported["utilization"] = u.reason
        elif isinstance(u, dict) and u.get("gpu") is not None:
            util = float(u["gpu"])
    for k, v in r.items():
        if is_na(v) and v.code == NOT_SUPPORTED and k not in g.setdefault("not_polled", []):
            g["not_polled"].append(k)
    mem = r.get("memory")
    mem_used = None
    if is_na(mem):
        unsupported["memory"] = mem.reason
    elif isinstance(mem, dict) and mem.get("used") is not None:
        mem_used = float(mem["used"])
        base = g.get("mem_baseline_bytes")
        if "reserved" in mem:
            g["mem_source"] = MEM_V2
        elif base is not None:
            mem_used = max(0.0, mem_used - float(base))
            g["mem_source"] = MEM_V1_BASELINE
    procs = r.get("compute_processes")
    mem_procs = None
    gpu_pids = None
    if is_na(procs):
        unsupported["compute_processes"] = procs.reason
    elif isinstance(procs, list) and job_pids is not None:
        mem_procs = float(sum(int(p["used_bytes"]) for p in procs
                              if isinstance(p, dict) and p.get("pid") in job_pids
                              and isinstance(p.get("used_bytes"), int)))
        gpu_pids = sorted({p["pid"] for p in procs if isinstance(p, dict) and p.get("pid") in job_pids})
    nvl_tx, nvl_rx = nvlink_rates(g, r.get("nvlink_kib"), t_rel_s)
    gpm = r.get("gpm")
    if is_na(gpm) and gpm.reason != "first GPM sample":
        unsupported["gpm"] = gpm.reason
    gpm = gpm if isinstance(gpm, dict) else {}      # a refused PCIe metric: read_gpu asked the blocking call
    unsupported.update((k, v.reason) for k, v in gpm.items() if is_na(v) and k not in PCIE_KEYS)
    values = {
        "util_pct": util,
        "mem_used_bytes": mem_used,
        "power_w": num("power_mw", 1e-3),
        "sm_clock_mhz": num("sm_clock_mhz"),
        "temperature_c": num("temperature_c"),
        "pcie_tx_bytes_s": num("pcie_tx_kbs", 1024.0),
        "pcie_rx_bytes_s": num("pcie_rx_kbs", 1024.0),
        "nvlink_tx_bytes_s": nvl_tx,
        "nvlink_rx_bytes_s": nvl_rx,
        **{k: v if isinstance(v := gpm.get(k), (int, float)) else None for k in GPM_KEYS},
        "mem_procs_bytes": mem_procs,
    }
    for k, v in values.items():
        if k not in m:   # a state from before this metric existed (restarted sampler)
            m[k] = Metric()
        if gap_s > 0:
            m[k].add_gap(gap_s)
        m[k].add(v, dt_s)
    tl = g["timeline"]
    for k in TIMELINE_METRICS:
        tl[k].add(t_rel_s, values[k])
    g["energy"].add(num("energy_mj"), t_rel_s)
    if g["first_s"] is None:
        g["first_s"] = t_rel_s
    g["last_ok_s"] = t_rel_s
    tr = r.get("throttle_reasons")
    if tr is not None and not is_na(tr):
        for cause, mask in THROTTLE_CAUSES.items():
            if int(tr) & mask:
                g["throttle_s"][cause] += dt_s
    elif is_na(tr):
        unsupported["throttle_reasons"] = tr.reason
    ecc = num("ecc_uncorrected")
    if ecc is not None:
        if g["ecc_uncorrected_first"] is None:
            g["ecc_uncorrected_first"] = ecc
        g["ecc_uncorrected_last"] = ecc
    xids = r.get("xid_events")
    if isinstance(xids, list) and xids:
        g["xid"] = (g["xid"] + [int(x) for x in xids])[-32:]
    values["job_gpu_pids"] = gpu_pids
    return values


def nvlink_rates(g: dict, reading, t_rel_s: float) -> tuple[float | None, float | None]:
    """NVLink ``(tx, rx)`` bytes/s since ``g["nvlink_prev"]`` from the
    ``nvlink_kib`` counters ``{"tx": KiB, "rx": KiB}`` (all links), which become
    the next baseline. None, never 0, where unknown or a counter went back (reset)."""
    if reading is None:
        return None, None
    if is_na(reading):
        g["unsupported"]["nvlink_kib"] = reading.reason
        g["nvlink_prev"] = None
        return None, None
    try:
        tx, rx = int(reading["tx"]), int(reading["rx"])
    except (KeyError, TypeError, ValueError):
        g["unsupported"]["nvlink_kib"] = f"unexpected value {reading!r}"[:200]
        g["nvlink_prev"] = None
        return None, None
    prev = g.get("nvlink_prev")
    g["nvlink_prev"] = {"t_s": t_rel_s, "tx_kib": tx, "rx_kib": rx}
    if not isinstance(prev, dict):
        return None, None
    try:
        span = t_rel_s - float(prev["t_s"])
        deltas = (tx - int(prev["tx_kib"]), rx - int(prev["rx_kib"]))
    except (KeyError, TypeError, ValueError):
        return None, None
    if span <= 0:
        return None, None
    tx_s, rx_s = (None if d < 0 else d * 1024.0 / span for d in deltas)
    return tx_s, rx_s


_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError)
SETTLED_S = 5.0     # a process this old is past fork and exec: its environment stays
RECHECK_S = 30.0    # root (before a setuid) or the job's user (before its exec) may still become the job's
# (pid, create_time) -> (real uid, read at) of settled processes, shared by every job's scan in the node monitor
_SETTLED_UIDS: dict[tuple[int, float], tuple[int, float]] = {}


class JobProcs:
    """CPU time and memory of the job's processes without a job cgroup: those
    with ``SLURM_JOB_ID=<id>`` and this ``SLURMD_NODENAME`` in their environment
    (an exited process's CPU time is kept, in one sum), found in ``psutil``'s cached process table."""

    def __init__(self, job_id: str, uid: int | None, node: str | None = None):
        self.job_id, self.uid, self.node = job_id, uid, node
        self.seen: dict[tuple[int, float], float] = {}   # the job's live processes -> their CPU seconds
        self.exited_cpu_s = 0.0                         # the CPU seconds of those that exited
        self.other: dict[tuple[int, float], float] = {}  # processes not the job's -> until (inf: for good)
        self.current: set[int] = set()                # the job's PIDs at the last poll

    def poll(self) -> tuple[float, int]:
        """``(cumulative CPU seconds, current RSS bytes)`` of the job's processes."""
        rss = 0
        current: set[int] = set()
        for key, p in self._scan():
            with suppress(*_GONE):
                ct = p.cpu_times()
                self.seen[key] = ct.user + ct.system
                rss += p.memory_info().rss
                current.add(key[0])
        self.current = current
        return self.exited_cpu_s + sum(self.seen.values()), rss

    def _scan(self):
        """``((pid, create_time), process)`` of every process of the job's on this node."""
        now, live = time.time(), set()
        for p in psutil.process_iter():
            try:
                key = (p.pid, p.create_time())
                if key in self.seen and not p.is_running():     # its pid reused: psutil >= 6 kept the old object
                    continue
                live.add(key)
                if self.other.get(key, 0.0) > now:
                    continue
                if key not in self.seen:
                    settled = now - key[1] > SETTLED_S
                    uid, read_at = _SETTLED_UIDS.get(key, (None, 0.0))
                    if uid is None or (uid == 0 and now - read_at > RECHECK_S):
                        uid = p.uids().real
                        if settled:
                            _SETTLED_UIDS[key] = (uid, now)
                    mine = self.uid is None or uid == self.uid
                    env = p.environ() if mine else {}
                    job = env.get("SLURM_JOB_ID")
                    # another job's, or (several slurmd on one host) another node's task of this job
                    if job != self.job_id or (self.node and env.get("SLURMD_NODENAME", self.node) != self.node):
                        if settled:     # for good when another job's or another user's, else looked at again
                            self.other[key] = float("inf") if job or (not mine and uid) else now + RECHECK_S
                        continue
            except _GONE:
                continue
            yield key, p
        if len(_SETTLED_UIDS) > 2 * len(live) + 64:
            for key in _SETTLED_UIDS.keys() - live:
                del _SETTLED_UIDS[key]
        self.other = {k: v for k, v in self.other.items() if k in live}
        for key in self.seen.keys() - live:     # one sum, not a key per process the job ever ran
            self.exited_cpu_s += self.seen.pop(key)


def update_job(state: dict, cpu_time_s, mem_current, mem_peak, source: str, t_rel_s: float, dt_s: float):
    """Fold the job's CPU seconds and memory bytes in. Pure. ``mem_peak`` None: the highest sampled."""
    prev = state["cpu"]["time_s"]
    state["cpu"] = {"time_s": cpu_time_s, "source": source}
    sampled = state["mem"]["sampled"]
    sampled.add(mem_current, dt_s)
    peak = mem_peak
    if sampled.max is not None:
        peak = max(peak or 0, sampled.max)
    state["mem"] = {"current_bytes": mem_current, "peak_bytes": peak, "sampled": sampled,
                    "source": source + ("" if mem_peak is not None else " (peak from sampled current)")}
    if prev is not None and cpu_time_s is not None and dt_s > 0:
        state["cpu_timeline"].add(t_rel_s, max(0.0, (cpu_time_s - prev) / dt_s))


class Sampler:
    """One job's sampling on this node: :meth:`poll` each ``interval_s``,
    :meth:`finish` at its end. Injectable ``clock``, ``nvml`` (a
    backend or a callable returning one) and ``usage`` (``() -> (cpu_time_s,
    mem_current_bytes, mem_peak_bytes, source)``). ``mem_baseline``: gres index
    -> v1 memory used before the job. ``export(state)``: called after each flush."""

    export = None

    def __init__(self, hostfs, job_id: str, uid: int | None, node: str, gres_indices: list[int],
                 state_path: str, interval_s: float, flush_s: float, timeline_points: int = 1000,
                 clock=time.time, nvml=None, usage=None,
                 mem_baseline: dict[int, int] | None = None, idle=None):
        self.hostfs = hostfs
        self.job_id = job_id
        self.uid = uid
        self.state_path = state_path
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.clock = clock
        self._last_flush: float | None = None
        t0 = clock()
        try:
            if nvml is None:
                self.nv = open_nvml(hostfs)
            elif callable(nvml) and not hasattr(nvml, "get"):
                self.nv = nvml()
            else:
                self.nv = nvml
            refs, notes = resolve_gpus(self.nv, gres_indices)
            err = None
        except NvmlUnavailable as e:
            # field case 15 (docs/field-cases.md): the job runs on; the GPU section says why
            self.nv = None
            refs = [GpuRef(g, None) for g in gres_indices]
            notes, err = [f"NVML: {e}"], f"NVML init failed: {e.code_name}"
        prior = read_json(state_path)
        if prior and prior.get("version") == STATE_VERSION and prior.get("job_id") == job_id \
                and not prior.get("done"):
            self.state = state_from_json(prior, idle)   # restarted sampler: continue the same aggregates
            self.state["notes"].append(f"sampler restarted at {t0:.0f}")
        else:
            self.state = new_state(job_id, node, refs, err, notes, t0, interval_s, timeline_points,
                                   mem_baseline)
        self.refs = [GpuRef(**g["ref"]) for g in self.state["gpus"]]
        self.idle_cfg = idle if idle is not None else IdleConfig()
        w = self.state.get("watch")
        if not (isinstance(w, list) and len(w) == len(self.refs)):
            self.state["watch"] = [GpuWatch(str(r.gres_index), self.idle_cfg) for r in self.refs]
            self.state["waste_findings"] = []
        for watch, r in zip(self.state["watch"], self.refs):     # a new watch's, or a restored one's
            watch.power_limit_w = r.power_limit_w      # not in the watch's state: the ref holds it
            watch.max_gap_s, watch.window_s = stretch_gap_s(interval_s), interval_s   # not the restored state's
        self.state.setdefault("waste_findings", [])
        self.procs = JobProcs(job_id, uid, node)
        self._cg, self._cg_looked = None, False     # the job's cgroup, once looked for
        self._usage = usage
        self.live = None          # gsrun.node.live.LiveActions (the monitor sets it)

    def _job_usage(self):
        if self._usage is not None:
            return self._usage()

        if not self._cg_looked:
            self._cg = cgroup.find_job_cgroup(self.hostfs, self.job_id, self.uid)
            self._cg_looked = True
        if self._cg is not None:
            u = cgroup.read_usage(self.hostfs, self._cg)
            if u is not None and u.cpu_time_s is not None:
                return u.cpu_time_s, u.mem_current_bytes, u.mem_peak_bytes, u.source
        cpu, rss = self.procs.poll()
        return cpu, rss, None, "processes with SLURM_JOB_ID (psutil)"

    def _job_pids(self) -> set[int] | None:
        """The job's PIDs: its cgroup's, else :class:`JobProcs`'s; None when usage is injected."""
        if self._usage is not None:
            return None
        if self._cg is not None:
            return set(cgroup.read_pids(self.hostfs, self._cg))
        return set(self.procs.current)

    def sample_once(self) -> None:
        """One poll of every GPU and of the job's CPU/memory."""
        now = self.clock()
        st = self.state
        dt = max(0.0, now - st["last_time"]) if st["samples"] else 0.0
        gap = 0.0
        if dt > GAP_FACTOR * self.interval_s:
            # not running (restart, stopped VM): one interval of readings, the rest gap
            gap, dt = dt - self.interval_s, self.interval_s
            st["gap_s"] = st.get("gap_s", 0.0) + gap
        t_rel = now - st["start_time"]
        try:
            cpu, cur, peak, src = self._job_usage()
        except Exception as e:  # noqa: BLE001
            cpu, cur, peak, src = None, None, None, f"unavailable ({e})"
        pids = None
        if self.nv is not None:
            try:
                pids = self._job_pids()
            except Exception:  # noqa: BLE001 - no PIDs: the job-process figure has a gap
                pids = None
        watches = st["watch"]
        for i, (ref, g) in enumerate(zip(self.refs, st["gpus"])):
            vals = None
            if self.nv is not None and ref.nvml_index is not None and g["lost_at_s"] is None:
                # (a lost GPU is not polled again: calls on it may hang)
                try:
                    r = read_gpu(self.nv, ref, g["last_sample_us"], set(g.get("not_polled", ())),
                             first=not st["samples"])
                except Exception as e:  # noqa: BLE001 - a broken binding must not kill the sampler
                    r = {"memory": NA(f"read failed: {e}", None)}
                vals = update_gpu(g, r, t_rel, dt, gap, pids)
                self._warn_energy(ref, g)
            self._watch(watches[i], t_rel, vals)
        update_job(st, cpu, cur, peak, src, t_rel, dt)
        st["samples"] += 1
        st["last_time"] = now

    def _watch(self, watch, t_rel: float, vals: dict | None) -> None:
        """Feed one GPU's poll to its waste detector (findings: the newest :data:`WASTE_FINDINGS_MAX`)."""
        try:
            new = watch.update(t_rel, vals or {})
        except Exception as e:  # noqa: BLE001 - the detector must never cost the job its figures
            note = f"waste detection stopped on GPU {watch.gpu}: {e}"
            if note not in self.state["notes"]:
                self.state["notes"].append(note)
            return
        found = self.state["waste_findings"]
        st = watch.stretch
        if st is not None and st.reported and not new:
            # the detection still holds: how long it lasted (until_s), for the final report
            for f in reversed(found):
                if f["gpu"] == watch.gpu and f["since_s"] == round(st.since_s, 3):
                    f["until_s"] = round(st.last_s, 3)
                    break
        if new:
            found.extend(new)
            if len(found) > WASTE_FINDINGS_MAX:
                drop = len(found) - WASTE_FINDINGS_MAX
                del found[:drop]
                self.state["waste_findings_dropped"] = self.state.get("waste_findings_dropped", 0) + drop

    def _warn_energy(self, ref: GpuRef, g: dict) -> None:
        """Note once per GPU that the energy counter gave nothing: power is integrated."""
        why = g["unsupported"].get("energy_mj")
        if why is None or g["energy"].first is not None:
            return
        # NOT_SUPPORTED is final; another error only after 3 polls without a reading
        if "energy_mj" not in g.get("not_polled", ()) and g["metrics"]["power_w"].n + \
                g["metrics"]["power_w"].gap_s / max(self.interval_s, 1e-9) < 3:
            return
        note = (f"GPU {ref.gres_index}: energy counter (nvmlDeviceGetTotalEnergyConsumption) {why}: "
                "energy estimated from power samples")
        if any(n.startswith(f"GPU {ref.gres_index}: energy counter") for n in self.state["notes"]):
            return
        self.state["notes"].append(note)

        print(f"gsrun: sampler: job {self.job_id}: warning: {note}", file=sys.stderr, flush=True)

    def flush(self, done: bool = False) -> None:
        """Rewrite the state file atomically. No fsync: a killed daemon leaves
        the file in the page cache, and a node that crashes ends its jobs."""
        self.state["done"] = done
        text = json.dumps(state_to_json(self.state), separators=(",", ":"))
        atomic_write(self.state_path, text + "\n", 0o600, durable=False)
        if self.export is not None:    # [metrics] textfile_dir: gsrun.node.metrics_textfile
            self.export(self.state)

    def after_flush(self) -> None:
        """The live effects (:mod:`gsrun.node.live`), when the monitor set ``self.live``."""
        if self.live is not None:
            self.live.after_flush(self.state, lambda: state_to_json(self.state, timelines=False))

    def poll(self) -> None:
        """One poll; a flush and the live effects when ``flush_s`` has passed (at once on the first)."""
        self.sample_once()
        now = self.clock()
        if self._last_flush is None or now - self._last_flush >= self.flush_s:
            self.flush()
            self.after_flush()
            self._last_flush = now

    def finish(self) -> None:
        """The last sample and the final flush (``done``)."""
        self.sample_once()
        self.flush(done=True)
