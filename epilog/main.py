"""``gsrun-node epilog``: run by slurmd as root after the job on a node.

Runs :data:`RESTORE` (the node as before the job), answers slurmd through the
node daemon, then :data:`REPORT` (the job's last sample, its node summary); each
step runs even after one failed (``CLEANUP``), keeping :data:`STEP_RESERVE_S` of
``timeouts.epilog_budget_s`` for every later one. Non-zero when the node needs
an admin (a GPU lost, GPU memory still held, a step out of time): slurmd drains
it. No Slurm command is on slurmd's path (field case 20): a GPU first found lost
by the last sample, and MIG's failure path, drain through ``scontrol``.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from dataclasses import dataclass, replace

from gsrun.base.errors import GsrunError
from gsrun.base.fsutil import atomic_write, json_text, read_json, remove_tree, write_user_copy
from gsrun.base.ids import is_job_id
from gsrun.base.log import JobLog, safe_text
from gsrun.base.paths import Paths
from gsrun.facts.hostfs import HostFS
from gsrun.facts.jobenv import job_from_env
from gsrun.facts.task_notes import read_task_notes
from gsrun.facts.nvml import NvmlUnavailable, open_nvml
from gsrun.node import mig, monitor, mps, residual, tuning
from gsrun.node.metrics_textfile import remove_job_file
from gsrun.node.mig_nvml import RealMig
from gsrun.node.steps import CLEANUP, Step, drain_node, run_steps
from gsrun.report.node_end import node_settings
from gsrun.report.summary import node_record
from gsrun.request.config import load_config_or_defaults

STEP_RESERVE_S = 5.0


@dataclass
class Ctx:
    """What the epilog's steps share."""

    job: object
    cfg: object
    hostfs: HostFS
    paths: Paths
    sdir: object
    log: JobLog
    stopped: str | None = None      # how the job's sampling ended (:func:`_end_sampling`)


RESTORE = (
    Step("gpus", "ask the monitor which of the job's GPUs it found lost (field case 16)", 1.0,
         lambda c: {"lost_gpus": monitor.ask(c.paths.state_dir, {"op": "lost", "job_id": c.job.job_id},
                                             timeout_s=2.0, wait_s=1.0).get("lost") or []}),
    Step("mps", "stop the job's MPS daemon, put compute modes back", STEP_RESERVE_S, lambda c: _mps_stop(c)),
    Step("residual", "end the job's processes still holding GPU memory, check again", STEP_RESERVE_S,
         lambda c: _residual(c)),
    Step("mig", "end the job's sampling, put its GPUs back to their MIG layout before the job", STEP_RESERVE_S,
         lambda c: _mig_restore(c)),
    Step("tuning", "restore the node settings from the journal (last job out, reverse order)", STEP_RESERVE_S,
         lambda c: tuning.epilog_restore(c.hostfs, str(c.paths.state_dir), c.job.job_id, log=c.log, uid=c.job.uid)),
)
REPORT = (
    Step("sampler+summary", "end the job's sampling (final sample and flush) and write the node summary",
         STEP_RESERVE_S, lambda c: _summary(c)),
    Step("metrics", "remove the job's Prometheus textfile ([metrics] textfile_dir)", 1.0,
         lambda c: {"removed": remove_job_file(c.cfg["metrics.textfile_dir"], c.job.job_id)},
         when=lambda c: bool(c.cfg["metrics.textfile_dir"])),
)


def run(environ, host_root: str | None = None, state_dir: str | None = None,
        spool_dir: str | None = None, *, stream=None, answer=None) -> int:
    """Run :data:`RESTORE`, ``answer(status)`` (the node daemon's: slurmd has the
    node back), :data:`REPORT` for the job in ``environ`` (slurmd's). ``stream``:
    where the log lines go besides syslog (default stderr). Returns the exit
    status: 1 when the node needs an admin (slurmd drains it)."""
    t0 = time.monotonic()
    log = JobLog(environ.get("SLURM_JOB_ID"), "epilog", **({"stream": stream} if stream is not None else {}))
    try:
        job = job_from_env(environ)
    except GsrunError as e:
        log.error(str(e))
        return 0
    cfg = load_config_or_defaults(log)
    budget_s = float(cfg["timeouts.epilog_budget_s"])
    hostfs = HostFS.from_env(host_root)
    paths = Paths.from_config(cfg, state_dir, spool_dir)
    sdir = paths.state_job(job.job_id)
    ctx = Ctx(job, cfg, hostfs, paths, sdir, log)
    hint = f"run 'gsrun-node restore --job {job.job_id}'"
    out = run_steps("epilog", RESTORE, ctx, log, rule=CLEANUP, budget_s=budget_s,
                    verdict=lambda results: _verdict(results, log), timeout_hint=hint)
    if answer is not None:
        answer(out.rc)
        log.stream = None       # the report's lines: syslog (or GSRUN_LOG_FILE) only, not twice in the daemon's
        log(f"answered in {time.monotonic() - t0:.3f} s")
    known = set((out.results.get("gpus") or {}).get("lost_gpus") or ())
    report = run_steps("epilog", REPORT, ctx, log, rule=CLEANUP, budget_s=max(budget_s - (time.monotonic() - t0),
                       STEP_RESERVE_S), verdict=lambda results: _lost(results, known))
    for reason in report.reasons:
        drain_node(job.node, reason, log)
    if not out.rc and not report.reasons:
        _forget_job(sdir, log)
    log(f"done in {time.monotonic() - t0:.3f} s")
    return out.rc


def _lost(results: dict, known=()) -> list[str]:
    """The reason to drain for the job's GPUs found lost, but those in ``known``."""
    found = (results.get("sampler+summary") or results.get("gpus") or {}).get("lost_gpus") or ()
    lost = [g for g in found if g not in known]
    return [f"GPU(s) lost during the job: {lost}"] if lost else []


def _verdict(results: dict, log) -> list[str]:
    """The restore's reasons to drain: a GPU lost, GPU memory still held."""
    reasons = _lost(results)
    res = results.get("residual") or {}
    if isinstance(res, dict) and str(res.get("reason") or "").startswith("Residual GPU processes"):
        reasons.append(res["reason"])     # the next job would OOM (field case 17)
    elif isinstance(res, dict) and res.get("reason"):
        log.warn(f"GPU process check incomplete: {res['reason']}")   # a wedged nvidia-smi is not a drain
    return reasons


def _forget_job(sdir, log) -> None:
    """Remove the job's state directory unless a journal still has work
    (``mig.json``, a ``.pending`` summary)."""
    try:
        if (sdir / "mig.json").exists() or any(sdir.glob("*.pending")):
            return
        remove_tree(sdir)
    except OSError as e:
        log.warn(f"cannot remove {sdir}: {e}")


def _nvml_reason(hostfs, prolog: dict) -> str | None:
    """Why NVML cannot start (field case 15): the prolog's finding, else a fresh probe."""
    nv_err = (prolog.get("steps") or {}).get("nvml")
    if isinstance(nv_err, str) and nv_err.startswith("NVML init failed"):
        return nv_err
    try:
        open_nvml(hostfs).close()
    except NvmlUnavailable as e:
        return str(e)
    except Exception:  # noqa: BLE001
        return None
    return None


def _end_sampling(c: Ctx) -> str:
    """End the job's sampling in the monitor (its last sample, final flush,
    C-state hold released), once -> how it ended (:attr:`Ctx.stopped`)."""
    if c.stopped is None:
        try:
            out = monitor.ask(c.paths.state_dir, {"op": "end", "job_id": c.job.job_id})
            c.stopped = str(out.get("stopped")) if out.get("ok") else f"refused: {out.get('error')}"
        except GsrunError as e:
            c.stopped = f"monitor not answering: {safe_text(e)}"
            c.log.warn(f"{c.stopped}: the summary has the figures of the last flush")
    return c.stopped


def _summary(c: Ctx) -> dict:
    """End the job's sampling and write the node summary from ``sampler.json``
    (a silent monitor costs the figures since its last flush)."""
    job, paths, sdir, hostfs, log = c.job, c.paths, c.sdir, c.hostfs, c.log
    stopped = _end_sampling(c)
    prolog = read_json(paths.spool_job(job.job_id) / f"prolog-{job.node}.json") or {}
    env = job.to_dict()
    env["prolog_time"] = prolog.get("prolog_time")
    state = read_json(sdir / "sampler.json")
    summ = node_record(state, env, time.time())
    gpu_reason, nvml_error = summ.gpu_reason, (state or {}).get("nvml_error")
    if not summ.gpu_available and (state is None or nvml_error):
        why = nvml_error or _nvml_reason(hostfs, prolog)
        if why:
            gpu_reason = why
            log.error(f"GPU section unavailable: {why}")
    notes = read_task_notes(str(paths.spool_dir), job.job_id, job.node, job.uid) if job.uid > 0 else None
    summ = replace(summ, gpu_reason=gpu_reason, sampler_stop=stopped, mem_total_bytes=hostfs.mem_total_bytes(),
                   request=prolog.get("request"),
                   settings=node_settings(prolog, notes))      # None: no prolog record, settings unknown
    lost = [g.index for g in summ.gpus if g.lost_at_s is not None]
    text = json_text(summ.to_json())    # one serialization, two copies (root's and the user's)
    out = paths.spool_job(job.job_id) / f"node-{job.node}.json"
    try:
        paths.make_spool_job(job.job_id, log=log.warn, gid=job.gid)
        atomic_write(out, text, mode=0o600)
        # root's copy is the durable record; the user's is not fsync'd (a crash may lose it)
        write_user_copy(paths.spool_job(job.job_id) / f"user-node-{job.node}.json", text, job.gid,
                        durable=False)
        with suppress(FileNotFoundError):   # the final node summary replaces the running job's live file
            os.unlink(paths.spool_job(job.job_id) / f"user-live-{job.node}.json")
    except (OSError, GsrunError) as e:
        # spool full or broken: keep the summary on the node (state dir), nothing is lost
        log.error(f"cannot write the node summary to the spool: {safe_text(e)}; kept in {sdir}")
        try:
            atomic_write(sdir / f"node-{job.node}.json.pending", text, mode=0o600)
        except (OSError, GsrunError) as e2:
            log.error(f"cannot keep the summary in {sdir} either: {safe_text(e2)}")
        return {"sampler": stopped, "summary": None, "error": safe_text(e), "samples": summ.samples,
                "lost_gpus": lost}
    return {"sampler": stopped, "summary": str(out), "samples": summ.samples, "lost_gpus": lost}


def _mps_stop(c: Ctx):
    job, paths, cfg = c.job, c.paths, c.cfg
    # the prolog journals before it starts a daemon: with neither the journal nor the
    # job's MPS directory there is nothing to stop (and no process scan to pay)
    if not mps.journal_path(job.job_id, str(paths.state_dir)).exists() \
            and not os.path.lexists(paths.mps_dir / job.job_id):
        return {"skipped": "no MPS journal or directory"}
    return mps.stop(job.job_id, str(paths.mps_dir), str(paths.state_dir), cfg["mps.control_bin"],
                    cfg["mps.quit_timeout_s"], log=c.log)


def _live_jobs(paths, job_id: str) -> set[str]:
    """Jobs with prolog state on this node: only those may protect a GPU process by its SLURM_JOB_ID."""
    d = paths.state_dir / "jobs"
    try:
        return {p.name for p in d.iterdir() if is_job_id(p.name) and p.name != job_id}
    except OSError:
        return set()


def _residual(c: Ctx):
    job, paths = c.job, c.paths
    rep = residual.cleanup(job.job_id, job.uid, job.gpus, c.hostfs,
                           smi_timeout_s=min(10.0, c.cfg["timeouts.command_s"]), log=c.log,
                           live_jobs=_live_jobs(paths, job.job_id), nv=monitor.RemoteNvml(paths.state_dir))
    if rep.get("reason"):
        c.log.error(rep["reason"])
    return rep


def _mig_restore(c: Ctx):
    job, log = c.job, c.log
    if not (c.paths.state_job(job.job_id) / mig.JOURNAL_NAME).exists():
        return {"skipped": "no MIG journal"}
    _end_sampling(c)        # the restore removes the job's MIG devices: their last sample first
    return mig.epilog_restore(RealMig(), str(c.paths.state_dir / "jobs"), job.job_id,
                              drain=lambda reason: drain_node(job.node, reason, log), log=log)
