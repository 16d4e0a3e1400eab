"""The Slurm step environment -> the plan's inputs (reads facts, no effects):
:func:`plan_from_env`, :func:`worker_environ` (a launcher's worker),
:func:`read_job_mig_devices` (the prolog's MIG devices).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gsrun.base.errors import InputError
from gsrun.base.fsutil import read_json
from gsrun.base.ids import is_job_id, is_node_name
from gsrun.facts.devices import DeviceToken, parse_device_list
from gsrun.facts.hostfs import HostFS
from gsrun.facts.slurm import parse_tasks_per_node
from gsrun.facts.topology import NVML_IF_NEEDED, Topology, read_allowed_cpus, read_topology
from gsrun.bind.plan.rules import MAX_LOCAL_RANKS, Plan, make_plan, max_local_ranks, resolve_step_gpus

#: Most GPUs a step's device list may name on one node, counted before expanding
#: (16 GPUs x 7 MIG instances = 112 today; the list is parsed as root).
MAX_STEP_GPUS = 256
#: Most digits of a task number: above :data:`MAX_LOCAL_RANKS`, below ``int()``'s 4300-digit limit
MAX_DIGITS = 9


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name)
    if v is None or not v.strip():
        return None
    v = v.strip()
    if not v.isdigit():
        raise InputError("bind", f"{name} is not a number", repr(v)[:60])
    if len(v) > MAX_DIGITS:
        raise InputError("bind", f"{name} out of range", f"{v[:12]}... ({len(v)} digits)",
                         hint=f"Slurm writes task numbers below {MAX_LOCAL_RANKS}")
    return int(v)


def _device_list(environ: Mapping[str, str], name: str, allow_ranges: bool) -> list[DeviceToken] | None:
    """:func:`gsrun.facts.devices.parse_device_list` of ``environ[name]``,
    refused first when it names more than :data:`MAX_STEP_GPUS` devices,
    ranges expanded (counted from the text, nothing expanded yet).

    Raises:
        InputError: too many devices, or what ``parse_device_list`` raises.
    """
    value = environ.get(name)
    if value is None:
        return None
    entries = value.count(",") + 1
    total = 0
    if entries <= MAX_STEP_GPUS:
        for part in value.split(","):
            lo, dash, hi = part.strip().partition("-")
            if allow_ranges and dash and lo.isdigit() and hi.isdigit() and len(lo) <= 6 and len(hi) <= 6:
                total += max(1, int(hi) - int(lo) + 1)
            else:
                total += 1
            if total > MAX_STEP_GPUS:
                break
    if entries > MAX_STEP_GPUS or total > MAX_STEP_GPUS:
        detail = (f"{entries} entries" if entries > MAX_STEP_GPUS
                  else f"over {MAX_STEP_GPUS} GPUs once its ranges are expanded")
        raise InputError("bind", f"{name} names too many GPUs", f"{detail}; a node has at most {MAX_STEP_GPUS}",
                         hint="Slurm writes this node's GPUs of the step, e.g. 0-3 or 0,2; check the job's "
                              "environment")
    return parse_device_list(value, allow_ranges=allow_ranges)


def _tasks_per_node(text: str, name: str) -> list[int]:
    """``4(x2),2`` -> ``[4, 4, 2]`` (:func:`gsrun.facts.slurm.parse_tasks_per_node`),
    with the error named for the task's variable."""
    try:
        return parse_tasks_per_node(text)
    except InputError:
        raise InputError("bind", f"bad {name}", repr(text)[:80],
                         hint="Slurm writes forms like 4(x2),2") from None


def ntasks_from_env(environ: Mapping[str, str]) -> int | None:
    """Local task count: ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``
    (``4(x2),2``, entry ``SLURM_NODEID``), else ``SLURM_NTASKS_PER_NODE``.

    Raises:
        InputError: a malformed value.
    """
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        v = environ.get(name)
        if v and v.strip():
            counts = _tasks_per_node(v, name)
            if counts:
                nid = _int_env(environ, "SLURM_NODEID") or 0
                return counts[min(nid, len(counts) - 1)]
    return _int_env(environ, "SLURM_NTASKS_PER_NODE")


def worker_environ(environ: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """(environment, True) for a per-node launcher's worker (``LOCAL_RANK`` <
    ``LOCAL_WORLD_SIZE``, with ``GSRUN_LAUNCHER`` set or Slurm's local task
    count different): its ``LOCAL_*`` replace Slurm's, which describe the
    launcher task; else (environment, False)."""
    env = dict(environ)
    lr = (environ.get("LOCAL_RANK") or "").strip()
    lws = (environ.get("LOCAL_WORLD_SIZE") or "").strip()
    if not (lr.isdigit() and lws.isdigit()) or max(len(lr), len(lws)) > MAX_DIGITS or int(lr) >= int(lws):
        return env, False
    try:
        n = ntasks_from_env(environ)
    except InputError:
        n = None
    if not environ.get("GSRUN_LAUNCHER") and n == int(lws):
        return env, False
    env["SLURM_LOCALID"] = str(int(lr))
    env["SLURM_NTASKS_PER_NODE"] = str(int(lws))
    env.pop("SLURM_STEP_TASKS_PER_NODE", None)
    env.pop("SLURM_TASKS_PER_NODE", None)
    return env, True


#: Slurm task variables that describe a launcher's one task; a worker of it gets torchrun's world instead
WORKER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE")


def worker_task_env(environ: Mapping[str, str]) -> dict[str, str | None]:
    """For a launcher's worker: Slurm task variables set from torchrun's
    (``SLURM_PROCID`` = ``RANK`` ... :data:`WORKER_TASK_VARS`; None: unset, also
    for a torchrun value that is not a number), so Lightning or Accelerate
    see one world."""
    def num(name: str) -> str | None:
        v = (environ.get(name) or "").strip()
        return str(int(v)) if v.isdigit() and len(v) <= 9 else None
    world = num("WORLD_SIZE")
    return {"SLURM_PROCID": num("RANK"), "SLURM_LOCALID": num("LOCAL_RANK"), "SLURM_NTASKS": world,
            "SLURM_NPROCS": world, "SLURM_STEP_NUM_TASKS": world, "SLURM_NTASKS_PER_NODE": num("LOCAL_WORLD_SIZE"),
            "SLURM_TASKS_PER_NODE": None, "SLURM_STEP_TASKS_PER_NODE": None}


def plan_from_env(environ: Mapping[str, str], hostfs: HostFS,
                  allowed_cpus: list[int] | None = None, gpu_isolation: bool = False,
                  topology: Topology | None = None, ntasks: int | None = None) -> Plan:
    """Plan all local ranks of this node from a Slurm task environment (task
    count: ``ntasks`` when the caller knows it, as slurmstepd does, else
    :func:`ntasks_from_env`, else one per GPU, raised to cover ``SLURM_LOCALID``).
    ``allowed_cpus`` None: the affinity (live host) or all online CPUs;
    ``topology`` None: read the host, NVML only if needed.

    Raises:
        InputError: a malformed Slurm/CUDA variable, no allowed CPU online,
            more than :data:`MAX_STEP_GPUS` GPUs or more ranks than the node
            plans (user values, bounded because the plan is made as root).
        TopologyError: an ambiguous GPU UUID prefix.
    """
    topo = topology if topology is not None else read_topology(hostfs, nvml=NVML_IF_NEEDED)
    if allowed_cpus is None:
        allowed_cpus = read_allowed_cpus(hostfs, topo.cpus_online)
    warns: list[str] = []
    step_name = "SLURM_STEP_GPUS" if environ.get("SLURM_STEP_GPUS") is not None else "SLURM_JOB_GPUS"
    step = _device_list(environ, step_name, allow_ranges=True)
    cuda = _device_list(environ, "CUDA_VISIBLE_DEVICES", allow_ranges=False)
    refs = resolve_step_gpus(topo, step, cuda, environ.get("CUDA_DEVICE_ORDER"), warns)
    cap = max_local_ranks(topo)
    n = ntasks if ntasks is not None else ntasks_from_env(environ)
    if n is not None and n > cap:
        raise InputError("bind", "tasks per node out of range", f"{n} local tasks, this node plans at most {cap}",
                         hint="fewer tasks per node (slurmstepd's count)" if ntasks is not None else
                         "check SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE")
    if n is None:
        n = max(1, len(refs))
    lr = _int_env(environ, "SLURM_LOCALID") if ntasks is None else None
    if lr is not None and lr >= cap:
        raise InputError("bind", "SLURM_LOCALID out of range", f"{lr}, this node plans at most {cap} local ranks",
                         hint="Slurm sets SLURM_LOCALID to the task's index on the node (0 to tasks per node - 1)")
    if lr is not None and lr >= n:
        warns.append(f"SLURM_LOCALID {lr} >= tasks per node {n}; planning {lr + 1} ranks")
        n = lr + 1
    return make_plan(topo, refs, n, allowed_cpus, gpu_isolation, environ, warns)


def read_job_mig_devices(spool_dir: str, job_id: str | None, node: str | None) -> list[str] | None:
    """The MIG device UUIDs the prolog created for this job on this node
    (``<spool>/jobs/<id>/user-mig-<node>.json``, owned by the job's user),
    or None when the job has no MIG layout here."""
    if not is_job_id(job_id) or not is_node_name(node):
        return None
    data = read_json(os.path.join(spool_dir, "jobs", job_id, f"user-mig-{node}.json"))
    devs = data.get("devices") if isinstance(data, dict) else None
    return [d for d in devs if isinstance(d, str)] if isinstance(devs, list) else None
