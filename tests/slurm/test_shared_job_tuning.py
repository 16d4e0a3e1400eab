"""Node tuning on the real local cluster decided by exclusivity: a shared 1-GPU job
that asks for tuning leaves the node's settings alone (during the job, read by the
job itself from the fake host tree, and after it), its prolog records it as not
exclusive, and it still completes with 0:0; the same request in an ``--exclusive``
job is in force during the job and restored after it. The decision itself over each
Slurm release's record: tests/recorded/test_slurm_records.py."""

from __future__ import annotations

import json
import re
import time


def _swappiness_script(cluster) -> str:
    """Prints the swappiness of the fake host tree of the node it runs on at its
    start and again after a few seconds (the job's whole life: both must be one value)."""
    return cluster.user_script("swappiness-twice.sh", f"""#!/bin/bash
[ "${{SLURM_PROCID:-0}}" = 0 ] || exit 0
f={cluster.hostroot}/$SLURMD_NODENAME/proc/sys/vm/swappiness
[ -e "$f" ] || f={cluster.hostroot}/proc/sys/vm/swappiness
echo "node=$SLURMD_NODENAME"
echo "start=$(cat "$f")"
sleep 3
echo "later=$(cat "$f")"
""")


def _values(stdout: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^(node|start|later)=(\S*)$", stdout, re.M))


def _end_state(cluster, job: str) -> tuple[str, str]:
    cluster.wait_job_done(job)
    line = cluster.as_root(["scontrol", "-o", "show", "job", job]).stdout
    state, code = re.search(r"(?:^| )JobState=(\S+)", line), re.search(r"(?:^| )ExitCode=(\S+)", line)
    assert state and code, line
    return state.group(1), code.group(1)


def _wait_baseline(cluster, timeout_s: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while cluster.hostroot_changes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return cluster.hostroot_changes()


def test_shared_job_asking_for_tuning_leaves_the_node_alone(cluster):
    assert cluster.hostroot_changes() == [], "fake host tree not at baseline before the test"
    show = _swappiness_script(cluster)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--tune", "swappiness=10",
                          "--output", "shared-tune-%j.out", show])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    got = _values(cp.stdout)
    node = got.get("node")
    assert node, cp.stdout
    base = cluster.hostroot / node / "proc/sys/vm/swappiness"
    if not base.exists():
        base = cluster.hostroot / "proc/sys/vm/swappiness"
    before = base.read_text().strip()
    assert before != "10", "the baseline must differ from the request for the test to mean anything"
    # during the job: the job itself saw the baseline, at its start and seconds later
    assert (got["start"], got["later"]) == (before, before), cp.stdout
    # the prolog: the record says not exclusive, and the tuning was refused for that
    rec = json.loads((cluster.spool / "jobs" / job / f"prolog-{node}.json").read_text())
    assert rec["exclusive"] is False and rec["request"]["exclusive"] is False, rec["request"]
    assert rec["request"]["exclusive_source"].startswith("job record "), rec["request"]
    items = rec["steps"]["tuning"]["items"]
    assert [i["action"] for i in items] == ["refused"] and "exclusive" in items[0]["reason"], items
    # after the job: nothing of the host tree changed, and Slurm ends the job as a success
    assert _wait_baseline(cluster) == []
    assert _end_state(cluster, job) == ("COMPLETED", "0:0")


def test_exclusive_job_asking_for_tuning_has_it_during_the_job_and_restored_after(cluster):
    assert cluster.hostroot_changes() == [], "fake host tree not at baseline before the test"
    show = _swappiness_script(cluster)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--exclusive", "--wait", "--tune", "swappiness=10",
                          "--output", "excl-tune-%j.out", show])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    got = _values(cp.stdout)
    node = got.get("node")
    assert node, cp.stdout
    assert (got["start"], got["later"]) == ("10", "10"), cp.stdout
    rec = json.loads((cluster.spool / "jobs" / job / f"prolog-{node}.json").read_text())
    assert rec["exclusive"] is True and rec["request"]["exclusive"] is True, rec["request"]
    assert rec["steps"]["tuning"]["applied"] == ["swappiness"], rec["steps"]["tuning"]
    assert _wait_baseline(cluster) == []
    assert _end_state(cluster, job) == ("COMPLETED", "0:0")
