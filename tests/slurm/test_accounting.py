"""Slurm accounting end to end: slurmdbd + MariaDB on the local cluster.

Needs a cluster started with ``tests/cluster/up --accounting`` and
``GSRUN_TEST_ACCOUNTING=1`` (plus ``GSRUN_TEST_CLUSTER``, as every test here).
For the job's duration the cluster's fake host tree gets an NVML recording
with four H200s (minor numbers 0-3, fixed utilization and memory), so the
job summary has GPU figures; it is removed again afterwards (the node tests
compare the tree with its baseline).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from gsrun.facts.sacct import SACCT_FORMAT, efficiency_from_sacct
from gsrun.report.summary import decode_js1
from helpers.jobstats_layout import check_jobstats_layout

REPO = Path(__file__).resolve().parents[2]
VENV = os.environ.get("GSRUN_VENV", "/opt/gsrun/venv")
UTIL = [37, 47, 57, 67]            # % per GPU index (fake NVML answers)
MEM_USED = [10, 20, 30, 40]        # GiB per GPU index

pytestmark = [
    pytest.mark.skipif(os.environ.get("GSRUN_TEST_ACCOUNTING") != "1",
                       reason="needs tests/cluster/up --accounting and GSRUN_TEST_ACCOUNTING=1"),
]


def _fake_nvml() -> dict:
    rec = json.loads((REPO / "tests/data/hosts/h200-vm/nvml.json").read_text())
    dev0 = rec["devices"][0]
    total = dev0["memory"]["ok"]["total"]
    devs = []
    for i in range(4):
        d = copy.deepcopy(dev0)
        d["index"] = {"ok": i}
        d["minor"] = {"ok": i}
        d["uuid"] = {"ok": f"GPU-00000000-0000-0000-0000-00000000000{i}"}
        bus = f"00000000:0{i + 1}:00.0"
        if "ok" in d.get("pci", {}):
            d["pci"]["ok"] = dict(d["pci"]["ok"], busId=bus, busIdLegacy=bus[4:])
        d["utilization"] = {"ok": {"gpu": UTIL[i], "memory": 10}}
        used = MEM_USED[i] << 30
        # v2 answer ("reserved" present): the figures reach sacct as set; a v1-only answer
        # would be read minus the prolog's baseline (the same static value here: 0)
        d["memory"] = {"ok": {"total": total, "reserved": 0, "used": used, "free": total - used}}
        d.pop("memory_v2", None)
        devs.append(d)
    rec["devices"] = devs
    return rec


def _sacct(cluster, *args) -> str:
    return cluster.as_root(["sacct", "-P", "-n", *args]).stdout


@pytest.fixture(scope="module")
def acct_job(cluster):
    """One 8-GPU job on both nodes, with fake NVML figures; its id."""
    with cluster.fake_nvml(_fake_nvml()):
        dst = cluster.work / "train.py"
        shutil.copy(REPO / "examples" / "train.py", dst)
        shutil.chown(dst, "gsrun-test")
        cp = cluster.as_user(["gsrun", "--gpus", "8", "--wait", "--output", "acct-%j.out", "train.py",
                              "--seconds", "3"])
        assert cp.returncode == 0, cp.stdout + cp.stderr
        job = cluster.job_id_from(cp.stderr)
        cluster.assert_job_end(job, "COMPLETED", "0:0")
        assert cluster.wait_file(cluster.spool / "jobs" / job / "summary.json", 60)
    # the background step stores AdminComment once slurmdbd has the final record
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _sacct(cluster, "-X", "--format=AdminComment", "-j", job).strip().startswith("JS1:"):
            break
        time.sleep(1)
    return job


def test_sacct_has_gpu_tres_and_js1(cluster, acct_job):
    line = _sacct(cluster, "-X", "--format=JobID,State,AllocTRES,AdminComment", "-j", acct_job).strip()
    jid, state, tres, comment = line.split("|", 3)
    assert (jid, state) == (acct_job, "COMPLETED")
    assert "gres/gpu=8" in tres.split(","), tres
    blob = decode_js1(comment)
    check_jobstats_layout(blob, gpus=True)       # what jobstats needs to render it
    assert blob["gpus"] == 8
    assert sorted(blob["nodes"]) == ["gpu01", "gpu02"]
    for node in ("gpu01", "gpu02"):
        nd = blob["nodes"][node]
        assert nd["gpu_utilization"] == {str(i): float(UTIL[i]) for i in range(4)}, nd
        assert nd["gpu_used_memory"] == {str(i): MEM_USED[i] << 30 for i in range(4)}, nd
        assert nd["cpus"] == 4


def test_gseff_agrees_with_sacct(cluster, acct_job):
    eff = efficiency_from_sacct(_sacct(cluster, "--format=" + ",".join(SACCT_FORMAT), "-j", acct_job),
                                SACCT_FORMAT, acct_job)
    spool = json.loads(cluster.as_user(["gseff", "--json", acct_job], check=True).stdout)
    acct = json.loads(cluster.as_user(["gseff", "--json", "--sacct", acct_job], check=True).stdout)
    # gseff --sacct is the sacct parser's figure, exactly
    assert acct["efficiency"]["cpu_eff_pct"] == pytest.approx(eff.cpu_eff_pct)
    assert acct["efficiency"]["mem_peak_bytes"] == eff.mem_peak_bytes
    assert acct["gpu"]["util_mean_pct"] == pytest.approx(sum(UTIL) / 4)
    # gsrun's own sampling (psutil / cgroup) vs Slurm's accounting: same job, other
    # clocks -- CPU efficiency within 2 points, memory peak within 15 %
    assert spool["cpu"]["efficiency_pct"] == pytest.approx(eff.cpu_eff_pct, abs=2.0)
    assert spool["memory"]["peak_bytes"] == pytest.approx(eff.mem_peak_bytes, rel=0.15)


def test_gseff_unknown_job_message(cluster):
    cp = cluster.as_user(["gseff", "999999"])
    assert cp.returncode == 2
    assert "unknown job: 999999" in cp.stderr and "sacct -j" in cp.stderr


def test_reportseff_shows_gpu_efficiency(cluster, acct_job):
    # reportseff is in the test extra (tests/cluster/up installs it: no download while the tests run)
    assert (Path(VENV) / "bin" / "reportseff").exists(), "pip install '.[test]' brings reportseff"
    cp = cluster.as_user(["reportseff", "--no-color", "--format", "JobID,State,CPUEff,GPUEff,GPUMem", acct_job],
                         check=True)
    rows = [ln.split() for ln in cp.stdout.splitlines() if ln.split()[:1] == [acct_job]]
    assert rows, cp.stdout
    _, state, cpu, gpu, gpumem = rows[0]
    assert state == "COMPLETED"
    assert float(gpu.rstrip("%")) == pytest.approx(sum(UTIL) / 4, abs=0.1)
    total = json.loads((REPO / "tests/data/hosts/h200-vm/nvml.json").read_text())["devices"][0]["memory"]["ok"]["total"]
    want_mem = sum(round((m << 30) / total * 100, 1) for m in MEM_USED) / 4
    assert float(gpumem.rstrip("%")) == pytest.approx(want_mem, abs=0.1)
    assert re.match(r"^\d+(\.\d)?%$", cpu)
