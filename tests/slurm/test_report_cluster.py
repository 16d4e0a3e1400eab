"""gsrun-report over real accounting: slurmdbd + MariaDB on the local cluster, blobs stored by
the real EpilogSlurmctld, every figure of the report checked against the jobs' own summaries
(``gseff --json JOBID``).

Needs a cluster started with ``tests/cluster/up --accounting`` and ``GSRUN_TEST_ACCOUNTING=1``
(tests/run does both). The module's jobs run as the test user under an account of their own
(made here with sacctmgr, named by the run's start so a second run on the same cluster does
not see the first's jobs), so ``-A`` isolates them from the other tests' jobs:

- ``busy``: 2 GPUs on one node, fake NVML figures (utilization, memory, SM activity, an
  energy counter that rises 150 W);
- ``spread``: 2 GPUs on 2 nodes (one node would hold them: fragmented), fake NVML figures;
- ``bare``: 1 GPU without fake NVML (emulated GPUs: a blob without GPU figures).

The fake recording goes into both fake host roots for the first two jobs only and is removed
again afterwards (the node tests compare the tree with its baseline). The report runs as root
with a copy of the cluster's gsrun.toml whose ``min_gpu_hours`` is 0 (the jobs last seconds)
and whose mail has a default domain (the digest's address).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from gsrun.report.fleet import mig_fit
from gsrun.report.summary import decode_js1
from helpers.fake_nvml import work_then_idle

UTIL = [0, 20, 0, 12]                  # % per GPU minor (fake NVML)
SM = [0.0, 9.0, 0.0, 6.0]              # GPM SM activity % per GPU minor
MEM_GIB = [1, 3, 1, 2]                 # GPU memory used per GPU minor, GiB
POWER_MW = 150_000                     # the energy counter rises this fast (mJ per s)
ACCOUNT = f"rpt{int(time.time())}"
USER = os.environ.get("GSRUN_TEST_USER", "gsrun-test")

pytestmark = [
    pytest.mark.skipif(os.environ.get("GSRUN_TEST_ACCOUNTING") != "1",
                       reason="needs tests/cluster/up --accounting and GSRUN_TEST_ACCOUNTING=1"),
]


def _fake_nvml() -> dict:
    rec = work_then_idle(4, 0.0)
    for i, d in enumerate(rec["devices"]):
        total = d["memory"]["ok"]["total"]
        used = MEM_GIB[i] << 30
        d["utilization"] = {"ok": {"gpu": UTIL[i], "memory": 5}}
        d["memory"] = {"ok": {"total": total, "used": used, "free": total - used, "reserved": 0}}
        d["power_mw"] = {"ok": POWER_MW}
        d["energy_mj"] = {"script": [[t, {"ok": 10 ** 9 + t * POWER_MW}] for t in range(0, 900)]}
        d["gpm_supported"] = {"ok": 1}
        d["gpm"] = {"ok": {"sm_active_pct": SM[i], "sm_occupancy_pct": SM[i], "tensor_active_pct": 0.0,
                           "dram_bw_pct": 1.0}}
    return rec


def _sacct(cluster, *args) -> str:
    return cluster.as_root(["sacct", "-P", "-n", *args]).stdout


def _script(cluster, name: str, seconds: int) -> str:
    p = cluster.work / name
    p.write_text(f"#!/bin/bash\nsleep {seconds}\necho slept\n")
    p.chmod(0o755)
    shutil.chown(p, USER)
    return str(p)


def _run_job(cluster, script: str, *opts: str) -> str:
    cp = cluster.as_user(["gsrun", *opts, "--time", "10", "--account", ACCOUNT, "--wait",
                          "--output", "report-%j.out", script])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0", output=cluster.work / f"report-{job}.out")
    assert cluster.wait_file(cluster.spool / "jobs" / job / "summary.json", 60)
    return job


def _wait_blob(cluster, job: str) -> str:
    """The job's AdminComment once EpilogSlurmctld's background step stored it."""
    deadline = time.monotonic() + 120
    comment = ""
    while time.monotonic() < deadline:
        comment = _sacct(cluster, "-X", "--format=AdminComment", "-j", job).strip()
        if comment.startswith("JS1:"):
            return comment
        time.sleep(1)
    raise AssertionError(f"job {job}: no JS1 blob in AdminComment after 120 s: {comment[:80]!r}")


@pytest.fixture(scope="module")
def jobs(cluster):
    """name -> job id of the module's three jobs (ended COMPLETED 0:0, blobs stored)."""
    cluster.as_root(["sacctmgr", "-i", "add", "account", ACCOUNT, "cluster=gsrun", "description=gsrun-report",
                     "organization=gsrun"])
    cluster.as_root(["sacctmgr", "-i", "add", "user", USER, f"account={ACCOUNT}", "cluster=gsrun"])
    script = _script(cluster, "report-sleep.sh", 8)
    out = {}
    with cluster.fake_nvml(_fake_nvml()):
        out["busy"] = _run_job(cluster, script, "--gpus", "2", "--nodes", "1")
        out["spread"] = _run_job(cluster, script, "--gpus", "2", "--nodes", "2", "--gpus-per-node", "1")
    out["bare"] = _run_job(cluster, _script(cluster, "report-short.sh", 5), "--gpus", "1")
    for job in out.values():
        _wait_blob(cluster, job)
    return out


@pytest.fixture(scope="module")
def summaries(cluster, jobs) -> dict:
    """job id -> the job's own summary (``gseff --json``, as its user)."""
    return {j: json.loads(cluster.as_user(["gseff", "--json", j], check=True).stdout) for j in jobs.values()}


@pytest.fixture(scope="module")
def report_conf(cluster):
    text = cluster.gsrun_config.read_text()
    if "default_domain" not in text:
        text = text.replace("[mail]\n", '[mail]\ndefault_domain = "localhost"\n', 1)
    p = cluster.dir / "etc" / "gsrun-report-test.toml"
    p.write_text(text + "\n[cluster_report]\nmin_gpu_hours = 0\n")
    p.chmod(0o644)
    return p


def _report(cluster, conf, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, **cluster.env(GSRUN_CONFIG=str(conf)))
    cp = subprocess.run(["gsrun-report", "--since", "1d", *args], capture_output=True, text=True, timeout=120,
                        env=env)
    assert cp.returncode == 0, f"gsrun-report {args} -> {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return cp


@pytest.fixture(scope="module")
def report(cluster, jobs, report_conf) -> dict:
    """``gsrun-report --since 1d --json -A ACCOUNT``: table key -> table."""
    out = json.loads(_report(cluster, report_conf, "--json", "-A", ACCOUNT).stdout)
    assert out["scope"]["accounts"] == [ACCOUNT]
    assert out["jobs"] == 3 and out["gpu_jobs"] == 3, out
    return {t["key"]: t for t in out["tables"]}


def _gpu_h(s: dict) -> float:
    return s["job"]["gpus_alloc"] * s["job"]["elapsed_s"] / 3600.0


def _utils(s: dict) -> list[float]:
    return [d["util_mean_pct"] for d in s["gpu"]["devices"] if d.get("util_mean_pct") is not None]


def _zero_gpu_h(s: dict) -> float:
    u = _utils(s)
    return _gpu_h(s) * sum(1 for x in u if x <= 0.0) / len(u) if u else 0.0


def _sm(s: dict) -> float | None:
    sm = [d["sm_active_mean_pct"] for d in s["gpu"]["devices"] if d.get("sm_active_mean_pct") is not None]
    return sum(sm) / len(sm) if sm else None


def _row(table: dict, first) -> list:
    rows = [r for r in table["rows"] if r[0] == first]
    assert len(rows) == 1, (first, table)
    return rows[0]


def test_jobs_and_blobs(cluster, jobs, summaries):
    for name, job in jobs.items():
        s = summaries[job]
        assert s["job"]["state"] == "COMPLETED" and s["job"]["user"] == USER
        blob = decode_js1(_sacct(cluster, "-X", "--format=AdminComment", "-j", job).strip())
        assert blob["gpus"] == s["job"]["gpus_alloc"]
        if name == "bare":
            assert _utils(s) == [] and s["gpu"]["energy_kwh"] is None
        else:
            assert sorted(_utils(s)) == sorted(UTIL[d["index"]] for d in s["gpu"]["devices"])
            assert s["gpu"]["energy_kwh"] > 0 and _sm(s) is not None
    assert summaries[jobs["spread"]]["job"]["nodes"] == ["gpu01", "gpu02"]


def test_usage_and_job_tables_match_summaries(jobs, summaries, report):
    ss = list(summaries.values())
    gpu_h = sum(_gpu_h(s) for s in ss)
    cpu_h = sum(s["job"]["cpus_alloc"] * s["job"]["elapsed_s"] / 3600.0 for s in ss)
    assert _row(report["usage_account"], ACCOUNT) == [ACCOUNT, 3, 3, pytest.approx(gpu_h, rel=1e-9),
                                                      pytest.approx(cpu_h, rel=1e-9), 1]
    assert _row(report["usage_partition"], "gpu")[1:4] == [3, 3, pytest.approx(gpu_h, rel=1e-9)]
    for job, s in summaries.items():
        j = s["job"]
        assert _row(report["most_gpus"], job) == [job, USER, ACCOUNT, "gpu", j["gpus_alloc"], len(j["nodes"]),
                                                  pytest.approx(_gpu_h(s), rel=1e-9)]
        assert _row(report["longest_queued"], job)[5] == pytest.approx(j["start_time"] - j["submit_time"], abs=1)
    spread = summaries[jobs["spread"]]
    assert report["fragmentation"]["rows"] == [[jobs["spread"], USER, ACCOUNT, "gpu", 2, 2, 1,
                                                pytest.approx(_gpu_h(spread), rel=1e-9)]]
    assert report["fragmentation"]["jobs"] == 1 and report["fragmentation"]["no_figures"] == 0


def test_zero_util_efficiency_and_energy_match_summaries(jobs, summaries, report):
    ss = list(summaries.values())
    fig = [summaries[jobs["busy"]], summaries[jobs["spread"]]]
    gpu_h = sum(_gpu_h(s) for s in ss)
    zero = sum(_zero_gpu_h(s) for s in ss)
    assert zero > 0
    zero_ids = sorted(j for j, s in summaries.items() if _zero_gpu_h(s) > 0)
    for who, key in ((USER, "zero_util_user"), (ACCOUNT, "zero_util_account")):
        r = _row(report[key], who)
        assert r[:5] == [who, pytest.approx(zero, rel=1e-9), pytest.approx(gpu_h, rel=1e-9),
                         pytest.approx(100 * zero / gpu_h, rel=1e-9), len(zero_ids)]
        assert sorted(r[5].split(",")) == zero_ids
    # utilization and SM activity: GPU-hours-weighted over the jobs with figures
    w = sum(_gpu_h(s) for s in fig)
    util = sum(_gpu_h(s) * sum(_utils(s)) / len(_utils(s)) for s in fig) / w
    sm = sum(_gpu_h(s) * _sm(s) for s in fig) / w
    assert _row(report["low_efficiency"], USER) == [USER, pytest.approx(w, rel=1e-9), pytest.approx(util, abs=0.05),
                                                    pytest.approx(sm, abs=0.05), 3]
    kwh = sum(s["gpu"]["energy_kwh"] for s in fig)
    for who, key in ((USER, "energy_user"), (ACCOUNT, "energy_account")):
        r = _row(report[key], who)
        assert r[:3] == [who, pytest.approx(kwh, rel=1e-3), pytest.approx(w, rel=1e-9)]
        assert r[3] == pytest.approx(kwh * 1000 / w, rel=1e-3) and r[4] == 2
        assert report[key]["no_figures"] == 1          # the bare job: no energy reading


def test_allocation_mig_and_time_limits_match_summaries(jobs, summaries, report):
    ss = list(summaries.values())
    # the node's share (sinfo): 4 cores and 4096 MiB for 4 GPUs. No job asks for memory and the
    # cluster has no DefMemPerCPU: Slurm gives each job its nodes' whole memory (sacct ReqMem), which
    # the summaries leave unset (no request) and the blobs store as the node's MemTotal
    node_mem = 4096 << 20
    assert all(s["job"]["mem_req_bytes"] is None for s in ss)
    cores = [s["job"]["cpus_alloc"] / s["job"]["gpus_alloc"] for s in ss]
    mems = [len(s["job"]["nodes"]) * node_mem / s["job"]["gpus_alloc"] for s in ss]
    over = [c > 1.0 or m > node_mem / 4 + 1 for c, m in zip(cores, mems)]
    used = sum(s["memory"]["peak_bytes"] for s in ss)
    req = sum(n["mem_total_bytes"] for s in ss for n in s["nodes_detail"])
    low = sum(1 for s in ss if s["memory"]["peak_bytes"] < 0.25 * sum(n["mem_total_bytes"] for n in s["nodes_detail"]))
    r = _row(report["over_allocation"], USER)
    assert r == [USER, pytest.approx(sum(_gpu_h(s) for s, o in zip(ss, over) if o), rel=1e-9),
                 sum(1 for c in cores if c > 1.0), pytest.approx(max(cores)),
                 sum(1 for m in mems if m > node_mem / 4 + 1), pytest.approx(max(mems) / (1 << 30)),
                 pytest.approx(100 * used / req, rel=0.01), low]
    # MIG: the product's rule applied to each summary's own figures
    fits = {}
    for job in (jobs["busy"], jobs["spread"]):
        devs = summaries[job]["gpu"]["devices"]
        prof = mig_fit(max(d["mem_peak_bytes"] for d in devs), min(d["mem_total_bytes"] for d in devs),
                       _sm(summaries[job]), 20.0)
        assert prof is not None          # 3 GiB of 141 GB and 9 % SM: a 1g slice
        fits[job] = prof
    r = _row(report["mig_fit"], USER)
    assert r[1] == 2 and r[2] == pytest.approx(sum(_gpu_h(summaries[j]) for j in fits), rel=1e-9)
    assert sorted(r[4].split(",")) == sorted(fits)
    assert report["mig_fit"]["no_figures"] == 1
    # time limits: 10 minutes asked, seconds used
    lim = [s["job"]["time_limit_s"] for s in ss]
    assert lim == [600, 600, 600]
    el = [s["job"]["elapsed_s"] for s in ss]
    r = _row(report["time_limits"], USER)
    assert r[1] == 3 and r[2] == pytest.approx(100 * sum(el) / sum(lim), rel=1e-9)
    assert r[3] == pytest.approx(sum(s["job"]["gpus_alloc"] * (600 - s["job"]["elapsed_s"]) / 3600 for s in ss),
                                 rel=1e-9)


def test_one_gpu_model_nothing_too_powerful(report):
    t = report["model_fit"]
    assert t["rows"] == [] and t["jobs"] == 3


def test_text_and_unfiltered_admin_view(cluster, jobs, report, report_conf):
    text = _report(cluster, report_conf).stdout
    assert text.startswith("gsrun cluster report: ")
    for title in ("GPU-hours at 0 % utilization per user", "Usage per account", "Jobs with the most GPUs"):
        assert f"== {title} ==" in text
    full = {t["key"]: t for t in json.loads(_report(cluster, report_conf, "--json").stdout)["tables"]}
    assert _row(full["usage_account"], ACCOUNT) == _row(report["usage_account"], ACCOUNT)
    assert _row(full["energy_account"], ACCOUNT) == _row(report["energy_account"], ACCOUNT)


def test_digest_dry_run_names_the_user(cluster, jobs, report_conf):
    cp = _report(cluster, report_conf, "-A", ACCOUNT, "--email", "--dry-run")
    assert f"--- would send digest.{USER}." in cp.stdout, cp.stdout
    assert f"to {USER}@localhost" in cp.stdout
    for job in jobs.values():
        assert job in cp.stdout
    assert not (cluster.spool / "mail" / "new").exists() or not any(
        p.name.startswith(f"digest.{USER}.") for p in (cluster.spool / "mail" / "new").iterdir())
