"""The one NVML choke point, with a fake backend loaded from JSON.

:func:`open_nvml` returns a :class:`Backend`; ``get(index, key)`` is one NVML
call (:data:`KEYS`) and answers the value or an :class:`NA` saying why not
(``Not Supported``, ``GPU is lost``): "not available" is a value, never an
exception. :class:`RealNvml` wraps ``pynvml`` (``nvidia-ml-py``);
:class:`FakeNvml` answers from a recording of the real H200
(``tests/data/hosts/h200-vm/nvml.json``). Indices are NVML's order; callers
map gres indices through ``"minor"`` and ``"pci_bus_id"``, never by position.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any


# key -> the NVML call it stands for
KEYS = {
    "name": "nvmlDeviceGetName",
    "uuid": "nvmlDeviceGetUUID",
    "pci": "nvmlDeviceGetPciInfo (busId, busIdLegacy)",
    "minor": "nvmlDeviceGetMinorNumber",
    "numa_node": "nvmlDeviceGetNumaNodeId (the GPU's own node; meaningful on Grace only)",
    "cpu_affinity_words": "nvmlDeviceGetCpuAffinity (64-bit words, lowest CPUs first)",
    "memory": "nvmlDeviceGetMemoryInfo (bytes: total, used, free)",
    "mig_mode": "nvmlDeviceGetMigMode ([current, pending])",
    "compute_mode": "nvmlDeviceGetComputeMode (0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS)",
    "power_mw": "nvmlDeviceGetPowerUsage (milliwatts)",
    "power_limit_mw": "nvmlDeviceGetEnforcedPowerLimit (milliwatts)",
    "energy_mj": "nvmlDeviceGetTotalEnergyConsumption (millijoules since driver load)",
    "temperature_c": "nvmlDeviceGetTemperature(GPU) (degrees C)",
    "sm_clock_mhz": "nvmlDeviceGetClockInfo(SM)",
    "max_sm_clock_mhz": "nvmlDeviceGetMaxClockInfo(SM)",
    "throttle_reasons": "nvmlDeviceGetCurrentClocksEventReasons (bitmask)",
    "utilization": "nvmlDeviceGetUtilizationRates (percent: gpu, memory)",
    "util_samples": "nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES, since) -> [[ts_us, pct], ...]",
    "pcie_tx_kbs": "nvmlDeviceGetPcieThroughput(TX) (KB/s)",
    "pcie_rx_kbs": "nvmlDeviceGetPcieThroughput(RX) (KB/s)",
    "nvlink_kib": "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, scopeId UINT_MAX: all "
                  "links) -> {tx, rx}: KiB of data since the driver loaded (cumulative counters)",
    "ecc_uncorrected": "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)",
    "gpm_supported": "nvmlGpmQueryDeviceSupport",
    "gpm": "nvmlGpmSampleGet x2 + nvmlGpmMetricsGet -> {sm_active_pct, sm_occupancy_pct, tensor_active_pct, "
           "dram_bw_pct, pcie_tx_kbs, pcie_rx_kbs (PCIE_TX/RX_PER_SEC MiB/s x 1024)}; a metric NVML refuses is left out",
    "compute_processes": "nvmlDeviceGetComputeRunningProcesses -> [{pid, used_bytes}]",
    "xid_events": "nvmlEventSetWait (XID critical errors since last call) -> [xid, ...]",
    "gpu_instance_profiles": "nvmlDeviceGetGpuInstanceProfileInfo + PossiblePlacements (all profiles)",
}


@dataclass(frozen=True, slots=True)
class NA:
    """No value: ``reason`` is NVML's text (``"Not Supported"``), ``code`` its
    return code (3 NOT_SUPPORTED, 15 GPU_IS_LOST, 18 LIB_RM_VERSION_MISMATCH)."""

    reason: str
    code: int | None = None

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"N/A ({self.reason})"


#: NVML return codes (``nvmlReturn_t``), one home for :mod:`gsrun.node.mig_nvml` too
NVML_SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999
ERROR_NAMES = {1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
               9: "DRIVER_NOT_LOADED", 12: "LIBRARY_NOT_FOUND", 13: "FUNCTION_NOT_FOUND",
               15: "GPU_IS_LOST", 18: "LIB_RM_VERSION_MISMATCH", 999: "UNKNOWN"}


def is_na(value: Any) -> bool:
    return isinstance(value, NA)


class NvmlUnavailable(Exception):
    """NVML could not be initialised. ``code_name`` is NVML's error name
    (``LIB_RM_VERSION_MISMATCH`` after a driver upgrade without reboot,
    ``LIBRARY_NOT_FOUND`` / ``DRIVER_NOT_LOADED`` on a node without a driver)."""

    def __init__(self, code_name: str, detail: str = ""):
        self.code_name = code_name
        self.detail = detail
        super().__init__(f"NVML init failed: {code_name}" + (f" ({detail})" if detail else ""))


class Backend:
    def driver_version(self) -> str | NA: ...
    def count(self) -> int: ...
    def get(self, index: int, key: str, **kw) -> Any: ...
    def close(self) -> None: ...


class FakeNvml(Backend):
    """Answers from a recording: per call ``{"ok": value}`` or ``{"error":
    text, "code": n}``; ``set(index, key, value)`` changes one (``NA``, a
    value, or a :class:`Seq`). ``{"script": [[t_s, answer], ...]}`` answers
    by seconds since the backend was made (``tests/cluster/up --fake-nvml``
    replays a job that works, then idles); a scripted ``util_samples`` number
    is one sample stamped now."""

    def __init__(self, data: dict, clock=time.monotonic, _own: bool = False):
        if not _own:
            data = copy.deepcopy(data)
        self.data = data
        self.clock = clock
        self.t0 = clock()
        init = self.data.get("init")
        if init and "error" in init:
            code = init.get("code", 999)
            raise NvmlUnavailable(ERROR_NAMES.get(code, str(code)), init["error"])
        self.calls: list[tuple[int, str]] = []

    @classmethod
    def from_file(cls, path: str | os.PathLike, clock=time.monotonic) -> "FakeNvml":
        with open(path, "rb") as f:
            return cls(json.loads(f.read()), clock, _own=True)

    def driver_version(self):
        return _unwrap(self.data.get("driver", {"error": "Not Found", "code": 6}))

    def count(self) -> int:
        return len(self.data.get("devices", []))

    def set(self, index: int, key: str, value: Any) -> None:
        dev = self.data["devices"][index]
        if isinstance(value, NA):
            dev[key] = {"error": value.reason, "code": value.code}
        elif isinstance(value, Seq):
            dev[key] = {"seq": list(value.items)}
        else:
            dev[key] = {"ok": value}

    def get(self, index: int, key: str, **kw) -> Any:
        self.calls.append((index, key))
        devs = self.data.get("devices", [])
        if not 0 <= index < len(devs):
            return NA("Invalid Argument", 2)
        dev = devs[index]
        lost = dev.get("lost")
        if lost:
            return NA("GPU is lost", GPU_IS_LOST)
        if key == "pci_bus_id":
            pci = _unwrap(dev.get("pci", {"error": "Not Supported", "code": 3}))
            return pci if is_na(pci) else normalize_bus_id(pci["busId"])
        if key == "gpu_instance_profiles":
            return dev.get("gpu_instance_profiles", NA("Not Supported", NOT_SUPPORTED))
        entry = dev.get(key)
        if entry is None:
            return NA("Not Supported", NOT_SUPPORTED)
        if isinstance(entry, dict) and "seq" in entry:
            seq = entry["seq"]
            item = seq.pop(0) if len(seq) > 1 else seq[0]
            return _unwrap(item) if isinstance(item, dict) and ("ok" in item or "error" in item) else item
        if isinstance(entry, dict) and "script" in entry:
            v = _unwrap(_scripted(entry["script"], self.clock() - self.t0))
            if key == "util_samples" and isinstance(v, (int, float)) and not isinstance(v, bool):
                return [[int(time.time() * 1e6), v]]
            return v
        return _unwrap(entry)


@dataclass
class Seq:
    """Answers given one per call, the last one repeating (see :class:`FakeNvml`)."""

    items: list


def _scripted(script: list, elapsed_s: float) -> Any:
    """The answer of a time script ``elapsed_s`` in; Not Supported for an empty one."""
    answer: Any = {"error": "Not Supported", "code": NOT_SUPPORTED}
    for i, step in enumerate(script):
        if not (isinstance(step, (list, tuple)) and len(step) == 2):
            continue
        if i == 0 or float(step[0]) <= elapsed_s:
            answer = step[1]
        else:
            break
    return answer


def _unwrap(entry: Any) -> Any:
    if isinstance(entry, dict):
        if "ok" in entry:
            return entry["ok"]
        if "error" in entry:
            return NA(str(entry["error"]), entry.get("code"))
    return entry


def index_by_minor(nv: "Backend") -> tuple[dict[int, int], int]:
    """``{minor number (= gres index, field cases 7-8): NVML index}``, and how
    many devices answered ``GPU_IS_LOST``."""
    out: dict[int, int] = {}
    lost = 0
    for i in range(nv.count()):
        m = nv.get(i, "minor")
        if not is_na(m):
            out[int(m)] = i
        elif m.code == GPU_IS_LOST:
            lost += 1
    return out, lost


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``"00000000:00:06.0"`` or sysfs form -> lower-case ``"0000:00:06.0"``."""
    b = bus_id.strip().lower()
    if b.count(":") == 2:
        dom, rest = b.split(":", 1)
        dom = dom[-4:].rjust(4, "0")
        return f"{dom}:{rest}"
    if b.count(":") == 1:
        return "0000:" + b
    return b


#: keys answered by one pynvml call on the handle: key -> (function, pynvml constants passed after it)
_SIMPLE_CALLS = {
    "name": ("nvmlDeviceGetName",),
    "uuid": ("nvmlDeviceGetUUID",),
    "minor": ("nvmlDeviceGetMinorNumber",),
    "compute_mode": ("nvmlDeviceGetComputeMode",),
    "power_mw": ("nvmlDeviceGetPowerUsage",),
    "power_limit_mw": ("nvmlDeviceGetEnforcedPowerLimit",),
    "energy_mj": ("nvmlDeviceGetTotalEnergyConsumption",),
    "temperature_c": ("nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"),
    "sm_clock_mhz": ("nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
    "max_sm_clock_mhz": ("nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
    "pcie_tx_kbs": ("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_TX_BYTES"),
    "pcie_rx_kbs": ("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_RX_BYTES"),
    "ecc_uncorrected": ("nvmlDeviceGetTotalEccErrors", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
}


class RealNvml(Backend):
    """``pynvml`` on the live host. Raises NvmlUnavailable when ``nvmlInit`` fails."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - dependency
            raise NvmlUnavailable("LIBRARY_NOT_FOUND", str(e)) from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            code = getattr(e, "value", 999)
            raise NvmlUnavailable(ERROR_NAMES.get(code, str(code)), str(e)) from None
        self._handles: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._eventsets: dict[int, Any] = {}

    def close(self) -> None:
        for h in self._gpm_prev.values():
            with suppress(Exception):
                self.nv.nvmlGpmSampleFree(h[1])
        with suppress(Exception):
            self.nv.nvmlShutdown()

    def driver_version(self):
        return self._call(self.nv.nvmlSystemGetDriverVersion)

    def count(self) -> int:
        n = self._call(self.nv.nvmlDeviceGetCount)
        return 0 if is_na(n) else int(n)

    def _call(self, fn, *args):
        try:
            v = fn(*args)
        except self.nv.NVMLError as e:
            code = getattr(e, "value", None)
            return NA(str(e), code)
        if isinstance(v, bytes):
            v = v.decode()
        return v

    def _h(self, index: int):
        h = self._handles.get(index)
        if h is None:
            h = self._call(self.nv.nvmlDeviceGetHandleByIndex, index)
            if is_na(h):
                return h
            self._handles[index] = h
        return h

    def get(self, index: int, key: str, **kw) -> Any:
        h = self._h(index)
        if is_na(h):
            return h
        nv = self.nv
        c = self._call
        if key in _SIMPLE_CALLS:
            fn, *consts = _SIMPLE_CALLS[key]
            return c(getattr(nv, fn), h, *(getattr(nv, x) for x in consts))
        if key in ("pci", "pci_bus_id"):
            p = c(nv.nvmlDeviceGetPciInfo, h)
            if is_na(p):
                return p
            bus = p.busId.decode() if isinstance(p.busId, bytes) else p.busId
            if key == "pci_bus_id":
                return normalize_bus_id(bus)
            return {"busId": bus}
        if key == "numa_node":
            fn = getattr(nv, "nvmlDeviceGetNumaNodeId", None)
            return c(fn, h) if fn else NA("Function Not Found", 13)
        if key == "cpu_affinity_words":
            v = c(nv.nvmlDeviceGetCpuAffinity, h, 16)
            return v if is_na(v) else [int(x) for x in v]
        if key == "memory":
            # v2 first: v1's "used" counts the driver's reservation (615 MiB on an idle H200)
            v2 = getattr(nv, "nvmlMemory_v2", None)
            if v2 is not None:
                m = c(nv.nvmlDeviceGetMemoryInfo, h, v2)
                if not is_na(m):
                    return {"total": m.total, "used": m.used, "free": m.free, "reserved": m.reserved}
            m = c(nv.nvmlDeviceGetMemoryInfo, h)
            return m if is_na(m) else {"total": m.total, "used": m.used, "free": m.free}
        if key == "mig_mode":
            v = c(nv.nvmlDeviceGetMigMode, h)
            return v if is_na(v) else list(v)
        if key == "throttle_reasons":
            fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            return c(fn, h)
        if key == "utilization":
            u = c(nv.nvmlDeviceGetUtilizationRates, h)
            return u if is_na(u) else {"gpu": u.gpu, "memory": u.memory}
        if key == "util_samples":
            since_us = int(kw.get("since_us", 0))
            r = c(nv.nvmlDeviceGetSamples, h, nv.NVML_GPU_UTILIZATION_SAMPLES, since_us)
            if is_na(r):
                return r
            _vtype, samples = r
            return [[int(s.timeStamp), int(s.sampleValue.uiVal)] for s in samples]
        if key == "nvlink_kib":
            return self._nvlink_kib(h)
        if key == "gpm_supported":
            fn = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
            if fn is None:
                return NA("Function Not Found", 13)
            v = c(fn, h)
            return v if is_na(v) else int(getattr(v, "isSupportedDevice", v))
        if key == "gpm":
            return self._gpm(index, h)
        if key == "compute_processes":
            ps = c(nv.nvmlDeviceGetComputeRunningProcesses, h)
            if is_na(ps):
                return ps
            return [{"pid": p.pid, "used_bytes": p.usedGpuMemory} for p in ps]
        if key == "xid_events":
            return self._xids(index, h)
        if key == "gpu_instance_profiles":
            return gi_profiles(nv, h)
        return NA("Not Supported", NOT_SUPPORTED)

    def _gpm(self, index, h):
        """GPM metrics since the previous call (NA on the first: it needs two samples; a refused metric: its NA)."""
        nv = self.nv
        try:
            cur = nv.nvmlGpmSampleAlloc()
        except Exception as e:  # noqa: BLE001
            return NA(str(e), getattr(e, "value", None))
        try:
            nv.nvmlGpmSampleGet(h, cur)
        except Exception as e:  # noqa: BLE001 - free what we allocated, never leak per poll
            with suppress(Exception):
                nv.nvmlGpmSampleFree(cur)
            return NA(str(e), getattr(e, "value", None))
        prev = self._gpm_prev.get(index)
        self._gpm_prev[index] = (time.monotonic(), cur)
        if prev is None:
            return NA("first GPM sample", None)
        ids = {"sm_active_pct": nv.NVML_GPM_METRIC_SM_UTIL,
               "sm_occupancy_pct": nv.NVML_GPM_METRIC_SM_OCCUPANCY,
               "tensor_active_pct": nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
               "dram_bw_pct": nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
               "pcie_tx_kbs": nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_rx_kbs": nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC}
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(ids)
            mg.sample1 = prev[1]
            mg.sample2 = cur
            for i, mid in enumerate(ids.values()):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            out = {k: return_na(m.nvmlReturn) if m.nvmlReturn else m.value * (1024.0 if k[:4] == "pcie" else 1.0)
                   for k, m in zip(ids, mg.metrics)}
        except Exception as e:  # noqa: BLE001
            out = NA(str(e), getattr(e, "value", None))
        finally:
            with suppress(Exception):
                nv.nvmlGpmSampleFree(prev[1])
        return out

    def _nvlink_kib(self, h):
        """``{"tx": KiB, "rx": KiB}`` over all links (``nvmlDeviceGetFieldValues``
        fields 138/139, scopeId ``UINT_MAX``), or the first field's NA
        (NOT_SUPPORTED without NVLink: PCIe H100, L40S)."""
        nv = self.nv
        fn = getattr(nv, "nvmlDeviceGetFieldValues", None)
        ids = [getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
               getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)]
        if fn is None or None in ids:
            return NA("Function Not Found (nvidia-ml-py without NVLink throughput fields)", FUNCTION_NOT_FOUND)
        got = self._call(fn, h, [(i, ALL_LINKS) for i in ids])
        if is_na(got):
            return got
        out = {}
        for name, v in zip(("tx", "rx"), got):
            x = field_value(v)
            if is_na(x):
                return x
            out[name] = x
        return out

    def _xids(self, index, h):
        nv = self.nv
        es = self._eventsets.get(index)
        if es is None:
            try:
                es = nv.nvmlEventSetCreate()
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
            except Exception as e:  # noqa: BLE001
                self._eventsets[index] = NA(str(e), getattr(e, "value", None))
                return self._eventsets[index]
            self._eventsets[index] = es
        if is_na(es):
            return es
        xids = []
        for _ in range(64):
            try:
                ev = nv.nvmlEventSetWait_v2(es, 0)
            except nv.NVMLError:
                break
            xids.append(int(ev.eventData))
        return xids


ALL_LINKS = 0xFFFFFFFF       # nvmlFieldValue_t.scopeId for an NVLink counter: the sum over every link
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def return_na(code: int) -> NA:
    """A per-item ``nvmlReturn_t`` (field values, GPM metrics) that is not NVML_SUCCESS -> its NA."""
    return NA("Not Supported" if code == NOT_SUPPORTED else ERROR_NAMES.get(code, f"NVML error {code}"), code)


def field_value(v) -> Any:
    """One ``c_nvmlFieldValue_t`` -> its number, or NA from its own ``nvmlReturn``."""
    code = int(getattr(v, "nvmlReturn", 999))
    if code != 0:
        return return_na(code)
    member = _VALUE_MEMBER.get(int(getattr(v, "valueType", 3)), "ullVal")
    return getattr(v.value, member)


def gi_profiles(nv, h) -> dict:
    """Every GPU-instance profile of the device handle ``h`` (``nv``: pynvml) in the recording's form:
    ``{"<profile index>": {"info": {"id", "sliceCount", "instanceCount", "memorySizeMB", "name"},
    "possible_placements": {"ok": ["[start, size]", ...]} | {"error", "code"}} | {"error", "code"}}``."""
    out: dict = {}
    for p in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 15))):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
        except Exception as e:  # noqa: BLE001 - NVMLError (a profile this GPU has not) or a binding mismatch
            out[str(p)] = {"error": str(e), "code": getattr(e, "value", None)}
            continue
        entry = out[str(p)] = {"info": {"id": int(info.id), "sliceCount": int(info.sliceCount),
                                        "instanceCount": int(info.instanceCount),
                                        "memorySizeMB": int(info.memorySizeMB), "name": _profile_name(info)}}
        try:
            arr, cnt = (nv.c_nvmlGpuInstancePlacement_t * 16)(), ctypes.c_uint(16)
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(cnt))
            entry["possible_placements"] = {"ok": [f"[{arr[i].start}, {arr[i].size}]" for i in range(cnt.value)]}
        except Exception as e:  # noqa: BLE001
            entry["possible_placements"] = {"error": str(e), "code": getattr(e, "value", None)}
    return out


def _profile_name(info) -> str:
    name = getattr(info, "name", b"")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return name or f"profile {info.id}"


def open_nvml(hostfs=None) -> Backend:
    """:class:`FakeNvml` from a fake root's ``nvml.json``, else :class:`RealNvml`.

    Raises:
        NvmlUnavailable: no driver/library, driver/library mismatch, or a fake
            root without ``nvml.json`` (NVML then counts as absent).
    """
    if hostfs is not None and not hostfs.is_real:
        p = hostfs.nvml_json()
        if p is None:
            raise NvmlUnavailable("LIBRARY_NOT_FOUND", f"no nvml.json under {hostfs.root_dir}")
        return FakeNvml.from_file(p)
    return RealNvml()
