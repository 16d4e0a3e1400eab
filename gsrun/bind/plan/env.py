"""The Slurm step environment -> the plan's inputs (reads facts, no effects).

:func:`plan_from_env` reads the topology through a
:class:`~gsrun.facts.hostfs.HostFS` and the task environment
(``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``, ``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER``, ``SLURM_LOCALID``, the tasks per node), then calls
:func:`gsrun.bind.plan.rules.make_plan`. :func:`worker_environ` maps a
per-node launcher's worker onto that environment; :func:`read_job_mig_devices`
reads the MIG devices the prolog made for the job.
"""

from __future__ import annotations

import os

from gsrun.base.errors import InputError
from gsrun.base.ids import is_job_id, is_node_name
from gsrun.facts.devices import parse_device_list
from gsrun.facts.hostfs import HostFS
from gsrun.facts.slurm import parse_tasks_per_node
from gsrun.facts.topology import NVML_IF_NEEDED, Topology, read_allowed_cpus, read_topology
from gsrun.bind.plan.rules import Plan, make_plan, resolve_step_gpus

TYPE_CHECKING = False   # not `typing`
if TYPE_CHECKING:
    from collections.abc import Mapping


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name)
    if v is None or not v.strip():
        return None
    v = v.strip()
    if not v.isdigit():
        raise InputError("bind", f"{name} is not a number", repr(v)[:60])
    return int(v)


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
    """The environment of a worker a per-node launcher started (torchrun
    under ``gsrun --launcher torchrun``): Slurm's ``SLURM_LOCALID`` and task
    counts describe the one launcher task, not the worker, so ``LOCAL_RANK``
    and ``LOCAL_WORLD_SIZE`` take their place. Returns (environment, True)
    for such a worker; the environment unchanged and False otherwise.

    A worker is a process with ``LOCAL_RANK`` < ``LOCAL_WORLD_SIZE`` (both
    numbers) where ``GSRUN_LAUNCHER`` is set or Slurm's local task count is
    not ``LOCAL_WORLD_SIZE`` (one task per GPU with the same counts is
    described by Slurm already).
    """
    env = dict(environ)
    lr = (environ.get("LOCAL_RANK") or "").strip()
    lws = (environ.get("LOCAL_WORLD_SIZE") or "").strip()
    if not (lr.isdigit() and lws.isdigit()) or int(lr) >= int(lws):
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


def plan_from_env(environ: Mapping[str, str], hostfs: HostFS,
                  allowed_cpus: list[int] | None = None, gpu_isolation: bool = False,
                  topology: Topology | None = None) -> Plan:
    """Plan all local ranks of this node from a Slurm task environment.

    Reads ``SLURM_STEP_GPUS`` (else ``SLURM_JOB_GPUS``), ``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER``, the task counts (:func:`ntasks_from_env`, else one
    per GPU, else 1) and ``SLURM_LOCALID`` (the count is raised to cover it).
    ``allowed_cpus`` None: the process's affinity on the live host, all
    online CPUs under a host root. ``topology`` skips reading the host;
    without it the host is read sysfs/procfs first, NVML only for what they
    leave unknown (:data:`gsrun.facts.topology.NVML_IF_NEEDED`: the plan is
    the same either way).

    Raises:
        InputError: a malformed Slurm/CUDA variable (see
            :func:`gsrun.facts.devices.parse_device_list`), no allowed CPU online.
        TopologyError: an ambiguous GPU UUID prefix.
    """
    topo = topology if topology is not None else read_topology(hostfs, nvml=NVML_IF_NEEDED)
    if allowed_cpus is None:
        allowed_cpus = read_allowed_cpus(hostfs, topo.cpus_online)
    warns: list[str] = []
    step_var = environ.get("SLURM_STEP_GPUS")
    if step_var is None:
        step_var = environ.get("SLURM_JOB_GPUS")
    step = parse_device_list(step_var, allow_ranges=True)
    cuda = parse_device_list(environ.get("CUDA_VISIBLE_DEVICES"))
    refs = resolve_step_gpus(topo, step, cuda, environ.get("CUDA_DEVICE_ORDER"), warns)
    n = ntasks_from_env(environ)
    if n is None:
        n = max(1, len(refs))
    lr = _int_env(environ, "SLURM_LOCALID")
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
    path = os.path.join(spool_dir, "jobs", job_id, f"user-mig-{node}.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None   # the usual case: no MIG layout, and no `json` import (~8 ms with re) in the step
    import json

    try:
        with os.fdopen(fd) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    devs = data.get("devices") if isinstance(data, dict) else None
    return [d for d in devs if isinstance(d, str)] if isinstance(devs, list) else None
