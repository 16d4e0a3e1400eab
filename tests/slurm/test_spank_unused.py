"""The SPANK plugin costs nothing when unused and never blocks submission,
on the real local cluster: its plugstack line is pointed at
a Python side that cannot be imported, or given ``bind=none``, for the length
of one test and put back after it whatever the outcome.

Evidence comes from what Slurm's own clients print and from the prolog
records slurmd's prolog wrote (``<spool>/jobs/<id>/prolog-<node>.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

PARTITION = "gpu"


def _plugin_line(cluster) -> str:
    text = (cluster.dir / "etc" / "plugstack.conf").read_text()
    lines = [ln for ln in text.splitlines() if "gsrun_spank.so" in ln]
    if not lines:
        pytest.skip("the cluster runs without the SPANK plugin (tests/cluster/up --no-spank)")
    return lines[0]


@contextlib.contextmanager
def _plugstack(cluster, line: str):
    """Use ``line`` as the whole plugstack.conf (sbatch/srun read it at start,
    slurmstepd at each step), then restore the file."""
    plug = cluster.dir / "etc" / "plugstack.conf"
    original = plug.read_text()
    plug.write_text(line + "\n")
    try:
        yield
    finally:
        plug.write_text(original)


@contextlib.contextmanager
def _broken_python_side():
    """A pythonpath= folder whose ``gsrun`` package raises on import (what a
    half-finished upgrade looks like to the plugin); readable by the test user."""
    d = Path(tempfile.mkdtemp(prefix="gsrun-broken-", dir="/tmp"))
    try:
        os.chmod(d, 0o755)
        (d / "gsrun").mkdir(mode=0o755)
        (d / "gsrun" / "__init__.py").write_text("raise ImportError('gsrun broken on purpose by test_spank_unused')\n")
        os.chmod(d / "gsrun" / "__init__.py", 0o644)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _replace_arg(line: str, key: str, value: str) -> str:
    return " ".join([w for w in line.split() if not w.startswith(key + "=")] + [f"{key}={value}"])


def _prolog_record(cluster, job: str, node: str = "gpu01") -> dict:
    path = cluster.spool / "jobs" / job / f"prolog-{node}.json"
    assert cluster.wait_file(path, 60), f"no prolog record {path}"
    return json.loads(path.read_text())


def test_broken_python_side_does_not_block_plain_sbatch_and_refuses_gs_options(cluster):
    line = _plugin_line(cluster)
    with _broken_python_side() as broken, _plugstack(cluster, _replace_arg(line, "pythonpath", str(broken))):
        plain = cluster.as_user(["sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null", "--wrap", "true"])
        refused = cluster.as_user(["sbatch", "-p", PARTITION, "-o", "/dev/null", "--gs-mps=50",
                                   "--wrap", "true"])
        step = cluster.as_user(["srun", "-p", PARTITION, "-N", "1", "-n", "1", "sh", "-c", 'echo "$SLURM_JOB_ID"'])
        helps = cluster.as_user(["sbatch", "--help"])
    assert plain.returncode == 0, plain.stderr
    assert "gsrun" not in plain.stderr, plain.stderr                  # as if the plugin were absent
    job = plain.stdout.strip().split(";")[0]
    assert job.isdigit(), plain.stdout
    assert refused.returncode != 0 and "Submitted batch job" not in refused.stdout
    assert "gsrun: spank: python: cannot import gsrun.spank_py.hooks" in refused.stderr, refused.stderr
    assert "gsrun broken on purpose by test_spank_unused" in refused.stderr
    assert ("gsrun: spank: options: --gs-mps given, but gsrun's Python side cannot be loaded on this host: "
            "job refused") in refused.stderr
    assert "hint: submit without --gs-* options" in refused.stderr
    assert step.returncode == 0, step.stderr                          # a bound step runs (the daemon plans it)
    assert step.stdout.strip().isdigit(), step.stdout
    cluster.assert_srun_ok(step, step.stdout.strip())
    assert "--gs-mps" in helps.stdout                                 # options come from the compiled table
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    assert _prolog_record(cluster, job)["spank"] == {}


def test_options_still_reach_the_prolog_and_the_tasks(cluster):
    """With the working plugin: sbatch's and srun's --gs-* options reach the
    prolog as SPANK_GS_*, and srun's --gs-mps gives the task the MPS env
    (the node daemon planned the step for the forwarded option)."""
    _plugin_line(cluster)
    sb = cluster.as_user(["sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null", "--gs-mps=50",
                          "--gs-report=none", "--gs-tune=swappiness=10", "--wrap", "true"])
    assert sb.returncode == 0, sb.stderr
    job = sb.stdout.strip().split(";")[0]
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    assert _prolog_record(cluster, job)["spank"] == {"SPANK_GS_MPS": "50", "SPANK_GS_REPORT": "none",
                                                     "SPANK_GS_TUNE": "swappiness=10"}
    sr = cluster.as_user(["srun", "-p", PARTITION, "-N", "1", "-n", "1", "--gs-mps=25", "sh", "-c",
                          'echo "$SLURM_JOB_ID $CUDA_MPS_PIPE_DIRECTORY"'])
    assert sr.returncode == 0, sr.stderr
    words = sr.stdout.split()
    assert len(words) == 2, sr.stdout                                 # no MPS env: no plan from the daemon
    job2, pipe = words
    assert pipe.endswith(f"/{job2}/pipe"), sr.stdout
    cluster.assert_srun_ok(sr, job2)
    assert _prolog_record(cluster, job2)["spank"] == {"SPANK_GS_MPS": "25"}


def test_bind_none_and_no_option_leaves_tasks_alone(cluster):
    """bind=none and no --gs-* option: slurmstepd asks the node daemon for no plan, so
    the task carries none of the binding's variables (with bind=auto it does:
    tests/slurm/test_spank_cluster.py)."""
    line = _plugin_line(cluster)
    with _plugstack(cluster, _replace_arg(line, "bind", "none")):
        p = cluster.as_user(["srun", "-p", PARTITION, "-N", "1", "-n", "2", "sh", "-c",
                             'echo "x${GSRUN_BIND_CPUS:-unset} $SLURM_JOB_ID"'])
    assert p.returncode == 0, p.stderr
    rows = sorted(ln.split() for ln in p.stdout.splitlines() if ln.strip())
    assert len(rows) == 2 and [r[0] for r in rows] == ["xunset", "xunset"], p.stdout
    assert rows[0][1:] == rows[1][1:] and len(rows[0]) == 2 and rows[0][1].isdigit(), p.stdout
    cluster.assert_srun_ok(p, rows[0][1])
