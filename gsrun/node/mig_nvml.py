"""MIG operations through NVML, behind one small interface.

:class:`MigBackend` is what :mod:`gsrun.node.mig` needs from the driver;
:class:`RealMig` calls ``pynvml``, the tests use ``tests/helpers/fake_mig.py``.
Every failure is a :class:`MigNvmlError` with the NVML return code. Shapes:

- profile table: ``{"<profile index>": {"info": {"id", "sliceCount",
  "instanceCount", "memorySizeMB", "name", ...}, "possible_placements":
  {"ok": ["[start, size]", ...]}} | {"error", "code"}}`` -- the format of the
  recording and of ``gsrun.facts.nvml`` key ``"gpu_instance_profiles"``;
- GPU instance: ``{"id", "profile_id", "start", "size"}`` (placement in
  memory slices, from ``nvmlGpuInstanceGetInfo``);
- compute instance: ``{"id", "profile_id", "start", "size"}``
  (``nvmlComputeInstanceGetInfo``);
- MIG device: ``{"uuid": "MIG-...", "gi_id", "ci_id"}``
  (``nvmlDeviceGetMigDeviceHandleByIndex`` + ``GetUUID``/``GetGpuInstanceId``/
  ``GetComputeInstanceId``).
"""

from __future__ import annotations

import ctypes
import json
from contextlib import suppress
from typing import Any

from gsrun.facts.nvml import (IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND,  # noqa: F401
                              NOT_SUPPORTED, NVML_SUCCESS, UNKNOWN, gi_profiles)

#: ``nvmlErrorString`` of the codes MIG calls answer
CODE_TEXT = {0: "Success", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
             6: "Not Found", 16: "GPU requires restart", 19: "In use by another client",
             23: "Insufficient Resources", 999: "Unknown Error"}


class MigNvmlError(Exception):
    """An NVML MIG call failed: ``op`` (``"create_gpu_instance"``...), ``gpu``
    index, NVML return ``code`` and its text."""

    def __init__(self, op: str, gpu: int, detail: str, code: int | None = None):
        self.op = op
        self.gpu = gpu
        self.code = code
        self.detail = detail
        super().__init__(f"GPU {gpu}: {op}: {detail}" + (f" (NVML code {code})" if code is not None else ""))


class MigBackend:
    """The interface (see module doc for the shapes)."""

    def count(self) -> int: ...
    def uuid(self, gpu: int) -> str: ...
    def mig_mode(self, gpu: int) -> tuple[int, int]: ...
    def set_mig_mode(self, gpu: int, mode: int) -> int: ...
    def profiles(self, gpu: int) -> dict: ...
    def compute_processes(self, gpu: int) -> list[dict]: ...
    def gpu_instances(self, gpu: int) -> list[dict]: ...
    def compute_instances(self, gpu: int, gi_id: int) -> list[dict]: ...
    def create_gpu_instance(self, gpu: int, profile_id: int, start: int, size: int) -> int: ...
    def create_compute_instance(self, gpu: int, gi_id: int, profile_id: int | None = None,
                                start: int | None = None, size: int | None = None) -> int: ...
    def destroy_compute_instance(self, gpu: int, gi_id: int, ci_id: int) -> None: ...
    def destroy_gpu_instance(self, gpu: int, gi_id: int) -> None: ...
    def mig_devices(self, gpu: int) -> list[dict]: ...


def parse_placement(p: Any) -> tuple[int, int]:
    """``"[0, 4]"`` (recording), ``[0, 4]`` or ``{"start": 0, "size": 4}`` -> ``(0, 4)``."""
    if isinstance(p, str):
        p = json.loads(p)
    if isinstance(p, dict):
        return int(p["start"]), int(p["size"])
    start, size = p
    return int(start), int(size)


class RealMig(MigBackend):
    """``pynvml`` on the live host, initialised on first use; ``set_mig_mode``
    / ``create_*`` / ``destroy_*`` change the GPU (root, exclusive node only).

    Raises:
        MigNvmlError: from any method, with NVML's code (``NO_PERMISSION`` when
            not root, ``IN_USE`` when a client holds the GPU,
            ``INSUFFICIENT_RESOURCES`` for a taken placement,
            ``LIBRARY_NOT_FOUND`` / ``DRIVER_NOT_LOADED`` without a driver).
    """

    def __init__(self, nv=None):
        self._nv = nv
        self._handles: dict[int, Any] = {}

    @property
    def nv(self):
        if self._nv is None:
            try:
                import pynvml
            except ImportError as e:  # pragma: no cover - dependency
                raise MigNvmlError("init", -1, f"pynvml missing: {e}", 12) from None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                raise MigNvmlError("init", -1, str(e), getattr(e, "value", None)) from None
            self._nv = pynvml
        return self._nv

    def _call(self, op: str, gpu: int, fn, *args):
        nv = self.nv
        try:
            v = fn(*args)
        except nv.NVMLError as e:
            raise MigNvmlError(op, gpu, str(e), getattr(e, "value", None)) from None
        return v.decode() if isinstance(v, bytes) else v

    def _h(self, gpu: int):
        h = self._handles.get(gpu)
        if h is None:
            h = self._call("handle", gpu, self.nv.nvmlDeviceGetHandleByIndex, gpu)
            self._handles[gpu] = h
        return h

    def close(self) -> None:
        if self._nv is not None:
            with suppress(Exception):
                self._nv.nvmlShutdown()

    def count(self) -> int:
        return int(self._call("count", -1, self.nv.nvmlDeviceGetCount))

    def uuid(self, gpu: int) -> str:
        return self._call("uuid", gpu, self.nv.nvmlDeviceGetUUID, self._h(gpu))

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        cur, pend = self._call("mig_mode", gpu, self.nv.nvmlDeviceGetMigMode, self._h(gpu))
        return int(cur), int(pend)

    def compute_processes(self, gpu: int) -> list[dict]:
        ps = self._call("compute_processes", gpu, self.nv.nvmlDeviceGetComputeRunningProcesses, self._h(gpu))
        return [{"pid": int(p.pid), "used_bytes": p.usedGpuMemory} for p in ps]

    def profiles(self, gpu: int) -> dict:
        return gi_profiles(self.nv, self._h(gpu))

    def _gi_handles(self, gpu: int) -> list:
        nv = self.nv

        h = self._h(gpu)
        if self.mig_mode(gpu)[0] != 1:
            return []
        found = []
        for p in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 15))):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            except nv.NVMLError:
                continue
            arr = (nv.c_nvmlGpuInstance_t * 8)()
            cnt = ctypes.c_uint(0)
            self._call("gpu_instances", gpu, nv.nvmlDeviceGetGpuInstances, h, int(info.id), arr,
                       ctypes.byref(cnt))
            found.extend(arr[i] for i in range(cnt.value))
        return found

    def gpu_instances(self, gpu: int) -> list[dict]:
        out = []
        for gi in self._gi_handles(gpu):
            i = self._call("gpu_instance_info", gpu, self.nv.nvmlGpuInstanceGetInfo, gi)
            out.append({"id": int(i.id), "profile_id": int(i.profileId),
                        "start": int(i.placement.start), "size": int(i.placement.size)})
        return sorted(out, key=lambda g: g["id"])

    def _gi(self, gpu: int, gi_id: int):
        return self._call("gpu_instance_by_id", gpu, self.nv.nvmlDeviceGetGpuInstanceById, self._h(gpu), gi_id)

    def _ci_profiles(self, gpu: int, gi) -> list:
        nv = self.nv
        out = []
        for p in range(int(getattr(nv, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8))):
            with suppress(nv.NVMLError):
                out.append(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, p, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED))
        return out

    def compute_instances(self, gpu: int, gi_id: int) -> list[dict]:
        nv = self.nv

        gi = self._gi(gpu, gi_id)
        out = []
        for info in self._ci_profiles(gpu, gi):
            arr = (nv.c_nvmlComputeInstance_t * 8)()
            cnt = ctypes.c_uint(0)
            self._call("compute_instances", gpu, nv.nvmlGpuInstanceGetComputeInstances, gi, int(info.id),
                       arr, ctypes.byref(cnt))
            for k in range(cnt.value):
                ci = self._call("compute_instance_info", gpu, nv.nvmlComputeInstanceGetInfo, arr[k])
                out.append({"id": int(ci.id), "profile_id": int(ci.profileId),
                            "start": int(ci.placement.start), "size": int(ci.placement.size)})
        return sorted(out, key=lambda c: c["id"])

    def set_mig_mode(self, gpu: int, mode: int) -> int:
        return int(self._call("set_mig_mode", gpu, self.nv.nvmlDeviceSetMigMode, self._h(gpu), int(mode)))

    def create_gpu_instance(self, gpu: int, profile_id: int, start: int, size: int) -> int:
        nv = self.nv
        pl = nv.c_nvmlGpuInstancePlacement_t()
        pl.start, pl.size = start, size
        gi = self._call("create_gpu_instance", gpu, nv.nvmlDeviceCreateGpuInstanceWithPlacement,
                        self._h(gpu), profile_id, pl)
        return int(self._call("gpu_instance_info", gpu, nv.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, gpu: int, gi_id: int, profile_id: int | None = None,
                                start: int | None = None, size: int | None = None) -> int:
        nv = self.nv
        gi = self._gi(gpu, gi_id)
        if profile_id is None:
            # the CI that spans the whole GI: the CI profile with the most slices
            infos = self._ci_profiles(gpu, gi)
            if not infos:
                raise MigNvmlError("create_compute_instance", gpu, "no compute-instance profile", NOT_SUPPORTED)
            profile_id = int(max(infos, key=lambda i: i.sliceCount).id)
        if start is None:
            ci = self._call("create_compute_instance", gpu, nv.nvmlGpuInstanceCreateComputeInstance,
                            gi, profile_id)
        else:
            pl = nv.c_nvmlComputeInstancePlacement_t()
            pl.start, pl.size = start, size
            ci = self._call("create_compute_instance", gpu,
                            nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, profile_id, pl)
        return int(self._call("compute_instance_info", gpu, nv.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_compute_instance(self, gpu: int, gi_id: int, ci_id: int) -> None:
        nv = self.nv
        gi = self._gi(gpu, gi_id)
        ci = self._call("compute_instance_by_id", gpu, nv.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
        self._call("destroy_compute_instance", gpu, nv.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, gpu: int, gi_id: int) -> None:
        self._call("destroy_gpu_instance", gpu, self.nv.nvmlGpuInstanceDestroy, self._gi(gpu, gi_id))

    def mig_devices(self, gpu: int) -> list[dict]:
        nv = self.nv
        h = self._h(gpu)
        if self.mig_mode(gpu)[0] != 1:
            return []
        n = int(self._call("max_mig_devices", gpu, nv.nvmlDeviceGetMaxMigDeviceCount, h))
        out = []
        for i in range(n):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nv.NVMLError:
                continue  # an empty slot (NOT_FOUND)
            out.append({"uuid": self._call("mig_uuid", gpu, nv.nvmlDeviceGetUUID, m),
                        "gi_id": int(self._call("mig_gi_id", gpu, nv.nvmlDeviceGetGpuInstanceId, m)),
                        "ci_id": int(self._call("mig_ci_id", gpu, nv.nvmlDeviceGetComputeInstanceId, m))})
        return out
