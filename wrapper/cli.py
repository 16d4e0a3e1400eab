"""``gsrun``: render an sbatch script for one task per GPU, submit, follow.

click parses flags into a :class:`~gsrun.wrapper.spec.JobSpec`; rendering is
pure (:mod:`gsrun.wrapper.render`); only :mod:`gsrun.wrapper.submit` talks to
Slurm.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from gsrun.request.config import load_config
from gsrun.request.mps_share import parse_mps_share
from gsrun.base.errors import InputError, run_cli
from gsrun.facts.slurm import gpus_per_node
from gsrun.wrapper.render import render_script
from gsrun.wrapper.spec import JobSpec, plan_nodes, validate_fields


def _bind_exe() -> str:
    """Absolute path of the gsrun-bind beside this gsrun (the job's tasks
    must find the same installation), else the name on PATH."""
    here = Path(sys.argv[0]).resolve().parent / "gsrun-bind"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("gsrun-bind")
    return found or "gsrun-bind"


def _command(script: str, args: tuple[str, ...], python: str | None) -> tuple[str, ...]:
    if script.endswith(".py"):
        interp = python or os.environ.get("GSRUN_PYTHON") or sys.executable
        return (interp, os.path.abspath(script), *args)
    if os.path.sep in script or os.path.exists(script):
        return (os.path.abspath(script), *args)
    return (script, *args)


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                "allow_interspersed_args": False})
@click.option("--gpus", type=int, required=True, help="Total GPUs (one task per GPU).")
@click.option("--nodes", type=int, default=None, help="Nodes (default: from the cluster's GPUs per node).")
@click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (default: read with sinfo).")
@click.option("--time", "time_", default=None, help="Time limit (Slurm format).")
@click.option("--partition", "-p", default=None, help="Partition.")
@click.option("--job-name", "-J", default=None, help="Job name (default: the script's name).")
@click.option("--output", "-o", default=None, help="Job stdout file (Slurm patterns like %j allowed).")
@click.option("--cpus-per-task", type=int, default=None, help="CPUs per task (default: Slurm's).")
@click.option("--mail-type", default=None, help="Mail the efficiency report, e.g. END.")
@click.option("--mail-user", default=None, help="Address for --mail-type.")
@click.option("--tune", default=None, help="Node tuning, e.g. governor=performance,swappiness=10.")
@click.option("--mps", is_flag=False, flag_value="", default=None, metavar="[PCT]",
              help="Per-job MPS daemon; optional active thread percentage.")
@click.option("--mig", default=None, help="Per-job MIG layout per GPU, e.g. 3g.71gb+3g.71gb.")
@click.option("--gpu-isolation", is_flag=True, help="Each rank sees only its own GPU.")
@click.option("--exclusive", is_flag=True, help="Hold the nodes exclusively (needed for node tuning/MIG).")
@click.option("--python", default=None, help="Interpreter for a .py SCRIPT (default: this gsrun's).")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job, stream its output, exit with its exit code.")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(gpus, nodes, gpus_per_node, time_, partition, job_name, output, cpus_per_task, mail_type,
        mail_user, tune, mps, mig, gpu_isolation, exclusive, python, dry_run, wait, script, args):
    """Run SCRIPT [ARGS...] as one task per GPU on Slurm."""
    cfg = load_config()
    job_name = job_name or _default_name(script)
    validate_fields(job_name, partition, time_, mail_type, mail_user)
    if tune:
        from gsrun.request.tune import parse_tune_request
        parse_tune_request(tune)
    if mps is not None:
        pct = parse_mps_share(mps, "--mps", phase="submit")
        mps = "" if pct is None else str(pct)
    if mig:
        from gsrun.request.mig_layout import parse_layout
        mig = cfg["mig.layouts"].get(mig, mig)
        parse_layout(mig)
    if cpus_per_task is not None and not 1 <= cpus_per_task <= 4096:
        raise InputError("submit", "bad --cpus-per-task", str(cpus_per_task))
    cluster_gpn = None
    if nodes is None and gpus_per_node is None:
        cluster_gpn = gpus_per_node_from_cluster(partition)
    n_nodes, gpn = plan_nodes(gpus, nodes, gpus_per_node, cluster_gpn)
    spec = JobSpec(
        gpus=gpus, nodes=n_nodes, gpus_per_node=gpn,
        command=_command(script, args, python), job_name=job_name, partition=partition,
        time=time_, output=output, cpus_per_task=cpus_per_task,
        mail_type=mail_type.upper() if mail_type else None, mail_user=mail_user,
        tune=tune, mps=mps, mig=mig, gpu_isolation=gpu_isolation, exclusive=exclusive,
        bind_exe=_bind_exe(), nccl_env=tuple(sorted(cfg["nccl.env"].items())),
        mps_dir=cfg["paths.mps_dir"])
    text = render_script(spec)
    if dry_run:
        click.echo(text, nl=False)
        return 0
    from gsrun.wrapper.submit import follow, submit

    job_id = submit(text, cwd=os.getcwd())
    click.echo(f"gsrun: submitted job {job_id}: {gpus} GPUs on {n_nodes} node(s)", err=True)
    if not wait:
        click.echo(job_id)
        return 0
    rc = follow(job_id)
    click.echo(f"gsrun: job {job_id} exited {rc}; report: gseff {job_id}", err=True)
    return rc


def gpus_per_node_from_cluster(partition):
    return gpus_per_node(partition)


def _default_name(script: str) -> str:
    import re

    base = os.path.basename(script) or "gsrun"
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", base)[:128]
    return name or "gsrun"


def main(argv=None) -> None:
    run_cli(cli, "gsrun", argv)
