"""What EpilogSlurmctld stores in AdminComment, checked against Princeton
jobstats' own rules (PrincetonUniversity/jobstats, ``jobstats.py``
``Jobstats.report_job_json`` and ``Jobstats.__init__``, and
``slurm/slurmctldepilog.sh``), reimplemented here from that source:

- the marker ``Short`` when ``end - start < 2 * SAMPLING_PERIOD`` (30 s in
  its ``config.py``), then ``None`` when there are no node figures, else
  base64(gzip(json)); the epilog stores ``JS1:`` + that word and accepts only
  output matching ``^(Short|None|H4s)``;
- an array task addressed as ``${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}``
  (``jobid=<ArrayJobId>`` alone would overwrite every task of the array);
- the reader decodes only a comment that starts with ``JS1:`` and is longer
  than 10 characters, and sums ``total_time``/``cpus`` and the memory keys
  over ``nodes`` (``parse_stats``).

The job records are ``tests/data/slurm-array/24.11-array-task-*.txt``."""

from __future__ import annotations

import base64
import gzip
import json
import random
import re
import subprocess

import pytest

from gsrun.epilog.ctld import accounting_job_id, job_from_record
from gsrun.facts.slurm import parse_job_record
from gsrun import SUMMARY_SCHEMA
from gsrun.report import accounting
from gsrun.report.records import JobSummary
from gsrun.report.summary import (JS1_CAP_MAX, JS1_MAX_CHARS, JS1_NONE, JS1_SHORT, decode_js1, js1_blob,
                                  js1_comment)
from gsrun.request.config import SETTINGS
from helpers.paths import DATA

from test_js1_bounded import big_job

RECORDS = DATA / "slurm-array"
SAMPLING_PERIOD = 30          # jobstats config.py


# ------------------------------------------------ jobstats' own logic, from its source

def jobstats_encode_word(diff: float, sp_node: dict, data: str) -> str:
    """``report_job_json(encode=True)``: Short, None, or the base64 text."""
    if diff < 2 * SAMPLING_PERIOD:
        return "Short"
    if len(sp_node) == 0:
        return "None"
    return data


def jobstats_epilog_accepts(stats: str) -> bool:
    """``slurmctldepilog.sh``: ``[[ $STATS =~ ^(Short|None|H4s) ]]``."""
    return re.match(r"^(Short|None|H4s)", stats) is not None


def jobstats_epilog_jobid(env: dict) -> str:
    """``slurmctldepilog.sh``'s INTERNAL_JOBID."""
    if env.get("SLURM_ARRAY_JOB_ID", "") == env["SLURM_JOB_ID"]:
        return f'{env["SLURM_ARRAY_JOB_ID"]}_{env["SLURM_ARRAY_TASK_ID"]}'
    return env["SLURM_JOB_ID"]


def jobstats_read(admin_comment: str) -> dict:
    """``Jobstats.__init__``'s decoding of AdminComment, then ``parse_stats``'
    CPU and memory totals. ``{}`` when it does not decode (it then asks Prometheus)."""
    sp_node = {}
    if admin_comment is not None and admin_comment.startswith("JS1:") and len(admin_comment) > 10:
        t = json.loads(gzip.decompress(base64.b64decode(admin_comment[4:])))
        sp_node = t["nodes"]
    if not sp_node:
        return {}
    used = cores = mem_used = mem_alloc = 0
    for n in sp_node:
        d = sp_node[n]
        assert "total_time" in d and "cpus" in d, n          # else its cpu_util_error_code 1
        assert "used_memory" in d and "total_memory" in d, n  # else its cpu_mem_error_code 1
        used += d["total_time"]
        cores += d["cpus"]
        mem_used += d["used_memory"]
        mem_alloc += d["total_memory"]
    return {"nodes": len(sp_node), "cpu_time": used, "cores": cores, "mem_used": mem_used,
            "mem_alloc": mem_alloc}


# ------------------------------------------------ markers

def _job(elapsed, nodes=True) -> JobSummary:
    j = big_job(2)
    j["job"]["elapsed_s"] = elapsed
    if not nodes:
        j["nodes_detail"] = []
    return JobSummary.from_json(j)


@pytest.mark.parametrize("elapsed, nodes, want", [
    (0.0, True, JS1_SHORT), (59.0, True, JS1_SHORT), (59.9, False, JS1_SHORT),
    (60.0, True, "blob"), (3600.0, False, JS1_NONE), (None, True, JS1_NONE)])
def test_short_and_none_markers_follow_jobstats(elapsed, nodes, want):
    job = _job(elapsed, nodes)
    got = js1_comment(job)
    if want == "blob":
        assert got == js1_blob(job) and got.startswith("JS1:H4s")
    else:
        assert got == want
    # the same word jobstats' report_job_json gives for that job
    word = jobstats_encode_word(elapsed if elapsed is not None else 0.0 if want == JS1_SHORT else 1e9,
                                {"n": 1} if nodes else {}, got[4:])
    assert "JS1:" + word == got
    assert jobstats_epilog_accepts(got[4:]) and accounting.valid_js1(got)
    # jobstats' reader never tries to decode a marker (10 characters at most)
    if got in (JS1_SHORT, JS1_NONE):
        assert len(got) <= 10 and jobstats_read(got) == {}
        with pytest.raises(ValueError, match="marker"):
            decode_js1(got)


# ------------------------------------------------ array tasks

@pytest.mark.parametrize("case, raw, want", [("array-task-7", "4249", "4242_7"),
                                              ("array-task-0", "4242", "4242_0"),
                                              ("shared", "4242", "4242")])
def test_array_task_is_addressed_as_arrayjob_task(case, raw, want):
    path = DATA / "slurm-records" / "24.11" / "shared.txt" if case == "shared" else RECORDS / f"24.11-{case}.txt"
    rec = parse_job_record(path.read_text(), raw)
    env = {"SLURM_JOB_ID": raw}
    if rec.get("ArrayJobId"):      # slurmctld sets these for an array task's EpilogSlurmctld
        env.update(SLURM_ARRAY_JOB_ID=rec["ArrayJobId"], SLURM_ARRAY_TASK_ID=rec["ArrayTaskId"])
    job = job_from_record(raw, rec, env)
    assert accounting_job_id(raw, job) == want
    # jobstats addresses the first task (raw id = array id) the same way; later tasks it
    # addresses by raw id, which names the same single record: gsrun uses A_T for all
    assert jobstats_epilog_jobid(env) in (want, raw)


def test_an_array_id_written_into_a_job_name_never_addresses_another_job():
    """A non-array job's record has no ArrayJobId: one in its JobName is not the job's. The
    task id comes from slurmctld's EpilogSlurmctld environment only."""
    text = ("JobId=4250 JobName=x ArrayJobId=99 ArrayTaskId=1 UserId=u(1001) GroupId=g(1001) "
            "JobState=COMPLETED ExitCode=0:0\n")
    rec = parse_job_record(text, "4250")
    assert rec.get("ArrayJobId") == "99"                       # the record alone cannot tell
    job = job_from_record("4250", rec, {"SLURM_JOB_ID": "4250"})
    assert job.array is None and accounting_job_id("4250", job) == "4250"
    job = job_from_record("4250", rec, {"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4249",
                                        "SLURM_ARRAY_TASK_ID": "3"})
    assert accounting_job_id("4250", job) == "4249_3"


def test_sacctmgr_and_sql_address_the_task(monkeypatch):
    calls = []

    def fake_run(argv, timeout_s, check=False):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, " Modified job...\n", "")   # sacctmgr 24.11's answer
    monkeypatch.setattr(accounting, "run_slurm", fake_run)
    monkeypatch.setattr(accounting, "admin_comment", lambda j, t=15.0: JS1_SHORT if j == "4242_7" else None)
    assert accounting.store_admin_comment("4242_7", JS1_SHORT, "c1") == "sacctmgr"
    assert calls == [["sacctmgr", "-i", "modify", "job", "where", "jobid=4242_7", "set", "AdminComment=JS1:Short"]]
    assert accounting.sql_job_where("4242_7") == "id_array_job=4242 AND id_array_task=7"
    assert accounting.sql_job_where("4249") == "id_job=4249"
    with pytest.raises(Exception, match="bad job id"):
        accounting.sql_job_where("4242_7; DROP TABLE x")


# ------------------------------------------------ size cap

def test_cap_is_a_site_setting_whose_default_keeps_64_nodes_whole():
    s = next(x for x in SETTINGS if x.key == "report.js1_max_chars")
    assert s.default == JS1_MAX_CHARS == 32768
    assert s.check(JS1_CAP_MAX) is None and s.check(JS1_CAP_MAX + 1) and s.check(1024)
    text = js1_comment(JobSummary.from_json(big_job(64)))
    raw = decode_js1(text)
    assert "reduced" not in raw["gsrun"] and len(raw["nodes"]) == 64
    assert all(len(d["gpu_utilization"]) == 8 for d in raw["nodes"].values())
    assert 12000 < len(text) <= JS1_MAX_CHARS      # about 13.6 k characters
    # a lower site cap reduces the same job
    small = js1_comment(JobSummary.from_json(big_job(64)), 8192)
    assert len(small) <= 8192 and decode_js1(small)["gsrun"]["reduced"] == "gpus"


@pytest.mark.parametrize("n_nodes, cap", [(1, 32768), (64, 32768), (64, 8192), (300, 32768), (4000, 32768),
                                          (4000, 2048)])
def test_reduction_is_deterministic_and_jobstats_reads_every_blob(n_nodes, cap):
    job = big_job(n_nodes)
    text = js1_comment(JobSummary.from_json(job), cap)
    assert len(text) <= cap and jobstats_epilog_accepts(text[4:])
    shuffled = json.loads(json.dumps(job))
    random.Random(7).shuffle(shuffled["nodes_detail"])
    random.Random(8).shuffle(shuffled["gpu"]["devices"])
    assert js1_comment(JobSummary.from_json(shuffled), cap) == text == js1_comment(JobSummary.from_json(job), cap)
    got = jobstats_read(text)
    det = job["nodes_detail"]
    assert got["cores"] == sum(n["cpus_alloc"] for n in det)
    assert got["cpu_time"] == pytest.approx(sum(n["cpu_time_s"] for n in det), rel=1e-6)
    assert got["mem_used"] == sum(n["mem_peak_bytes"] for n in det)
    assert got["mem_alloc"] == sum(n["mem_total_bytes"] for n in det)


# ------------------------------------------------ through EpilogSlurmctld's background step

@pytest.mark.parametrize("elapsed, want", [(42.0, JS1_SHORT), (7200.0, "blob")])
def test_admin_comment_step_stores_the_tasks_own_comment(tmp_path, monkeypatch, elapsed, want):
    from gsrun.epilog import ctld
    monkeypatch.setenv("GSRUN_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("GSRUN_LOG_FILE", str(tmp_path / "log"))
    rec = parse_job_record((RECORDS / "24.11-array-task-7.txt").read_text(), "4249")
    summary = big_job(2)
    summary["job"].update(job_from_record("4249", rec, {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "7"}).to_json(),
                          elapsed_s=elapsed)
    d = tmp_path / "spool/jobs/4249"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(accounting, "config_cached", lambda *a, **k: {
        "AccountingStorageType": "accounting_storage/slurmdbd", "ClusterName": "c"})
    stored = []
    monkeypatch.setattr(accounting, "store_admin_comment_retry",
                        lambda job, blob, *a, **k: stored.append((job, blob)) or "sacctmgr")
    assert ctld.admin_comment_step("4249", str(tmp_path / "spool")) == 0
    assert [s[0] for s in stored] == ["4242_7"]          # the task, never the array's id
    blob = stored[0][1]
    assert blob == JS1_SHORT if want == JS1_SHORT else jobstats_read(blob)["nodes"] == 2
    mark = json.loads((d / "accounting.json").read_text())
    assert mark["admin_comment"] == ("no figures" if want == JS1_SHORT else "stored")


def test_the_short_job_threshold_is_a_site_setting():
    """report.js1_short_s: jobstats' 60 s by default; a site that samples often (0) stores
    a blob for a job of seconds."""
    from gsrun.report.summary import JS1_SHORT, js1_comment
    from gsrun.request.config import parse_config

    summ = JobSummary.from_json({"schema": SUMMARY_SCHEMA, "kind": "job", "job": {"id": "1", "elapsed_s": 12.0},
                                 "nodes_detail": []})
    assert js1_comment(summ) == JS1_SHORT
    assert parse_config("")["report.js1_short_s"] == 60
    assert parse_config("[report]\njs1_short_s = 0\n")["report.js1_short_s"] == 0
    assert js1_comment(summ, short_s=0) != JS1_SHORT
