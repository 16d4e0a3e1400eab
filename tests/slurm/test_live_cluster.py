"""While the job runs, on the real local cluster with scripted fake NVML GPUs (tests/helpers/fake_nvml.py:
idle from the sampler's start): an idle job gets exactly one alert mail on the test SMTP server while it
runs, gseff shows RUNNING figures, and with ``idle.cancel = "on"`` it is cancelled after
``idle.cancel_after_min`` with the reason in its report; a job in an exempt partition is not cancelled and
``gsrun --wait`` prints the alert line.

The fixture puts the fake NVML into both fake host roots and an ``[idle]`` table with thresholds of
seconds into the cluster's gsrun.toml (read by each job's prolog and at its begin by the node monitor),
and puts both back after (``tests/cluster/up --fake-nvml`` does the NVML part for a whole session)."""

from __future__ import annotations

import json
import re
import shutil
import time
from email import policy as email_policy
from email.parser import BytesParser

import pytest

from helpers.fake_nvml import work_then_idle

WARN_MIN = 0.1          # 6 s
CANCEL_MIN = 0.5        # 30 s
GRACE_MIN = 0.1         # 6 s between the warning and the cancel
IDLE_TABLE = f"""
[idle]
warn_after_min = {WARN_MIN}
cancel = "on"
cancel_after_min = {CANCEL_MIN}
cancel_grace_min = {GRACE_MIN}
exempt_partitions = ["gpu-exempt"]
mail_per_user_per_hour = 20
"""


@pytest.fixture
def idle_site(cluster):
    conf = cluster.gsrun_config
    before = conf.read_text()
    text = before if "default_domain" in before else before.replace("[mail]\n", '[mail]\ndefault_domain = "localhost"\n', 1)
    conf.write_text(text + IDLE_TABLE)
    try:
        if (cluster.hostroot / "gpu01" / "nvml.json").exists():     # tests/cluster/up --fake-nvml
            yield cluster
        else:
            with cluster.fake_nvml(work_then_idle(4, 0.0)):
                yield cluster
    finally:
        conf.write_text(before)


def _script(cluster, name: str, seconds: int) -> str:
    p = cluster.work / name
    p.write_text(f"#!/bin/bash\nsleep {seconds}\necho slept\n")
    p.chmod(0o755)
    shutil.chown(p, "gsrun-test")
    return str(p)


def _alerts_for(received, job: str, kind: str) -> list:
    """The job's alert mails of ``kind``; ``idle`` also counts ``never_used`` (the fake
    GPUs here are never used, so the unused-GPU alert is the idle one)."""
    kinds = ("idle", "never_used") if kind == "idle" else (kind,)
    out = []
    for e in received:
        msg = BytesParser(policy=email_policy.default).parsebytes(e.content)
        if msg["X-Gsrun-Job"] == job and msg["X-Gsrun-Alert"] in kinds:
            out.append(msg)
    return out


def _state(cluster, job: str) -> str:
    return cluster.job_state(job)


def test_idle_job_alerted_once_live_report_then_cancelled_with_reason(idle_site, smtp_server):
    cluster = idle_site
    script = _script(cluster, "idle-300.sh", 300)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--output", "idle-%j.out", script], check=True)
    job = cp.stdout.strip().splitlines()[-1]
    assert job.isdigit(), cp.stdout + cp.stderr
    jd = cluster.spool / "jobs" / job
    t0 = time.monotonic()
    # the live node file appears at the sampler's first flush; gseff reads it as the job's user
    live = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and live is None:
        hits = list(jd.glob("user-live-*.json")) if jd.exists() else []
        live = hits[0] if hits else None
        time.sleep(0.5)
    assert live is not None, f"no live file in {jd}"
    assert live.stat().st_size < 8192 and live.stat().st_mode & 0o777 == 0o440 and live.stat().st_uid == 0
    # the alert: in the live file (and so in gseff) within seconds of warn_after_min
    deadline = time.monotonic() + 40
    js = {}
    while time.monotonic() < deadline:
        cp = cluster.as_user(["gseff", "--json", job])
        if cp.returncode == 0:
            js = json.loads(cp.stdout)
            if js.get("live", {}).get("alerts"):
                break
        time.sleep(1)
    assert _state(cluster, job) == "RUNNING"
    # running: Slurm has no elapsed time for it yet; the sampled span stands in, labelled so
    assert js["job"]["state"] == "RUNNING" and js["job"]["elapsed_s"] is None and js["job"]["sampled_s"] > 0
    dev = js["gpu"]["devices"][0]
    assert dev["status"] == "ok" and dev["util_mean_pct"] == 0.0 and dev["power_mean_w"] == 70.0
    assert re.match(r"GPU 0 on gpu0[12] ", js["live"]["alerts"][0]), js["live"]
    text = cluster.as_user(["gseff", job], check=True).stdout
    assert text.startswith("RUNNING: figures as of") and "ALERT: GPU 0 on gpu0" in text
    # exactly one alert mail while it runs
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _alerts_for(smtp_server, job, "idle"):
        time.sleep(0.5)
    assert len(_alerts_for(smtp_server, job, "idle")) == 1
    assert _state(cluster, job) == "RUNNING"
    # warned at cancel_after_min of all-idle GPUs, cancelled cancel_grace_min later (+ the 2 s
    # flush and scancel): scancel's SIGTERM ends the batch script, Slurm records signal 15
    cluster.assert_job_end(job, "CANCELLED", "0:15", timeout_s=120, output=cluster.work / f"idle-{job}.out")
    took = time.monotonic() - t0
    assert (CANCEL_MIN + GRACE_MIN) * 60 - 5 < took < 100, took
    marker = json.loads((jd / "idle-cancel.json").read_text())
    assert "idle" in marker["reason"]
    assert cluster.wait_file(jd / "user-summary.json", 60)
    # EpilogSlurmctld saw the job COMPLETING: its state is a guess until the background
    # step has read Slurm's final one (epilog/ctld.py settle_state, seconds)
    deadline = time.monotonic() + 60
    while True:
        final = json.loads(cluster.as_user(["gseff", "--json", job], check=True).stdout)
        if final["job"].get("state_source") != "exit_code" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert final["job"]["state"] == "CANCELLED" and final["job"]["state_source"] == "slurm" and "live" not in final
    notes = [n for ns in final["node_notes"].values() for n in ns]
    assert any(n.startswith("cancelled by gsrun (idle GPUs): ") for n in notes), notes
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _alerts_for(smtp_server, job, "cancel"):
        time.sleep(0.5)
    time.sleep(3)       # a duplicate would have arrived by now
    assert len(_alerts_for(smtp_server, job, "idle")) == 1
    cancel = _alerts_for(smtp_server, job, "cancel")
    assert len(cancel) == 1 and marker["reason"][:60] in cancel[0].get_content()
    assert len(_alerts_for(smtp_server, job, "warning")) == 1       # the warning before the cancel
    log = (cluster.dir / "log" / "gsrun.log").read_text()
    assert "cancelled by gsrun (idle GPUs)" in log


def test_exempt_partition_not_cancelled_and_wait_prints_alert(idle_site, smtp_server):
    cluster = idle_site
    seconds = int(CANCEL_MIN * 60) + 15
    script = _script(cluster, "idle-exempt.sh", seconds)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--partition", "gpu-exempt", "--wait",
                          "--output", "exempt-%j.out", script], timeout=seconds + 120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    assert "slept" in cp.stdout
    alert = [ln for ln in cp.stderr.splitlines() if ": ALERT: " in ln]
    assert len(alert) == 1 and re.match(rf"gsrun: job {job}: ALERT: GPU 0 on gpu0[12] (idle|not used by the job) since ", alert[0]), cp.stderr
    assert not (cluster.spool / "jobs" / job / "idle-cancel.json").exists()
    assert cluster.wait_file(cluster.spool / "jobs" / job / "user-summary.json", 60)
    final = json.loads(cluster.as_user(["gseff", "--json", job], check=True).stdout)
    assert final["job"]["state"] == "COMPLETED"
    notes = [n for ns in final["node_notes"].values() for n in ns]
    assert not any("cancel" in n for n in notes), notes
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _alerts_for(smtp_server, job, "idle"):
        time.sleep(0.5)
    assert len(_alerts_for(smtp_server, job, "idle")) == 1 and not _alerts_for(smtp_server, job, "cancel")
