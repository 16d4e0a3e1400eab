"""Helpers (no tests here): GPU traces (``tests/data/traces/*.json``, format in
that folder's README) replayed through the sampler's own per-poll fold
(:func:`gsrun.node.sampler.update_gpu`) into the waste detector
(:class:`gsrun.request.waste.GpuWatch`), as the sampler does in production."""

from __future__ import annotations

import json
from pathlib import Path

from gsrun.facts.nvml import NA
from gsrun.facts.sampler_state import GpuRef
from gsrun.node.sampler import new_gpu_state, stretch_gap_s, update_gpu
from gsrun.request.waste import GpuWatch, IdleConfig

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
FORMAT = "gsrun.gpu-trace/1"


def decode(v):
    """A recorded reading: ``{"error", "code"}`` -> :class:`NA`, anything else as is."""
    if isinstance(v, dict) and set(v) == {"error", "code"}:
        return NA(v["error"], v["code"])
    return v


def load(path: Path) -> dict:
    t = json.loads(Path(path).read_text())
    if t.get("format") != FORMAT:
        raise ValueError(f"{path}: format {t.get('format')!r} is not {FORMAT}")
    return t


def trace_files() -> list[Path]:
    return sorted(p for p in TRACES.glob("*.json") if p.name != "expect.json")


def replay(trace: dict, cfg: IdleConfig) -> tuple[list[dict], GpuWatch, list[dict]]:
    """Every poll of ``trace`` through ``update_gpu`` then ``GpuWatch.update``.
    Returns (detections in order, the watch at the end, the per-poll figures)."""
    gpu = trace.get("gpu") or {}
    ref = GpuRef(0, 0, gpu.get("uuid"), None, gpu.get("name"), None, bool(gpu.get("mig")), bool(gpu.get("gpm")))
    g = new_gpu_state(ref, 100)
    w = GpuWatch("0", cfg, None, stretch_gap_s(float(trace["interval_s"])), gpu.get("power_limit_w"))
    found, figures = [], []
    prev = None
    for p in trace["polls"]:
        t = float(p["t_s"])
        r = {k: decode(v) for k, v in p["r"].items()}
        pids = p.get("job_pids")
        vals = update_gpu(g, r, t, 0.0 if prev is None else t - prev, 0.0, None if pids is None else set(pids))
        figures.append(dict(vals or {}, t_s=t))
        found += w.update(t, vals or {})
        prev = t
    return found, w, figures


def phase_start(trace: dict, name: str) -> float:
    """``start``: the first poll; else the named phase's ``start_s``."""
    if name == "start":
        return float(trace["polls"][0]["t_s"])
    for ph in trace.get("phases") or []:
        if ph["name"] == name:
            return float(ph["start_s"])
    raise KeyError(f"trace {trace.get('name')}: no phase {name!r}")


def figures(trace: dict) -> list[tuple[float, dict]]:
    """``(t_s, values)`` per poll of ``trace``: what :func:`update_gpu` gives the
    detector (a fresh GPU state for the trace)."""
    gpu = trace.get("gpu") or {}
    ref = GpuRef(0, 0, gpu.get("uuid"), None, gpu.get("name"), None, bool(gpu.get("mig")), bool(gpu.get("gpm")))
    g = new_gpu_state(ref, 100)
    out, prev = [], None
    for p in trace["polls"]:
        t = float(p["t_s"])
        r = {k: decode(v) for k, v in p["r"].items()}
        pids = p.get("job_pids")
        vals = update_gpu(g, r, t, 0.0 if prev is None else t - prev, 0.0, None if pids is None else set(pids))
        out.append((t, vals or {}))
        prev = t
    return out


def job_polls(gpus: dict[str, list[tuple[dict, float]]]) -> list[tuple[float, str, dict]]:
    """A simulated job's polls, in time order: GPU name -> its segments
    ``[(trace, offset_s), ...]`` (a GPU that went idle, then trained, then
    idled again is three segments); each poll ``(t_s + offset_s, gpu, values)``."""
    out = []
    for name, segments in gpus.items():
        for trace, offset in segments:
            out += [(t + offset, name, vals) for t, vals in figures(trace)]
    return sorted(out, key=lambda x: (x[0], x[1]))
