"""``gsrun-node epilog``: run by slurmd as root after the job on a node.

Order: stop the sampler (its final flush) -> node summary (atomic, versioned)
-> MPS stop -> MIG restore -> tuning restore (journal, reverse order).
Each step runs even when an earlier one failed; the whole epilog has a hard
budget (``timeouts.epilog_budget_s``). Exit status is 0 unless the node
needs an admin (a GPU was lost): slurmd then drains it with our reason.
No Slurm command is called here (field case 20).
"""

from __future__ import annotations

import signal
import time

from ..config import Config, SETTINGS, load_config
from ..errors import GsrunError
from ..fsutil import atomic_write_json, read_json
from ..hostfs import HostFS
from ..jobenv import job_from_env
from ..log import JobLog
from ..paths import Paths
from ..sampler import stop_sampler
from ..summary import node_summary


class BudgetExceeded(Exception):
    pass


def _alarm(signum, frame):
    raise BudgetExceeded()


def run(environ, host_root: str | None = None, state_dir: str | None = None,
        spool_dir: str | None = None) -> int:
    t0 = time.time()
    log = JobLog(environ.get("SLURM_JOB_ID"), "epilog")
    try:
        job = job_from_env(environ)
    except GsrunError as e:
        log.error(str(e).replace("\n", " "))
        return 0
    try:
        cfg = load_config()
    except GsrunError as e:
        log.error(f"{e}; using built-in defaults".replace("\n", " "))
        cfg = Config({s.key: s.default for s in SETTINGS})
    hostfs = HostFS.from_env(host_root)
    paths = Paths.from_config(cfg, state_dir, spool_dir)
    sdir = paths.state_job(job.job_id)
    result: dict = {"steps": {}}
    rc = 0
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, cfg["timeouts.epilog_budget_s"])
    steps = [("sampler+summary", lambda: _summary(job, paths, sdir, log)),
             ("mps", lambda: _mps_stop(job, paths, cfg, log)),
             ("mig", lambda: _mig_restore(job, paths, log)),
             ("tuning", lambda: _tuning_restore(hostfs, paths, job, log))]
    try:
        for name, fn in steps:
            try:
                with log.step(name):
                    result["steps"][name] = fn()
            except BudgetExceeded:
                raise
            except Exception as e:  # noqa: BLE001 - every step runs; the error is logged
                result["steps"][name] = {"error": str(e)}
    except BudgetExceeded:
        log.error(f"budget of {cfg['timeouts.epilog_budget_s']:g} s exceeded; run 'gsrun-node restore --job {job.job_id}'")
        rc = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    summ = result["steps"].get("sampler+summary") or {}
    if isinstance(summ, dict) and summ.get("lost_gpus"):
        log.error(f"GPU(s) lost during the job: {summ['lost_gpus']}: node needs an admin")
        rc = 1
    log(f"done in {time.time() - t0:.3f} s")
    return rc


def _summary(job, paths, sdir, log) -> dict:
    pid_info = read_json(sdir / "sampler.pid.json")
    stopped = "no sampler record"
    if pid_info:
        stopped = stop_sampler(int(pid_info["pid"]), pid_info.get("create_time"))
    state = read_json(sdir / "sampler.json")
    prolog = read_json(paths.spool_job(job.job_id) / f"prolog-{job.node}.json") or {}
    env = job.to_dict()
    env["prolog_time"] = prolog.get("prolog_time")
    summ = node_summary(state, env, time.time())
    summ["sampler_stop"] = stopped
    summ["request"] = prolog.get("request")
    paths.make_spool_job(job.job_id)
    out = paths.spool_job(job.job_id) / f"node-{job.node}.json"
    atomic_write_json(out, summ, mode=0o600)
    atomic_write_json(paths.spool_job(job.job_id) / f"user-node-{job.node}.json", summ, mode=0o400,
                      uid=job.uid, gid=job.gid)
    lost = [g["index"] for g in summ["gpus"] if g.get("lost_at_s") is not None]
    return {"sampler": stopped, "summary": str(out), "samples": summ["samples"], "lost_gpus": lost}


def _mps_stop(job, paths, cfg, log):
    from .. import mps

    return mps.stop(job.job_id, str(paths.mps_dir), str(paths.state_dir), cfg["mps.control_bin"],
                    cfg["mps.quit_timeout_s"], log=log)


def _mig_restore(job, paths, log):
    from .. import mig

    if not (paths.state_job(job.job_id) / mig.JOURNAL_NAME).exists():
        return {"skipped": "no MIG journal"}
    from ..mig_nvml import RealMig

    return mig.epilog_restore(RealMig(), str(paths.state_dir / "jobs"), job.job_id,
                              drain=lambda reason: drain_node(job.node, reason, log), log=log)


def drain_node(node: str, reason: str, log) -> None:
    """``scontrol update nodename=NODE state=drain reason=...`` (bounded); the
    epilog also exits non-zero, which drains the node even if this fails."""
    from ..slurm import run_slurm

    reason = "gsrun: " + " ".join(reason.split())[:200]
    log.error(f"draining {node}: {reason}")
    try:
        run_slurm(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], 10.0)
    except Exception as e:  # noqa: BLE001
        log.error(f"drain via scontrol failed: {e}")


def _tuning_restore(hostfs, paths, job, log):
    from .. import tuning

    return tuning.epilog_restore(hostfs, str(paths.state_dir), job.job_id, log=log)
