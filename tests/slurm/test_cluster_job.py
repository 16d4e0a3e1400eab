"""The main job on the real local cluster: 8 ranks over gpu01 and gpu02."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _copy_to_work(cluster, name: str) -> str:
    dst = cluster.work / name
    shutil.copy(REPO / "examples" / name, dst)
    shutil.chown(dst, "gsrun-test")
    return name


def test_main_job_eight_ranks_two_nodes_and_gseff(cluster):
    script = _copy_to_work(cluster, "train.py")
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--wait", "--output", "main-%j.out", script, "--seconds", "2"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    ranks = [ln for ln in cp.stdout.splitlines() if ln.startswith("rank ")]
    assert len(ranks) == 8, cp.stdout
    seen = set()
    for ln in ranks:
        f = ln.split()
        node, local = f[3], f[5]
        cpus = f[f.index("cpus") + 1]
        seen.add((node, local))
        # gsrun-bind gave each rank CPUs of its own (2 real CPUs, 4 ranks per node: round-robin)
        assert cpus in ("0", "1"), ln
        assert int(local) % 2 == int(cpus), ln
    assert seen == {(n, str(i)) for n in ("gpu01", "gpu02") for i in range(4)}
    assert "trained" in cp.stdout
    # evidence written by slurmd's own prolog/epilog and slurmctld's EpilogSlurmctld
    jd = cluster.spool / "jobs" / job
    assert cluster.wait_file(jd / "user-summary.json", 60)
    for node in ("gpu01", "gpu02"):
        rec = json.loads((jd / f"prolog-{node}.json").read_text())
        assert rec["job"]["node"] == node and rec["job"]["gpus"] == [0, 1, 2, 3]
        summ = json.loads((jd / f"node-{node}.json").read_text())
        assert summ["samples"] >= 1 and summ["cpu_time_s"] > 0
    out = cluster.as_user(["gseff", job], check=True).stdout
    assert f"job {job}" in out and "gpu01" in out and "gpu02" in out
    assert "CPU efficiency" in out
    js = json.loads(cluster.as_user(["gseff", "--json", job], check=True).stdout)
    assert js["job"]["nodes"] == ["gpu01", "gpu02"]
    assert js["job"]["gpus_alloc"] == 8 and js["gpu"]["count"] == 8
    assert js["job"]["state"] == "COMPLETED" and js["job"]["exit_code"] == 0
    assert js["cpu"]["time_s"] > 0 and 0 < js["cpu"]["efficiency_pct"] <= 100


def test_hostile_argument_reaches_script_literally(cluster, tmp_path):
    (cluster.work / "argv.py").write_text("import sys, os\nif os.environ.get('SLURM_PROCID') == '0':\n"
                                          "    print('ARGV=' + repr(sys.argv[1:]))\n")
    shutil.chown(cluster.work / "argv.py", "gsrun-test")
    marker = Path("/tmp/pwned")
    marker.unlink(missing_ok=True)
    hostile = "'$(touch /tmp/pwned)'; echo x"
    others = ["a b", "`touch /tmp/pwned`", "*", "$HOME", "line1\nline2", "\"quoted\""]
    dry = cluster.as_user(["gsrun", "--gpus", "1", "--dry-run", "argv.py", hostile, *others], check=True).stdout
    subprocess.run(["bash", "-n"], input=dry, text=True, check=True)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--output", "argv-%j.out", "argv.py", hostile, *others])
    assert cp.returncode == 0, cp.stderr
    cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith("ARGV=")]
    assert line, cp.stdout
    assert eval(line[0][5:]) == [hostile, *others]  # noqa: S307 - repr of a list of str we printed
    assert not marker.exists()


def test_wait_propagates_failing_exit_code(cluster):
    script = _copy_to_work(cluster, "train.py")
    # the script exits 3: gsrun --wait exits 3, the job is FAILED with exit code 3
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--output", "fail-%j.out",
                          script, "--fail-rank", "0"])
    assert cp.returncode == 3, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "FAILED", "3:0")
    assert cluster.wait_file(cluster.spool / "jobs" / job / "user-summary.json", 60)
    js = json.loads(cluster.as_user(["gseff", "--json", job], check=True).stdout)
    assert js["job"]["state"] == "FAILED" and js["job"]["exit_code"] == 3
    # one rank fails: srun kills the others (--kill-on-bad-exit) and Slurm records srun's
    # exit code, 143 (the others' SIGTERM); gsrun names the rank that failed first and
    # exits with its code, from srun's own lines
    cp = cluster.as_user(["gsrun", "--gpus", "2", "--gpus-per-node", "1", "--wait", "--output", "fail-%j.out",
                          script, "--fail-rank", "1"])
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "task 1: Exited with exit code 3" in cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    assert re.search(rf"gsrun: job {job}: FAILED after \S+; rank 1 on gpu0[12] failed first: exit code 3; "
                     rf"output: \S+/fail-{job}.out; report: gseff {job}", cp.stderr), cp.stderr
    cluster.assert_job_end(job, "FAILED", "143:0")


def test_gseff_refuses_unknown_and_bad_ids(cluster):
    cp = cluster.as_user(["gseff", "987654"])
    assert cp.returncode == 2 and "gsrun: gseff: unknown job: 987654" in cp.stderr and "hint:" in cp.stderr
    cp = cluster.as_user(["gseff", "1;id"])
    assert cp.returncode == 2 and "bad job id" in cp.stderr


def test_other_user_cannot_read_summary(cluster):
    jobs = sorted((cluster.spool / "jobs").iterdir(), key=lambda p: int(p.name))
    done = [j for j in jobs if (j / "user-summary.json").exists()]
    assert done, "no finished job yet"
    cp = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(done[-1] / "user-summary.json")],
                        capture_output=True, text=True)
    assert cp.returncode != 0 and "Permission denied" in cp.stderr
    cp = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(done[-1] / "summary.json")],
                        capture_output=True, text=True)
    assert cp.returncode != 0
