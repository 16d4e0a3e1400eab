"""Node and job efficiency summaries (schema ``gsrun.summary/1``). Pure.

- :func:`node_summary`: the epilog turns the sampler's state into one node's
  summary (per GPU: utilization mean, SM/tensor activity means, memory high
  water vs total, energy and mean power, seconds throttled per cause, Xid and
  ECC events, lost-at time; the job's CPU time and memory high water there).
- :func:`job_summary`: EpilogSlurmctld (or ``gseff``) merges node summaries
  and the job record into one summary with CPU efficiency
  (CPU time / (allocated cores x elapsed)), memory high water vs request,
  GPU-hours used vs allocated, energy, and plain-language findings.
- :func:`js1_blob`: the compact ``JS1:`` + base64(gzip(json)) form that
  Princeton jobstats and reportseff read from ``AdminComment``.

Units are in the names. ``None`` means "not available" and is shown as N/A,
never as 0.
"""

from __future__ import annotations

import base64
import gzip
import json

from . import SUMMARY_SCHEMA
from .aggregate import Counter, Metric


def _metric(g: dict, key: str) -> Metric:
    return Metric.from_dict(g["metrics"][key])


def _r(x, nd=1):
    return None if x is None else round(float(x), nd)


def gpu_summary(g: dict, node: str, elapsed_s: float) -> dict:
    """One GPU's figures from its sampler state."""
    ref = g["ref"]
    util = _metric(g, "util_pct")
    sm = _metric(g, "sm_active_pct")
    tensor = _metric(g, "tensor_active_pct")
    mem = _metric(g, "mem_used_bytes")
    power = _metric(g, "power_w")
    energy = Counter.from_dict(g["energy"])
    energy_j = energy.total / 1000.0 if energy.first is not None else None
    covered_s = (g["lost_at_s"] if g["lost_at_s"] is not None else elapsed_s) or 0.0
    power_mean = None
    if energy_j is not None and covered_s > 0 and energy.last != energy.first:
        power_mean = energy_j / covered_s
    elif power.mean is not None:
        power_mean = power.mean
    ecc = None
    if g.get("ecc_uncorrected_last") is not None:
        ecc = int(g["ecc_uncorrected_last"] - (g.get("ecc_uncorrected_first") or 0))
    return {
        "node": node,
        "index": ref["gres_index"],
        "nvml_index": ref["nvml_index"],
        "name": ref.get("name"),
        "uuid": ref.get("uuid"),
        "pci_bus_id": ref.get("pci_bus_id"),
        "util_mean_pct": _r(util.mean),
        "util_idle_frac": _r(None if util.weight_s <= 0 else 1.0 - (util.frac_above(5.0) or 0.0), 3),
        "sm_active_mean_pct": _r(sm.mean),
        "sm_occupancy_mean_pct": _r(_metric(g, "sm_occupancy_pct").mean),
        "tensor_active_mean_pct": _r(tensor.mean),
        "dram_bw_mean_pct": _r(_metric(g, "dram_bw_pct").mean),
        "mem_peak_bytes": None if mem.max is None else int(mem.max),
        "mem_total_bytes": ref.get("mem_total_bytes"),
        "energy_j": _r(energy_j),
        "power_mean_w": _r(power_mean),
        "power_max_w": _r(power.max),
        "temperature_max_c": _r(_metric(g, "temperature_c").max),
        "throttle_s": {k: _r(v) for k, v in g["throttle_s"].items()},
        "xid": list(g.get("xid", [])),
        "ecc_uncorrected": ecc,
        "lost_at_s": g["lost_at_s"],
        "unsupported": dict(g.get("unsupported", {})),
        "timeline": {k: v["points"] for k, v in g["timeline"].items()},
        "emulated": ref["nvml_index"] is None,
    }


def node_summary(state: dict, job_env: dict, end_time: float) -> dict:
    """The epilog's summary of one node.

    ``state`` is the sampler state (or None when no sampler ran: the reason
    goes in ``notes``); ``job_env`` is the validated job context from the
    prolog record (:mod:`gsrun.jobenv`). ``end_time`` is epoch seconds.
    """
    node = job_env["node"]
    if state is None:
        start = job_env.get("prolog_time") or end_time
        return {"schema": SUMMARY_SCHEMA, "kind": "node", "job_id": job_env["job_id"], "node": node,
                "start_time": start, "end_time": end_time, "elapsed_s": _r(end_time - start, 3),
                "cpus_alloc": job_env.get("cpus_on_node"), "gres_gpus": job_env.get("gpus") or [],
                "cpu_time_s": None, "cpu_source": None, "mem_peak_bytes": None, "mem_source": None,
                "gpu_available": False, "gpu_reason": "no sampler state (sampler did not run)",
                "gpus": [], "samples": 0, "notes": ["no sampler state"]}
    elapsed = max(0.0, end_time - state["start_time"])
    nvml_error = state.get("nvml_error")
    gpus = [gpu_summary(g, node, elapsed) for g in state["gpus"]]
    real = [g for g in gpus if not g["emulated"]]
    reason = None
    if nvml_error:
        reason = nvml_error
    elif gpus and not real:
        reason = "no NVIDIA device matches the job's gres (emulated GPUs)"
    elif not gpus:
        reason = "job has no GPUs on this node"
    return {
        "schema": SUMMARY_SCHEMA, "kind": "node", "job_id": state["job_id"], "node": node,
        "start_time": state["start_time"], "end_time": end_time, "elapsed_s": _r(elapsed, 3),
        "cpus_alloc": job_env.get("cpus_on_node"), "gres_gpus": job_env.get("gpus") or [],
        "cpu_time_s": _r(state["cpu"]["time_s"], 3), "cpu_source": state["cpu"]["source"],
        "mem_peak_bytes": None if state["mem"]["peak_bytes"] is None else int(state["mem"]["peak_bytes"]),
        "mem_source": state["mem"]["source"],
        "gpu_available": bool(real) and not nvml_error, "gpu_reason": reason,
        "gpus": gpus, "samples": state["samples"], "notes": list(state.get("notes", [])),
        "cpu_timeline": state.get("cpu_timeline", {}).get("points", []),
    }


def job_summary(job: dict, nodes: list[dict], cfg=None, partition: str | None = None) -> dict:
    """Merge node summaries into the job summary.

    ``job``: fields from the job record (``id``, ``user``, ``name``,
    ``partition``, ``state``, ``exit_code``, ``nodes`` (expected node names),
    ``cpus_alloc``, ``mem_req_bytes``, ``gpus_alloc``, ``mail_user``,
    ``mail_type``, ``start_time``, ``end_time``) -- any may be None.
    """
    from .findings import findings as make_findings

    nodes = sorted(nodes, key=lambda n: n["node"])
    seen = {n["node"] for n in nodes}
    expected = job.get("nodes") or sorted(seen)
    missing = [n for n in expected if n not in seen]
    start = job.get("start_time") or min((n["start_time"] for n in nodes), default=None)
    end = job.get("end_time") or max((n["end_time"] for n in nodes), default=None)
    elapsed = job.get("elapsed_s")
    if elapsed is None:
        elapsed = max((n["elapsed_s"] or 0 for n in nodes), default=None)
    cpu_times = [n["cpu_time_s"] for n in nodes if n["cpu_time_s"] is not None]
    cpu_time = sum(cpu_times) if cpu_times else None
    cpus_alloc = job.get("cpus_alloc")
    if cpus_alloc is None:
        per = [n["cpus_alloc"] for n in nodes if n.get("cpus_alloc")]
        cpus_alloc = sum(per) if per else None
    cpu_eff = None
    if cpu_time is not None and cpus_alloc and elapsed:
        cpu_eff = min(100.0, 100.0 * cpu_time / (cpus_alloc * elapsed))
    mem_peaks = [n["mem_peak_bytes"] for n in nodes if n["mem_peak_bytes"] is not None]
    mem_peak = sum(mem_peaks) if mem_peaks else None
    mem_req = job.get("mem_req_bytes")
    mem_eff = 100.0 * mem_peak / mem_req if mem_peak is not None and mem_req else None
    gpus = [g for n in nodes for g in n["gpus"]]
    real = [g for g in gpus if not g["emulated"]]
    reasons = sorted({n["gpu_reason"] for n in nodes if n.get("gpu_reason")})
    gpus_alloc = job.get("gpus_alloc") or len(gpus)
    gpu_hours_alloc = gpus_alloc * elapsed / 3600.0 if elapsed is not None else None
    gpu_hours_used = None
    utils = [g for g in real if g["util_mean_pct"] is not None]
    if utils and elapsed is not None:
        gpu_hours_used = sum(g["util_mean_pct"] / 100.0 for g in utils) * elapsed / 3600.0
    energies = [g["energy_j"] for g in real if g["energy_j"] is not None]
    energy_j = sum(energies) if energies else None
    summary = {
        "schema": SUMMARY_SCHEMA, "kind": "job",
        "job": {
            "id": job["id"], "array": job.get("array"), "user": job.get("user"), "name": job.get("name"),
            "partition": job.get("partition"), "state": job.get("state"), "exit_code": job.get("exit_code"),
            "nodes": expected, "start_time": start, "end_time": end, "elapsed_s": _r(elapsed, 3),
            "cpus_alloc": cpus_alloc, "gpus_alloc": gpus_alloc, "mem_req_bytes": mem_req,
            "mail_user": job.get("mail_user"), "mail_type": job.get("mail_type"),
        },
        "cpu": {"time_s": _r(cpu_time, 3), "efficiency_pct": _r(cpu_eff),
                "source": "; ".join(sorted({n["cpu_source"] for n in nodes if n.get("cpu_source")})) or None},
        "memory": {"peak_bytes": mem_peak, "req_bytes": mem_req, "efficiency_pct": _r(mem_eff),
                   "source": "; ".join(sorted({n["mem_source"] for n in nodes if n.get("mem_source")})) or None},
        "gpu": {"available": bool(real) and any(n["gpu_available"] for n in nodes),
                "reason": "; ".join(reasons) or None, "count": len(gpus), "devices": gpus,
                "gpu_hours_alloc": _r(gpu_hours_alloc, 4), "gpu_hours_used": _r(gpu_hours_used, 4),
                "energy_j": _r(energy_j), "energy_kwh": _r(None if energy_j is None else energy_j / 3.6e6, 6)},
        "nodes_missing": missing,
        "node_notes": {n["node"]: n.get("notes", []) for n in nodes if n.get("notes")},
    }
    summary["findings"] = make_findings(summary, cfg, partition)
    return summary


def js1_blob(summary: dict) -> str:
    """``JS1:`` + base64(gzip(json)) in the layout Princeton jobstats writes to
    AdminComment (``{"gpus": bool, "nodes": {node: {"cpus", "total_time",
    "used_memory", "total_memory", "gpu_utilization": {idx: pct},
    "gpu_used_memory": {idx: bytes}, "gpu_total_memory": {idx: bytes}}},
    "total_time": elapsed_s}``), plus gsrun's own ``gsrun`` section
    (SM/tensor activity, energy) which jobstats ignores."""
    nodes: dict[str, dict] = {}
    for g in summary["gpu"]["devices"]:
        n = nodes.setdefault(g["node"], {"gpu_utilization": {}, "gpu_used_memory": {}, "gpu_total_memory": {}})
        if g["util_mean_pct"] is not None:
            n["gpu_utilization"][str(g["index"])] = g["util_mean_pct"]
        if g["mem_peak_bytes"] is not None:
            n["gpu_used_memory"][str(g["index"])] = g["mem_peak_bytes"]
        if g["mem_total_bytes"] is not None:
            n["gpu_total_memory"][str(g["index"])] = g["mem_total_bytes"]
    blob = {"gpus": bool(summary["gpu"]["devices"]), "nodes": nodes,
            "total_time": summary["job"]["elapsed_s"],
            "gsrun": {"schema": summary["schema"], "cpu_eff_pct": summary["cpu"]["efficiency_pct"],
                      "energy_j": summary["gpu"]["energy_j"],
                      "sm_active_pct": {f'{g["node"]}:{g["index"]}': g["sm_active_mean_pct"]
                                        for g in summary["gpu"]["devices"]}}}
    raw = json.dumps(blob, separators=(",", ":"), sort_keys=True).encode()
    return "JS1:" + base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def decode_js1(text: str) -> dict:
    """Inverse of :func:`js1_blob`.

    Raises:
        ValueError: not a ``JS1:`` blob.
    """
    if not text.startswith("JS1:"):
        raise ValueError("not a JS1 blob")
    return json.loads(gzip.decompress(base64.b64decode(text[4:])))
