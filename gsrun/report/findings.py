"""Plain-language findings with the number behind each. Pure.

Thresholds come from the site config (``findings.*``, per partition).
Each finding: ``{"code", "severity" (info|warn|alert), "text", "value"}``;
``value`` is the number the text is about (percent, seconds, a list).

Order: hardware events first (lost GPU, Xid, ECC: whatever the job length),
then, for jobs long enough for the figures to mean something
(``findings.short_job_s``), advice: idle GPUs, low SM activity, throttling,
GPU memory, a CPU-bound input pipeline, host memory over-request, idle CPUs.
A short job gets the ``short_job`` line and no advice. A GPU without a
utilization figure (MIG, field case 12 in docs/field-cases.md) is never called
idle or unused.

Codes: :class:`gsrun.report.records.FindingCode` (never_started, deferred,
short_job, gpu_lost, xid, ecc, gpu_unavailable, idle_gpu, low_sm_activity,
util_na, throttle_thermal, throttle_power, throttle_hw_slowdown, gpu_mem_low,
cpu_bound, mem_overrequest, cpu_idle, cpu_anomaly, nodes_missing).
"""

from __future__ import annotations

from gsrun.request.config import Config, SETTINGS
from gsrun.report.records import Finding, FindingCode

_DEFAULTS = {s.key: s.default for s in SETTINGS}
THROTTLE_FRAC = 0.10        # throttled more than this share of the GPU's time -> finding
CPU_IDLE_PCT = 10.0         # CPU efficiency below this -> fewer CPUs
CPU_BOUND_GPU_PCT = 50.0    # GPUs below this mean while CPUs saturated -> CPU-bound pipeline
XID_MEANING = {79: "GPU has fallen off the bus", 48: "double-bit ECC error", 63: "ECC page retirement",
               64: "ECC page retirement failure", 74: "NVLink error", 94: "contained ECC error",
               95: "uncontained ECC error", 119: "GSP timeout", 13: "graphics engine exception",
               31: "GPU memory page fault", 43: "GPU stopped processing"}


def _t(cfg: Config | None, key: str, partition: str | None):
    return cfg.get(key, partition) if cfg is not None else _DEFAULTS[key]


def _gpu(g: dict) -> str:
    return f"GPU {g['index']} on {g['node']}"


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _hardware(gpu: dict) -> list[dict]:
    out = []
    for g in gpu["devices"]:
        if g.get("lost_at_s") is not None:
            xid = " (Xid 79: fallen off the bus)" if 79 in (g.get("xid") or []) else ""
            out.append({"code": FindingCode.GPU_LOST, "severity": "alert", "value": g["lost_at_s"],
                        "text": f"Hardware event: {_gpu(g)} was lost {g['lost_at_s']:.0f} s into the job{xid} "
                                "and the node was flagged for the admins. Its figures cover only the time "
                                "before; if the job failed then, resubmit it."})
        xids = [x for x in (g.get("xid") or []) if not (x == 79 and g.get("lost_at_s") is not None)]
        if xids:
            named = ", ".join(f"{x} ({XID_MEANING[x]})" if x in XID_MEANING else str(x)
                              for x in dict.fromkeys(xids))
            out.append({"code": FindingCode.XID, "severity": "alert", "value": list(xids),
                        "text": f"Hardware event: {_gpu(g)} reported Xid error(s) {named}."})
        if g.get("ecc_uncorrected"):
            out.append({"code": FindingCode.ECC, "severity": "alert", "value": g["ecc_uncorrected"],
                        "text": f"Hardware event: {_gpu(g)} had {g['ecc_uncorrected']} uncorrected ECC "
                                "error(s) during the job."})
    return out


def findings(summary: dict, cfg: Config | None = None, partition: str | None = None) -> list[dict]:
    """The findings of a job summary (see :func:`gsrun.report.summary.job_summary`),
    JSON form: ``[{"code", "severity", "text", "value"}]``."""
    return [f.to_json() for f in finding_records(summary, cfg, partition)]


def finding_records(summary: dict, cfg: Config | None = None, partition: str | None = None) -> list[Finding]:
    """The findings of a job summary (JSON form) as :class:`~gsrun.report.records.Finding`
    records, most important first (see the module doc)."""
    return [Finding(**f) for f in _findings(summary, cfg, partition)]


def _findings(summary: dict, cfg: Config | None, partition: str | None) -> list[dict]:
    out: list[dict] = []
    job, gpu, cpu, mem = summary["job"], summary["gpu"], summary["cpu"], summary["memory"]
    elapsed = job.get("elapsed_s") or 0.0
    state = (job.get("state") or "").upper()
    if state.startswith("CANCELLED") and elapsed <= 0:
        return [{"code": FindingCode.NEVER_STARTED, "severity": "info", "value": 0,
                 "text": "The job was cancelled before it started: nothing to report."}]
    if state in ("PENDING", "REQUEUED"):
        return [{"code": FindingCode.DEFERRED, "severity": "info", "value": None,
                 "text": f"The job is {state.lower()}: the report is deferred until it runs."}]
    out += _hardware(gpu)
    if not gpu["available"] and gpu.get("reason"):
        out.append({"code": FindingCode.GPU_UNAVAILABLE, "severity": "info", "value": None,
                    "text": f"GPU figures unavailable: {gpu['reason']}."})
    if summary.get("nodes_missing"):
        out.append({"code": FindingCode.NODES_MISSING, "severity": "warn", "value": summary["nodes_missing"],
                    "text": f"No summary from node(s) {', '.join(summary['nodes_missing'])}: figures are partial."})
    short_s = _t(cfg, "findings.short_job_s", partition)
    if elapsed < short_s:
        out.append({"code": FindingCode.SHORT_JOB, "severity": "info", "value": round(elapsed, 1),
                    "text": f"The job ran {elapsed:.0f} s (less than {short_s:.0f} s): too short for the "
                            "figures below to be meaningful, so there is no advice."})
        return out
    real = [g for g in gpu["devices"] if g.get("status", "emulated" if g["emulated"] else "ok") in ("ok", "lost")]
    if gpu["available"]:
        out += _gpu_advice(real, cfg, partition)
    cpu_sat = _t(cfg, "findings.cpu_saturated_pct", partition)
    busy = [g["util_mean_pct"] for g in real if g["util_mean_pct"] is not None]
    if gpu["available"] and cpu["efficiency_pct"] is not None and cpu["efficiency_pct"] >= cpu_sat and busy \
            and sum(busy) / len(busy) < CPU_BOUND_GPU_PCT:
        gmean = sum(busy) / len(busy)
        out.append({"code": FindingCode.CPU_BOUND, "severity": "warn", "value": cpu["efficiency_pct"],
                    "text": f"The allocated CPUs were {cpu['efficiency_pct']:.0f}% busy while the GPUs were "
                            f"busy only {gmean:.0f}% of the time: the input pipeline is likely CPU-bound. "
                            "Use more DataLoader workers (num_workers), pin_memory=True, and ask for more "
                            "CPUs per GPU if the node has them."})
    if cpu.get("anomaly"):
        out.append({"code": FindingCode.CPU_ANOMALY, "severity": "info", "value": cpu["efficiency_pct"],
                    "text": "The CPU time exceeds the allocated cores x elapsed time (accounting anomaly): "
                            "CPU efficiency is shown as 100%."})
    if mem["efficiency_pct"] is not None and mem["efficiency_pct"] < _t(cfg, "findings.mem_overrequest_pct", partition):
        out.append({"code": FindingCode.MEM_OVERREQUEST, "severity": "info", "value": mem["efficiency_pct"],
                    "text": f"The job used at most {mem['efficiency_pct']:.0f}% of the host memory it requested: "
                            "ask for less next time so other jobs can run."})
    if cpu["efficiency_pct"] is not None and cpu["efficiency_pct"] < CPU_IDLE_PCT:
        out.append({"code": FindingCode.CPU_IDLE, "severity": "info", "value": cpu["efficiency_pct"],
                    "text": f"CPU efficiency was {cpu['efficiency_pct']:.0f}% of {job.get('cpus_alloc')} "
                            "allocated cores: fewer CPUs per task would do."})
    return out


def _gpu_advice(real: list[dict], cfg, partition) -> list[dict]:
    out = []
    idle_thr = _t(cfg, "findings.idle_util_pct", partition)
    low_sm = _t(cfg, "findings.low_sm_activity_pct", partition)
    idle = [g for g in real if g["util_mean_pct"] is not None and g["util_mean_pct"] < idle_thr]
    with_util = [g for g in real if g["util_mean_pct"] is not None]
    keep = len(real) - len(idle)
    for g in idle:
        frac = g.get("util_idle_frac")
        pct = 100.0 * frac if frac is not None else 100.0 - g["util_mean_pct"]
        if keep > 0:
            advice = f"ask for {_n(keep, 'GPU')}"
        else:
            advice = "check that the code runs on the GPU at all (e.g. model and data moved to 'cuda')"
        out.append({"code": FindingCode.IDLE_GPU, "severity": "warn", "value": round(pct, 1),
                    "text": f"{_gpu(g)} was idle {pct:.0f}% of the job (mean utilization "
                            f"{g['util_mean_pct']:.1f}%): {advice}."})
    for g in with_util:
        u, sm = g["util_mean_pct"], g.get("sm_active_mean_pct")
        if sm is not None and u >= idle_thr and sm < low_sm and sm < 0.5 * u:
            out.append({"code": FindingCode.LOW_SM_ACTIVITY, "severity": "warn", "value": sm,
                        "text": f"{_gpu(g)}: SM activity {sm:.1f}% is far below its utilization {u:.0f}%: "
                                "kernels ran most of the time but kept few of the GPU's SMs busy (tiny kernels "
                                "or small batches). Try a larger batch, CUDA graphs or torch.compile."})
    for g in real:
        if g["util_mean_pct"] is None and g.get("status") != "lost":
            why = "N/A (MIG)" if g.get("mig") or g.get("util_na_reason") == "MIG" \
                else f"N/A ({g.get('util_na_reason') or 'not reported'})"
            out.append({"code": FindingCode.UTIL_NA, "severity": "info", "value": None,
                        "text": f"{_gpu(g)}: utilization {why}: NVML gives no utilization figure here, which "
                                "does not mean the GPU was unused."
                                + (f" Its memory high water was {g['mem_peak_pct']:.0f}% of the slice."
                                   if g.get("mem_peak_pct") is not None else "")})
        covered = g.get("covered_s") or 0.0
        ts = g.get("throttle_s") or {}
        for cause in ("thermal", "power", "hw_slowdown"):
            s = ts.get(cause) or 0.0
            if covered > 0 and s > THROTTLE_FRAC * covered:
                hint = {"thermal": "report it to the admins (cooling)",
                        "power": "the GPU hit its power limit; normal for heavy loads, report it if frequent",
                        "hw_slowdown": "report it to the admins"}[cause]
                out.append({"code": FindingCode(f"throttle_{cause}"), "severity": "warn", "value": round(s, 1),
                            "text": f"{_gpu(g)} was slowed down by {cause.replace('_', ' ')} "
                                    f"{100 * s / covered:.0f}% of the time ({s:.0f} s): {hint}."})
        if g["mem_peak_bytes"] and g["mem_total_bytes"] and g["util_mean_pct"] is not None \
                and g["mem_peak_bytes"] < 0.1 * g["mem_total_bytes"] and g["util_mean_pct"] >= idle_thr:
            out.append({"code": FindingCode.GPU_MEM_LOW, "severity": "info",
                        "value": round(100 * g["mem_peak_bytes"] / g["mem_total_bytes"], 1),
                        "text": f"{_gpu(g)} used at most "
                                f"{100 * g['mem_peak_bytes'] / g['mem_total_bytes']:.0f}% of its memory: "
                                "a larger batch would fit, or a MIG slice / MPS share would do."})
    return out
