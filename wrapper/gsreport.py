"""``gsrun-report``: the cluster's GPU-waste report over a time window from
``sacct`` and the ``AdminComment`` blobs; tables as text, ``--json`` or
``--csv``; ``--email`` digests and ``--report-to`` through the mail spool.
"""

from __future__ import annotations

import sys
import time

import click

from gsrun.base.errors import InputError, SlurmError, run_cli
from gsrun.base.paths import Paths
from gsrun.facts.slurm import run_slurm
from gsrun.report import fleet_mail
from gsrun.report.fleet import FleetReport, parse_sinfo_models, parse_sinfo_nodes, thresholds_from_config
from gsrun.report.fleet_render import Scope, report_csv, report_json, report_text
from gsrun.report.fleet_source import (blob_figures, check_names, parse_since, parse_when, window_jobs)
from gsrun.request.config import load_config


def node_shares(clusters, timeout_s: float) -> tuple[dict, list[str]]:
    """partition -> NodeShare and the gres GPU types from one ``sinfo`` (``({}, [])`` if it fails)."""
    argv = ["sinfo", "-h", "-N", "-o", "%P|%c|%m|%G"] + (["-M", ",".join(clusters)] if clusters else [])
    try:
        text = run_slurm(argv, timeout_s).stdout
    except SlurmError as e:
        click.echo(f"{e}", err=True)
        return {}, []
    return parse_sinfo_nodes(text), parse_sinfo_models(text)


def run_report(scope: Scope, cfg, lines_of=None, shares=None, digests: bool = False, digest_after=None,
               models=None):
    """Stream the window's jobs into a :class:`FleetReport` (``lines_of``: as ``window_jobs``)."""
    rep = FleetReport(thresholds_from_config(cfg), shares, digest_after, digests, models)
    for job in window_jobs(scope.start_s, scope.end_s, float(cfg["cluster_report.chunk_h"]) * 3600.0,
                           float(cfg["cluster_report.sacct_timeout_s"]), scope.clusters, scope.partitions,
                           scope.accounts, lines_of):
        rep.add(job, *(blob_figures(job.comment) if job.gpus > 0 else (None, "no GPUs")))
    return rep


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gsrun", prog_name="gsrun-report", message="%(prog)s %(version)s")
@click.option("--since", default=None, help="Window ending now: 7d, 36h, 90m, 2w (default 7d).")
@click.option("--start", default=None, help="Window start, local time: 2024-05-01 or 2024-05-01T12:00.")
@click.option("--end", default=None, help="Window end (default now).")
@click.option("-M", "--clusters", default="", help="Comma-separated clusters (sacct -M).")
@click.option("-p", "--partitions", default="", help="Comma-separated partitions.")
@click.option("-A", "--accounts", default="", help="Comma-separated accounts.")
@click.option("--json", "as_json", is_flag=True, help="Print the tables as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the tables as CSV.")
@click.option("--email", is_flag=True, help="Mail each user their digest (through the mail spool).")
@click.option("--report-to", default=None, help="Mail the admin tables to this address.")
@click.option("--dry-run", is_flag=True, help="With --email/--report-to: print what would be sent.")
@click.option("--spool-dir", default=None, hidden=True)
def cli(since, start, end, clusters, partitions, accounts, as_json, as_csv, email, report_to, dry_run, spool_dir):
    """Rank the window's GPU jobs: idle GPU-hours, low efficiency, over-allocation, MIG fits,
    smaller GPU models, fragmentation, time limits, energy and usage."""
    if since and start:
        raise InputError("report", "conflicting options", "--since and --start", hint="give one of them")
    if as_json and as_csv:
        raise InputError("report", "conflicting options", "--json and --csv", hint="give one of them")
    cfg = load_config()
    now = time.time()
    end_s = parse_when(end) if end else now
    start_s = parse_when(start) if start else parse_since(since or "7d", end_s)
    if start_s >= end_s:
        raise InputError("report", "empty window", f"start {start} is not before end {end}")
    scope = Scope(start_s, end_s, tuple(check_names("cluster", filter(None, clusters.split(",")))),
                  tuple(check_names("partition", filter(None, partitions.split(",")))),
                  tuple(check_names("account", filter(None, accounts.split(",")))))
    paths = Paths.from_config(cfg, None, spool_dir)
    state = fleet_mail.read_state(paths.spool_dir) if email else {}
    shares, models = node_shares(scope.clusters, float(cfg["timeouts.command_s"]))
    rep = run_report(scope, cfg, shares=shares, digests=email, digest_after=fleet_mail.digest_after(state),
                     models=models)
    tables = rep.tables()
    if as_json:
        click.echo(report_json(tables, scope, {"jobs": rep.jobs, "gpu_jobs": rep.gpu_jobs,
                                               "no_figures_why": rep.no_figures_why}), nl=False)
    elif as_csv:
        click.echo(report_csv(tables, scope), nl=False)
    elif not (email or report_to) or dry_run:
        click.echo(report_text(tables, scope, rep.clusters, _head(rep)), nl=False)
    outgoing, skipped = [], []
    if email:
        outgoing, skipped = fleet_mail.plan_digests(rep.digests(), scope, cfg, state, now)
    if report_to:
        outgoing.append(fleet_mail.admin_mail(report_to, report_text(tables, scope, rep.clusters, _head(rep)),
                                              scope))
    if dry_run:
        click.echo(fleet_mail.dry_run_text(outgoing, skipped), nl=False)
    elif outgoing:
        res = fleet_mail.send(outgoing, cfg, paths.spool_dir, now)
        for s in skipped:
            click.echo(f"gsrun: report: digest skipped: {s}", err=True)
        click.echo(f"gsrun: report: queued {res['queued']} mails: sent {res['sent']}, "
                   f"deferred {res['deferred']}, failed {res['failed']}", err=True)
    return 0


def _head(rep: FleetReport) -> str:
    why = ", ".join(f"{n} {k}" for k, n in sorted(rep.no_figures_why.items()) if k != "no GPUs")
    return (f"gsrun cluster report: {rep.jobs} jobs, {rep.gpu_jobs} with GPUs, {rep.gpu_no_figures} of them "
            f"without figures{f' ({why})' if why else ''}\n\n")


def main(argv=None) -> None:
    run_cli(cli, "gsrun-report", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
