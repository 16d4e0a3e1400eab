"""``gsrun-node``'s click CLI: the node side, run as root by slurmd/slurmctld
(the hooks; their job context comes from the environment Slurm sets) or an admin.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from gsrun.base.errors import GsrunError, run_cli
from gsrun.base.log import JobLog
from gsrun.base.paths import Paths
from gsrun.bind import plan as binding
from gsrun.epilog import ctld
from gsrun.epilog.ctld_start import detach
from gsrun.facts import topology as topo
from gsrun.facts.hostfs import HostFS
from gsrun.facts.hwloc_xml import read_topology_xml
from gsrun.node import mig as migmod, mps, tuning
from gsrun.node.live import job_fields_from_record, read_job_record
from gsrun.node.mig_nvml import RealMig
from gsrun.node import monitor
from gsrun.prolog.main import run
from gsrun.report import alerts, mail, retention
from gsrun.request.config import idle_config, load_config
from gsrun.spank_py import build
from gsrun.daemon import build as daemon_client, server
from gsrun.admin import doctor as doc, install as inst
from gsrun.admin.install import render_config_reference

HOST_ROOT = click.option("--host-root", default=None, envvar="GSRUN_HOST_ROOT",
                         type=click.Path(exists=True, file_okay=False),
                         help="Read/write /proc and /sys under DIR (a recorded or fake tree).")
STATE_DIR = click.option("--state-dir", default=None, envvar="GSRUN_STATE_DIR",
                         help="The node's state directory (default: paths.state_dir, /run/gsrun).")
SPOOL_DIR = click.option("--spool-dir", default=None, envvar="GSRUN_SPOOL_DIR", help="Spool directory.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gsrun", prog_name="gsrun-node", message="%(prog)s %(version)s")
def cli():
    """gsrun node side: Slurm prolog/epilog, sampler, restore, status."""


#: where ``install`` writes gsrun's systemd units by default (as root)
SYSTEMD_UNITS_DIR = "/etc/systemd/system"


@cli.command()
@HOST_ROOT
@STATE_DIR
@SPOOL_DIR
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
def prolog(host_root, state_dir, spool_dir, dry_run):
    """Slurm Prolog: tune, MPS/MIG, begin the job's sampling."""
    return run(os.environ, host_root, state_dir, spool_dir, dry_run=dry_run)


@cli.command()
@HOST_ROOT
@STATE_DIR
@SPOOL_DIR
def epilog(host_root, state_dir, spool_dir):
    """Slurm Epilog: restore the node, then end the job's sampling and write its node summary."""
    from gsrun.epilog.main import run
    return run(os.environ, host_root, state_dir, spool_dir)


@cli.command("epilog-ctld")
@SPOOL_DIR
@click.option("--wait-s", type=float, default=30.0, help="Wait this long for node summaries.")
@click.option("--foreground", is_flag=True,
              help="Merge before returning (default: in a detached process, so that slurmctld frees the "
                   "job's nodes at once).")
def epilog_ctld(spool_dir, wait_s, foreground):
    """EpilogSlurmctld: merge node summaries, job report, queue mail."""
    if foreground:
        return ctld.run(os.environ, spool_dir, wait_s)
    return detach(os.environ, spool_dir, wait_s)


@cli.command()
@HOST_ROOT
@STATE_DIR
@click.option("--job", "job_id", default=None, help="Restore what this job changed.")
@click.option("--all", "all_jobs", is_flag=True, help="Restore the node baseline (after a crash or reboot).")
def restore(host_root, state_dir, job_id, all_jobs):
    """Undo node changes from the journals (idempotent): tuning, MPS daemons,
    MIG layouts. Progress goes to stderr, the JSON result to stdout."""
    if not job_id and not all_jobs:
        raise click.UsageError("give --job ID or --all")
    cfg = load_config()
    paths = Paths.from_config(cfg, state_dir)
    hostfs = HostFS.from_env(host_root)
    log = functools.partial(click.echo, err=True)
    log(f"gsrun-node restore: state dir {paths.state_dir} (config {cfg.source})")
    out = {"state_dir": str(paths.state_dir), "config": cfg.source,
           "tuning": tuning.restore(hostfs, str(paths.state_dir), job_id=job_id, all_jobs=all_jobs, log=log)}
    jobs = [job_id] if job_id else sorted(p.name[len("mps-"):-len(".json")]
                                           for p in paths.state_dir.glob("mps-*.json"))
    out["mps"] = {j: mps.stop(j, str(paths.mps_dir), str(paths.state_dir), cfg["mps.control_bin"],
                              cfg["mps.quit_timeout_s"], log=log) for j in jobs}
    if hostfs.is_real:
        jobs_dir = paths.state_dir / "jobs"
        if job_id:
            done = {job_id: migmod.epilog_restore(RealMig(), str(jobs_dir), job_id, log=log)} \
                if (jobs_dir / job_id / migmod.JOURNAL_NAME).exists() else {}
        else:
            done = migmod.restore_crashed(RealMig(), jobs_dir, log=log)
        if done:
            out["mig"] = done
    click.echo(json.dumps(out, indent=1, default=str))
    return 0


@cli.command()
@HOST_ROOT
@STATE_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON ({tuning, samplers}) instead of text.")
def status(host_root, state_dir, as_json):
    """What is changed on this node and by which job, and the jobs the node
    monitor samples. Text by default; ``--json`` prints ``{"tuning":
    tuning.status(...), "samplers": {job: {"pid", "running"}}}`` (``pid``: the
    monitor's; ``running`` false: a job begun but not sampled now)."""
    cfg = load_config()
    paths = Paths.from_config(cfg, state_dir)
    out = {"tuning": tuning.status(HostFS.from_env(host_root), str(paths.state_dir)), "samplers": {}}
    try:
        mon = monitor.ask(paths.state_dir, {"op": "status"}, timeout_s=5.0, wait_s=0)
    except GsrunError as e:
        click.echo(f"{e}", err=True)
        mon = {}
    for j in mon.get("jobs") or []:
        out["samplers"][j] = {"pid": mon.get("pid"), "running": True}
    jobs = paths.state_dir / "jobs"
    if jobs.is_dir():
        for d in sorted(jobs.iterdir()):
            if d.name not in out["samplers"] and (d / monitor.JOB_FILE).exists():
                out["samplers"][d.name] = {"pid": None, "running": False}   # begun, not sampled now
    if as_json:
        click.echo(json.dumps(out, indent=1, default=str))
        return 0
    text = tuning.format_status(out["tuning"])
    text += "sampled jobs: " + (", ".join(f"job {j} ({'sampled by monitor ' + str(v['pid']) if v['running'] else 'not sampled now'})"
                                      for j, v in out["samplers"].items()) or "none") + "\n"
    click.echo(text, nl=False)
    return 0


@cli.command()
@HOST_ROOT
@click.option("--topology-xml", type=click.Path(dir_okay=False), default=None, envvar="GSRUN_TOPOLOGY_XML",
              help="An hwloc XML export (lstopo --of xml) instead of this host.")
def topology(host_root, topology_xml):
    """A table like `nvidia-smi topo -m` plus the binding gsrun would choose."""
    env = dict(os.environ)
    if topology_xml:
        t = read_topology_xml(topology_xml)
        hostfs = HostFS.from_env(None, {})
        allowed = list(t.cpus_online)
    else:
        hostfs = HostFS.from_env(host_root)
        t = topo.read_topology(hostfs)
        allowed = None
    plan = binding.plan_from_env(env, hostfs, allowed, topology=t) if env.get("SLURM_LOCALID") else None
    click.echo(binding.render_table(t, plan))
    return 0


@cli.group()
def mig():
    """Per-job MIG layouts."""


@mig.command("plan")
@click.option("--gpu", type=int, required=True, help="NVML index of the GPU.")
@click.argument("layout")
@HOST_ROOT
def mig_plan(gpu, layout, host_root):
    """Print the MIG plan for LAYOUT on GPU (read-only NVML calls)."""
    click.echo(migmod.cli_plan(gpu, layout, HostFS.from_env(host_root)))
    return 0


@cli.group()
def spank():
    """Build and install the SPANK plugin."""


@spank.command("build")
@click.option("--out-dir", default=".", type=click.Path(file_okay=False))
@click.option("--slurm-include", default=None, type=click.Path(file_okay=False, exists=True),
              help="Include dir holding slurm/spank.h (default: /usr/include, /usr/local/include).")
def spank_build(out_dir, slurm_include):
    click.echo(str(build.build(out_dir, slurm_include=slurm_include)))
    return 0


@spank.command("install")
@click.option("--so", "so_path", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--dest-dir", default="/usr/lib/gsrun")
@click.option("--plugstack", default="/etc/slurm/plugstack.conf.d/gsrun.conf")
@click.option("--arg", "args", multiple=True, help="key=value plugstack argument.")
def spank_install(so_path, dest_dir, plugstack, args):
    kv: dict = {}
    for a in args:
        if "=" not in a:
            raise click.UsageError(f"--arg {a!r}: expected key=value")
        k, v = a.split("=", 1)
        if k == "pythonpath":
            kv.setdefault(k, []).append(v)   # repeatable
        else:
            kv[k] = v
    click.echo(str(build.install(so_path, dest_dir, plugstack, kv)))
    return 0


@cli.group()
def daemon():
    """The node daemon: runs every Slurm hook of this node (docs/ADMIN.md)."""


@daemon.command("run")
@click.option("--socket", "socket_path", default=None, type=click.Path(dir_okay=False),
              help="Unix socket to listen on (default: <state dir>/daemon.sock).")
@STATE_DIR
@HOST_ROOT
@click.option("--monitor/--no-monitor", default=True, show_default=True,
              help="Run the node monitor (NVML, sampling, Prometheus); --no-monitor on a slurmctld host "
                   "that runs no jobs.")
@click.option("--node-name", default=None,
              help="The node label of the Prometheus series (default: the short host name).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus on this port instead of [metrics] http_port (0 = off; hosts running "
                   "several slurmd).")
@click.option("--ctld-user", default=None, metavar="USER",
              help="slurm.conf's SlurmUser when it is not root: EpilogSlurmctld runs as that user and "
                   "reaches this daemon on ctld.sock beside --socket (gsrun-node install sets it).")
def daemon_run(socket_path, state_dir, host_root, monitor, node_name, metrics_port, ctld_user):
    """Serve hooks until SIGTERM (SIGHUP: re-execute, e.g. after an upgrade)."""
    sys.exit(server.run(socket_path, state_dir, host_root=host_root, monitor=monitor, node_name=node_name,
                        metrics_port=metrics_port, ctld_user=ctld_user))


@daemon.command("status")
@click.option("--socket", "socket_path", default=None, type=click.Path(dir_okay=False),
              help="The daemon's socket (default: <state dir>/daemon.sock).")
@STATE_DIR
@click.option("--json", "as_json", is_flag=True, help="The daemon's answer as JSON.")
def daemon_status(socket_path, state_dir, as_json):
    """Ask the daemon whether it runs and answers (exit 1 when not)."""
    try:
        st = server.ping(socket_path or server.default_socket(state_dir))
    except GsrunError as e:
        click.echo(str(e), err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(st, sort_keys=True))
    else:
        click.echo(f"gsrun-daemon {st['version']}: pid {st['pid']}, serving {st['socket']}, "
                   f"{st['served']} requests served, {st['running']} running")


@daemon.command("build")
@click.option("--out-dir", default=".", type=click.Path(file_okay=False))
def daemon_build(out_dir):
    """Compile the hooks' client OUT_DIR/gsrun-hook (needs cc)."""
    click.echo(str(daemon_client.build(out_dir)))
    return 0


@cli.group("mail")
def mail_group():
    """The report mail queue."""


@mail_group.command("flush")
@SPOOL_DIR
def mail_flush(spool_dir):
    """Deliver queued report mails (with retry); safe to run concurrently."""
    cfg = load_config()
    paths = Paths.from_config(cfg, None, spool_dir)
    alerts = _alerts_to_mail(paths, cfg)
    out = mail.flush(str(paths.spool_dir), cfg)
    if alerts is not None:
        out["alerts"] = alerts
    click.echo(json.dumps(out, default=str))
    return 0


def _alerts_to_mail(paths, cfg) -> dict | None:
    """Queue the pending idle alerts / cancel notices as mail
    (:func:`gsrun.report.alerts.process`) before delivering; None when there
    is no alert spool yet. A failure here never stops the report mail."""
    if not (paths.spool_dir / "alerts").is_dir():
        return None

    log = JobLog(None, "alerts")
    try:
        return alerts.process(str(paths.spool_dir), cfg, idle_config(cfg), log=log,
                              job_record=lambda j: job_fields_from_record(
                                  read_job_record(j, cfg["timeouts.command_s"])))
    except Exception as e:  # noqa: BLE001
        log.error(f"alert requests not processed: {e}")
        return {"error": str(e)[:300]}


@cli.command()
@SPOOL_DIR
@click.option("--older-than", "older_than", type=click.FloatRange(min=0), default=None, metavar="DAYS",
              help="Age in days (default: spool.retention_days of the site config).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--force", is_flag=True, help="Also remove job directories whose summary is not in accounting.")
@click.option("--json", "as_json", is_flag=True)
def prune(spool_dir, older_than, dry_run, force, as_json):
    """Remove old job directories of the spool (and delivered/failed mails of
    the same age). Safe while hooks run: see gsrun.report.retention."""
    cfg = load_config()
    paths = Paths.from_config(cfg, None, spool_dir)
    days = older_than if older_than is not None else cfg["spool.retention_days"]
    if older_than is None and days == 0:
        click.echo("gsrun: prune: nothing to do: spool.retention_days = 0 (keep forever)", err=True)
        return 0
    rows = retention.prune_job_dirs(str(paths.spool_dir), days, dry_run=dry_run, force=force)
    mails = 0 if dry_run else mail.prune(str(paths.spool_dir), max_age_s=max(days, 1) * 86400)
    if not dry_run:
        try:
            retention.record_run(str(paths.spool_dir), rows, mails, days)
        except OSError as e:
            click.echo(f"gsrun: prune: last-run record not written: {e.strerror or e}\n"
                       "hint: gsrun-node doctor will not know this run; check the spool's permissions", err=True)
    if as_json:
        click.echo(json.dumps({"older_than_days": days, "dry_run": dry_run, "jobs": rows, "mails_removed": mails}))
    else:
        for r in rows:
            if r["action"] == "remove" or r["reason"].startswith(("summary not stored", "not ")):
                click.echo(f"{r['job']}\t{r['action']}\t{r.get('result', '')}\t{r['reason']}")
        gone = sum(1 for r in rows if r.get("result") in ("removed", "dry run"))
        click.echo(f"# {gone} job director{'y' if gone == 1 else 'ies'} "
                   f"{'would be ' if dry_run else ''}removed (older than {days:g} days), "
                   f"{len(rows) - gone} kept; {mails} mails removed")
    return 1 if any(str(r.get("result", "")).startswith("error") for r in rows) else 0


@cli.group("config")
def config_group():
    """Site configuration."""


@config_group.command("check")
@click.option("--config", "--file", "path", default=None,
              help="Config file (default: $GSRUN_CONFIG or /etc/gsrun/gsrun.toml).")
@click.option("--partition", default=None)
def config_check(path, partition):
    """Parse the site config strictly and show the effective policy."""
    cfg = load_config(path)
    click.echo(f"# {cfg.source}: OK")
    parts = [partition] if partition else [None, *sorted(cfg.partitions)]
    for p in parts:
        click.echo(f"[effective{'' if p is None else ' partition=' + p}]")
        for k, v in cfg.effective(p).items():
            click.echo(f"  {k} = {json.dumps(v)}")
    return 0


@config_group.command("reference")
def config_reference():
    """Print the configuration reference (docs/CONFIG.md) generated from the settings table."""
    click.echo(render_config_reference(), nl=False)
    return 0


@cli.command()
@click.option("--print", "print_only", is_flag=True, help="Show what would be done; change nothing.")
@click.option("--config", "config_path", default=None,
              help="Site config to write if absent (default: $GSRUN_CONFIG or /etc/gsrun/gsrun.toml).")
@STATE_DIR
@SPOOL_DIR
@click.option("--layout", type=click.Choice(["single", "prolog.d"]), default="single", show_default=True,
              help="single: Prolog=<hook>; prolog.d: Prolog=<dir>/* with gsrun's hook linked in.")
@click.option("--hooks-dir", "--prefix", "hooks_dir", default=None, metavar="DIR",
              help="Write the three hook executables and the node daemon's client gsrun-hook into DIR "
                   "(default: <prefix>/libexec/gsrun of this installation).")
@click.option("--log-file", default=None, metavar="PATH",
              help="Bake GSRUN_LOG_FILE=PATH into the hooks (hosts without syslog).")
@click.option("--units-dir", default=None, metavar="DIR",
              help="Write gsrun's systemd units into DIR: gsrun-daemon.service, the mail and prune timers "
                   "and the (disabled) weekly report timer. Default: /etc/systemd/system when run as root "
                   "(not with --print), else they are only named.")
@click.option("--prolog-d", default="/etc/slurm/prolog.d", show_default=True)
@click.option("--epilog-d", default="/etc/slurm/epilog.d", show_default=True)
@click.option("--no-measure", "measure", is_flag=True, flag_value=False, default=True,
              help="Do not time a prolog dry run.")
@click.option("--irqbalance-script", default=None, metavar="PATH",
              help="Install gsrun's irqbalance policy script here (default: tuning.irqbalance_policy_script).")
def install(**options):
    """Create gsrun's directories and site config; print the slurm.conf lines."""
    opts = inst.InstallOptions(**options)
    if opts.units_dir is None and not opts.print_only and os.geteuid() == 0 and os.path.isdir(SYSTEMD_UNITS_DIR):
        opts.units_dir = SYSTEMD_UNITS_DIR
    return inst.run(opts, out=click.echo)


@cli.command()
@HOST_ROOT
@STATE_DIR
@SPOOL_DIR
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output for fleet tooling.")
@click.option("--config", "config_path", default=None, help="Site config (default: $GSRUN_CONFIG or /etc/gsrun/gsrun.toml).")
@click.option("--node", default=None, help="Slurm NodeName of this node (default: $SLURMD_NODENAME or hostname).")
@click.option("--spank-so", default=None, help="The installed gsrun_spank.so (default: found in plugstack.conf).")
@click.option("--check", "only", multiple=True, help="Run only this check (repeatable).")
def doctor(host_root, state_dir, spool_dir, as_json, config_path, node, spank_so, only):
    """Check what this node can do for gsrun; exit 1 if a check fails."""
    ctx = doc.Context(HostFS.from_env(host_root), config_path=config_path, state_dir=state_dir,
                      spool_dir=spool_dir, node=node, slurm_conf=os.environ.get("SLURM_CONF"), spank_so=spank_so)
    checks = doc.run_all(ctx, list(only) or None)
    click.echo(doc.to_json(checks, ctx) if as_json else doc.render_table(checks))
    return doc.exit_status(checks)


def main(argv=None) -> None:
    try:
        run_cli(cli, "gsrun-node", argv)
    except Exception as e:  # noqa: BLE001 - a hook must never die with a traceback
        import traceback

        phase = (argv or sys.argv[1:] or ["node"])[0]
        click.echo(f"gsrun: {phase}: internal error: {e!r}", err=True)
        traceback.print_exc(file=sys.stderr)
        # a bug of ours must not drain the node: hooks exit 0
        sys.exit(0 if phase in ("prolog", "epilog", "epilog-ctld") else 1)

if __name__ == "__main__":
    main()
