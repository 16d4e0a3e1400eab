"""A MIG backend in memory, for tests: :class:`FakeMig` keeps the state
:class:`gsrun.node.mig_nvml.RealMig` would change on a GPU, seeded from a
recording (``tests/data/nvml/h200-mig.json``: the real H200's profile table),
checks what NVML checks (MIG mode on, placement allowed and free, instance
count, no CI left in a GI being destroyed, no process when MIG mode changes)
and can inject a failure at any mutating step (:meth:`FakeMig.fail_at_step`).

Only tests use it: the prolog makes no MIG change under a fake host root, and
``gsrun-node mig plan --host-root`` reads the profile table from the tree's
``nvml.json`` (``gsrun.facts.nvml``), so it left the package.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from gsrun.node.mig_nvml import (CODE_TEXT, INSUFFICIENT_RESOURCES, IN_USE, INVALID_ARGUMENT, NOT_FOUND,
                                 NOT_SUPPORTED, NVML_SUCCESS, UNKNOWN, MigBackend, MigNvmlError,
                                 parse_placement)

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
