"""``gseff JOBID``: the job's GPU efficiency report (seff for GPUs), from the
spool (merged here when missing or behind the node files; a running job's so
far), else from slurmdbd: ``sacct`` and the ``AdminComment`` blob (``--sacct``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

import click

from gsrun.base.errors import GsrunError, InputError, SlurmError, run_cli
from gsrun.base.fsutil import read_spool_json
from gsrun.base.ids import check_job_id
from gsrun.base.log import escape_strings
from gsrun.base.paths import Paths
from gsrun.facts.live import read_live_docs
from gsrun.report import accounting
from gsrun.report.live import live_summary, live_text
from gsrun.report.records import JobInfo, JobSummary, NodeSummary, read_record
from gsrun.facts.slurm import PENDING_STATES, REQUEUE_STATES, show_job, state_word
from gsrun.report.render import explain_text, render_png, render_text
from gsrun.report.summary import JS1_MARKERS, JS1_SHORT, JS1_SHORT_S, decode_js1, job_summary, pending_summary
from gsrun.report.units import fmt_duration_s, fmt_gib, fmt_pct
from gsrun.request.config import load_config


def load_summary(paths: Paths, job_id: str, cfg=None, escape: bool = False) -> JobSummary:
    """The final job summary, else a running job's so far (:mod:`gsrun.report.live`). ``escape``: every
    string read passed through :func:`~gsrun.base.log.escape_strings` (a report for a terminal).

    Raises:
        InputError: no record here (unknown id, another user's job, a spool not shared with this host).
    """
    d = paths.spool_job(job_id)
    read = (lambda p: escape_strings(read_spool_json(p))) if escape else read_spool_json
    summary = read_record(JobSummary, d / "summary.json", read) or read_record(JobSummary, d / "user-summary.json", read)
    files: dict[str, object] = {}     # node -> its file; names only: a node file is parsed only when merging here
    for p in sorted(d.glob("node-*.json")) + sorted(d.glob("user-node-*.json")):
        files.setdefault(p.name[len("user-node-") if p.name.startswith("user-") else len("node-"):-len(".json")], p)
    behind = summary is None or len(files) > len(summary.job.nodes or ()) - len(summary.nodes_missing or ())
    nodes = {s.node: s for p in reversed([*files.values()])          # the first file of a node
             if behind and (s := read_record(NodeSummary, p, read))}
    if summary is None and (live := read_live_docs(d)):
        running = live_summary(job_id, escape_strings(live) if escape else live, list(nodes.values()), cfg)
        if running is not None:
            return running
    if nodes:       # no summary yet, or fewer nodes than files: merged here
        base = summary.job if summary else JobInfo(id=job_id, nodes=tuple(sorted(nodes)),
                                                   state="RUNNING or unmerged")
        summary = job_summary(base, nodes.values())
    elif summary is None:
        raise InputError("gseff", "no report for job", job_id, hint=NO_REPORT_HINT)
    return summary


NO_REPORT_HINT = ("the job may belong to another user, or have run on a cluster whose spool is not shared "
                  "with this host")


def not_started(job_id: str, cfg, timeout_s: float | None = None, escape: bool = False) -> JobSummary | None:
    """A job not started yet: :func:`~gsrun.report.summary.pending_summary`, else None; ``escape``: as
    :func:`load_summary`'s."""
    try:
        rec = show_job(job_id, timeout_s or cfg["timeouts.command_s"])
    except GsrunError:
        return None
    if not rec or state_word(rec.get("JobState")) not in PENDING_STATES | REQUEUE_STATES:
        return None
    return pending_summary(escape_strings(rec) if escape else rec, cfg)


def gpu_from_js1(blob: dict) -> dict:
    """A decoded JS1 blob as reportseff reads it: ``{"gpus": [{node, index, util_pct, mem_used_bytes,
    mem_total_bytes}], "util_mean_pct", "mem_mean_pct"}`` (means over GPUs with a value, else None)."""
    rows = []
    for node, nd in sorted((blob.get("nodes") or {}).items()):
        idx = set(nd.get("gpu_utilization", {})) | set(nd.get("gpu_total_memory", {}))
        for i in sorted(idx, key=lambda x: (len(x), x)):
            rows.append({"node": node, "index": i, "util_pct": nd.get("gpu_utilization", {}).get(i),
                         "mem_used_bytes": nd.get("gpu_used_memory", {}).get(i),
                         "mem_total_bytes": nd.get("gpu_total_memory", {}).get(i)})
    utils = [r["util_pct"] for r in rows if r["util_pct"] is not None]
    mems = [100.0 * r["mem_used_bytes"] / r["mem_total_bytes"] for r in rows
            if r["mem_used_bytes"] is not None and r["mem_total_bytes"]]
    return {"gpus": rows, "util_mean_pct": sum(utils) / len(utils) if utils else None,
            "mem_mean_pct": sum(mems) / len(mems) if mems else None}


def load_accounting(job_id: str, timeout_s: float = 15.0) -> dict:
    """``{"job_id", "source": "sacct", "efficiency", "js1": decoded or None, "js1_error", "gpu"}``.

    Raises:
        InputError: the job is not in the accounting database.
        SlurmError: sacct missing / accounting disabled / slurmdbd unreachable.
    """
    try:
        eff = accounting.sacct_efficiency(job_id, timeout_s)
    except SlurmError as e:
        if e.what in ("no accounting record", "job not in output"):
            raise InputError("gseff", "unknown job", job_id,
                             hint="no report in the spool and no record in Slurm accounting: check "
                                  "the job id (sacct -j ID), or the cluster (sacct -M)") from None
        raise
    comment = accounting.admin_comment(job_id, timeout_s)
    js1, err = None, None
    if comment in JS1_MARKERS:
        err = ("AdminComment is jobstats' short-job marker (JS1:Short): the job ran under "
               "report.js1_short_s (jobstats' default: " f"{JS1_SHORT_S} s), no GPU figures were stored") \
            if comment == JS1_SHORT else \
              "AdminComment is jobstats' marker JS1:None: no node figures were stored for the job"
    elif comment and comment.startswith("JS1:"):
        try:
            js1 = decode_js1(comment)
        except (ValueError, OSError, EOFError) as e:
            err = f"AdminComment JS1 blob does not decode: {e}"
    elif comment:
        err = "AdminComment holds no JS1 blob" if not comment.lower().startswith("js1:") else \
            "AdminComment JS1 blob was lowercased (sacctmgr on Slurm 22.05)"
    else:
        err = "no AdminComment (gsrun's EpilogSlurmctld did not store the GPU summary)"
    return {"job_id": job_id, "source": "sacct", "efficiency": asdict(eff), "js1": js1,
            "js1_error": err, "gpu": gpu_from_js1(js1) if js1 else None}


def render_accounting(rec: dict) -> str:
    """:func:`load_accounting`'s record as text, its strings escaped."""
    rec = escape_strings(rec)
    e = rec["efficiency"]
    out = [f"gsrun efficiency report (from Slurm accounting): job {rec['job_id']}",
           f"  State: {e['state'] or 'N/A'}   Elapsed: {fmt_duration_s(e['elapsed_s'], 'clock')}"
           f"   Nodes: {e['nodes'] or 'N/A'}"
           f"   CPUs: {e['alloc_cpus'] or 'N/A'}   GPUs: {e['alloc_gpus'] or 'N/A'}", "",
           "CPU and memory (sacct)",
           f"  CPU time: {fmt_duration_s(e['cpu_time_s'], 'clock')}   CPU efficiency: {fmt_pct(e['cpu_eff_pct'], 1)}"
           + (f"   [{e['cpu_time_source']}]" if e["cpu_time_source"] else ""),
           f"  Memory peak: {fmt_gib(e['mem_peak_bytes'])} of {fmt_gib(e['mem_req_bytes'])}"
           f"   Memory efficiency: {fmt_pct(e['mem_eff_pct'], 1)}"
           + (f"   [{e['mem_peak_source']}]" if e["mem_peak_source"] else ""), "",
           "GPUs (AdminComment JS1)"]
    g = rec["gpu"]
    if g is None:
        out.append(f"  GPU figures unavailable: {rec['js1_error']}")
    elif not g["gpus"]:
        out.append("  no per-GPU figures in the JS1 blob")
    else:
        out.append(f"  {'node':<10} {'gpu':>4} {'util':>7} {'mem peak':>12} {'mem total':>12}")
        for r in g["gpus"]:
            out.append(f"  {r['node']:<10} {r['index']:>4} {fmt_pct(r['util_pct'], 1):>7} "
                       f"{fmt_gib(r['mem_used_bytes']):>12} {fmt_gib(r['mem_total_bytes']):>12}")
        out.append(f"  GPU utilization: {fmt_pct(g['util_mean_pct'], 1)}"
                   f"   GPU memory: {fmt_pct(g['mem_mean_pct'], 1)}")
    notes = [n for n in e["notes"] if n]
    if notes:
        out += ["", "Notes"] + [f"  - {n}" for n in notes]
    return "\n".join(out) + "\n"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gsrun", prog_name="gseff", message="%(prog)s %(version)s")
@click.argument("job_id", required=False)
@click.option("--explain", is_flag=True, help="Say what each figure of the report means, and how it compares "
              "with jobstats and reportseff; no JOB_ID needed.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a per-GPU timeline PNG.")
@click.option("--all", "all_gpus", is_flag=True, help="List every GPU (a job of more than 32 GPUs is summarised).")
@click.option("--sacct", "from_sacct", is_flag=True,
              help="Read the job from Slurm accounting (sacct + AdminComment) even if the spool has it.")
@click.option("--watch", is_flag=True,
              help="Redraw a running job's report every live flush interval until it ends, then print the final one.")
@click.option("--spool-dir", default=None, hidden=True)
def cli(job_id, explain, as_json, plot, all_gpus, from_sacct, watch, spool_dir):
    """Show the GPU efficiency report of JOB_ID (the report so far while it runs)."""
    if explain:
        click.echo(explain_text(), nl=False)
        if not job_id:
            return 0
    if not job_id:
        raise InputError("gseff", "no job id", "JOB_ID is missing", hint="gseff JOBID, or gseff --explain")
    jid = job_id.strip()
    check_job_id(jid, array=True)
    cfg = load_config()
    paths = Paths.from_config(cfg, None, spool_dir)
    if watch:
        return watch_job(paths, jid, cfg, all_gpus)
    summary = None
    if not from_sacct:
        try:
            summary = load_summary(paths, jid, cfg, escape=not as_json)
        except InputError:
            summary = not_started(jid, cfg, escape=not as_json)
    if summary is None:
        try:
            rec = load_accounting(jid, cfg["timeouts.command_s"])
        except GsrunError as e:
            if from_sacct or isinstance(e, InputError):
                raise
            raise InputError("gseff", "no report for job", job_id,
                             hint=f"{NO_REPORT_HINT}; Slurm accounting unavailable: {e.what}") from None
        if plot:
            raise InputError("gseff", "no plot", "Slurm accounting keeps no GPU timeline")
        click.echo(json.dumps(rec, indent=1, sort_keys=True) + "\n" if as_json else render_accounting(rec), nl=False)
        return 0
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, sort_keys=True))
    else:
        click.echo(report_text(summary, cfg, all_gpus, sys.stdout.isatty() and not os.environ.get("NO_COLOR")),
                   nl=False)
    if plot:
        png = render_png(summary)
        if png is None:
            raise InputError("gseff", "no plot", "no GPU timeline in this job (or matplotlib missing)")
        with open(plot, "wb") as f:
            f.write(png)
        click.echo(f"gseff: wrote {plot}", err=True)
    return 0


def report_text(summary: JobSummary, cfg, all_gpus: bool = False, color: bool = False, now: float | None = None) -> str:
    """The text report (a running job's after its live lines) of a summary read with ``escape``
    (:func:`load_summary`, :func:`not_started`): no control or bidi character of a record reaches the screen."""
    head = live_text(summary, time.time() if now is None else now) if summary.live else ""
    return head + render_text(summary, color=color, cfg=cfg, all_gpus=all_gpus)


def watch_job(paths: Paths, job_id: str, cfg, all_gpus: bool = False, out=None, sleep=None,
              max_rounds: int | None = None) -> int:
    """``gseff --watch``: redraw every ``live.flush_s`` until the final report (spool only, no Slurm RPC)."""
    out = out or sys.stdout
    sleep = sleep or time.sleep
    tty = out.isatty()
    rounds = waits_unmerged = 0
    while True:
        rounds += 1
        try:
            summary = load_summary(paths, job_id, cfg, escape=True)
        except InputError:
            summary = None
        unmerged = summary is not None and summary.job.state == "RUNNING or unmerged"
        final = summary is not None and not summary.live and (not unmerged or waits_unmerged >= 3)
        if unmerged and not final:     # the nodes are done; the controller's merge comes within seconds
            waits_unmerged += 1
            sleep(min(5.0, float(cfg["live.flush_s"])))
            continue
        if tty:
            out.write("\033[H\033[2J")
        out.write(f"gseff: job {job_id}: no report yet (pending, or its prolog is running); waiting\n"
                  if summary is None else report_text(summary, cfg, all_gpus, tty and not os.environ.get("NO_COLOR")))
        out.flush()
        if final or max_rounds is not None and rounds >= max_rounds:
            return 0
        sleep(float(cfg["live.flush_s"]))


def main(argv=None) -> None:
    run_cli(cli, "gseff", argv)
