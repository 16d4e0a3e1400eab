"""Per-job MIG layouts: plan (pure), apply in the prolog, undo in the epilog.

Facts: the profile table (``nvmlDeviceGetGpuInstanceProfileInfo``,
``nvmlDeviceGetGpuInstancePossiblePlacements``) through
:mod:`gsrun.node.mig_nvml` or the nvml key ``"gpu_instance_profiles"``.
:func:`prolog_apply` journals each GPU's prior state
(``<state_dir>/<job_id>/mig.json``, locked) before changing it and rolls back
on failure; a GPU that cannot be brought back drains the node.
"""

from __future__ import annotations

import os
import re
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gsrun.base.errors import InputError, NodeError
from gsrun.base.fsutil import ensure_dir
from gsrun.base.ids import check_job_id, is_job_id
from gsrun.facts.nvml import NA, open_nvml
from gsrun.node.journal import Journal
from gsrun.node.mig_nvml import CODE_TEXT, MigBackend, MigNvmlError, RealMig, parse_placement
from gsrun.request.mig_layout import format_layout, parse_layout

JOURNAL_NAME = "mig.json"
JOURNAL_VERSION = 1


# -------------------- facts -> plain data

@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile: ``index`` the NVML profile enum, ``id`` the
    profile id for placements and creation, ``placements`` ``((start, size),
    ...)`` in memory slices, ``memory_mb`` NVML's ``memorySizeMB``."""

    index: int
    id: int
    name: str
    slice_count: int
    instance_count: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ProfileTable:
    profiles: tuple[Profile, ...]

    def by_name(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def memory_slices(self) -> int:
        """Memory slices of the GPU: the end of the furthest placement (8 on H200)."""
        return max((s + n for p in self.profiles for s, n in p.placements), default=0)

    @property
    def compute_slices(self) -> int:
        """Compute slices of the GPU: the largest profile's ``sliceCount`` (7 on H200)."""
        return max((p.slice_count for p in self.profiles), default=0)

    def names(self) -> list[str]:
        return [p.name for p in sorted(self.profiles, key=lambda p: (p.slice_count, p.memory_mb, p.name))]


def short_name(nvml_name: str) -> str:
    """``"MIG 1g.18gb+me"`` (``nvmlGpuInstanceProfileInfo_v2_t.name``) -> ``"1g.18gb+me"``."""
    n = nvml_name.strip()
    if n.upper().startswith("MIG "):
        n = n[4:]
    return n.strip().lower()


def profile_table(raw: dict) -> ProfileTable:
    """Profile table from the recorded/NVML form ``{"<index>": {"info": {...},
    "possible_placements": {"ok": ["[0, 1]", ...]}} | {"error", "code"}}``;
    profiles with an error or no placements are left out.

    Raises:
        InputError: ``raw`` is not a mapping (no MIG support).
    """
    if not isinstance(raw, dict):
        raise InputError("mig", "no MIG profile table", f"NVML answered {raw}",
                         hint="this GPU or driver does not support MIG")
    out = []
    for key, e in raw.items():
        if not isinstance(e, dict) or "info" not in e:
            continue
        pl = e.get("possible_placements", {})
        if not isinstance(pl, dict) or "ok" not in pl:
            continue
        info = e["info"]
        out.append(Profile(index=int(key), id=int(info["id"]), name=short_name(str(info.get("name", ""))),
                           slice_count=int(info["sliceCount"]), instance_count=int(info["instanceCount"]),
                           memory_mb=int(info["memorySizeMB"]),
                           placements=tuple(sorted(parse_placement(p) for p in pl["ok"]))))
    return ProfileTable(tuple(sorted(out, key=lambda p: p.index)))


# -------------------- decision: the planner

@dataclass(frozen=True)
class Placed:
    """One GPU instance of a plan, at memory slices ``[start, start+size)``."""

    name: str
    profile_id: int
    start: int
    size: int
    slice_count: int
    memory_mb: int


@dataclass(frozen=True)
class Plan:
    layout: str
    instances: tuple[Placed, ...]
    memory_slices: int
    compute_slices: int
    items: tuple[tuple[int, str], ...] = field(default=())

    def free_slices(self) -> list[int]:
        used = {s for p in self.instances for s in range(p.start, p.start + p.size)}
        return [s for s in range(self.memory_slices) if s not in used]


def _where(placements) -> str:
    sizes = sorted({n for _, n in placements})
    starts = ", ".join(str(s) for s, _ in placements)
    word = "slice" if len(placements) == 1 else "slices"
    size = f"size {sizes[0]}" if len(sizes) == 1 else "sizes " + "/".join(map(str, sizes))
    return f"{word} {starts} ({size})"


def _ordinal(n: int) -> str:
    words = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
    return words[n - 1] if 1 <= n <= len(words) else f"#{n}"


def _refuse(layout: str, detail: str, table: ProfileTable) -> InputError:
    return InputError("mig", f"layout {layout!r} does not fit this GPU", detail,
                      hint="this GPU's profiles: " + ", ".join(table.names()))


def plan_layout(table: ProfileTable | dict, layout: str | list[tuple[int, str]]) -> Plan:
    """Non-overlapping placements for every instance of ``layout`` on a GPU
    with profile table ``table`` (or its raw form). Pure: largest first, each
    in NVML's order (``4g.71gb+3g.71gb`` gets ``[0,4)`` and ``[4,8)``).

    Raises:
        InputError: a bad layout; a profile the GPU lacks; over
            ``instanceCount``, compute or memory slices; or no arrangement fits
            (the detail names the instance and what took its slices).
    """
    if isinstance(table, dict):
        table = profile_table(table)
    items = parse_layout(layout) if isinstance(layout, str) else [(int(n), str(p)) for n, p in layout]
    text = layout.strip() if isinstance(layout, str) else format_layout(items)
    if not items:
        raise _refuse(text, "empty layout", table)
    profs: list[tuple[Profile, int]] = []
    for n, name in items:
        p = table.by_name(name)
        if p is None:
            raise _refuse(text, f"this GPU has no MIG profile {name}", table)
        if n > p.instance_count:
            nth = _ordinal(p.instance_count + 1)
            if len(p.placements) <= p.instance_count:
                why = (f"{name} can be placed only at {_where(p.placements)}, so the {nth} one "
                       "has no free placement")
            else:
                why = (f"the GPU allows {p.instance_count} at a time although {name} has "
                       f"{len(p.placements)} possible placements ({_where(p.placements)})")
            raise _refuse(text, f"instanceCount of {name} is {p.instance_count} (NVML); the layout asks for "
                          f"{n}: {why}", table)
        profs.append((p, n))
    compute = sum(p.slice_count * n for p, n in profs)
    if compute > table.compute_slices:
        raise _refuse(text, f"needs {compute} compute slices; the GPU has {table.compute_slices}", table)
    mem = sum(min(s for _, s in p.placements) * n for p, n in profs)
    if mem > table.memory_slices:
        raise _refuse(text, f"needs at least {mem} memory slices; the GPU has {table.memory_slices} "
                      "(" + ", ".join(f"{n}x{p.name} takes {min(s for _, s in p.placements)} each"
                                      for p, n in profs) + ")", table)
    # expand and order: largest placement first, then most compute, fewest choices
    seq: list[Profile] = []
    for p, n in sorted(profs, key=lambda pn: (-max(s for _, s in pn[0].placements), -pn[0].slice_count,
                                               len(pn[0].placements), pn[0].name)):
        seq.extend([p] * n)
    best_fail: dict = {"depth": -1}
    chosen: list[tuple[int, int]] = []

    def free(start: int, size: int, used: int) -> bool:
        mask = ((1 << size) - 1) << start
        return not (used & mask)

    def dfs(k: int, used: int) -> bool:
        if k == len(seq):
            return True
        p = seq[k]
        min_start = chosen[-1][0] + 1 if k > 0 and seq[k - 1] is p else -1
        for start, size in p.placements:
            if start < min_start or not free(start, size, used):
                continue
            chosen.append((start, size))
            if dfs(k + 1, used | (((1 << size) - 1) << start)):
                return True
            chosen.pop()
        if k > best_fail["depth"]:
            best_fail.update(depth=k, placed=list(zip(seq[:k], chosen)))
        return False

    if not dfs(0, 0):
        k = best_fail["depth"]
        p = seq[k]
        nth = sum(1 for q in seq[:k + 1] if q is p)
        taken = "; ".join(f"{q.name} at slice {s}" + (f"-{s + n - 1}" if n > 1 else "")
                          for q, (s, n) in best_fail["placed"]) or "nothing"
        raise _refuse(text, f"{p.name} can be placed only at {_where(p.placements)}; the {_ordinal(nth)} "
                      f"one has no free placement (already taken: {taken}; no other arrangement works)", table)
    placed = tuple(sorted((Placed(p.name, p.id, s, n, p.slice_count, p.memory_mb)
                           for p, (s, n) in zip(seq, chosen)), key=lambda x: x.start))
    return Plan(layout=text, instances=placed, memory_slices=table.memory_slices,
                compute_slices=table.compute_slices, items=tuple(items))


def format_plan(plan: Plan, gpu: int | None = None, gpu_name: str | None = None) -> str:
    """The plan as text: a line per instance and a slice map (``AAAABBCC``)."""
    head = f"MIG plan for {plan.layout}"
    if gpu is not None:
        head += f" on GPU {gpu}" + (f" ({gpu_name})" if gpu_name else "")
    lines = [head, f"  GPU: {plan.compute_slices} compute slices, {plan.memory_slices} memory slices"]
    letters = "ABCDEFGHIJKLMNOP"
    cells = ["."] * plan.memory_slices
    for i, p in enumerate(plan.instances):
        end = p.start + p.size - 1
        where = f"{p.start}" if p.size == 1 else f"{p.start}-{end}"
        lines.append(f"  {letters[i]}  memory slices {where:<5} {p.name:<12} profile id {p.profile_id:<3} "
                     f"{p.slice_count}/{plan.compute_slices} compute  {p.memory_mb} MiB")
        for s in range(p.start, p.start + p.size):
            cells[s] = letters[i]
    free = plan.free_slices()
    lines.append(f"  map [{''.join(cells)}]  free memory slices: {', '.join(map(str, free)) or 'none'}")
    used = sum(p.slice_count for p in plan.instances)
    lines.append(f"  compute slices used: {used}/{plan.compute_slices}")
    return "\n".join(lines)


def resolve_layout(text: str, named: dict[str, str] | None = None) -> str:
    """A site-named layout (config ``mig.layouts``) -> its text; else ``text``."""
    if named and text in named:
        return named[text]
    return text


# -------------------- effects: apply / restore with a journal

def _journal_path(state_dir, job_id: str) -> Path:
    job_id = check_job_id(str(job_id), array=True, phase="mig")
    return Path(state_dir) / job_id / JOURNAL_NAME


def _journal(path: Path) -> Journal:
    """The job's MIG journal, locked (restore and epilog never race)."""
    return Journal(path, "mig")


def _read_state(backend: MigBackend, gpu: int) -> dict:
    """``{"mode": [cur, pend], "gis": [{"profile_id", "start", "size", "cis": [{...}]}]}``."""
    cur, pend = backend.mig_mode(gpu)
    gis = []
    if cur == 1:
        for g in backend.gpu_instances(gpu):
            cis = [{"profile_id": c["profile_id"], "start": c["start"], "size": c["size"]}
                   for c in backend.compute_instances(gpu, g["id"])]
            gis.append({"profile_id": g["profile_id"], "start": g["start"], "size": g["size"], "cis": cis})
    return {"mode": [int(cur), int(pend)], "gis": gis}


def _signature(state: dict) -> tuple:
    return (state["mode"][0],
            tuple(sorted((g["profile_id"], g["start"], g["size"],
                          tuple(sorted((c["profile_id"], c["start"], c["size"]) for c in g["cis"])))
                         for g in state["gis"])))


def _sanitize_reason(text: str) -> str:
    r = re.sub(r"[^A-Za-z0-9 ._:/,=+()\[\]-]", "_", " ".join(text.split()))
    return r[:200]


def _clear(backend: MigBackend, gpu: int) -> None:
    """Destroy every compute and GPU instance on ``gpu`` (exclusive node)."""
    if backend.mig_mode(gpu)[0] != 1:
        return
    for g in backend.gpu_instances(gpu):
        for c in backend.compute_instances(gpu, g["id"]):
            backend.destroy_compute_instance(gpu, g["id"], c["id"])
        backend.destroy_gpu_instance(gpu, g["id"])


def _restore_gpu(backend: MigBackend, gpu: int, prior: dict, log) -> None:
    """Bring ``gpu`` back to ``prior`` (see :func:`_read_state`). Idempotent.

    Raises:
        NodeError: it does not read back as ``prior`` (a mode pending a reset).
        MigNvmlError: an NVML call failed.
    """
    now = _read_state(backend, gpu)
    if _signature(now) == _signature(prior) and now["mode"][1] == prior["mode"][1]:
        return
    _clear(backend, gpu)
    want_mode = int(prior["mode"][0])
    if backend.mig_mode(gpu)[1] != want_mode or backend.mig_mode(gpu)[0] != want_mode:
        backend.set_mig_mode(gpu, want_mode)
    if want_mode == 1:
        for g in prior["gis"]:
            gi = backend.create_gpu_instance(gpu, g["profile_id"], g["start"], g["size"])
            for c in g["cis"]:
                backend.create_compute_instance(gpu, gi, c["profile_id"], c["start"], c["size"])
    after = _read_state(backend, gpu)
    if _signature(after) != _signature(prior):
        raise NodeError("mig", f"GPU {gpu} not restored",
                        f"MIG mode is {after['mode']} (current, pending), expected {prior['mode']}; "
                        f"{len(after['gis'])} GPU instances, expected {len(prior['gis'])}",
                        hint="a MIG mode change that stays pending needs a GPU reset (nvidia-smi -r)")
    log(f"gsrun: mig: GPU {gpu} restored (MIG mode {want_mode}, {len(prior['gis'])} GPU instances)")


def _restore_journal(backend: MigBackend, journal: dict, path: Path, log) -> list[str]:
    """Restore every GPU of ``journal``; return the failures (empty: all good)."""
    failures = []
    for gpu_s, g in sorted(journal.get("gpus", {}).items(), key=lambda kv: int(kv[0])):
        try:
            _restore_gpu(backend, int(gpu_s), g["prior"], log)
        except (MigNvmlError, NodeError) as e:
            failures.append(f"GPU {gpu_s}: {getattr(e, 'detail', None) or e}")
    return failures


def _blocker_detail(gpu: int, status: int, mode: tuple[int, int], holders) -> str:
    why = CODE_TEXT.get(status, f"NVML status {status}")
    d = (f"GPU {gpu}: MIG enable is pending (current {mode[0]}, pending {mode[1]}): {why}; "
         "the change takes effect only when no client holds the GPU, or after a GPU reset")
    held = []
    if holders is not None:
        try:
            held = list(holders(gpu))
        except Exception as e:  # noqa: BLE001 - a reporting aid only
            held = [f"(could not list holders: {e})"]
    if held:
        d += "; holding it: " + ", ".join(map(str, held))
    else:
        d += ("; usual holders: nvidia-persistenced, nvidia_drm (modeset=1), DCGM / dcgm-exporter, "
              "slurmd's own NVML GPU accounting (AcctGatherEnergyType=acct_gather_energy/gpu)")
    return d


def prolog_apply(mig_backend: MigBackend, state_dir, job_id, gpu_indices: list[int], layout: str,
                 drain: Callable[[str], None] | None = None, log: Callable[[str], None] = print,
                 exclusive: bool = True, holders: Callable[[int], list] | None = None,
                 named: dict[str, str] | None = None) -> dict:
    """Cut each of the job's GPUs (NVML indices) into ``layout`` (or its
    name in ``named``), journaling every step; a failure rolls back, a failed
    rollback calls ``drain``. -> ``{"devices": [MIG UUIDs in GPU order],
    "gpus": {index: [uuid]}, "plans": {index: Plan}, "journal": path}``.

    Raises:
        InputError: a bad layout, one this GPU cannot hold, a bad job id.
        NodeError: node not exclusive, processes on a GPU, MIG mode blocked
            (pending reset, a client holding the GPU), or an NVML failure
            (rolled back; ``drained`` in the detail if the rollback failed).
    """
    drain = drain or (lambda reason: None)
    path = _journal_path(state_dir, job_id)
    gpus = [int(g) for g in gpu_indices]
    if not gpus:
        raise InputError("mig", "no GPUs", f"job {job_id} has no GPUs for layout {layout!r}")
    if len(set(gpus)) != len(gpus):
        raise InputError("mig", "duplicate GPUs", f"GPU indices {gpus}")
    if not exclusive:
        raise NodeError("prolog", "MIG layout refused",
                        f"job {job_id} does not hold the node exclusively; a MIG layout changes whole GPUs",
                        hint="submit with --exclusive")
    text = resolve_layout(layout, named)
    if path.exists():
        raise NodeError("prolog", "MIG journal exists",
                        f"{path} is left from an earlier run of job {job_id}",
                        hint="run `gsrun-node restore` first")
    busy = {}
    for g in gpus:
        try:
            ps = mig_backend.compute_processes(g)
        except MigNvmlError as e:
            raise NodeError("prolog", "cannot check GPU processes", str(e)) from None
        if ps:
            busy[g] = ps
    if busy:
        raise NodeError("prolog", "GPU in use",
                        "; ".join(f"GPU {g}: pids {', '.join(str(p['pid']) for p in ps)}"
                                  for g, ps in busy.items()),
                        hint="a MIG layout needs idle GPUs; stop those processes or pick other GPUs")
    plans = {}
    priors = {}
    try:
        for g in gpus:
            plans[g] = plan_layout(profile_table(mig_backend.profiles(g)), text)
            priors[g] = _read_state(mig_backend, g)
    except MigNvmlError as e:
        raise NodeError("prolog", "cannot read MIG state", str(e)) from None
    if not path.parent.parent.exists():  # the state dir itself (normally made by the node setup)
        ensure_dir(path.parent.parent, 0o755, os.geteuid(), os.getegid())
    ensure_dir(path.parent, 0o700, os.geteuid(), os.getegid())
    with _journal(path).lock():
        journal = {"version": JOURNAL_VERSION, "job_id": str(job_id), "layout": plans[gpus[0]].layout,
                   "status": "applying", "pid": os.getpid(),
                   "gpus": {str(g): {"prior": priors[g], "mode_set": False, "prior_cleared": False,
                                     "created": [], "devices": []} for g in gpus}}
        _journal(path).write(journal)
        log(f"gsrun: mig: job {job_id}: applying {plans[gpus[0]].layout} on GPU(s) "
            f"{','.join(map(str, gpus))}; journal {path}")
        try:
            for g in gpus:
                ent = journal["gpus"][str(g)]
                cur, pend = mig_backend.mig_mode(g)
                if cur != 1:
                    ent["mode_set"] = True
                    _journal(path).write(journal)
                    status = mig_backend.set_mig_mode(g, 1)
                    mode = mig_backend.mig_mode(g)
                    if mode[0] != 1:
                        raise NodeError("prolog", "MIG mode not enabled", _blocker_detail(g, status, mode, holders),
                                        hint="stop the holders (or reset the GPU) and retry")
                if ent["prior"]["gis"]:
                    ent["prior_cleared"] = True
                    _journal(path).write(journal)
                    _clear(mig_backend, g)
                for p in plans[g].instances:
                    gi = mig_backend.create_gpu_instance(g, p.profile_id, p.start, p.size)
                    ent["created"].append({"gi_id": gi, "profile_id": p.profile_id, "start": p.start,
                                           "size": p.size, "ci_ids": []})
                    _journal(path).write(journal)
                    ci = mig_backend.create_compute_instance(g, gi)
                    ent["created"][-1]["ci_ids"].append(ci)
                    _journal(path).write(journal)
                devs = {(d["gi_id"], d["ci_id"]): d["uuid"] for d in mig_backend.mig_devices(g)}
                uuids = []
                for c in ent["created"]:
                    u = devs.get((c["gi_id"], c["ci_ids"][0]))
                    if not u:
                        raise NodeError("prolog", "MIG device missing",
                                        f"GPU {g}: no MIG device for GPU instance {c['gi_id']} "
                                        f"compute instance {c['ci_ids'][0]}")
                    uuids.append(u)
                ent["devices"] = uuids
                _journal(path).write(journal)
        except (MigNvmlError, NodeError) as e:
            cause = str(e) if isinstance(e, MigNvmlError) else e.detail
            journal["status"] = "rolling_back"
            journal["error"] = cause
            _journal(path).write(journal)
            log(f"gsrun: mig: job {job_id}: {cause}; rolling back")
            failures = _restore_journal(mig_backend, journal, path, log)
            if failures:
                _record_failure(path, journal, job_id, "rollback", failures, drain)
                raise NodeError("prolog", "MIG layout failed and node drained",
                                f"{cause}; rollback failed: {'; '.join(failures)}",
                                hint="the journal stays in place; `gsrun-node restore` retries") from None
            _remove(path)
            if isinstance(e, NodeError):
                raise
            raise NodeError("prolog", "MIG layout not applied", f"{cause} (rolled back)") from None
        journal["status"] = "applied"
        _journal(path).write(journal)
        devices = [u for g in gpus for u in journal["gpus"][str(g)]["devices"]]
        log(f"gsrun: mig: job {job_id}: {len(devices)} MIG devices")
        return {"devices": devices, "gpus": {g: journal["gpus"][str(g)]["devices"] for g in gpus},
                "plans": plans, "journal": str(path)}


def _record_failure(path: Path, journal: dict, job_id: str, what: str, failures: list[str], drain,
                    log: Callable[[str], None] | None = None) -> str:
    """Journal ``{what}_failed`` and its ``failures``, log if ``log``, drain -> the drain reason."""
    reason = _sanitize_reason(f"gsrun mig job {job_id}: {what} failed: {'; '.join(failures)}")
    journal["status"] = f"{what}_failed"
    journal["failures"] = failures
    _journal(path).write(journal)
    if log is not None:
        log(f"gsrun: mig: job {job_id}: {reason}; draining")
    drain(reason)
    return reason


def _remove(path: Path) -> None:
    _journal(path).remove()
    with suppress(OSError):
        path.parent.rmdir()  # only if empty: other modules may share the job dir


def _restore_path(mig_backend, path: Path, job_id: str, drain, log) -> dict:
    if not path.parent.is_dir() or path.parent.is_symlink():
        return {"restored": False, "reason": "no MIG journal"}
    drain = drain or (lambda reason: None)
    with _journal(path).lock():
        got = _journal(path).load()
        journal = got.data if got else None
        if got is not None and got.earlier_boot:
            log(f"gsrun: mig: job {job_id}: journal {path} is from an earlier boot (boot {got.boot_id}): "
                "its instances are gone, the MIG mode may persist; restoring")
        if journal is None:
            if path.exists():
                reason = _sanitize_reason(f"gsrun mig job {job_id}: journal {path} unreadable")
                drain(reason)
                return {"restored": False, "drained": True, "reason": reason}
            return {"restored": False, "reason": "no MIG journal"}
        failures = _restore_journal(mig_backend, journal, path, log)
        if failures:
            reason = _record_failure(path, journal, job_id, "restore", failures, drain, log)
            return {"restored": False, "drained": True, "reason": reason, "failures": failures}
        _remove(path)
        return {"restored": True, "gpus": sorted(int(g) for g in journal.get("gpus", {}))}


def epilog_restore(mig_backend: MigBackend, state_dir, job_id, drain: Callable[[str], None] | None = None,
                   log: Callable[[str], None] = print) -> dict:
    """Bring the job's GPUs back to the journaled MIG state and remove the
    journal. Idempotent; a GPU problem drains (the journal stays) instead of raising.
    -> ``{"restored": True, "gpus"}``, ``{"restored": False, "reason": "no MIG
    journal"}`` or ``{"restored": False, "drained": True, "reason", "failures"}``.
    """
    return _restore_path(mig_backend, _journal_path(state_dir, job_id), str(job_id), drain, log)


def restore_crashed(mig_backend: MigBackend, state_dir, log: Callable[[str], None] = print,
                    drain: Callable[[str], None] | None = None, keep_jobs=()) -> dict:
    """:func:`epilog_restore` for every ``mig.json`` left but ``keep_jobs`` -> ``{job_id: result}``."""
    out = {}
    base = Path(state_dir)
    if not base.is_dir():
        return out
    keep = {str(j) for j in keep_jobs}
    for d in sorted(base.iterdir()):
        if not is_job_id(d.name, array=True) or d.name in keep or d.is_symlink():
            continue
        p = d / JOURNAL_NAME
        if not p.exists():
            continue
        log(f"gsrun: mig: restoring MIG state left by job {d.name}")
        out[d.name] = _restore_path(mig_backend, p, d.name, drain, log)
    return out


# -------------------- gsrun-node mig plan (read-only)

def cli_plan(gpu_index: int, layout: str, hostfs=None, named: dict[str, str] | None = None,
             mig_backend: MigBackend | None = None) -> str:
    """Text for ``gsrun-node mig plan --gpu N LAYOUT`` (read-only NVML).

    Raises:
        InputError: a bad layout or one the GPU cannot hold.
        NodeError: NVML could not be read (no driver, no such GPU, no MIG).
    """
    text = resolve_layout(layout, named)
    mode = None
    name = None
    if mig_backend is None and hostfs is not None and not hostfs.is_real:
        nv = open_nvml(hostfs)
        raw = nv.get(gpu_index, "gpu_instance_profiles")
        if isinstance(raw, NA):
            raise NodeError("mig", f"GPU {gpu_index}: no MIG profile table", str(raw))
        m = nv.get(gpu_index, "mig_mode")
        mode = None if isinstance(m, NA) else tuple(m)
        n = nv.get(gpu_index, "name")
        name = None if isinstance(n, NA) else n
    else:
        if mig_backend is None:
            mig_backend = RealMig()
        try:
            raw = mig_backend.profiles(gpu_index)
            mode = mig_backend.mig_mode(gpu_index)
        except MigNvmlError as e:
            raise NodeError("mig", f"GPU {gpu_index}: cannot read MIG profiles", str(e)) from None
    plan = plan_layout(profile_table(raw), text)
    out = format_plan(plan, gpu_index, name)
    if mode is not None:
        state = {0: "disabled", 1: "enabled"}
        out += (f"\n  MIG mode now: {state.get(mode[0], mode[0])} (pending {state.get(mode[1], mode[1])})"
                + ("; a job with this layout would enable it and restore it after" if mode[0] != 1 else ""))
    out += "\n  (dry run: read-only NVML calls; nothing was changed)"
    return out
