"""``gsrun-node prolog``: run by slurmd as root before the job starts on a node.

Order: validate env -> config -> records dirs -> NVML health -> read the job's
requests -> tuning (journal first) -> MIG -> MPS -> sampler -> record.
Exit status is non-zero only when the node truly cannot run GPU jobs (NVML
driver/library mismatch): Slurm then drains the node with our message as the
reason. Every other failure is logged and the job runs with defaults.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ..config import load_config, Config, SETTINGS
from ..errors import GsrunError
from ..fsutil import atomic_write_json
from ..hostfs import HostFS
from ..jobenv import job_from_env
from ..log import JobLog
from ..nvml import NvmlUnavailable, open_nvml
from ..paths import Paths
from ..requests import JobRequest, comment_from_slurm, request_from_job_record, request_from_spank


class BudgetExceeded(Exception):
    pass


def _alarm(signum, frame):
    raise BudgetExceeded()


def run(environ, host_root: str | None = None, state_dir: str | None = None, spool_dir: str | None = None,
        dry_run: bool = False, start_sampler: bool = True) -> int:
    t0 = time.time()
    log = JobLog(environ.get("SLURM_JOB_ID"), "prolog")
    try:
        job = job_from_env(environ)
    except GsrunError as e:
        log.error(str(e).replace("\n", " "))
        return 0   # a broken env is not the node's fault: do not drain
    try:
        cfg = load_config()
    except GsrunError as e:
        log.error(f"{e}; using built-in defaults".replace("\n", " "))
        cfg = Config({s.key: s.default for s in SETTINGS})
    hostfs = HostFS.from_env(host_root)
    paths = Paths.from_config(cfg, state_dir, spool_dir)
    record: dict = {"job": job.to_dict(), "prolog_time": t0, "steps": {}, "spank": dict(job.spank)}
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, cfg["timeouts.prolog_budget_s"])
    rc = 0
    try:
        with log.step("records"):
            if not dry_run:
                paths.make_state_job(job.job_id)
                paths.make_spool_job(job.job_id)
        # NVML health: only a driver/library mismatch makes the node unusable (case 15)
        nvml_ok = None
        try:
            nv = open_nvml(hostfs)
            nvml_ok = True
            nv.close()
        except NvmlUnavailable as e:
            record["steps"]["nvml"] = str(e)
            if e.code_name == "LIB_RM_VERSION_MISMATCH":
                log.error("NVML/driver mismatch: reboot required (GPU jobs cannot start on this node)")
                print("gsrun: prolog: NVML/driver mismatch: reboot required", file=sys.stderr)
                rc = 1
                return rc
            log(f"nvml: {e} (GPU figures will be unavailable)")
        record["nvml_ok"] = nvml_ok
        req = request_from_spank(job)
        if req is None:
            rec = comment_from_slurm(job.job_id, min(5.0, cfg["timeouts.command_s"]))
            req = request_from_job_record(rec) if rec else JobRequest(source="none (slurmctld not asked/answered)")
        record["request"] = req.to_dict()
        exclusive = bool(req.exclusive)
        record["exclusive"] = exclusive
        with log.step("tuning"):
            record["steps"]["tuning"] = _tuning(hostfs, paths, job, req, cfg, exclusive, dry_run, log)
        if req.mps is not None and not dry_run:
            with log.step("mps"):
                record["steps"]["mps"] = _mps(paths, job, req, cfg, log)
        if start_sampler and not dry_run:
            with log.step("sampler"):
                record["steps"]["sampler"] = start_sampler_process(job, paths, cfg, hostfs)
    except BudgetExceeded:
        log.error(f"budget of {cfg['timeouts.prolog_budget_s']:g} s exceeded; job goes on with what was done")
        record["steps"]["budget"] = "exceeded"
    except GsrunError as e:
        log.error(str(e).replace("\n", " "))
        record["steps"]["error"] = str(e)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        record["duration_s"] = round(time.time() - t0, 3)
        if not dry_run and rc == 0:
            try:
                atomic_write_json(paths.spool_job(job.job_id) / f"prolog-{job.node}.json", record, mode=0o600)
            except OSError as e:
                log.error(f"cannot write prolog record: {e}")
        log(f"done in {record['duration_s']:.3f} s")
    if dry_run:
        import json
        print(json.dumps(record, indent=1, default=str))
    return rc


def _tuning(hostfs, paths, job, req, cfg, exclusive, dry_run, log):
    try:
        from .. import tuning
    except ImportError as e:
        return {"error": f"tuning module unavailable: {e}"}
    if not cfg.get("tuning.enabled", job.partition):
        return {"skipped": "tuning.enabled = false"}
    try:
        return tuning.prolog_tune(hostfs, str(paths.state_dir), job.job_id, req.tune, cfg, job.partition,
                                  exclusive, dry_run=dry_run, log=log)
    except GsrunError as e:
        log.error(f"tuning: {e}".replace("\n", " "))
        return {"error": str(e)}


def _mps(paths, job, req, cfg, log):
    try:
        from .. import mps
    except ImportError as e:
        return {"error": f"mps module unavailable: {e}"}
    if not cfg.get("mps.enabled", job.partition):
        return {"skipped": "mps.enabled = false"}
    try:
        pct = mps.requested_pct(os.environ, req.mps)
        if pct is None and cfg.get("mps.default_active_thread_percentage", job.partition):
            pct = cfg.get("mps.default_active_thread_percentage", job.partition)
        gpus = [str(g) for g in (job.gpus or [])]
        return mps.start(job.job_id, job.uid, job.gid, gpus, str(paths.mps_dir), str(paths.state_dir), pct,
                         cfg.get("mps.pinned_mem_limit", job.partition) or None, cfg["mps.control_bin"],
                         cfg["mps.quit_timeout_s"], log=log)
    except GsrunError as e:
        log.error(f"mps: {e}".replace("\n", " "))
        return {"error": str(e)}


def start_sampler_process(job, paths, cfg, hostfs) -> dict:
    """Start the sampler detached (own session, outside the job's processes),
    record its PID and start time so the epilog never signals a reused PID."""
    import psutil

    d = paths.make_state_job(job.job_id)
    argv = [sys.executable, "-m", "gsrun.node", "sampler", "--job-id", job.job_id, "--uid", str(job.uid),
            "--node", job.node, "--gpus", ",".join(str(g) for g in (job.gpus or [])),
            "--state-dir", str(paths.state_dir), "--spool-dir", str(paths.spool_dir)]
    if not hostfs.is_real:
        argv += ["--host-root", str(hostfs.root)]
    logf = open(d / "sampler.log", "ab")
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                             close_fds=True, cwd="/", env=_sampler_env())
    finally:
        logf.close()
    try:
        ct = psutil.Process(p.pid).create_time()
    except psutil.Error:
        ct = None
    info = {"pid": p.pid, "create_time": ct, "argv": argv[3:]}
    atomic_write_json(d / "sampler.pid.json", info, mode=0o600)
    return info


def _sampler_env() -> dict:
    keep = ("PATH", "LANG", "LC_ALL", "GSRUN_CONFIG", "GSRUN_HOST_ROOT", "SLURM_CONF", "PYTHONPATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return env
