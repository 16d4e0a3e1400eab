"""EpilogSlurmctld sees a finishing job as COMPLETING: the state it writes is
a guess from the exit code (``job.state_source = "exit_code"``), the mail
waits, and the background step (:func:`gsrun.epilog.ctld.settle_state`) puts
Slurm's final state (CANCELLED, TIMEOUT...) into the summary once slurmctld
has it, then queues the mail. Found on a real slurmd: a job stopped by
``scancel`` was reported FAILED (exit 143) while Slurm said CANCELLED."""

from __future__ import annotations

import json
from dataclasses import replace

from gsrun.base.paths import Paths
from gsrun.epilog import ctld
from gsrun.report.records import JobSummary
from gsrun.request.config import Config, SETTINGS
from helpers.paths import REPO

CANCELLED_SUMMARY = REPO / "tests" / "data" / "golden" / "summaries" / "job-cancelled.json"


class Log:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, msg):
        self.lines.append(msg)

    warn = error = __call__


def _cfg() -> Config:
    return Config({s.key: s.default for s in SETTINGS})


def _spool(tmp_path, state: str, source: str | None):
    paths = Paths.from_config(_cfg(), str(tmp_path / "state"), str(tmp_path / "spool"))
    s = json.loads(CANCELLED_SUMMARY.read_text())
    s["job"]["state"] = state
    s["job"]["exit_code"] = 143
    if source:
        s["job"]["state_source"] = source
    ctld.write_summary(paths, JobSummary.from_json(s), None, None)
    return paths, s["job"]["id"]


def test_completing_record_is_a_guess_from_the_exit_code():
    j = ctld.job_from_record("42", {"JobState": "COMPLETING", "ExitCode": "0:15"}, {})
    assert (j.state, j.exit_code, j.state_source) == ("FAILED", 143, "exit_code")
    j = ctld.job_from_record("42", {"JobState": "COMPLETING", "ExitCode": "0:0"}, {})
    assert (j.state, j.state_source) == ("COMPLETED", "exit_code")
    j = ctld.job_from_record("42", {"JobState": "CANCELLED", "ExitCode": "0:15"}, {})
    assert (j.state, j.state_source) == ("CANCELLED", "slurm")
    assert "state_source" not in ctld.job_from_record("42", {}, {}).to_json()    # nothing known: nothing claimed


def test_settle_replaces_the_guess_with_slurms_final_state(tmp_path):
    paths, job = _spool(tmp_path, "FAILED", "exit_code")
    answers = iter([{"JobState": "COMPLETING", "ExitCode": "0:15"},
                    {"JobState": "CANCELLED", "ExitCode": "0:15", "UserId": "nobody(65534)"}])
    slept: list[float] = []
    log = Log()
    out = ctld.settle_state(paths, job, _cfg(), log, show_job=lambda j, t: next(answers), sleep=slept.append)
    assert slept == [1.0, 2.0]                            # backoff: one RPC per poll, stops when final
    assert out.job.state == "CANCELLED" and out.job.state_source == "slurm"
    on_disk = json.loads((paths.spool_job(job) / "summary.json").read_text())
    assert on_disk["job"]["state"] == "CANCELLED" and on_disk["job"]["exit_code"] == 143
    assert any("final state CANCELLED" in ln and "guessed FAILED" in ln for ln in log.lines)


def test_settle_gives_up_after_its_polls_and_keeps_the_guess(tmp_path):
    paths, job = _spool(tmp_path, "COMPLETED", "exit_code")
    calls = []
    out = ctld.settle_state(paths, job, _cfg(), Log(), show_job=lambda j, t: calls.append(j) or
                            {"JobState": "COMPLETING"}, sleep=lambda s: None, delays_s=(1, 2, 3))
    assert len(calls) == 3 and out.job.state == "COMPLETED" and out.job.state_source == "exit_code"


def test_settle_does_nothing_for_a_state_slurm_gave(tmp_path):
    paths, job = _spool(tmp_path, "CANCELLED", "slurm")
    calls = []
    assert ctld.settle_state(paths, job, _cfg(), Log(), show_job=lambda j, t: calls.append(j),
                             sleep=lambda s: None) is None
    assert calls == []


def test_mail_is_deferred_while_the_state_is_a_guess(tmp_path, monkeypatch):
    queued = []
    monkeypatch.setattr(ctld, "queue_mail", lambda *a: queued.append(a))
    s = JobSummary.from_json(json.loads(CANCELLED_SUMMARY.read_text()))
    s = replace(s, job=replace(s.job, state="FAILED", state_source="exit_code"))
    c = {"summary": s, "paths": None, "cfg": None, "log": Log()}
    assert ctld._mail_step(c) == {"deferred": "until Slurm has the job's final state"} and queued == []
    c["summary"] = replace(s, job=replace(s.job, state_source="slurm"))
    assert ctld._mail_step(c) is None and len(queued) == 1


def test_settle_ignores_fields_a_job_name_forges(tmp_path, monkeypatch):
    """A job named ``x UserId=victim(4321) ExitCode=0:0`` puts those keys in
    scontrol's record ahead of Slurm's own: the state settling drops the
    duplicated keys (the exit code stays the one EpilogSlurmctld had) and
    the user's copy goes to the job's uid/gid from slurmctld's environment,
    never to a uid read from the record."""
    import os

    from gsrun.facts import slurm

    paths, job = _spool(tmp_path, "FAILED", "exit_code")
    s = json.loads((paths.spool_job(job) / "summary.json").read_text())
    s["job"]["exit_code"] = 3
    ctld.write_summary(paths, JobSummary.from_json(s), None, None)
    line = (f"JobId={job} JobName=x UserId=victim(4321) ExitCode=0:0 UserId=nobody(65534) GroupId=nogroup(65534) "
            "JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 Partition=gpu\n")
    monkeypatch.setattr(slurm, "run_slurm", lambda argv, *a, **k: __import__("subprocess").CompletedProcess(
        argv, 0, line, ""))
    out = ctld.settle_state(paths, job, _cfg(), Log(), sleep=lambda s: None,
                            environ={"SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid())})
    assert out.job.state == "FAILED" and out.job.exit_code == 3
    st = (paths.spool_job(job) / "user-summary.json").stat()
    assert st.st_uid != 4321 and st.st_gid != 4321
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (0, os.getgid())
    assert json.loads((paths.spool_job(job) / "user-summary.json").read_text())["job"]["exit_code"] == 3


def test_show_job_drops_forged_keys_and_refuses_a_split_record(monkeypatch):
    import subprocess

    import pytest

    from gsrun.base.errors import SlurmError
    from gsrun.facts import slurm

    out = {"text": "JobId=7 JobName=a ExitCode=0:0 UserId=u(1) ExitCode=3:0 JobState=FAILED\n"}
    monkeypatch.setattr(slurm, "run_slurm", lambda argv, *a, **k: subprocess.CompletedProcess(argv, 0, out["text"], ""))
    rec = slurm.show_job("7")
    assert "ExitCode" not in rec and rec["UserId"] == "u(1)" and rec["JobState"] == "FAILED"
    out["text"] = "JobId=7 JobName=a\nExitCode=0:0 UserId=u(1) ExitCode=3:0 JobState=FAILED\n"
    with pytest.raises(SlurmError):
        slurm.show_job("7")
