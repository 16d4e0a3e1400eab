"""Node-side behaviour on the real local cluster: tuning applied by slurmd's
prolog and restored by its epilog (on the cluster's fake host tree), and the
report mail delivered exactly once to a real SMTP server on loopback."""

from __future__ import annotations

import json
import time


def test_tuning_in_force_during_job_and_restored_after(cluster):
    hr = cluster.hostroot / "gpu01"
    assert cluster.hostroot_changes() == [], "fake host tree not at baseline before the test"
    before = (hr / "proc/sys/vm/swappiness").read_text()
    show = cluster.user_script("show-tuning.sh", f"""#!/bin/bash
[ "$SLURM_PROCID" = 0 ] || exit 0
echo "swappiness=$(cat {hr}/proc/sys/vm/swappiness)"
echo "thp=$(cat {hr}/sys/kernel/mm/transparent_hugepage/enabled)"
echo "governor=$(cat {hr}/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor)"
""")
    cp = cluster.as_user(["gsrun", "--gpus", "2", "--gpus-per-node", "1", "--exclusive", "--wait",
                          "--tune", "swappiness=10,thp=never,governor=performance",
                          "--output", "tune-%j.out", show])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "swappiness=10" in cp.stdout
    assert "thp=always madvise [never]" in cp.stdout
    assert "governor=performance" in cp.stdout
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    for node in ("gpu01", "gpu02"):
        rec = json.loads((cluster.spool / "jobs" / job / f"prolog-{node}.json").read_text())
        assert rec["request"]["source"] == "job comment" and rec["exclusive"] is True
        assert sorted(rec["steps"]["tuning"]["applied"]) == ["governor", "swappiness", "thp"]
    # the epilogs of both nodes ran: the last one out restored the baseline byte for byte
    deadline = time.monotonic() + 60
    while cluster.hostroot_changes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.hostroot_changes() == []
    assert (hr / "proc/sys/vm/swappiness").read_text() == before
    # the report says what was in force: one line for both nodes (same settings)
    assert cluster.wait_file(cluster.spool / "jobs" / job / "user-summary.json", 60)
    text = cluster.as_user(["gseff", job], check=True).stdout
    flat = " ".join(text.split())       # the report wraps long lines
    assert flat.count("Node settings") == 1 and "Node settings during the job: " in flat, text
    line = flat.split("Node settings during the job: ", 1)[1]
    assert "swappiness=10 applied" in line and "thp=never applied" in line \
        and "governor=performance applied" in line, text
    js = json.loads(cluster.as_user(["gseff", "--json", job], check=True).stdout)
    assert [sorted(g["nodes"]) for g in js["settings"]] == [["gpu01", "gpu02"]]


def test_tuning_refused_for_shared_job(cluster):
    show = cluster.user_script("show-swappiness.sh",
                   f"#!/bin/bash\ncat {cluster.hostroot}/gpu01/proc/sys/vm/swappiness\n")
    before = (cluster.hostroot / "gpu01/proc/sys/vm/swappiness").read_text().strip()
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--tune", "swappiness=10",
                          "--output", "shared-%j.out", show])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip().splitlines()[-1] == before
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    rec = json.loads((cluster.spool / "jobs" / job / "prolog-gpu01.json").read_text())
    items = rec["steps"]["tuning"]["items"]
    assert items[0]["action"] == "refused" and "exclusive" in items[0]["reason"]
    assert cluster.wait_file(cluster.spool / "jobs" / job / "user-summary.json", 60)
    text = cluster.as_user(["gseff", job], check=True).stdout
    assert "swappiness=10 refused (" in " ".join(text.split()), text


def test_job_with_mail_type_end_gets_exactly_one_mail(cluster, smtp_server):
    job_script = cluster.user_script("hello.sh", "#!/bin/bash\necho hello from $SLURM_PROCID\n")
    cp = cluster.as_user(["gsrun", "--gpus", "2", "--wait", "--mail-type", "END",
                          "--mail-user", "gsrun-test@localhost", "--output", "mail-%j.out", job_script])
    assert cp.returncode == 0, cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    deadline = time.monotonic() + 90
    while not smtp_server and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)   # a duplicate would arrive by now
    mine = [e for e in smtp_server if f"job {job}".encode() in e.content]
    assert len(mine) == 1, [e.content[:200] for e in smtp_server]
    msg = mine[0].content.decode(errors="replace")
    assert mine[0].rcpt_tos == ["gsrun-test@localhost"]
    assert "multipart/alternative" in msg and "text/html" in msg
