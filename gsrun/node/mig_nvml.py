"""MIG operations through NVML, behind one small interface.

:class:`MigBackend` is everything :mod:`gsrun.node.mig` needs from the driver:
read the MIG mode, the GPU-instance profile table, the instances that exist,
the MIG devices' UUIDs and the GPU's compute processes; set the MIG mode;
create and destroy GPU instances (GI) and compute instances (CI).

- :class:`RealMig` calls ``pynvml`` (package ``nvidia-ml-py``). Its read
  methods are safe anywhere; its set/create/destroy methods change the GPU
  and are only called by the prolog/epilog on an exclusive node.
- :class:`FakeMig` keeps the same state in memory, seeded from a recording
  (``tests/data/nvml/h200-mig.json``: the real H200's profile table), checks
  what NVML checks (MIG mode on, placement allowed and free, instance count,
  no CI left in a GI being destroyed, no process when MIG mode changes) and can
  inject a failure at any mutating step (:meth:`FakeMig.fail_at_step`).

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

import copy
import json
from pathlib import Path
from typing import Any

NVML_SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
RESET_REQUIRED = 16
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999
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


MUTATING = ("set_mig_mode", "create_gpu_instance", "create_compute_instance",
            "destroy_compute_instance", "destroy_gpu_instance")


class FakeMig(MigBackend):
    """In-memory MIG state. ``devices`` is the recording's device list (each
    with ``uuid``, ``mig_mode``, ``compute_processes``,
    ``gpu_instance_profiles`` in the recorded ``{"ok": ...}`` form).

    Test hooks: :meth:`fail_at_step` (the n-th mutating call from now raises),
    :meth:`fail_op` (the next calls to one operation raise),
    :attr:`mode_blocker` (``set_mig_mode`` leaves the change pending with this
    NVML status, as a GPU held open by another client does),
    :attr:`processes` (per-GPU compute processes), :meth:`snapshot` (state
    without ids), :attr:`ops` (log of mutating calls).
    """

    def __init__(self, devices: list[dict]):
        self._dev = copy.deepcopy(devices)
        self.state: list[dict] = []
        for i, d in enumerate(self._dev):
            mode = _ok(d.get("mig_mode"), [0, 0])
            self.state.append({"mode": [int(mode[0]), int(mode[1])], "gis": {}, "next_gi": 1,
                               "uuid": _ok(d.get("uuid"), f"GPU-fake-{i}")})
        self.processes: dict[int, list[dict]] = {
            i: list(_ok(d.get("compute_processes"), []) or []) for i, d in enumerate(self._dev)}
        self.mode_blocker: dict[int, int] = {}
        self.ops: list[tuple] = []
        self._step = 0
        self._fail_step: int | None = None
        self._fail_ops: dict[str, int] = {}
        self._uuid_seq = 0

    @classmethod
    def from_recording(cls, path_or_data, gpus: int | None = None) -> "FakeMig":
        """Load a recording; ``gpus=N`` clones device 0 N times (an 8-GPU node
        from a 1-GPU recording), with distinct UUIDs."""
        data = path_or_data
        if not isinstance(data, dict):
            data = json.loads(Path(path_or_data).read_text())
        devs = data["devices"]
        if gpus is not None:
            base = devs[0]
            devs = []
            for i in range(gpus):
                d = copy.deepcopy(base)
                d["index"] = i
                u = _ok(base.get("uuid"), "GPU-fake")
                d["uuid"] = {"ok": u[:-2] + f"{i:02d}"}
                devs.append(d)
        return cls(devs)

    # -- test hooks -------------------------------------------------------
    def fail_at_step(self, n: int, code: int = UNKNOWN) -> None:
        """The ``n``-th mutating call from now (1-based) raises ``MigNvmlError``."""
        self._fail_step = self._step + n
        self._fail_code = code

    def fail_op(self, op: str, times: int = 1) -> None:
        self._fail_ops[op] = times

    def clear_failures(self) -> None:
        self._fail_step = None
        self._fail_ops.clear()

    def snapshot(self, gpu: int) -> dict:
        """``{"mode": [cur, pend], "gis": sorted [(profile_id, start, size,
        ((ci_profile_id, start, size), ...))]}``: what a restore must bring back
        (NVML ids may differ after re-creation)."""
        st = self.state[gpu]
        gis = sorted((g["profile_id"], g["start"], g["size"],
                      tuple(sorted((c["profile_id"], c["start"], c["size"]) for c in g["cis"].values())))
                     for g in st["gis"].values())
        return {"mode": list(st["mode"]), "gis": gis}

    def _mutate(self, op: str, gpu: int, *args) -> None:
        self._step += 1
        self.ops.append((op, gpu) + args)
        if self._fail_step is not None and self._step == self._fail_step:
            self._fail_step = None
            raise MigNvmlError(op, gpu, f"injected failure at step {self._step}",
                               getattr(self, "_fail_code", UNKNOWN))
        if self._fail_ops.get(op):
            self._fail_ops[op] -= 1
            raise MigNvmlError(op, gpu, "injected failure", UNKNOWN)

    def _st(self, op, gpu) -> dict:
        if not 0 <= gpu < len(self.state):
            raise MigNvmlError(op, gpu, "Invalid Argument", INVALID_ARGUMENT)
        return self.state[gpu]

    # -- reads -------------------------------------------------------------
    def count(self) -> int:
        return len(self.state)

    def uuid(self, gpu: int) -> str:
        return self._st("uuid", gpu)["uuid"]

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        m = self._st("mig_mode", gpu)["mode"]
        return m[0], m[1]

    def profiles(self, gpu: int) -> dict:
        self._st("profiles", gpu)
        return copy.deepcopy(self._dev[gpu].get("gpu_instance_profiles", {}))

    def compute_processes(self, gpu: int) -> list[dict]:
        self._st("compute_processes", gpu)
        return [dict(p) for p in self.processes.get(gpu, [])]

    def gpu_instances(self, gpu: int) -> list[dict]:
        st = self._st("gpu_instances", gpu)
        if st["mode"][0] != 1:
            return []
        return [{"id": i, "profile_id": g["profile_id"], "start": g["start"], "size": g["size"]}
                for i, g in sorted(st["gis"].items())]

    def compute_instances(self, gpu: int, gi_id: int) -> list[dict]:
        st = self._st("compute_instances", gpu)
        g = st["gis"].get(gi_id)
        if g is None:
            raise MigNvmlError("compute_instances", gpu, f"GPU instance {gi_id} Not Found", NOT_FOUND)
        return [{"id": i, **c} for i, c in sorted(g["cis"].items())]

    def mig_devices(self, gpu: int) -> list[dict]:
        st = self._st("mig_devices", gpu)
        if st["mode"][0] != 1:
            return []
        return [{"uuid": c["uuid"], "gi_id": gi, "ci_id": ci}
                for gi, g in sorted(st["gis"].items()) for ci, c in sorted(g["cis"].items())]

    def _profile(self, gpu: int, profile_id: int) -> dict | None:
        for e in self._dev[gpu].get("gpu_instance_profiles", {}).values():
            if "info" in e and int(e["info"]["id"]) == profile_id:
                return e
        return None

    # -- effects -----------------------------------------------------------
    def set_mig_mode(self, gpu: int, mode: int) -> int:
        st = self._st("set_mig_mode", gpu)
        self._mutate("set_mig_mode", gpu, mode)
        if mode not in (0, 1):
            raise MigNvmlError("set_mig_mode", gpu, "Invalid Argument", INVALID_ARGUMENT)
        if self.processes.get(gpu):
            raise MigNvmlError("set_mig_mode", gpu, CODE_TEXT[IN_USE], IN_USE)
        if mode == 0 and st["gis"]:
            raise MigNvmlError("set_mig_mode", gpu, CODE_TEXT[IN_USE] + " (GPU instances exist)", IN_USE)
        st["mode"][1] = mode
        blocker = self.mode_blocker.get(gpu)
        if blocker:
            return blocker  # pending until a GPU reset
        st["mode"][0] = mode
        return NVML_SUCCESS

    def create_gpu_instance(self, gpu: int, profile_id: int, start: int, size: int) -> int:
        st = self._st("create_gpu_instance", gpu)
        self._mutate("create_gpu_instance", gpu, profile_id, start, size)
        if st["mode"][0] != 1:
            raise MigNvmlError("create_gpu_instance", gpu, "Not Supported (MIG mode is disabled)",
                               NOT_SUPPORTED)
        e = self._profile(gpu, profile_id)
        if e is None:
            raise MigNvmlError("create_gpu_instance", gpu, f"profile id {profile_id}: Invalid Argument",
                               INVALID_ARGUMENT)
        allowed = [parse_placement(p) for p in _ok(e.get("possible_placements"), [])]
        if (start, size) not in allowed:
            raise MigNvmlError("create_gpu_instance", gpu, f"placement [{start}, {size}] not allowed",
                               INVALID_ARGUMENT)
        same = [g for g in st["gis"].values() if g["profile_id"] == profile_id]
        clash = [g for g in st["gis"].values()
                 if g["start"] < start + size and start < g["start"] + g["size"]]
        if clash or len(same) >= int(e["info"]["instanceCount"]):
            raise MigNvmlError("create_gpu_instance", gpu, CODE_TEXT[INSUFFICIENT_RESOURCES],
                               INSUFFICIENT_RESOURCES)
        gi = st["next_gi"]
        st["next_gi"] += 1
        st["gis"][gi] = {"profile_id": profile_id, "start": start, "size": size,
                         "slices": int(e["info"]["sliceCount"]), "cis": {}}
        return gi

    def create_compute_instance(self, gpu: int, gi_id: int, profile_id: int | None = None,
                                start: int | None = None, size: int | None = None) -> int:
        st = self._st("create_compute_instance", gpu)
        self._mutate("create_compute_instance", gpu, gi_id, profile_id)
        g = st["gis"].get(gi_id)
        if g is None:
            raise MigNvmlError("create_compute_instance", gpu, f"GPU instance {gi_id} Not Found", NOT_FOUND)
        # compute-instance profiles were not recorded; model the full-GI one:
        # profile id = the GI's slice count's CI profile, placement [0, slices]
        full = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}.get(g["slices"], 0)
        pid = full if profile_id is None else profile_id
        pstart = 0 if start is None else start
        psize = g["slices"] if size is None else size
        used = sum(c["size"] for c in g["cis"].values())
        if used + psize > g["slices"]:
            raise MigNvmlError("create_compute_instance", gpu, CODE_TEXT[INSUFFICIENT_RESOURCES],
                               INSUFFICIENT_RESOURCES)
        ci = max(g["cis"], default=-1) + 1
        self._uuid_seq += 1
        u = f"MIG-{gpu:08x}-{gi_id:04x}-{ci:04x}-{self._uuid_seq:04x}-{0xfa4e00000000 + self._uuid_seq:012x}"
        g["cis"][ci] = {"profile_id": pid, "start": pstart, "size": psize, "uuid": u}
        return ci

    def destroy_compute_instance(self, gpu: int, gi_id: int, ci_id: int) -> None:
        st = self._st("destroy_compute_instance", gpu)
        self._mutate("destroy_compute_instance", gpu, gi_id, ci_id)
        g = st["gis"].get(gi_id)
        if g is None or ci_id not in g["cis"]:
            raise MigNvmlError("destroy_compute_instance", gpu, f"CI {gi_id}/{ci_id} Not Found", NOT_FOUND)
        del g["cis"][ci_id]

    def destroy_gpu_instance(self, gpu: int, gi_id: int) -> None:
        st = self._st("destroy_gpu_instance", gpu)
        self._mutate("destroy_gpu_instance", gpu, gi_id)
        g = st["gis"].get(gi_id)
        if g is None:
            raise MigNvmlError("destroy_gpu_instance", gpu, f"GPU instance {gi_id} Not Found", NOT_FOUND)
        if g["cis"]:
            raise MigNvmlError("destroy_gpu_instance", gpu, CODE_TEXT[IN_USE] + " (compute instances exist)",
                               IN_USE)
        del st["gis"][gi_id]


def _ok(entry, default):
    if isinstance(entry, dict):
        if "ok" in entry:
            return entry["ok"]
        if "error" in entry:
            return default
    return default if entry is None else entry


class RealMig(MigBackend):
    """``pynvml`` on the live host, initialised on first use.

    Read methods (``mig_mode``, ``profiles``, ``gpu_instances``,
    ``compute_instances``, ``mig_devices``, ``compute_processes``) make no
    change. ``set_mig_mode`` / ``create_*`` / ``destroy_*`` change the GPU:
    root only, and only on a node the job holds exclusively.

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
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

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

    def _placements(self, gpu: int, h, profile_id: int) -> list[tuple[int, int]]:
        nv = self.nv
        import ctypes

        arr = (nv.c_nvmlGpuInstancePlacement_t * 16)()
        cnt = ctypes.c_uint(16)
        self._call("possible_placements", gpu, nv.nvmlDeviceGetGpuInstancePossiblePlacements,
                   h, profile_id, arr, ctypes.byref(cnt))
        return [(int(arr[i].start), int(arr[i].size)) for i in range(cnt.value)]

    def profiles(self, gpu: int) -> dict:
        nv = self.nv
        h = self._h(gpu)
        out: dict[str, Any] = {}
        for p in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 15))):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            except nv.NVMLError as e:
                out[str(p)] = {"error": str(e), "code": getattr(e, "value", None)}
                continue
            name = getattr(info, "name", b"")
            name = name.decode(errors="replace") if isinstance(name, bytes) else name
            entry: dict[str, Any] = {"info": {"id": int(info.id), "sliceCount": int(info.sliceCount),
                                              "instanceCount": int(info.instanceCount),
                                              "memorySizeMB": int(info.memorySizeMB),
                                              "name": name or f"profile {info.id}"}}
            try:
                pl = self._placements(gpu, h, int(info.id))
                entry["possible_placements"] = {"ok": [f"[{s}, {n}]" for s, n in pl]}
            except MigNvmlError as e:
                entry["possible_placements"] = {"error": e.detail, "code": e.code}
            out[str(p)] = entry
        return out

    def _gi_handles(self, gpu: int) -> list:
        nv = self.nv
        import ctypes

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
            try:
                out.append(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, p, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED))
            except nv.NVMLError:
                continue
        return out

    def compute_instances(self, gpu: int, gi_id: int) -> list[dict]:
        nv = self.nv
        import ctypes

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
