"""The Prometheus series gsrun exports for GPUs, one table for both outputs:
the per-job textfile (:mod:`gsrun.node.metrics_textfile`) and the node
daemon's HTTP endpoint (:mod:`gsrun.node.metrics_http`). Pure.

:func:`job_readings` makes :class:`GpuReading` values from a sampler's state;
:func:`job_samples` / :func:`gpu_samples` turn them into :data:`JOB_SERIES` /
:data:`GPU_SERIES`. Labels (:func:`gpu_labels`): ``job_id`` (``""`` without a
job, as dcgm-exporter's ``hpc_job``), ``user`` (unless ``metrics.user_label =
false``), ``node``, ``gpu`` (the ``/dev/nvidiaN`` minor), ``uuid``,
``mig_instance``. An unknown value is left out, never written as 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, NamedTuple

# The window each output's gauges cover, appended to their help
WINDOW_TEXTFILE = ", mean over the last sampler flush window"
WINDOW_HTTP = ", over the last sampler interval (sampler.interval_s)"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's figures for the job holding it (``job_id`` None: no job);
    None = unknown. ``energy_j``: since the job started on the GPU (no job:
    since the driver loaded); ``idle``: the idle detector's verdict."""

    gres_index: int | None
    uuid: str | None = None
    name: str | None = None
    mig_instance: str | None = None
    job_id: str | None = None
    user: str | None = None
    util_pct: float | None = None
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    energy_j: float | None = None
    idle: bool | None = None


@dataclass(frozen=True, slots=True)
class Series:
    """One exported family: ``per`` divides the :class:`GpuReading` ``field``
    (100: % -> ratio); ``doc`` is the docs' table text, ``http_note`` the endpoint's."""

    name: str
    kind: str
    field: str
    per: float
    help: str
    windowed: bool
    doc: str
    http_note: str = ""

    @property
    def family(self) -> str:
        """The name ``prometheus_client``'s metric family takes (no ``_total``)."""
        return self.name[:-len("_total")] if self.kind == "counter" else self.name


# Per GPU per job (the textfile writes these, in this order).
JOB_SERIES: tuple[Series, ...] = (
    Series("gsrun_gpu_utilization_ratio", "gauge", "util_pct", 100.0,
           "GPU busy share 0-1 (NVML utilization)", True,
           "busy share 0-1 (`nvmlDeviceGetSamples` / `UtilizationRates`)"),
    Series("gsrun_gpu_sm_active_ratio", "gauge", "sm_active_pct", 100.0,
           "GPM SM activity 0-1", True, "GPM SM activity 0-1 (Hopper and later)"),
    Series("gsrun_gpu_tensor_active_ratio", "gauge", "tensor_active_pct", 100.0,
           "GPM tensor-core activity 0-1", True, "GPM tensor-core activity 0-1"),
    Series("gsrun_gpu_memory_used_bytes", "gauge", "mem_used_bytes", 1.0,
           "GPU memory used in bytes (NVML)", True, "GPU memory used, bytes (`nvmlDeviceGetMemoryInfo`)"),
    Series("gsrun_gpu_power_watts", "gauge", "power_w", 1.0,
           "GPU power draw in watts (NVML)", True, "board power, W (`nvmlDeviceGetPowerUsage`)"),
    Series("gsrun_gpu_energy_joules_total", "counter", "energy_j", 1.0,
           "GPU energy in joules since the job started on this node (NVML energy counter)", False,
           "energy since the job started on the node, J (`nvmlDeviceGetTotalEnergyConsumption`); "
           "endpoint, GPU without a job: since the driver loaded",
           "; a GPU without a job: since the driver loaded"),
    Series("gsrun_gpu_idle", "gauge", "idle", 1.0,
           "1 while gsrun's idle detector holds the GPU idle, else 0", False,
           "1 while the idle detector (`[idle]`) holds the GPU idle, else 0"),
)
# Per GPU, whoever holds it (the HTTP endpoint only).
GPU_SERIES: tuple[Series, ...] = (
    Series("gsrun_gpu_memory_total_bytes", "gauge", "mem_total_bytes", 1.0,
           "GPU memory in bytes (NVML)", False, "endpoint only: GPU memory, bytes (`nvmlDeviceGetMemoryInfo`)"),
    Series("gsrun_gpu_temperature_celsius", "gauge", "temperature_c", 1.0,
           "GPU temperature in degrees Celsius (NVML)", True,
           "endpoint only: GPU temperature, degrees C (`nvmlDeviceGetTemperature`)"),
)


class Sample(NamedTuple):
    """One series: family name (as exposed, ``_total`` included for counters), labels, value."""

    family: str
    labels: dict
    value: float


def _marks(metric) -> tuple[int, float, float, float]:
    return (metric.n, metric.weight_s, metric.wsum, metric.vsum)


def window_mean(now: tuple, before: tuple | None) -> float | None:
    """Mean of a :class:`~gsrun.facts.aggregate.Metric` between two marks
    ``(n, weight_s, wsum, vsum)``: time-weighted, else plain (a first poll),
    None when no value came."""
    n0, w0, ws0, vs0 = before or (0, 0.0, 0.0, 0.0)
    n, w, ws, vs = now
    if n < n0:            # a state that went back (sampler restarted from an older file)
        n0, w0, ws0, vs0 = 0, 0.0, 0.0, 0.0
    if n - n0 <= 0:
        return None
    if w - w0 > 1e-9:
        return (ws - ws0) / (w - w0)
    return (vs - vs0) / (n - n0)


def tidy(v: float) -> float:
    """``v`` to 12 significant digits: the float noise of a time-weighted mean
    (123.45599999999999 W) goes, every byte count below 1 TB stays exact."""
    return float(f"{v:.12g}")


def idle_flag(state: dict, i: int) -> float | None:
    """1.0 while the detector of GPU ``i`` (``state["watch"][i]``) has an idle
    stretch open, 0.0 when not, None when the GPU has no detector."""
    watch = state.get("watch") or ()
    w = watch[i] if i < len(watch) else None
    if not hasattr(w, "idle_since_s"):
        return None
    return 0.0 if w.idle_since_s is None else 1.0


# sampler metric keys a reading takes as window means
_WINDOW_KEYS = ("util_pct", "sm_active_pct", "tensor_active_pct", "mem_used_bytes", "power_w", "temperature_c")


def job_readings(state: dict, user: str | None, marks: dict | None = None) -> tuple[list[GpuReading], dict]:
    """One :class:`GpuReading` per GPU of a sampler's live ``state``. Pure.
    Gauges are means since the call that returned ``marks`` (``{gres_index:
    {key: (n, weight_s, wsum, vsum)}}``; empty: the whole job). -> (readings,
    the marks for the next call)."""
    job_id = str(state["job_id"])
    marks = marks or {}
    new_marks: dict = {}
    out = []
    for i, g in enumerate(state["gpus"]):
        ref = g["ref"]
        gi = ref.get("gres_index")
        before = marks.get(gi, {})
        cur: dict = {}
        values: dict = {}
        for key in _WINDOW_KEYS:
            m = g["metrics"].get(key)
            if m is None:
                continue
            cur[key] = _marks(m)
            values[key] = window_mean(cur[key], before.get(key))
        new_marks[gi] = cur
        energy = g.get("energy")
        if energy is not None and energy.first is not None:
            values["energy_j"] = energy.total / 1000.0
        flag = idle_flag(state, i) if g.get("lost_at_s") is None else None
        uuid = str(ref["uuid"]) if ref.get("uuid") else None
        mig = uuid if ref.get("mig") and uuid and uuid.startswith("MIG-") else None
        out.append(GpuReading(gi, uuid, ref.get("name"), mig, job_id, user,
                              mem_total_bytes=ref.get("mem_total_bytes"),
                              idle=None if flag is None else flag == 1.0, **values))
    return out, new_marks


def gpu_labels(r: GpuReading, node: str, user_label: bool) -> dict:
    """The labels of a job series for reading ``r`` (module docstring; the output sorts them)."""
    return {"job_id": r.job_id or "", **device_labels(r, node), **({"user": r.user or ""} if user_label else {})}


def device_labels(r: GpuReading, node: str) -> dict:
    """The labels of a GPU series: ``node``, ``gpu``, ``uuid``, ``mig_instance``."""
    labels = {"node": node, "gpu": "" if r.gres_index is None else str(r.gres_index)}
    if r.uuid:
        labels["uuid"] = r.uuid
    if r.mig_instance:
        labels["mig_instance"] = r.mig_instance
    return labels


def device_key(r: GpuReading) -> tuple:
    """What tells GPUs apart: (gres index, uuid, MIG instance)."""
    return (r.gres_index, r.uuid, r.mig_instance)


def _value(r: GpuReading, s: Series) -> float | None:
    v = getattr(r, s.field)
    if v is None or isinstance(v, str):
        return None
    v = float(v)
    return tidy(v / s.per) if math.isfinite(v) else None


def _by_series(rows: Iterable[tuple[GpuReading, dict]], series: tuple[Series, ...]) -> list[Sample]:
    rows = list(rows)
    return [Sample(s.name, labels, v) for s in series for r, labels in rows
            if (v := _value(r, s)) is not None]


def job_samples(readings: Iterable[GpuReading], node: str, user_label: bool) -> list[Sample]:
    """The :data:`JOB_SERIES` samples of ``readings``: families in table
    order, readings in the order given; unknown values left out. Pure."""
    return _by_series(((r, gpu_labels(r, node, user_label)) for r in readings), JOB_SERIES)


def gpu_samples(readings: Iterable[GpuReading], node: str) -> list[Sample]:
    """The :data:`GPU_SERIES` samples, one per GPU (:func:`device_key`; the
    first reading of a GPU that has several). Pure."""
    seen: dict = {}
    for r in readings:
        seen.setdefault(device_key(r), r)
    return _by_series(((r, device_labels(r, node)) for r in seen.values()), GPU_SERIES)


def families(samples: list[Sample], series: tuple[Series, ...], window: str, http: bool = False) -> list:
    """``prometheus_client`` families of ``samples`` in ``series`` order (empty
    ones left out); help with ``window`` for a windowed gauge."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    out = {}
    for s in series:
        help_text = s.help + (window if s.windowed else "") + (s.http_note if http else "")
        cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
        out[s.name] = cls(s.family, help_text)
    for smp in samples:
        out[smp.family].add_sample(smp.family, dict(smp.labels), smp.value)
    return [f for f in out.values() if f.samples]
