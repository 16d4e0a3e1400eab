"""Plain-language findings with the number behind each. Pure.

Thresholds come from the site config (``findings.*``, per partition).
Each finding: ``{"code", "severity" (info|warn|alert), "text", "value"}``.
"""

from __future__ import annotations

from .config import Config, SETTINGS

_DEFAULTS = {s.key: s.default for s in SETTINGS}


def _t(cfg: Config | None, key: str, partition: str | None):
    return cfg.get(key, partition) if cfg is not None else _DEFAULTS[key]


def findings(summary: dict, cfg: Config | None = None, partition: str | None = None) -> list[dict]:
    out: list[dict] = []
    job, gpu, cpu, mem = summary["job"], summary["gpu"], summary["cpu"], summary["memory"]
    elapsed = job.get("elapsed_s") or 0.0
    state = (job.get("state") or "").upper()
    if state.startswith("CANCELLED") and elapsed <= 0:
        return [{"code": "never_started", "severity": "info", "value": 0,
                 "text": "The job was cancelled before it started: nothing to report."}]
    if state in ("PENDING", "REQUEUED"):
        return [{"code": "deferred", "severity": "info", "value": None,
                 "text": f"The job is {state.lower()}: the report is deferred until it runs."}]
    if elapsed < _t(cfg, "findings.short_job_s", partition):
        out.append({"code": "short_job", "severity": "info", "value": elapsed,
                    "text": f"The job ran {elapsed:.0f} s: too short for the figures below to be meaningful."})
    for g in gpu["devices"]:
        if g.get("lost_at_s") is not None:
            out.append({"code": "gpu_lost", "severity": "alert", "value": g["lost_at_s"],
                        "text": f"GPU {g['index']} on {g['node']} was lost at {g['lost_at_s']:.0f} s "
                                "(hardware event; the node was flagged for the admins). Its figures cover the time before."})
        if g.get("xid"):
            out.append({"code": "xid", "severity": "alert", "value": g["xid"],
                        "text": f"GPU {g['index']} on {g['node']} reported Xid errors {g['xid']}."})
        if g.get("ecc_uncorrected"):
            out.append({"code": "ecc", "severity": "alert", "value": g["ecc_uncorrected"],
                        "text": f"GPU {g['index']} on {g['node']} had {g['ecc_uncorrected']} uncorrected ECC errors."})
    if not gpu["available"]:
        if gpu.get("reason"):
            out.append({"code": "gpu_unavailable", "severity": "info", "value": None,
                        "text": f"GPU figures unavailable: {gpu['reason']}."})
    else:
        real = [g for g in gpu["devices"] if not g["emulated"]]
        idle_thr = _t(cfg, "findings.idle_util_pct", partition)
        idle = [g for g in real if g["util_mean_pct"] is not None and g["util_mean_pct"] < idle_thr]
        for g in idle:
            frac = g.get("util_idle_frac")
            pct = 100.0 * frac if frac is not None else 100.0 - g["util_mean_pct"]
            out.append({"code": "idle_gpu", "severity": "warn", "value": round(pct, 1),
                        "text": f"GPU {g['index']} on {g['node']} was idle {pct:.0f}% of the job: "
                                f"ask for {max(1, len(real) - len(idle))} GPU(s)."})
        low_sm = _t(cfg, "findings.low_sm_activity_pct", partition)
        for g in real:
            u, sm = g["util_mean_pct"], g["sm_active_mean_pct"]
            if u is not None and sm is not None and u >= idle_thr and sm < low_sm:
                out.append({"code": "low_sm_activity", "severity": "warn", "value": sm,
                            "text": f"GPU {g['index']} on {g['node']}: kernels ran {u:.0f}% of the time but kept "
                                    f"only {sm:.0f}% of the SMs busy: the GPU is far less used than its "
                                    "utilization suggests (tiny kernels or small batches; try a larger batch, "
                                    "CUDA graphs or torch.compile)."})
            if u is None and not g.get("lost_at_s"):
                out.append({"code": "util_na", "severity": "info", "value": None,
                            "text": f"GPU {g['index']} on {g['node']}: utilization N/A "
                                    f"({g['unsupported'].get('utilization', 'not reported, e.g. MIG')}); "
                                    "this does not mean the GPU was unused."})
            ts = g.get("throttle_s") or {}
            for cause in ("thermal", "power", "hw_slowdown"):
                s = ts.get(cause) or 0.0
                if elapsed and s > 0.1 * elapsed:
                    out.append({"code": f"throttle_{cause}", "severity": "warn", "value": s,
                                "text": f"GPU {g['index']} on {g['node']} was slowed by {cause.replace('_', ' ')} "
                                        f"{100 * s / elapsed:.0f}% of the time."})
            if g["mem_peak_bytes"] and g["mem_total_bytes"] and g["util_mean_pct"] is not None \
                    and g["mem_peak_bytes"] < 0.1 * g["mem_total_bytes"] and g["util_mean_pct"] >= idle_thr:
                out.append({"code": "gpu_mem_low", "severity": "info",
                            "value": round(100 * g["mem_peak_bytes"] / g["mem_total_bytes"], 1),
                            "text": f"GPU {g['index']} on {g['node']} used at most "
                                    f"{100 * g['mem_peak_bytes'] / g['mem_total_bytes']:.0f}% of its memory: "
                                    "a larger batch, or a MIG slice / MPS share, would fit."})
        cpu_sat = _t(cfg, "findings.cpu_saturated_pct", partition)
        busy = [g["util_mean_pct"] for g in real if g["util_mean_pct"] is not None]
        if cpu["efficiency_pct"] is not None and cpu["efficiency_pct"] >= cpu_sat and busy \
                and sum(busy) / len(busy) < 50:
            out.append({"code": "cpu_bound", "severity": "warn", "value": cpu["efficiency_pct"],
                        "text": f"The allocated CPUs were {cpu['efficiency_pct']:.0f}% busy while the GPUs averaged "
                                f"{sum(busy) / len(busy):.0f}%: the input pipeline is likely CPU-bound "
                                "(more CPUs per task, more DataLoader workers, pin_memory=True)."})
    if mem["efficiency_pct"] is not None and mem["efficiency_pct"] < _t(cfg, "findings.mem_overrequest_pct", partition):
        out.append({"code": "mem_overrequest", "severity": "info", "value": mem["efficiency_pct"],
                    "text": f"The job used {mem['efficiency_pct']:.0f}% of the host memory it requested: "
                            "ask for less so others can run."})
    if cpu["efficiency_pct"] is not None and cpu["efficiency_pct"] < 10 and elapsed >= _t(cfg, "findings.short_job_s", partition):
        out.append({"code": "cpu_idle", "severity": "info", "value": cpu["efficiency_pct"],
                    "text": f"CPU efficiency was {cpu['efficiency_pct']:.0f}%: fewer CPUs per task would do."})
    if summary.get("nodes_missing"):
        out.append({"code": "nodes_missing", "severity": "warn", "value": summary["nodes_missing"],
                    "text": f"No summary from node(s) {', '.join(summary['nodes_missing'])}: figures are partial."})
    return out
