"""One verdict logic for every state: the findings, the verdict rows and the
"Next time" line of the text report and the mail agree, for a job too short
to judge, a job with one CPU per GPU task, a job whose node could not read
its GPUs, and a job without a time limit or memory request. Built from the
1-GPU golden summary with the fields each case changes."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from gsrun.report import mail
from gsrun.report.findings import finding_records, headline, verdicts
from gsrun.report.records import JobSummary
from gsrun.report.render import render_text
from helpers.paths import DATA

BASE = json.loads((DATA / "golden" / "summaries" / "job-1gpu.json").read_text())


def _job(**changes) -> JobSummary:
    return _with_findings(_dict(**changes))


def _dict(**changes) -> dict:
    s = copy.deepcopy(BASE)
    for path, value in changes.items():
        sec, key = path.split("__")
        s[sec][key] = value
    return s


def _with_findings(d: dict) -> JobSummary:
    s = JobSummary.from_json(d)
    return dataclasses.replace(s, findings=tuple(finding_records(s)))


def _next(s) -> str:
    return headline(s, verdicts(s))["next"]


def test_a_job_too_short_to_judge_gets_figures_without_levels_or_advice():
    s = _job(job__elapsed_s=3.0, job__end_time=BASE["job"]["start_time"] + 3, cpu__efficiency_pct=2.0)
    rows = verdicts(s)
    assert [r["key"] for r in rows] == ["gpu_busy", "gpu_sm", "gpu_mem", "cpu", "host_mem", "time"]
    assert all(r["level"] is None and r["word"] == "" for r in rows)
    assert [f.code for f in s.findings] == ["short_job"]
    assert _next(s) == ""
    text = render_text(s)
    assert "Next time" not in text and "findings below" not in text
    assert "The job ran 3 s (less than 60 s): too short" in text


def test_one_cpu_per_gpu_task_is_never_told_to_use_fewer():
    s = _job(job__cpus_alloc=1, cpu__efficiency_pct=4.0)
    assert "cpu_idle" not in [f.code for f in s.findings]
    cpu = next(r for r in verdicts(s) if r["key"] == "cpu")
    assert (cpu["pct"], cpu["level"], cpu["detail"]) == (4.0, None, "of 1 cores (one per task: the fewest there are)")
    assert "fewer CPUs" not in render_text(s)
    # two CPUs per GPU task: the advice stands, and heads the report when it is the only action
    s = _job(job__cpus_alloc=2, cpu__efficiency_pct=4.0, job__time_limit_s=None)
    assert next(f for f in s.findings if f.code == "cpu_idle").action == "fewer CPUs per task"
    assert _next(s) == "fewer CPUs per task."


def test_without_an_action_the_next_line_names_what_could_be_better():
    s = _job(cpu__efficiency_pct=30.0, job__time_limit_s=None, memory__efficiency_pct=80.0)   # no action
    assert not [f for f in s.findings if f.action]
    assert _next(s) == "nothing to change on the GPUs; CPU efficiency could be better (below)."
    d = _dict(job__time_limit_s=None, memory__efficiency_pct=80.0)
    d["gpu"]["devices"][0]["util_mean_pct"] = 30.0
    s = _with_findings(d)
    s = dataclasses.replace(s, findings=tuple(f for f in s.findings if not f.action))
    assert _next(s) == "GPU busy and CPU efficiency could be better (the figures below say by how much)."


def test_a_node_that_cannot_read_its_gpus_is_a_note_not_a_tip():
    s = _job(gpu__available=False, gpu__reason="NVML init failed: LIB_RM_VERSION_MISMATCH")
    f = next(f for f in s.findings if f.code == "gpu_unavailable")
    assert "NVML" not in f.text and f.text.startswith("No GPU figures: the node could not read")
    msg = mail.build_message(s, render_text(s), None, "alice@example.org", "gsrun@example.org", date=0)
    html = msg.get_body(("html",)).get_content()
    assert ">note:</b> No GPU figures" in html and ">tip:</b> No GPU figures" not in html


@pytest.mark.parametrize("limit, mem_req, ran, asked", [
    (None, None, "(01:00:00, no time limit)", "8 CPUs, 1 GPUs</td>"),
    (28800.0, 68719476736, "(01:00:00 of 08:00:00 limit)", "8 CPUs, 1 GPUs, 64.0 GiB memory</td>")])
def test_the_mail_says_no_time_limit_and_leaves_out_an_unknown_memory_request(limit, mem_req, ran, asked):
    s = _job(job__time_limit_s=limit, memory__req_bytes=mem_req, memory__efficiency_pct=None)
    html = mail.build_message(s, render_text(s), None, "a@example.org", "g@example.org", date=0) \
        .get_body(("html",)).get_content()
    assert ran in html and asked in html
    assert "none limit" not in html and "not recorded memory" not in html
