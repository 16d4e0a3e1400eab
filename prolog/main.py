"""``gsrun-node prolog``: run by slurmd as root before the job starts on a node.

Runs :data:`STEPS`, then writes ``<spool>/jobs/<id>/prolog-<node>.json``
whatever happened. Non-zero only when the node cannot run GPU jobs (NVML
driver/library mismatch: slurmd drains it); any other failure is logged.
Every environment value is validated (:mod:`gsrun.facts.jobenv`);
exclusivity comes from slurmctld's job record, read with a bounded
``scontrol`` only when needed (no answer: not exclusive).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from gsrun.base.errors import GsrunError, NodeError
from gsrun.base.fsutil import atomic_write_json, ensure_dir, json_text, unlink_names, write_user_copy
from gsrun.base.log import JobLog, safe_text
from gsrun.base.paths import Paths
from gsrun.bind.plan import plan_from_env
from gsrun.facts.cgroup import find_job_cgroup, read_cpuset
from gsrun.facts.hostfs import HostFS
from gsrun.facts.jobenv import job_from_env
from gsrun.facts.nvml import NvmlUnavailable, index_by_minor, open_nvml
from gsrun.facts.task_notes import NOTES_NAME, task_dir
from gsrun.facts.topology import read_topology
from gsrun.node import mig, mps, monitor, tuning
from gsrun.node.mig_nvml import RealMig
from gsrun.node.steps import NodeUnusable, SETUP, Step, drain_node, run_steps
from gsrun.node.sweep import sweep
from gsrun.node.tuning import JobScope
from gsrun.request.config import load_config_or_defaults
from gsrun.request.job import (JobRequest, comment_from_env, comment_from_slurm, exclusive_from_record,
                               malloc_from_comment, request_from_comment, request_from_job_record, request_from_spank)


NVML_MISMATCH_MSG = "NVML/driver mismatch: reboot required"
SCONTROL_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Ctx:
    """What the prolog's steps share; they set ``records_ok``, ``req`` and ``exclusive``."""

    environ: dict
    job: object
    cfg: object
    hostfs: HostFS
    paths: Paths
    log: JobLog
    dry_run: bool
    record: dict
    records_ok: bool = False
    req: JobRequest | None = None
    exclusive: bool = False


def _records(c: Ctx):
    if not c.dry_run:
        c.paths.make_state_job(c.job.job_id, log=c.log.warn)
        d = c.paths.make_spool_job(c.job.job_id, log=c.log.warn, gid=c.job.gid)
        gone = clear_earlier_run(d, c.job.node)
        task = task_dir(str(c.paths.spool_dir), c.job.job_id, c.job.node)
        if task is not None and c.job.uid > 0:   # gsrun-bind's notes for the node summary, written as the user
            ensure_dir(task, 0o700, c.job.uid, c.job.gid, replace_planted=True, log=c.log.warn)
            gone += [f"{os.path.basename(task)}/{n}" for n in unlink_names(task, (NOTES_NAME,))]
        if gone:
            c.log(f"removed an earlier run's {', '.join(gone)} (same job id: requeued, or ids reissued)")
    c.records_ok = True


def clear_earlier_run(job_dir, node: str) -> list[str]:
    """Remove what an earlier run with the same job id (requeued) left in the
    job's spool directory (links not followed). -> the names removed."""
    return unlink_names(job_dir, (f"node-{node}.json", f"user-node-{node}.json", f"user-live-{node}.json",
                                  "summary.json", "user-summary.json", "accounting.json", "idle-cancel.json"))


def _sweep(c: Ctx):
    """Remove the files of jobs gone from the node (:mod:`gsrun.node.sweep`)."""
    out = sweep(c.paths.state_dir, c.paths.spool_dir, c.job.node, c.cfg["metrics.textfile_dir"] or None,
                c.job.job_id)
    if out["prom"] or out["live"]:
        c.log(f"sweep: removed {len(out['prom'])} textfile(s) {' '.join(out['prom'])} and the live files of "
              f"job(s) {' '.join(out['live']) or '-'}: their jobs are gone from the node")
    return out if out["prom"] or out["live"] else None


def _nvml(c: Ctx):
    """Whether NVML answers, as the node monitor found; only a driver/library
    mismatch makes the node unusable (field case 15). A dry run does not wait."""
    try:
        out = monitor.ask(c.paths.state_dir, {"op": "nvml"}, wait_s=0 if c.dry_run else monitor.CONNECT_WAIT_S)
    except GsrunError as e:
        c.record["nvml_ok"] = None
        c.log.error(f"{e} (no GPU figures for this job)")
        return str(e)
    code, err = out.get("nvml_code"), out.get("nvml_error")
    if code == "LIB_RM_VERSION_MISMATCH":
        c.record["steps"]["nvml"] = str(err)
        c.log.error(f"{NVML_MISMATCH_MSG} (GPU jobs cannot start on this node): {err}")
        print(f"gsrun: prolog: {NVML_MISMATCH_MSG}", file=sys.stderr)
        raise NodeUnusable(NVML_MISMATCH_MSG)
    if err:
        c.record["nvml_ok"] = False
        c.log(f"nvml: {err} (GPU figures will be unavailable)")
        return str(err)
    c.record["nvml_ok"] = True
    return None


def _request(c: Ctx):
    """The job's requests (SPANK options, else the comment from the environment,
    else from the job record) and whether it holds the node."""
    job, cfg = c.job, c.cfg
    req = request_from_spank(job)
    comment = comment_from_env(c.environ)
    if req is None:
        if comment is not None:
            req = request_from_comment(comment, "prolog environment")
    elif comment:
        req.malloc = malloc_from_comment(comment)    # gsrun --malloc: no SPANK option, the comment has it
    need_record = req is None or req.needs_exclusivity() or _has_tuning_defaults(cfg, job.partition)
    rec = None
    if need_record and not c.dry_run:
        c.record["slurm_calls"].append("scontrol show job")
        rec = comment_from_slurm(job.job_id, min(SCONTROL_TIMEOUT_S, cfg["timeouts.command_s"]))
    if req is None:
        req = request_from_job_record(rec, rec.get("__line__")) if rec \
            else JobRequest(source="none (slurmctld not asked/answered)")
    elif rec is not None:
        req.exclusive, req.exclusive_source = exclusive_from_record(rec, rec.get("__line__"))
    if rec is None and need_record and not c.dry_run:
        c.log.warn("job record not available (slurmctld not answering?): job counts as not exclusive")
    c.req = req
    c.record["request"] = req.to_dict()
    c.exclusive = bool(req.exclusive)
    c.record["exclusive"] = c.exclusive


# The prolog, in order, within ``timeouts.prolog_budget_s`` (no step keeps time back).
STEPS = (
    Step("records", "make the job's state and spool directories (planted ones moved aside)", 0, _records),
    Step("sweep", "remove the Prometheus textfiles and live files of jobs gone from the node", 0, _sweep,
         when=lambda c: not c.dry_run),
    Step("nvml", "check that NVML answers; a driver/library mismatch means the node cannot run GPU jobs", 0,
         _nvml, quiet=True, catch=()),
    Step("request", "read the job's requests and whether it holds the node (slurmctld's record)", 0,
         _request, quiet=True, catch=()),
    Step("tuning", "tune the node for the job (journal first)", 0, lambda c: _tuning(c)),
    Step("mig", "cut the job's GPUs into its MIG layout (journal first)", 0, lambda c: _mig(c),
         when=lambda c: bool(c.req.mig) and not c.dry_run),
    Step("mps", "start the job's MPS control daemon as the job's user", 0, lambda c: _mps(c),
         when=lambda c: c.req.mps is not None and not c.dry_run),
    Step("sampler", "have the node monitor sample the job's GPUs and CPUs", 0,
         lambda c: begin_sampling(c.job, c.paths, _dma_hold(c)),
         when=lambda c: not c.dry_run and c.records_ok),
)


def run(environ, host_root: str | None = None, state_dir: str | None = None, spool_dir: str | None = None,
        dry_run: bool = False) -> int:
    """Run :data:`STEPS` for the job in ``environ`` (slurmd's). Returns the
    exit status: 1 only when the node cannot run the job (slurmd drains it)."""
    t0 = time.time()
    log = JobLog(environ.get("SLURM_JOB_ID"), "prolog")
    try:
        job = job_from_env(environ)
    except GsrunError as e:
        log.error(str(e))
        return 0   # a broken env is not the node's fault: do not drain
    cfg = load_config_or_defaults(log)
    hostfs = HostFS.from_env(host_root)
    paths = Paths.from_config(cfg, state_dir, spool_dir)
    record: dict = {"job": job.to_dict(), "prolog_time": t0, "steps": {}, "spank": dict(job.spank),
                    "slurm_calls": []}
    ctx = Ctx(environ, job, cfg, hostfs, paths, log, dry_run, record)
    budget_s = cfg["timeouts.prolog_budget_s"]
    rc = 0
    try:
        out = run_steps("prolog", STEPS, ctx, log, rule=SETUP, budget_s=budget_s,
                        catch=(GsrunError, OSError), results=record["steps"])
        rc = out.rc
        if out.budget_exceeded:
            log.error(f"budget of {budget_s:g} s exceeded; job goes on with what was done")
            record["steps"]["budget"] = "exceeded"
    except GsrunError as e:
        log.error(str(e))
        record["steps"]["error"] = safe_text(e)
    finally:
        record["duration_s"] = round(time.time() - t0, 3)
        if not dry_run and ctx.records_ok:
            try:
                # not fsync'd: after a node crash the job is gone and nothing reads it
                atomic_write_json(paths.spool_job(job.job_id) / f"prolog-{job.node}.json", record, mode=0o600,
                                  durable=False)
            except OSError as e:
                log.error(f"cannot write prolog record: {e}")
        log(f"done in {record['duration_s']:.3f} s")
    if dry_run and not rc:
        print(json.dumps(record, indent=1, default=str))
    return rc


def _has_tuning_defaults(cfg, partition) -> bool:
    try:
        return bool(cfg.get("tuning.enabled", partition) and cfg.get("tuning.defaults", partition))
    except Exception:  # noqa: BLE001
        return False


def _tuning(c: Ctx):
    job, cfg = c.job, c.cfg
    if not cfg.get("tuning.enabled", job.partition):
        return {"skipped": "tuning.enabled = false"}
    try:
        scope = _job_scope(c.hostfs, job, c.log) if _needs_scope(c.req.tune, cfg, job.partition) else None
        return tuning.prolog_tune(c.hostfs, str(c.paths.state_dir), job.job_id, c.req.tune, cfg, job.partition,
                                  c.exclusive, dry_run=c.dry_run, log=c.log, scope=scope)
    except GsrunError as e:
        c.log.error(f"tuning: {e}")
        return {"error": str(e)}


def _needs_scope(tune: str | None, cfg, partition) -> bool:
    text = f"{tune or ''},{cfg.get('tuning.defaults', partition) or ''}"
    return "irq=" in text or "hugepages=" in text


def _job_scope(hostfs, job, log):
    """The ``JobScope`` of ``irq``/``hugepages``: the job's GPUs, the NICs
    gsrun-bind picks for them, its CPUs (cgroup cpuset, else all online)."""
    topo = read_topology(hostfs, nvml=False)
    env = {"SLURM_JOB_GPUS": ",".join(str(g) for g in (job.gpus or []))}
    if job.gpus:
        env["SLURM_NTASKS_PER_NODE"] = str(len(job.gpus))
    plan = plan_from_env(env, hostfs, allowed_cpus=list(topo.cpus_online), topology=topo)
    devices, seen = [], set()
    for r in plan.ranks:
        for kind, bdf, name, node in (("gpu", r.gpu.pci_bus_id if r.gpu else None, r.gpu.label() if r.gpu else "",
                                       r.gpu.gpu.numa_node if r.gpu and r.gpu.gpu else None),
                                      ("nic", r.nic.pci_bus_id if r.nic else None, r.nic.name if r.nic else "",
                                       r.nic.numa_node if r.nic else None)):
            if bdf and bdf.lower() not in seen:
                seen.add(bdf.lower())
                devices.append({"bdf": bdf.lower(), "kind": kind, "name": name, "numa_node": node})
    cpus, source = list(topo.cpus_online), "all online CPUs (job cgroup not found)"
    try:
        jcg = find_job_cgroup(hostfs, job.job_id, job.uid)
        got = read_cpuset(hostfs, jcg) if jcg else None
        if got:
            cpus, source = got, "job cgroup cpuset"
    except GsrunError as e:
        log.warn(f"tuning: job cpuset unreadable ({e}); using all online CPUs")
    return JobScope(devices, cpus, {n.id: list(n.cpus) for n in topo.nodes}, source)


def _mig(c: Ctx):
    """Cut the job's GPUs into its MIG layout (real NVML only); the MIG devices'
    UUIDs go to ``user-mig-<node>.json`` (the user's, 0400) for the SPANK plugin."""
    hostfs, paths, job, req, cfg, log = c.hostfs, c.paths, c.job, c.req, c.cfg, c.log
    if not cfg.get("mig.enabled", job.partition):
        return {"skipped": "mig.enabled = false"}
    if not hostfs.is_real:
        return {"skipped": "MIG changes need the real NVML (fake host root)"}
    try:
        nv = open_nvml(hostfs)
    except NvmlUnavailable as e:
        return {"error": f"MIG needs NVML: {e}"}
    try:
        by_minor, _lost = index_by_minor(nv)
    finally:
        nv.close()
    indices = [by_minor[g] for g in (job.gpus or []) if g in by_minor]
    if not indices:
        return {"error": "no NVIDIA device matches the job's gres"}

    res = mig.prolog_apply(RealMig(), str(paths.state_dir / "jobs"), job.job_id, indices, req.mig,
                           drain=lambda reason: drain_node(job.node, reason, log), log=log,
                           exclusive=c.exclusive, named=cfg["mig.layouts"])
    devices = list(res.get("devices", []))
    write_user_copy(paths.spool_job(job.job_id) / f"user-mig-{job.node}.json",
                    json_text({"devices": devices, "layout": req.mig}), job.gid)
    return {"devices": devices, "journal": res.get("journal")}


def _mps(c: Ctx):
    paths, job, cfg, log = c.paths, c.job, c.cfg, c.log
    if not cfg.get("mps.enabled", job.partition):
        return {"skipped": "mps.enabled = false"}
    try:
        pct = mps.requested_pct(c.environ, c.req.mps)
        if pct is None and cfg.get("mps.default_active_thread_percentage", job.partition):
            pct = cfg.get("mps.default_active_thread_percentage", job.partition)
        gpus = [str(g) for g in (job.gpus or [])]
        return mps.start(job.job_id, job.uid, job.gid, gpus, str(paths.mps_dir), str(paths.state_dir), pct,
                         cfg.get("mps.pinned_mem_limit", job.partition) or None, cfg["mps.control_bin"],
                         cfg["mps.quit_timeout_s"], log=log)
    except GsrunError as e:
        log.error(f"mps: {e}")
        return {"error": str(e)}


def _dma_hold(c: Ctx) -> int | None:
    tun = c.record.get("steps", {}).get("tuning")
    us = (tun.get("holds") or {}).get("cpu_dma_latency_us") if isinstance(tun, dict) else None
    return us if isinstance(us, int) else None


def begin_sampling(job, paths, dma_latency_us: int | None = None) -> dict:
    """Have the node monitor sample the job from now on, holding
    ``/dev/cpu_dma_latency`` at ``dma_latency_us`` (``--tune cstate``).

    Raises:
        NodeError: the monitor is not running or refused (why, with a hint).
    """
    out = monitor.ask(paths.state_dir, {"op": "begin", "job_id": job.job_id, "uid": job.uid, "node": job.node,
                                        "gpus": [int(g) for g in (job.gpus or [])],
                                        "dma_latency_us": dma_latency_us})
    if not out.get("ok"):
        raise NodeError("prolog", "monitor", str(out.get("error")),
                        hint="journalctl -u gsrun-daemon says why the node monitor refused")
    return {"monitor": "sampling", "resumed": bool(out.get("resumed")), "gpus": out.get("gpus"),
            **({"notes": out["notes"]} if out.get("notes") else {})}


