"""The prolog sends no RPC for a job that asked gsrun for nothing, on the real Slurm of the local cluster: slurmd's own prolog records
the Slurm commands it ran under ``"slurm_calls"``, and where the job comment
came from under ``"request"."comment_from"``.

These also check the premise on this Slurm: slurmd hands the prolog the job
credential's fields, ``SLURM_JOB_COMMENT`` among them when the job has one.
"""

from __future__ import annotations

import json
import time

PARTITION = "gpu"


def _record(cluster, job: str, node: str) -> dict:
    path = cluster.spool / "jobs" / job / f"prolog-{node}.json"
    assert cluster.wait_file(path, 60), f"no prolog record {path}"
    return json.loads(path.read_text())


def _sbatch(cluster, *opts) -> str:
    cp = cluster.as_user(["sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null", *opts, "--wrap", "true"])
    assert cp.returncode == 0, cp.stderr
    job = cp.stdout.strip().split(";")[0]
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    return job


def test_plain_two_node_job_makes_no_slurm_call(cluster):
    job = _sbatch(cluster, "-N", "2")
    for node in ("gpu01", "gpu02"):
        rec = _record(cluster, job, node)
        assert rec["slurm_calls"] == [], rec
        assert rec["request"]["source"] == "none"
        assert rec["request"]["comment_from"] == "prolog environment"   # the credential's fields were there


def test_comment_reaches_the_prolog_environment(cluster):
    """gsrun's comment (what the wrapper writes without the plugin): an MPS
    request needs no exclusivity, so again no RPC."""
    job = _sbatch(cluster, "--comment=notes gsrun:mps=50")
    rec = _record(cluster, job, "gpu01")
    assert rec["slurm_calls"] == []
    assert (rec["request"]["source"], rec["request"]["comment_from"], rec["request"]["mps"]) == \
        ("job comment", "prolog environment", "50")


def _node_of(cluster, job: str) -> str:
    """The one node the job ran on (its spool holds one prolog record per node)."""
    d = cluster.spool / "jobs" / job
    assert cluster.wait_file(d, 60), f"no spool directory {d}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = sorted(p.name for p in d.glob("prolog-*.json"))
        if names:
            return names[0][len("prolog-"):-len(".json")]
        time.sleep(0.5)
    raise AssertionError(f"no prolog record in {d}")


def test_tuning_request_asks_slurmctld_once_per_node_for_exclusivity(cluster):
    job = _sbatch(cluster, "--exclusive", "--comment=gsrun:tune=swappiness=10")
    rec = _record(cluster, job, _node_of(cluster, job))     # whichever node was free
    assert rec["slurm_calls"] == ["scontrol show job"]
    assert rec["request"]["comment_from"] == "prolog environment" and rec["exclusive"] is True
