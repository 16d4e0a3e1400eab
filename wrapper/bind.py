"""``gsrun-bind``: bind one task to its GPU's CPUs and memory, then exec.

``--plan [--json]`` prints the plan; ``-- CMD ARGS...`` applies the rank's
part (affinity, environment, ``numactl --membind`` prefix) and execs the
command, no shell. A plan problem never stops the task: it runs on the
allowed CPUs with a warning (:func:`node_notes`). Usage errors and a command
that cannot run exit 2. ``GSRUN_BIND_VERBOSE=1`` prints each rank's binding.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import click

from gsrun.base.cpulist import format_cpulist, parse_cpulist
from gsrun.base.errors import GsrunError, InputError, flush_std
from gsrun.base.log import JobLog
from gsrun.bind.plan import (RankPlan, apply_affinity, exec_argv, fallback_rank, mig_visible_devices, plan_from_env,
                             read_job_mig_devices, render_table, worker_environ, worker_task_env)
from gsrun.facts.hostfs import HostFS
from gsrun.facts.hwloc_xml import read_topology_xml
from gsrun.facts.topology import NVML_IF_NEEDED, read_allowed_mems, read_topology
from gsrun.request.config import load_config
from gsrun.facts.slurm import expand_hostlist
from gsrun.bind.malloc import (LIB_DIRS_ENV, MALLOC_ENV, find_allocator, lib_dirs_from_env, preload_value,
                               watch_preload, write_notes)
from gsrun.facts.memlock import memlock_problem, raise_memlock_soft, rdma_devices, rdma_text
from gsrun.facts.task_notes import NOTES_NAME, task_dir
from gsrun.request.malloc import ALLOCATORS, LIB_DIRS

__all__ = ["main", "BindParams", "apply_affinity", "plan_environ", "run_plan", "run_exec"]


@dataclass(frozen=True)
class BindParams:
    plan: bool
    as_json: bool
    host_root: str | None
    gpus: str | None
    ntasks_per_node: int | None
    local_rank: int | None
    allowed_cpus: list[int] | None
    gpu_isolation: bool
    command: tuple[str, ...]
    topology_xml: str | None = None


def plan_environ(environ: Mapping[str, str], gpus: str | None, ntasks: int | None,
                 local_rank: int | None) -> dict[str, str]:
    """The task environment with the flags folded in: ``--gpus`` replaces
    ``SLURM_STEP_GPUS`` (and drops ``CUDA_VISIBLE_DEVICES``, whose names
    belong to the step's own list), ``--ntasks-per-node`` the task counts,
    ``--local-rank`` ``SLURM_LOCALID``."""
    env = dict(environ)
    if gpus is not None:
        env["SLURM_STEP_GPUS"] = gpus
        env.pop("SLURM_JOB_GPUS", None)
        env.pop("CUDA_VISIBLE_DEVICES", None)
    if ntasks is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(ntasks)
        env.pop("SLURM_STEP_TASKS_PER_NODE", None)
        env.pop("SLURM_TASKS_PER_NODE", None)
    if local_rank is not None:
        env["SLURM_LOCALID"] = str(local_rank)
    return env


def _warn(msg: str) -> None:
    click.echo(f"gsrun: bind: warning: {msg}", err=True)


def run_plan(p: BindParams, environ: Mapping[str, str]) -> str:
    """Text to print for ``--plan`` (JSON or table).

    Raises:
        GsrunError: bad input (flags, env, host root).
    """
    xml = p.topology_xml or environ.get("GSRUN_TOPOLOGY_XML") or None
    if xml and p.host_root:
        raise InputError("bind", "--topology-xml and --host-root both given", f"{xml} / {p.host_root}",
                         hint="give one source of the topology")
    fs = _hostfs(p.host_root, environ if not xml else {})
    allowed = p.allowed_cpus
    if xml:
        topo = read_topology_xml(xml)
        allowed = allowed or list(topo.cpus_online)
    else:
        # the JSON plan needs NVML only where sysfs leaves a gap; the table shows NVML's view too
        topo = read_topology(fs, nvml=NVML_IF_NEEDED if p.as_json else True)
    env = plan_environ(environ, p.gpus, p.ntasks_per_node, p.local_rank)
    if p.local_rank is None:
        env.pop("SLURM_LOCALID", None)
    plan = plan_from_env(env, fs, allowed, p.gpu_isolation, topology=topo)
    for w in plan.warnings:
        _warn(w)
    if p.as_json:
        doc = plan.to_json()
        if p.local_rank is not None:
            doc = {"ranks": [plan.rank(p.local_rank).to_json()]}
        return json.dumps(doc, indent=2, sort_keys=False)
    return render_table(topo, plan)


def _local_rank(environ: Mapping[str, str], flag: int | None) -> int:
    if flag is not None:
        return flag
    v = (environ.get("SLURM_LOCALID") or "").strip()
    if not v:
        return 0
    if not v.isdigit():
        raise InputError("bind", "SLURM_LOCALID is not a number", repr(v)[:60])
    return int(v)


def choose_rank(p: BindParams, environ: Mapping[str, str], fs: HostFS) -> tuple[RankPlan, int, list[str]]:
    """This task's rank plan, host NUMA node count and the node's warnings
    (the plan's and every local rank's, each once: every rank computes the
    same plan, local rank 0 prints them). Never raises for a plan problem:
    falls back to the allowed CPUs."""
    warnings: list[str] = []
    try:
        lr = _local_rank(environ, p.local_rank)
    except InputError as e:
        warnings.append(f"{e.what}: {e.detail}; using local rank 0")
        lr = 0
    env = plan_environ(environ, p.gpus, p.ntasks_per_node, lr)
    try:
        plan = plan_from_env(env, fs, p.allowed_cpus, p.gpu_isolation)
        warnings += plan.warnings
        rp = plan.rank(lr)
        for other in plan.ranks:
            warnings += other.warnings
        return rp, plan.host_nodes, list(dict.fromkeys(warnings))
    except (GsrunError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        allowed = p.allowed_cpus or (sorted(os.sched_getaffinity(0)) if fs.is_real else [])
        if not allowed:
            try:
                allowed = list(read_topology(fs, nvml=False).cpus_online)
            except (GsrunError, OSError):
                allowed = sorted(os.sched_getaffinity(0))
        rp = fallback_rank(lr, max(lr + 1, p.ntasks_per_node or 1), allowed, f"no plan: {first}")
        return rp, 1, warnings + list(rp.warnings)


MEMLOCK_ENV = "GSRUN_MEMLOCK_MIN_BYTES"


def memlock_warning(hard: int | None, floor_text: str | None, rdma: list[str] | None = None) -> str | None:
    """The task notes' warning for a hard ``RLIMIT_MEMLOCK`` (bytes; None:
    unreadable) below ``$GSRUN_MEMLOCK_MIN_BYTES`` (default unlimited), naming
    the ``rdma`` devices; None when fine."""
    problem = memlock_problem(hard, floor_text)
    if problem is None:
        return None
    return (f"memlock: {problem}: pinned host memory (DataLoader pin_memory, NCCL, cudaHostAlloc) fails or falls back "
            f"to pageable copies; {rdma_text(rdma or [])}; hint: LimitMEMLOCK=infinity in slurmd's systemd unit (else "
            "ulimit -l unlimited before slurmd), slurm.conf PropagateResourceLimitsExcept=MEMLOCK, then restart slurmd")


def node_notes(warnings: Sequence[str], node: str | None, environ: Mapping[str, str],
               log=None) -> list[str]:
    """Local rank 0's stderr lines for the node's ``warnings``: every warning
    goes to ``log`` (syslog); the terminal gets one line per job, from global
    rank 0 (the first and how many more), or all with ``GSRUN_BIND_VERBOSE=1``."""
    if not warnings:
        return []
    where = f"{node}: " if node else ""
    if log is None:
        log = JobLog(environ.get("SLURM_JOB_ID"), "bind", stream=None)
    for w in warnings:
        log.warn(where + w)
    if environ.get("GSRUN_BIND_VERBOSE") == "1":
        return [where + w for w in warnings]
    if (environ.get("SLURM_PROCID") or "0").strip() != "0":
        return []
    more = len(warnings) - 1
    tail = (f" (and {more} more: GSRUN_BIND_VERBOSE=1 prints them; the node's admin has them in syslog)"
            if more else "")
    return [where + warnings[0] + tail]


def run_exec(p: BindParams, environ: Mapping[str, str], notes_out: dict | None = None
             ) -> tuple[list[str], dict[str, str]]:
    """Apply the task's plan (and raise the soft ``RLIMIT_MEMLOCK``, preload
    ``GSRUN_MALLOC``) -> (argv, environment) to exec; local rank 0 fills
    ``notes_out`` with the task notes.

    Raises:
        GsrunError: a bad flag or host root (usage errors only).
    """
    if not p.command:
        raise InputError("bind", "no command to run", "nothing after --",
                         hint="gsrun-bind [--gpu-isolation] -- CMD ARGS...")
    fs = _hostfs(p.host_root, environ)
    slurm_environ = environ
    environ, worker = worker_environ(environ)
    rp, host_nodes, warnings = choose_rank(p, environ, fs)
    node = environ.get("SLURMD_NODENAME")
    limits = raise_memlock_soft() if fs.is_real else None      # every rank: limits are per process
    malloc = _malloc(environ, rp.local_rank == 0, warnings)
    if rp.local_rank == 0:   # once per node, not once per rank
        for line in node_notes(warnings, node, environ):
            _warn(line)
        if notes_out is not None:
            rdma = rdma_devices(fs)
            hard = None if limits is None or limits[1] == resource.RLIM_INFINITY else limits[1]
            notes_out["memlock"] = {"soft": None if limits is None or limits[0] == resource.RLIM_INFINITY
                                    else limits[0], "hard": hard, "rdma": rdma,
                                    "problem": memlock_warning(limits[1], environ.get(MEMLOCK_ENV), rdma)
                                    if limits else None}
            if malloc is not None:
                notes_out["malloc"] = malloc
    applied = list(rp.cpus)
    try:
        applied = apply_affinity(rp, 0)
    except OSError as e:
        _warn(f"sched_setaffinity({format_cpulist(rp.cpus)}) failed: {e}; affinity left unchanged")
        applied = sorted(os.sched_getaffinity(0))
    env = dict(slurm_environ)
    if worker:
        for k, v in worker_task_env(slurm_environ).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    for k in rp.unset:
        env.pop(k, None)
    env.update(rp.env)
    env["GSRUN_BIND_CPUS"] = format_cpulist(applied)
    # torch.distributed's RANK/WORLD_SIZE from srun's task ids (a launcher's worker keeps its own)
    for name, slurm_name in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS")):
        if not worker and environ.get(slurm_name, "").isdigit():
            env[name] = environ[slurm_name]
    if rp.gpu is not None:
        env["GSRUN_GPU"] = rp.gpu.label()
    mig = _job_mig_devices(environ)
    if mig:
        vis = mig_visible_devices(mig, rp.local_rank, p.gpu_isolation)
        if vis:
            env["CUDA_VISIBLE_DEVICES"] = vis   # the MIG devices the prolog made for this job
    if malloc is not None and malloc.get("path"):
        env["LD_PRELOAD"] = preload_value(malloc["path"], slurm_environ.get("LD_PRELOAD"))
    mems = read_allowed_mems(fs) if fs.is_real else None
    argv = exec_argv(rp, host_nodes, p.command, allowed_mems=mems)
    if environ.get("GSRUN_BIND_VERBOSE") == "1":
        membound = len(argv) > len(p.command)  # numactl prefix added
        mem = format_cpulist(rp.mem_nodes) if membound else "-"
        gpu = rp.gpu.label() if rp.gpu else "-"
        click.echo(f"gsrun-bind: rank {rp.local_rank} gpu {gpu} cpus {format_cpulist(applied)} "
                   f"mem {mem} ({rp.reason})", err=True)
    return argv, env


def _malloc(environ: Mapping[str, str], warn: bool, warnings: list[str]) -> dict | None:
    """The allocator this task preloads (``GSRUN_MALLOC``, set by the job script
    for ``--malloc``): ``{"name", "state", "path", "detail"}`` for the task notes
    (state ``not verified`` until the watcher looks, ``not found``), None
    without one. A library not found adds the node's warning (``warn``: local
    rank 0) naming where it looked; the task runs without it."""
    name = environ.get(MALLOC_ENV)
    if not name:
        return None
    if name not in ALLOCATORS:
        if warn:
            warnings.append(f"--malloc: unknown allocator {name[:40]!r} in {MALLOC_ENV}: not preloaded")
        return None
    dirs = lib_dirs_from_env(environ.get(LIB_DIRS_ENV))
    if dirs is None:
        dirs = LIB_DIRS
    path, looked, rejected = find_allocator(name, dirs)
    if path is None:
        alloc = ALLOCATORS[name]
        why = f"{' or '.join(alloc.sonames)} not found (looked in {', '.join(looked)})" + (
            f"; not usable: {'; '.join(rejected[:3])}" if rejected else "")
        if warn:
            warnings.append(f"--malloc {name}: {why}: the job runs without it; hint: install {alloc.debian} "
                            f"(Debian/Ubuntu) or {alloc.rhel} (RHEL) on the nodes, or submit with --malloc none")
        return {"name": name, "state": "not found", "path": None, "detail": why}
    return {"name": name, "state": "not verified", "path": path, "detail": "watcher not started"}


def _job_mig_devices(environ: Mapping[str, str]) -> list[str] | None:
    """MIG devices the prolog created for this job on this node, if any."""
    try:
        spool = load_config(environ=environ)["paths.spool_dir"]
    except Exception:  # noqa: BLE001 - a broken config must not stop the task
        return None
    return read_job_mig_devices(spool, environ.get("SLURM_JOB_ID"), environ.get("SLURMD_NODENAME"))


def _allowed(value: str | None) -> list[int] | None:
    """``--allowed-cpus`` -> CPU ids.

    Raises:
        InputError: not a CPU list, or empty.
    """
    if value is None:
        return None
    try:
        cpus = parse_cpulist(value)
    except InputError as e:
        raise InputError("bind", "bad --allowed-cpus", e.detail, hint="use a CPU list like 0-15,56-71") from None
    if not cpus:
        raise InputError("bind", "bad --allowed-cpus", "empty CPU list", hint="use a CPU list like 0-15,56-71")
    return cpus


def _hostfs(host_root: str | None, environ: Mapping[str, str]) -> HostFS:
    try:
        return HostFS.from_env(host_root, environ)
    except GsrunError as e:
        raise InputError("bind", e.what, e.detail, e.hint) from None


def first_job_host(environ: Mapping[str, str]) -> str:
    """The first host of ``SLURM_JOB_NODELIST`` (torch.distributed's rendezvous).

    Raises:
        InputError: the variable is missing, empty or not a hostlist.
    """

    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    try:
        hosts = expand_hostlist(nodelist)
    except InputError:
        hosts = []
    if not hosts:
        raise InputError("job", "no rendezvous host", f"SLURM_JOB_NODELIST={nodelist!r:.80}",
                         hint="run the script through sbatch (gsrun submits it); the job's node list names the host")
    return hosts[0]


@click.command(context_settings={"allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gsrun", prog_name="gsrun-bind", message="%(prog)s %(version)s")
@click.option("--plan", "plan", is_flag=True, help="Print the plan instead of running a command.")
@click.option("--json", "as_json", is_flag=True, help="With --plan: JSON instead of a table.")
@click.option("--host-root", type=click.Path(file_okay=False), default=None,
              help="Fake/recorded host tree (sys/, proc/, nvml.json); env GSRUN_HOST_ROOT.")
@click.option("--gpus", default=None, help="Step GPUs: gres indices (minor numbers) or UUIDs.")
@click.option("--ntasks-per-node", type=click.IntRange(1, 4096), default=None)
@click.option("--local-rank", type=click.IntRange(0, 4095), default=None)
@click.option("--allowed-cpus", default=None,
              help="CPU list the task may use (default: its affinity; all online under a host root).")
@click.option("--gpu-isolation", is_flag=True, help="Show each rank only its own GPU(s).")
@click.option("--topology-xml", type=click.Path(dir_okay=False), default=None,
              help="With --plan: an hwloc XML export instead of this host; env GSRUN_TOPOLOGY_XML.")
@click.option("--first-host", is_flag=True,
              help="Print the first host of $SLURM_JOB_NODELIST (the job's rendezvous host) and exit.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(plan, as_json, host_root, gpus, ntasks_per_node, local_rank, allowed_cpus,
         gpu_isolation, topology_xml, first_host, command):
    """Bind this task to its GPU's CPUs, memory node and NIC, then exec COMMAND."""
    environ = dict(os.environ)
    try:
        if first_host:
            click.echo(first_job_host(environ))
            return
        p = BindParams(plan, as_json, host_root, gpus, ntasks_per_node, local_rank,
                       _allowed(allowed_cpus), gpu_isolation, tuple(command), topology_xml)
        if topology_xml and not p.plan:
            raise InputError("bind", "--topology-xml plans only", topology_xml,
                             hint="add --plan; a task is bound on the host it runs on")
        if p.plan:
            if p.command:
                raise InputError("bind", "--plan takes no command", " ".join(p.command)[:80])
            click.echo(run_plan(p, environ), nl=False if not p.as_json else True)
            return
        notes: dict = {}
        argv, env = run_exec(p, environ, notes)
    except GsrunError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    flush_std()
    if notes:
        _record_notes(notes, environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        click.echo(str(InputError("bind", "cannot run command", f"{argv[0]}: {e.strerror}",
                                  hint="check the command name and PATH")), err=True)
        sys.exit(2)


def _record_notes(notes: dict, environ: Mapping[str, str]) -> None:
    """Write local rank 0's task notes where the epilog reads them
    (:func:`gsrun.facts.task_notes.task_dir`, made by the prolog for the job's
    user): through the preload watcher when an allocator is preloaded, else
    now. Nothing when the directory is not there (no prolog of gsrun, a test)."""
    try:
        spool = environ.get("GSRUN_SPOOL_DIR") or load_config(environ=environ)["paths.spool_dir"]
    except Exception:  # noqa: BLE001 - a broken config must not stop the task
        return
    d = task_dir(spool, environ.get("SLURM_JOB_ID"), environ.get("SLURMD_NODENAME"))
    if d is None or not os.path.isdir(d) or os.path.islink(d):
        return
    path = os.path.join(d, NOTES_NAME)
    m = notes.get("malloc")
    if m and m.get("path"):
        watch_preload(m["path"], notes, path)
    else:
        write_notes(path, notes)

