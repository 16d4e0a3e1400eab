"""``gsrun-node epilog-ctld``: EpilogSlurmctld, on the controller after the job.

Merges the node summaries (``<spool>/jobs/<id>/node-*.json``; the spool must
be shared between nodes and controller for multi-node jobs) with the job
record into one job summary, writes it (root copy + a copy owned by the job's
user), renders the report and queues the mail when the job asked for it.
The job record (``MailUser``, ``MailType``, ``TRES``...) comes from
``scontrol show job``: the EpilogSlurmctld environment lacks mail fields.
Mail is only *queued* here; ``gsrun-node mail flush`` delivers it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from ..config import Config, SETTINGS, load_config
from ..errors import GsrunError
from ..fsutil import atomic_write_json, read_json
from ..log import JobLog
from ..paths import Paths
from ..slurm import expand_hostlist, parse_exit_code, parse_oneliner, run_slurm, validate_job_id
from ..summary import job_summary

MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def _tres(tres: str) -> dict[str, str]:
    out = {}
    for item in (tres or "").split(","):
        k, _, v = item.partition("=")
        if k:
            out[k] = v
    return out


def _mem_bytes(v: str | None) -> int | None:
    if not v:
        return None
    m = MEM_RE.match(v.strip())
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def job_from_record(job_id: str, rec: dict[str, str] | None, env) -> dict:
    """Job fields for :func:`gsrun.summary.job_summary` from ``scontrol -o show
    job`` (``rec``) and the EpilogSlurmctld environment. Pure."""
    rec = rec or {}
    tres = _tres(rec.get("AllocTRES") or rec.get("TRES", ""))
    gpus = None
    for k, v in tres.items():
        if k == "gres/gpu" and v.isdigit():
            gpus = int(v)
    if gpus is None:
        # without AccountingStorageTRES=gres/gpu (needs slurmdbd) TRES lacks GPUs
        m = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d+)", rec.get("TresPerNode", "") or "")
        if m and (rec.get("NumNodes") or "").split("-")[0].isdigit():
            gpus = int(m.group(1)) * int(rec["NumNodes"].split("-")[0])
    nodes_expr = env.get("SLURM_JOB_NODELIST") or rec.get("NodeList") or ""
    nodes = expand_hostlist(nodes_expr) if nodes_expr and nodes_expr != "(null)" else []
    mem = _mem_bytes(tres.get("mem"))
    ec, sig = parse_exit_code(rec.get("ExitCode", "")) if rec.get("ExitCode") else (
        int(env.get("SLURM_JOB_EXIT_CODE2", "0:0").split(":")[0] or 0), 0)
    state = ((rec.get("JobState") or "").split() or [None])[0]
    if state == "COMPLETING":   # EpilogSlurmctld runs while the job completes
        state = "COMPLETED" if (ec, sig) == (0, 0) else "FAILED"
    mail_user = rec.get("MailUser") or None
    if mail_user in ("(null)", "None"):
        mail_user = None
    mail_type = rec.get("MailType") or None
    if mail_type in ("(null)", "NONE", "None"):
        mail_type = None
    array = None
    if rec.get("ArrayJobId") and rec.get("ArrayTaskId"):
        array = f"{rec['ArrayJobId']}_{rec['ArrayTaskId']}"
    cpus = tres.get("cpu")
    return {
        "id": job_id, "array": array, "user": env.get("SLURM_JOB_USER") or rec.get("UserId", "").split("(")[0] or None,
        "name": rec.get("JobName"), "partition": rec.get("Partition") or env.get("SLURM_JOB_PARTITION"),
        "state": state, "exit_code": ec if not sig else 128 + sig,
        "nodes": nodes, "cpus_alloc": int(cpus) if cpus and cpus.isdigit() else None,
        "mem_req_bytes": mem, "gpus_alloc": gpus, "mail_user": mail_user, "mail_type": mail_type,
        "start_time": None, "end_time": None, "elapsed_s": _elapsed(rec.get("RunTime")),
    }


def _elapsed(text: str | None) -> float | None:
    if not text:
        return None
    m = re.match(r"^(?:(\d+)-)?(\d+):(\d+):(\d+)$", text.strip())
    if not m:
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def merge(paths: Paths, job: dict, cfg, wait_s: float = 0.0) -> dict:
    """Read node summaries (waiting up to ``wait_s`` for missing nodes) and merge."""
    d = paths.spool_job(job["id"])
    deadline = time.monotonic() + wait_s
    while True:
        nodes = [s for p in sorted(d.glob("node-*.json")) if (s := read_json(p)) and s.get("kind") == "node"]
        have = {n["node"] for n in nodes}
        if all(n in have for n in job["nodes"]) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return job_summary(job, nodes, cfg, job.get("partition"))


def write_summary(paths: Paths, summary: dict, uid: int | None, gid: int | None) -> None:
    d = paths.make_spool_job(summary["job"]["id"])
    atomic_write_json(d / "summary.json", summary, mode=0o600)
    if uid is not None:
        atomic_write_json(d / "user-summary.json", summary, mode=0o400, uid=uid, gid=gid)


def run(environ, spool_dir: str | None = None, wait_s: float = 30.0) -> int:
    job_id = environ.get("SLURM_JOB_ID", "")
    log = JobLog(job_id or None, "epilog-ctld")
    try:
        validate_job_id(job_id)
    except GsrunError as e:
        log.error(str(e))
        return 0
    try:
        cfg = load_config()
    except GsrunError as e:
        log.error(str(e).replace("\n", " "))
        cfg = Config({s.key: s.default for s in SETTINGS})
    paths = Paths.from_config(cfg, None, spool_dir)
    rec = None
    try:
        cp = run_slurm(["scontrol", "-o", "show", "job", job_id], cfg["timeouts.command_s"], check=False)
        if cp.returncode == 0 and cp.stdout.strip():
            rec = parse_oneliner(cp.stdout.splitlines()[0])
    except GsrunError as e:
        log.warn(f"job record unavailable: {e}")
    job = job_from_record(job_id, rec, environ)
    uid = _uid(environ, rec)
    gid = None
    if uid is not None:
        try:
            import pwd
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    with log.step("merge"):
        summary = merge(paths, job, cfg, wait_s)
        write_summary(paths, summary, uid, gid)
    try:
        with log.step("mail"):
            queue_mail(paths, summary, cfg, log)
    except Exception as e:  # noqa: BLE001 - mail never fails the epilog
        log.error(f"mail: {e}")
    return 0


def _uid(environ, rec) -> int | None:
    v = environ.get("SLURM_JOB_UID")
    if v and v.isdigit():
        return int(v)
    if rec and rec.get("UserId"):
        m = re.search(r"\((\d+)\)", rec["UserId"])
        if m:
            return int(m.group(1))
    return None


def queue_mail(paths: Paths, summary: dict, cfg, log) -> str:
    from .. import mail
    from ..report import render_text, render_png

    job = summary["job"]
    if not cfg["mail.enabled"] or not job.get("mail_user"):
        return "not requested"
    if not mail.mail_wanted(job.get("mail_type"), cfg["mail.policy"]):
        return "not requested"
    png = None
    try:
        png = render_png(summary)
    except Exception as e:  # noqa: BLE001 - no picture is fine
        log.warn(f"no timeline picture: {e}")
    msg = mail.build_message(summary, render_text(summary, color=False), png, job["mail_user"],
                             cfg["mail.from_addr"])
    path = mail.enqueue(str(paths.spool_dir), job["id"], msg)
    _kick_flush()
    return str(path)


def _kick_flush() -> None:
    """Start ``gsrun-node mail flush`` detached so delivery never blocks us."""
    try:
        subprocess.Popen([sys.executable, "-m", "gsrun.node", "mail", "flush"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True, env={k: v for k, v in os.environ.items()
                                               if k in ("PATH", "GSRUN_CONFIG", "GSRUN_SPOOL_DIR", "LANG")})
    except OSError:
        pass
