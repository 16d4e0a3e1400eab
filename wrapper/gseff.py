"""``gseff JOBID``: the job's GPU efficiency report (seff for GPUs).

Reads ``<spool>/jobs/<id>/summary.json`` (as root) or ``user-summary.json``
(the job's user); when the job summary is missing or older than a node
summary, merges the node summaries here. A running job shows what the
sampler has so far.
"""

from __future__ import annotations

import json
import os
import sys

import click

from ..config import load_config
from ..errors import GsrunError, InputError
from ..fsutil import read_json
from ..paths import Paths
from ..slurm import validate_job_id


def load_summary(paths: Paths, job_id: str) -> dict:
    """The job summary for ``job_id``.

    Raises:
        InputError: no record of the job here (unknown id, another user's job,
            or a spool that is not shared with this host).
    """
    d = paths.spool_job(job_id)
    names = ("summary.json", "user-summary.json")
    summary = None
    for n in names:
        summary = read_json(d / n)
        if summary:
            break
    nodes = []
    for p in sorted(d.glob("node-*.json")) + sorted(d.glob("user-node-*.json")):
        s = read_json(p)
        if s and s.get("kind") == "node" and s["node"] not in {x["node"] for x in nodes}:
            nodes.append(s)
    if summary is None or len(nodes) > len(summary["job"]["nodes"]) - len(summary.get("nodes_missing", [])):
        if not nodes:
            if summary:
                return summary
            raise InputError("gseff", "no report for job", job_id,
                             hint="the job may still be pending, belong to another user, or have run on a "
                                  "cluster whose spool is not shared with this host")
        from ..summary import job_summary
        base = summary["job"] if summary else {"id": job_id, "nodes": sorted(n["node"] for n in nodes),
                                                "state": "RUNNING or unmerged"}
        summary = job_summary(base, nodes)
    return summary


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the summary JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a per-GPU timeline PNG.")
@click.option("--spool-dir", default=None, hidden=True)
def cli(job_id, as_json, plot, spool_dir):
    """Show the GPU efficiency report of JOB_ID."""
    validate_job_id(job_id.strip())
    cfg = load_config()
    paths = Paths.from_config(cfg, None, spool_dir)
    summary = load_summary(paths, job_id.strip())
    if as_json:
        click.echo(json.dumps(summary, indent=1, sort_keys=True))
    else:
        from ..report import render_text
        click.echo(render_text(summary, color=sys.stdout.isatty() and not os.environ.get("NO_COLOR")), nl=False)
    if plot:
        from ..report import render_png
        png = render_png(summary)
        if png is None:
            raise InputError("gseff", "no plot", "no GPU timeline in this job (or matplotlib missing)")
        with open(plot, "wb") as f:
            f.write(png)
        click.echo(f"gseff: wrote {plot}", err=True)
    return 0


def main(argv=None) -> None:
    try:
        rc = cli.main(args=argv, prog_name="gseff", standalone_mode=False)
    except GsrunError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(rc or 0)
