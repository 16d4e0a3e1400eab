"""The per-job GPU/CPU sampler: started detached by the prolog, stopped by the epilog.

Facts per interval (``sampler.interval_s``), for each of the job's GPUs
through the NVML choke point (:mod:`gsrun.nvml`):

- utilization: the driver's own sample buffer (``nvmlDeviceGetSamples``,
  key ``util_samples``) read since the previous poll, so bursts between polls
  are seen; ``nvmlDeviceGetUtilizationRates`` when the buffer is unsupported;
- memory used (``nvmlDeviceGetMemoryInfo``), power (``nvmlDeviceGetPowerUsage``),
  the energy counter (``nvmlDeviceGetTotalEnergyConsumption``), SM clock,
  temperature, throttle reasons (clock event reasons bitmask), PCIe throughput,
  uncorrected ECC count, Xid events, and GPM metrics where supported (SM
  activity, SM occupancy, tensor activity, DRAM bandwidth; Hopper has GPM);
- the job's CPU time and memory from its cgroup (:mod:`gsrun.cgroup`), else
  from its processes found by ``SLURM_JOB_ID`` in their environment (psutil).

State is O(1) in job length (:mod:`gsrun.aggregate`) and is rewritten
atomically every ``sampler.flush_s`` and on SIGTERM, so a killed sampler
loses at most one flush interval. A lost GPU (NVML ``GPU_IS_LOST``), a
missing driver or an unsupported metric is recorded, never a crash.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from .aggregate import HIST_EDGES_PCT, Counter, Metric, Timeline
from .fsutil import atomic_write_json, read_json
from .nvml import GPU_IS_LOST, NA, NvmlUnavailable, is_na, open_nvml

STATE_VERSION = 1
THROTTLE_CAUSES = {"power": 0x4 | 0x80, "thermal": 0x20 | 0x40, "hw_slowdown": 0x8, "sync_boost": 0x10}
GPU_METRICS = ("util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz", "temperature_c",
               "pcie_tx_bytes_s", "pcie_rx_bytes_s", "sm_active_pct", "sm_occupancy_pct",
               "tensor_active_pct", "dram_bw_pct")
TIMELINE_METRICS = ("util_pct", "sm_active_pct", "mem_used_bytes", "power_w")


@dataclass
class GpuRef:
    """A job GPU as the sampler knows it. ``gres_index`` is Slurm's index
    (the ``/dev/nvidiaN`` minor number); ``nvml_index`` is NVML's, found by
    matching the minor number (never by position: field cases 7 and 8)."""

    gres_index: int
    nvml_index: int | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    mem_total_bytes: int | None = None


def resolve_gpus(nv, gres_indices: list[int]) -> tuple[list[GpuRef], list[str]]:
    """Map Slurm gres indices (minor numbers) to NVML devices. Returns the refs
    and notes for indices with no matching device (emulated gres, or a GPU
    hidden from NVML)."""
    by_minor: dict[int, int] = {}
    for i in range(nv.count()):
        m = nv.get(i, "minor")
        if not is_na(m):
            by_minor[int(m)] = i
    refs, notes = [], []
    for g in gres_indices:
        idx = by_minor.get(g)
        if idx is None:
            refs.append(GpuRef(g, None))
            notes.append(f"gres index {g} matches no NVML device minor number")
            continue
        mem = nv.get(idx, "memory")
        refs.append(GpuRef(g, idx, _v(nv.get(idx, "uuid")), _v(nv.get(idx, "pci_bus_id")),
                           _v(nv.get(idx, "name")), None if is_na(mem) else int(mem["total"])))
    return refs, notes


def _v(x):
    return None if is_na(x) else x


def new_gpu_state(ref: GpuRef, timeline_points: int) -> dict:
    return {
        "ref": ref.__dict__.copy(),
        "metrics": {k: Metric((5.0, 50.0), HIST_EDGES_PCT if k.endswith("_pct") else ()).to_dict()
                    for k in GPU_METRICS},
        "timeline": {k: Timeline(timeline_points).to_dict() for k in TIMELINE_METRICS},
        "energy": Counter().to_dict(),
        "throttle_s": {k: 0.0 for k in THROTTLE_CAUSES},
        "xid": [],
        "ecc_uncorrected_first": None,
        "ecc_uncorrected_last": None,
        "lost_at_s": None,
        "unsupported": {},
        "last_sample_us": 0,
    }


def new_state(job_id: str, node: str, refs: list[GpuRef], nvml_error: str | None, notes: list[str],
              t0: float, interval_s: float, timeline_points: int) -> dict:
    return {
        "version": STATE_VERSION, "job_id": job_id, "node": node, "start_time": t0, "last_time": t0,
        "interval_s": interval_s, "samples": 0, "nvml_error": nvml_error, "notes": notes,
        "gpus": [new_gpu_state(r, timeline_points) for r in refs],
        "cpu": {"time_s": None, "source": None},
        "mem": {"current_bytes": None, "peak_bytes": None, "source": None,
                "sampled": Metric().to_dict()},
        "cpu_timeline": Timeline(timeline_points).to_dict(),
        "done": False,
    }


def read_gpu(nv, ref: GpuRef, since_us: int) -> dict:
    """One poll of one GPU -> raw readings (values or NA). I/O only."""
    i = ref.nvml_index
    r = {k: nv.get(i, k) for k in ("memory", "power_mw", "energy_mj", "sm_clock_mhz", "temperature_c",
                                   "throttle_reasons", "pcie_tx_kbs", "pcie_rx_kbs", "ecc_uncorrected",
                                   "gpm", "xid_events")}
    r["util_samples"] = nv.get(i, "util_samples", since_us=since_us)
    if is_na(r["util_samples"]):
        r["utilization"] = nv.get(i, "utilization")
    return r


def update_gpu(g: dict, r: dict, t_rel_s: float, dt_s: float) -> None:
    """Fold one poll's readings into a GPU's state. Pure on dicts."""
    if g["lost_at_s"] is not None:
        return
    if any(is_na(v) and v.code == GPU_IS_LOST for v in r.values()):
        g["lost_at_s"] = t_rel_s
        return
    m = {k: Metric.from_dict(v) for k, v in g["metrics"].items()}
    tl = {k: Timeline.from_dict(v) for k, v in g["timeline"].items()}

    def num(key, scale=1.0):
        v = r.get(key)
        if v is None or is_na(v):
            if is_na(v):
                g["unsupported"][key] = v.reason
            return None
        return float(v) * scale

    # utilization: the driver's samples since the last poll, time-weighted
    util = None
    samples = r.get("util_samples")
    if samples is not None and not is_na(samples):
        samples = [s for s in samples if s[0] > g["last_sample_us"]]
        if samples:
            g["last_sample_us"] = max(s[0] for s in samples)
            util = sum(s[1] for s in samples) / len(samples)
    elif "utilization" in r:
        u = r["utilization"]
        if is_na(u):
            g["unsupported"]["utilization"] = u.reason
        else:
            util = float(u["gpu"])
    mem = r.get("memory")
    mem_used = None if mem is None or is_na(mem) else float(mem["used"])
    gpm = r.get("gpm")
    gpm_ok = gpm if isinstance(gpm, dict) else {}
    if is_na(gpm) and gpm.reason != "first GPM sample":
        g["unsupported"]["gpm"] = gpm.reason
    values = {
        "util_pct": util,
        "mem_used_bytes": mem_used,
        "power_w": num("power_mw", 1e-3),
        "sm_clock_mhz": num("sm_clock_mhz"),
        "temperature_c": num("temperature_c"),
        "pcie_tx_bytes_s": num("pcie_tx_kbs", 1024.0),
        "pcie_rx_bytes_s": num("pcie_rx_kbs", 1024.0),
        "sm_active_pct": gpm_ok.get("sm_active_pct"),
        "sm_occupancy_pct": gpm_ok.get("sm_occupancy_pct"),
        "tensor_active_pct": gpm_ok.get("tensor_active_pct"),
        "dram_bw_pct": gpm_ok.get("dram_bw_pct"),
    }
    for k, v in values.items():
        m[k].add(v, dt_s)
    for k in TIMELINE_METRICS:
        tl[k].add(t_rel_s, values[k])
    e = Counter.from_dict(g["energy"])
    e.add(num("energy_mj"))
    g["energy"] = e.to_dict()
    tr = r.get("throttle_reasons")
    if tr is not None and not is_na(tr):
        for cause, mask in THROTTLE_CAUSES.items():
            if int(tr) & mask:
                g["throttle_s"][cause] += dt_s
    ecc = num("ecc_uncorrected")
    if ecc is not None:
        if g["ecc_uncorrected_first"] is None:
            g["ecc_uncorrected_first"] = ecc
        g["ecc_uncorrected_last"] = ecc
    xids = r.get("xid_events")
    if isinstance(xids, list):
        g["xid"] = (g["xid"] + [int(x) for x in xids])[-32:]
    g["metrics"] = {k: v.to_dict() for k, v in m.items()}
    g["timeline"] = {k: v.to_dict() for k, v in tl.items()}


class JobProcs:
    """CPU time and memory of the job's processes when no job cgroup exists
    (e.g. ``proctrack/linuxproc``): processes whose environment holds
    ``SLURM_JOB_ID=<id>`` and this node's ``SLURMD_NODENAME`` (psutil; root
    reads any environ). CPU time of
    processes that exit between polls is kept (last seen value)."""

    def __init__(self, job_id: str, uid: int | None, node: str | None = None):
        self.job_id = job_id
        self.uid = uid
        self.node = node
        self.seen: dict[tuple[int, float], float] = {}
        self.other: set[tuple[int, float]] = set()   # processes known not to be the job's
        self.rss_peak = 0

    def poll(self) -> tuple[float, int]:
        import psutil

        rss = 0
        for p in psutil.process_iter(["pid", "uids", "create_time"]):
            try:
                if self.uid is not None and p.info["uids"] and p.info["uids"].real != self.uid:
                    continue
                key = (p.info["pid"], p.info["create_time"])
                if key in self.other:
                    continue
                if key not in self.seen:
                    env = p.environ()
                    if env.get("SLURM_JOB_ID") != self.job_id:
                        if time.time() - key[1] > 5.0:   # settled: not between fork and exec
                            self.other.add(key)
                        continue
                    # several slurmd on one host (test clusters, multiple-slurmd):
                    # only this node's tasks
                    if self.node and env.get("SLURMD_NODENAME", self.node) != self.node:
                        self.other.add(key)
                        continue
                ct = p.cpu_times()
                self.seen[key] = ct.user + ct.system
                rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        self.rss_peak = max(self.rss_peak, rss)
        return sum(self.seen.values()), rss


def update_job(state: dict, cpu_time_s, mem_current, mem_peak, source: str, t_rel_s: float, dt_s: float):
    """Fold the job's CPU/memory reading into the state. Pure on dicts."""
    prev = state["cpu"]["time_s"]
    state["cpu"] = {"time_s": cpu_time_s, "source": source}
    sampled = Metric.from_dict(state["mem"]["sampled"])
    sampled.add(mem_current, dt_s)
    peak = mem_peak
    if sampled.max is not None:
        peak = max(peak or 0, sampled.max)
    state["mem"] = {"current_bytes": mem_current, "peak_bytes": peak, "sampled": sampled.to_dict(),
                    "source": source + ("" if mem_peak is not None else " (peak from sampled current)")}
    if prev is not None and cpu_time_s is not None and dt_s > 0:
        tl = Timeline.from_dict(state["cpu_timeline"])
        tl.add(t_rel_s, max(0.0, (cpu_time_s - prev) / dt_s))
        state["cpu_timeline"] = tl.to_dict()


class Sampler:
    """The sampler loop. ``run()`` until SIGTERM/SIGINT or ``max_samples``."""

    def __init__(self, hostfs, job_id: str, uid: int | None, node: str, gres_indices: list[int],
                 state_path: str, interval_s: float, flush_s: float, timeline_points: int = 1000,
                 clock=time.time, sleep=time.sleep):
        self.hostfs = hostfs
        self.job_id = job_id
        self.uid = uid
        self.state_path = state_path
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.clock = clock
        self.sleep = sleep
        self.stop = False
        t0 = clock()
        try:
            self.nv = open_nvml(hostfs)
            refs, notes = resolve_gpus(self.nv, gres_indices)
            err = None
        except NvmlUnavailable as e:
            self.nv = None
            refs = [GpuRef(g, None) for g in gres_indices]
            notes, err = [], str(e)
        prior = read_json(state_path)
        if prior and prior.get("version") == STATE_VERSION and prior.get("job_id") == job_id \
                and not prior.get("done"):
            self.state = prior          # restarted sampler: continue the same aggregates
            self.state["notes"].append(f"sampler restarted at {t0:.0f}")
        else:
            self.state = new_state(job_id, node, refs, err, notes, t0, interval_s, timeline_points)
        self.refs = [GpuRef(**g["ref"]) for g in self.state["gpus"]]
        self.procs = JobProcs(job_id, uid, node)
        self._cg = None
        self._cg_looked = False

    def _job_usage(self):
        from . import cgroup

        if not self._cg_looked:
            self._cg = cgroup.find_job_cgroup(self.hostfs, self.job_id, self.uid)
            self._cg_looked = True
        if self._cg is not None:
            u = cgroup.read_usage(self.hostfs, self._cg)
            if u is not None and u.cpu_time_s is not None:
                return u.cpu_time_s, u.mem_current_bytes, u.mem_peak_bytes, u.source
        cpu, rss = self.procs.poll()
        return cpu, rss, None, "processes with SLURM_JOB_ID (psutil)"

    def sample_once(self) -> None:
        now = self.clock()
        st = self.state
        dt = max(0.0, now - st["last_time"]) if st["samples"] else 0.0
        t_rel = now - st["start_time"]
        if self.nv is not None:
            for ref, g in zip(self.refs, st["gpus"]):
                if ref.nvml_index is None:
                    continue
                try:
                    r = read_gpu(self.nv, ref, g["last_sample_us"])
                except Exception as e:  # noqa: BLE001 - a broken binding must not kill the sampler
                    r = {"memory": NA(f"read failed: {e}", None)}
                update_gpu(g, r, t_rel, dt if st["samples"] else 0.0)
        try:
            cpu, cur, peak, src = self._job_usage()
        except Exception as e:  # noqa: BLE001
            cpu, cur, peak, src = None, None, None, f"unavailable ({e})"
        update_job(st, cpu, cur, peak, src, t_rel, dt)
        st["samples"] += 1
        st["last_time"] = now

    def flush(self, done: bool = False) -> None:
        self.state["done"] = done
        atomic_write_json(self.state_path, self.state, mode=0o600)

    def run(self, max_samples: int | None = None) -> dict:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        last_flush = 0.0
        n = 0
        while not self.stop:
            self.sample_once()
            n += 1
            if self.clock() - last_flush >= self.flush_s:
                self.flush()
                last_flush = self.clock()
            if max_samples is not None and n >= max_samples:
                break
            deadline = self.clock() + self.interval_s
            while not self.stop and self.clock() < deadline:
                self.sleep(min(0.2, max(0.0, deadline - self.clock())))
        self.sample_once()
        self.flush(done=True)
        if self.nv is not None:
            self.nv.close()
        return self.state

    def _on_signal(self, signum, frame):
        self.stop = True


def sampler_pid_alive(pid: int, create_time: float | None) -> bool:
    """True when ``pid`` is still our sampler (same start time: PIDs are reused)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return create_time is None or abs(p.create_time() - create_time) < 0.5
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def stop_sampler(pid: int, create_time: float | None, timeout_s: float = 5.0) -> str:
    """SIGTERM the sampler, wait up to ``timeout_s`` for its final flush, then
    SIGKILL. Returns what happened (``stopped``, ``killed``, ``not running``)."""
    if not sampler_pid_alive(pid, create_time):
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sampler_pid_alive(pid, create_time):
            return "stopped"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    return "killed"
