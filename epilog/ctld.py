"""``gsrun-node epilog-ctld``: EpilogSlurmctld, on the controller after the job.

Merges ``<spool>/jobs/<id>/node-*.json`` with the job record (``scontrol
show job``) into the job summary, writes root's and the user's copy, queues
the report mail, and stores the ``JS1:`` blob in ``AdminComment`` from a
detached background step (``python -m gsrun.epilog.ctld admin-comment JOBID``).
"""

from __future__ import annotations

import gc
import json
import os
import pwd
import re
import sys
import time
from contextlib import suppress
from dataclasses import replace

from gsrun.base.errors import GsrunError
from gsrun.base.fsutil import atomic_write, atomic_write_json, read_json, unlink_names, write_user_copy
from gsrun.base.ids import check_job_id, is_job_id
from gsrun.base.log import JobLog
from gsrun.base.paths import Paths
from gsrun.base.record import ABSENT, or_none
from gsrun.base.proc import root_child_env, root_python, spawn_detached
from gsrun.facts.live import LIVE_PREFIX
from gsrun.facts.sacct import epoch_or_none, parse_mem, parse_tres, time_s_or_none, tres_gpus
from gsrun.facts.slurm import (ACTIVE_STATES, expand_hostlist, job_record_argv, parse_exit_code, parse_job_record,
                               run_slurm, show_job as _show_job, state_word)
from gsrun.node.steps import CLEANUP, Step, run_steps
from gsrun.report import accounting, mail
from gsrun.report.findings import finding_records
from gsrun.report.records import JobInfo, JobSummary, NodeSummary, read_record
from gsrun.report.render import render_png, render_text
from gsrun.report.retention import ACCOUNTING_MARK
from gsrun.report.summary import (JS1_MARKERS, JS1_SHORT, JobTimeline, KEEP_GPU_TIMELINES, job_summary, js1_comment,
                                  strip_timelines)
from gsrun.request.config import load_config_or_defaults

def job_from_record(job_id: str, rec: dict[str, str] | None, env) -> JobInfo:
    """:func:`~gsrun.report.summary.job_summary`'s ``job`` from ``scontrol -o show job`` and the env. Pure."""
    rec = rec or {}
    tres = parse_tres(rec.get("AllocTRES") or rec.get("TRES", ""))
    gpus = tres_gpus(tres)
    if gpus is None:
        # without AccountingStorageTRES=gres/gpu (needs slurmdbd) TRES lacks GPUs
        m = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d+)", rec.get("TresPerNode", "") or "")
        if m and (rec.get("NumNodes") or "").split("-")[0].isdigit():
            gpus = int(m.group(1)) * int(rec["NumNodes"].split("-")[0])
    nodes_expr = env.get("SLURM_JOB_NODELIST") or rec.get("NodeList") or ""
    nodes = expand_hostlist(nodes_expr) if nodes_expr and nodes_expr != "(null)" else []
    mem = parse_mem(tres.get("mem")).bytes
    ec, sig = parse_exit_code(rec.get("ExitCode", "")) if rec.get("ExitCode") else (
        int(env.get("SLURM_JOB_EXIT_CODE2", "0:0").split(":")[0] or 0), 0)
    state = state_word(rec.get("JobState")) or None
    state_source = "slurm" if state else None
    # EndTime is the expected end until the job completes
    ended = state is not None and (state == "COMPLETING" or state not in ACTIVE_STATES)
    if state == "COMPLETING":      # not the final state yet: a guess, settled later (settle_state)
        state = "COMPLETED" if (ec, sig) == (0, 0) else "FAILED"
        state_source = "exit_code"
    mail_user = None if rec.get("MailUser") in ("(null)", "None") else rec.get("MailUser") or None
    mail_type = None if rec.get("MailType") in ("(null)", "NONE", "None") else rec.get("MailType") or None
    # the array task from slurmctld's env, never the record (an ArrayJobId= forged in JobName would
    # store the blob on another job)
    aj, at = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    array = f"{aj}_{at}" if aj.isdigit() and at.isdigit() and len(aj) <= 10 and len(at) <= 10 else None
    cpus = tres.get("cpu")
    return JobInfo(
        id=job_id, array=array, user=env.get("SLURM_JOB_USER") or rec.get("UserId", "").split("(")[0] or None,
        name=rec.get("JobName"), partition=rec.get("Partition") or env.get("SLURM_JOB_PARTITION"),
        state=state, exit_code=ec if not sig else 128 + sig,
        nodes=tuple(nodes), cpus_alloc=int(cpus) if cpus and cpus.isdigit() else None,
        mem_req_bytes=mem, gpus_alloc=gpus, mail_user=mail_user, mail_type=mail_type,
        # Slurm's elapsed time (= sacct Elapsed): what every report, mail and gsrun --wait show
        start_time=epoch_or_none(rec.get("StartTime")),
        end_time=epoch_or_none(rec.get("EndTime")) if ended else None,
        elapsed_s=time_s_or_none(rec.get("RunTime")),
        submit_time=epoch_or_none(rec.get("SubmitTime")), time_limit_s=time_s_or_none(rec.get("TimeLimit")),
        state_source=state_source or ABSENT)


def accounting_job_id(job_id: str, job: JobInfo) -> str:
    """The id for ``sacctmgr ... where jobid=``: ``A_T`` for an array task (``jobid=A`` names every task,
    as jobstats addresses them), else ``job_id``. Pure."""
    a = job.array
    return a if isinstance(a, str) and "_" in a and is_job_id(a, array=True) else job_id


POOL_MAX_NODES = 64     # up to this many nodes the merge pools the GPUs' timelines into the job's


def merge(paths: Paths, job: JobInfo, cfg, wait_s: float = 0.0, sleep=time.sleep) -> JobSummary:
    """Merge the node summaries, each file parsed once, waiting up to ``wait_s``
    (backoff 0.1 s to 2 s) for missing ones. Timelines: pooled as read up to
    :data:`POOL_MAX_NODES` nodes, else cut before parsing. GC is off meanwhile
    (no cycles; its passes cost a third of a 4,000-node merge)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _merge(paths, job, cfg, wait_s, sleep)
    finally:
        if enabled:
            gc.enable()


def _merge(paths: Paths, job: JobInfo, cfg, wait_s: float, sleep) -> JobSummary:
    d = paths.spool_job(job.id)
    deadline = time.monotonic() + wait_s
    by_node: dict[str, NodeSummary] = {}
    cut = len(job.nodes or ()) > POOL_MAX_NODES
    acc: list = [None, 0, or_none(job.start_time)]     # job timeline, GPUs read, its t0

    def take(p) -> None:
        s = read_record(NodeSummary, p, _node_without_timelines if cut else read_json)
        if s is None or _stale(s, job) or s.node in by_node:
            return      # not a node summary, or an earlier job's with this id (ids wrap; a requeued run)
        by_node[s.node] = s
        if cut:
            return
        if acc[2] is None and isinstance(s.start_time, (int, float)):
            acc[2] = s.start_time
        acc[1] += len(s.gpus or ())
        if acc[0] is None and acc[1] > KEEP_GPU_TIMELINES:
            acc[0] = JobTimeline()
            for k, x in by_node.items():
                by_node[k] = strip_timelines(x, acc[0], acc[2])
        elif acc[0] is not None:
            by_node[s.node] = strip_timelines(s, acc[0], acc[2])

    for p in sorted(d.glob("node-*.json")):
        take(p)
    pause, waited = 0.1, 0.0
    while True:
        missing = [n for n in job.nodes or () if n not in by_node]
        left = min(wait_s - waited, deadline - time.monotonic())
        if not missing or left <= 0:
            break
        sleep(min(pause, left))
        waited += min(pause, left)
        pause = min(2.0, pause * 2)
        for n in missing:
            p = d / f"node-{n}.json"
            if p.exists():
                take(p)

    return job_summary(job, list(by_node.values()), cfg, or_none(job.partition), acc[0])


STALE_SLACK_S = 300.0   # a node summary starting this long before the job's StartTime is not this run's


def _stale(node: NodeSummary, job: JobInfo) -> bool:
    """``node`` is an earlier run's (ids wrap, requeues)."""
    ns, js = node.start_time, job.start_time
    return isinstance(ns, (int, float)) and isinstance(js, (int, float)) and ns < js - STALE_SLACK_S


def _node_without_timelines(path) -> dict | None:
    """A node summary without its timelines (None if absent/corrupt): in the epilog's compact JSON a
    ``"timeline":{...}`` ends at the next ``}`` and ``"cpu_timeline":[...]`` at ``]]``, so both are cut
    (as bytes: memchr-fast) before ``json.loads``; another layout is parsed whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    except OSError:
        return None
    parts, i = [], 0
    while True:
        j = data.find(b'"timeline":{', i)
        if j < 0:
            break
        k = data.find(b"}", j)
        if k < 0:
            break
        parts.append(data[i:j])
        i = k + 1
        if data[i:i + 1] == b",":
            i += 1
        elif parts[-1].endswith(b","):
            parts[-1] = parts[-1][:-1]
    parts.append(data[i:])
    text = b"".join(parts)
    j = text.find(b'"cpu_timeline":[')
    if j >= 0:
        k = j + 17 if text.startswith(b"[]", j + 15) else text.find(b"]]", j) + 2
        if text[k:k + 1] == b",":
            text = text[:j] + text[k + 1:]
        else:
            text = text[:j].rstrip(b",") + text[k:]
    try:
        s = json.loads(text)
    except ValueError:
        s = read_json(path)
    if not isinstance(s, dict):
        return None
    s.pop("cpu_timeline", None)
    for g in s.get("gpus") or ():
        if isinstance(g, dict):
            g.pop("timeline", None)
    return s


def write_summary(paths: Paths, summary: JobSummary, uid: int | None, gid: int | None) -> None:
    """``summary.json`` (root 0600) and, with ``uid``, ``user-summary.json`` (group ``gid``, 0440); the job's
    live files removed."""
    d = paths.make_spool_job(summary.job.id, gid=gid)
    data = (json.dumps(summary.to_json(), separators=(",", ":"), sort_keys=True) + "\n").encode()
    atomic_write(d / "summary.json", data, mode=0o600)
    if uid is not None:
        write_user_copy(d / "user-summary.json", data, gid)
    with suppress(OSError):     # the summary replaces every node's live file (one a node left at a reboot too)
        unlink_names(d, lambda n: n.startswith(LIVE_PREFIX))


def _job_and_log(environ) -> tuple[str | None, JobLog]:
    """EpilogSlurmctld's job id (checked; None and logged when it is not one) and its log."""
    job_id = environ.get("SLURM_JOB_ID", "")
    log = JobLog(job_id or None, "epilog-ctld")
    try:
        check_job_id(job_id, array=True)
    except GsrunError as e:
        log.error(str(e))
        return None, log
    return job_id, log


def run(environ, spool_dir: str | None = None, wait_s: float = 30.0, background: bool = False) -> int:
    """Merge, report, mail (deferred while the state is a guess), then the background step (here when
    ``background``)."""
    job_id, log = _job_and_log(environ)
    if job_id is None:
        return 0
    cfg = load_config_or_defaults(log)
    paths = Paths.from_config(cfg, None, spool_dir)
    rec = None
    try:
        cp = run_slurm(job_record_argv(job_id), cfg["timeouts.command_s"], check=False)
        if cp.returncode == 0 and cp.stdout.strip():
            rec = parse_job_record(cp.stdout, job_id)   # forged (duplicated) fields dropped
            if rec is None:      # a split record may have forged fields, the mail address among them
                log.warn("job record is not one line of this job (newline in a user field?): using the "
                         "EpilogSlurmctld environment only; no report mail (its address is in the record)")
    except GsrunError as e:
        log.warn(f"job record unavailable: {e}")
    job = job_from_record(job_id, rec, environ)
    uid = _uid(environ)
    gid = _gid(environ, uid)
    ctx = {"paths": paths, "job": job, "cfg": cfg, "uid": uid, "gid": gid, "wait_s": wait_s, "log": log}
    out = run_steps("epilog-ctld", STEPS, ctx, log, rule=CLEANUP, budget_s=None)
    mail_res = out.results.get("mail") or {}
    if mail_res.get("error"):
        log.error(f"mail: {mail_res['error']}")
    if background:
        admin_comment_step(job_id, str(paths.spool_dir))
    elif not _kick_admin_comment(job_id, str(paths.spool_dir)) and mail_res.get("deferred") and ctx.get("summary"):
        # no background step to settle the state: the mail goes now, with the guess
        queue_mail(paths, ctx["summary"], cfg, log)
    return 0


def _merge_step(c: dict) -> None:
    c["summary"] = merge(c["paths"], c["job"], c["cfg"], c["wait_s"])
    write_summary(c["paths"], c["summary"], c["uid"], c["gid"])


def _mail_step(c: dict) -> dict | None:
    if c["summary"].job.state_source == "exit_code":      # settle_state mails it
        return {"deferred": "until Slurm has the job's final state"}
    queue_mail(c["paths"], c["summary"], c["cfg"], c["log"])
    return None


# no budget of its own (slurmctld's timeout applies); a failed merge ends it, mail never fails it
STEPS = (
    Step("merge", "merge the node summaries with the job record, write the job summary", 0, _merge_step,
         catch=()),
    Step("mail", "queue the report mail when the job asked for it", 0, _mail_step),
)


def _kick_admin_comment(job_id: str, spool_dir: str) -> bool:
    """Start :func:`admin_comment_step` detached (with the job's uid/gid for the user's copy); False if not."""
    try:
        spawn_detached(root_python("-m", "gsrun.epilog.ctld", "admin-comment", job_id, "--spool-dir", spool_dir),
                       root_child_env(("GSRUN_SPOOL_DIR", "GSRUN_LOG_FILE", "SLURM_JOB_UID", "SLURM_JOB_GID")))
        return True
    except OSError:
        return False


SETTLE_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)   # scontrol polls after EpilogSlurmctld: ~60 s in all


def settle_state(paths: Paths, job_id: str, cfg, log, show_job=None, sleep=time.sleep, delays_s=SETTLE_DELAYS_S,
                 summary: JobSummary | None = None, environ=None) -> JobSummary | None:
    """A guessed state (``state_source == "exit_code"``) polled at ``delays_s`` until slurmctld has the
    final one, then the summary and the user's copy rewritten with new findings. -> the summary when it
    was a guess (settled or not), else None. Slurm errors are logged, never raised."""
    show_job = show_job or _show_job
    summary = summary or read_record(JobSummary, paths.spool_job(job_id) / "summary.json", read_json)
    if summary is None or summary.job.state_source != "exit_code":
        return None
    job = summary.job
    for delay in delays_s:
        sleep(delay)
        try:
            rec = show_job(job_id, cfg["timeouts.command_s"])
        except GsrunError as e:
            log.warn(f"final state: {e}".replace("\n", " "))
            continue
        if rec is None:       # purged (MinJobAge): the guess stays
            break
        final = state_word(rec.get("JobState"))
        if not final or final in ACTIVE_STATES or final == "COMPLETING":
            continue
        ec, sig = parse_exit_code(rec["ExitCode"]) if rec.get("ExitCode") else (job.exit_code, 0)
        summary = replace(summary, job=replace(job, state=final, state_source="slurm",
                                               exit_code=ec if not sig else 128 + sig))
        summary = replace(summary, findings=tuple(finding_records(summary, cfg, job.partition or None)))
        env = os.environ if environ is None else environ
        uid = _uid(env)
        write_summary(paths, summary, uid, _gid(env, uid))
        log(f"final state {final} (EpilogSlurmctld saw COMPLETING and guessed {job.state} from the exit code)")
        return summary
    log.warn(f"final state not known after {sum(delays_s):.0f} s: the summary keeps {job.state} "
             "(a guess from the exit code)")
    return summary


def admin_comment_step(job_id: str, spool_dir: str | None = None, deadline_s: float = 180.0) -> int:
    """The background step: settle a guessed state and send the deferred mail, then with slurmdbd store
    the JS1 blob in AdminComment. -> 0 stored or not applicable, 1 gave up."""
    log = JobLog(job_id, "admin-comment")
    paths = None
    try:
        check_job_id(job_id, array=True)
        cfg = load_config_or_defaults(log)
        timeout_s = cfg["timeouts.command_s"]
        paths = Paths.from_config(cfg, None, spool_dir)
        first = read_record(JobSummary, paths.spool_job(job_id) / "summary.json", read_json)
        deferred = first is not None and first.job.state_source == "exit_code"
        settled = None
        try:
            if deferred:
                settled = settle_state(paths, job_id, cfg, log, summary=first)
        finally:
            if deferred:        # queued even when settling failed
                try:
                    queue_mail(paths, settled or first, cfg, log)
                except Exception as e:  # noqa: BLE001 - logged with the job id, never silent
                    log.error(f"mail: not queued: {e!r}".replace("\n", " "))
        sconf = accounting.config_cached(str(paths.spool_dir), timeout_s)
        if not accounting.uses_slurmdbd(sconf):
            _mark_accounting(paths, job_id, "no slurmdbd", log)
            return 0
        summary = read_record(JobSummary, paths.spool_job(job_id) / "summary.json", read_json)
        if summary is None:
            log.warn("no job summary: AdminComment not stored")
            return 1
        blob = js1_comment(summary, cfg["report.js1_max_chars"], cfg["report.js1_short_s"])
        target = accounting_job_id(job_id, summary.job)
        how = accounting.store_admin_comment_retry(
            target, blob, sconf.get("ClusterName", ""), os.environ.get("SLURM_CONF"), timeout_s,
            deadline_s, log=None)
        if blob in JS1_MARKERS:
            what = "ran under 60 s" if blob == JS1_SHORT else "no figures jobstats could use"
            log(f"AdminComment of {target} stored as jobstats' marker {blob} ({what}, {how})")
            _mark_accounting(paths, job_id, "no figures", log, f"{blob}; {how}")
            return 0
        log(f"AdminComment of {target} stored ({len(blob)} chars, {how})")
        _mark_accounting(paths, job_id, "stored", log, how)
        return 0
    except Exception as e:  # noqa: BLE001 - a bug or a broken summary too: logged with the job id, never silent
        why = str(e) if isinstance(e, GsrunError) else f"internal error: {e!r}"
        log.error(f"AdminComment not stored: {why}".replace("\n", " "))
        if paths is not None:
            _mark_accounting(paths, job_id, "failed", log, why[:300])
        return 1


def _mark_accounting(paths: Paths, job_id: str, state: str, log, detail: str = "") -> None:
    """``accounting.json`` (root 0600, read by ``gsrun-node prune``): ``{"admin_comment": "stored"|"no
    slurmdbd"|"no figures"|"failed", "detail", "time"}``. Never raises."""
    try:
        atomic_write_json(paths.spool_job(job_id) / ACCOUNTING_MARK,
                          {"admin_comment": state, "detail": detail, "time": round(time.time(), 3)}, mode=0o600)
    except (OSError, GsrunError) as e:
        log.warn(f"accounting marker not written: {e}".replace("\n", " "))


def _main(argv: list[str]) -> int:
    spool = argv[argv.index("--spool-dir") + 1] if "--spool-dir" in argv[:-1] else None
    if len(argv) >= 2 and argv[0] == "admin-comment":
        return admin_comment_step(argv[1], spool)
    if len(argv) >= 2 and argv[0] == "finish":      # ctld_start's detached merge
        if os.environ.get("SLURM_JOB_ID") != argv[1]:
            print("gsrun: epilog-ctld: finish: job id differs from SLURM_JOB_ID", file=sys.stderr)
            return 2
        wait_s = 30.0
        if "--wait-s" in argv[:-1]:
            try:
                wait_s = min(max(float(argv[argv.index("--wait-s") + 1]), 0.0), 600.0)
            except ValueError:
                pass
        return run(os.environ, spool, wait_s, background=True)
    print("usage: python -m gsrun.epilog.ctld admin-comment|finish JOBID [--spool-dir DIR] [--wait-s S]",
          file=sys.stderr)
    return 2


def _id(environ, key: str) -> int | None:
    v = environ.get(key, "")
    return int(v) if v.isdigit() and len(v) <= 10 else None


def _uid(environ) -> int | None:
    """The job's uid from slurmctld's ``SLURM_JOB_UID``, never the record (a user can forge ``UserId=``)."""
    return _id(environ, "SLURM_JOB_UID")


def _gid(environ, uid: int | None) -> int | None:
    """``SLURM_JOB_GID``, else ``uid``'s primary group (``uid`` without a passwd entry); None without uid."""
    if uid is None:
        return None
    gid = _id(environ, "SLURM_JOB_GID")
    if gid is not None:
        return gid
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def queue_mail(paths: Paths, summary: JobSummary, cfg, log) -> str:
    job = summary.job
    to_addr = job.mail_user
    if not cfg["mail.enabled"] or not to_addr or not mail.mail_wanted(job.mail_type or None, cfg["mail.policy"],
                                                                      state=job.state or None):
        return "not requested"
    if "@" not in to_addr:      # Slurm's default MailUser is the bare user name
        if not cfg["mail.default_domain"]:
            log.warn(f"mail: MailUser {to_addr!r} has no domain and mail.default_domain is empty: not mailed")
            return "no domain"
        to_addr = f"{to_addr}@{cfg['mail.default_domain']}"
    png = None
    try:
        png = render_png(summary)
    except Exception as e:  # noqa: BLE001 - no picture is fine
        log.warn(f"no timeline picture: {e}")
    msg = mail.build_message(summary, render_text(summary, color=False, cfg=cfg), png, to_addr,
                             cfg["mail.from_addr"], cfg=cfg)
    path = mail.enqueue(str(paths.spool_dir), job.id, msg)
    _kick_flush()
    return str(path)


def _kick_flush() -> None:
    """Start ``gsrun-node mail flush`` detached so delivery never blocks us."""
    with suppress(OSError):
        spawn_detached(root_python("-m", "gsrun.admin.node", "mail", "flush"), root_child_env(("GSRUN_SPOOL_DIR",)))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
