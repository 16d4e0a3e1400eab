"""``gseff`` on a job that has not started: the same report as every other
state (title, findings, job, GPUs), saying it is pending, why, when Slurm
expects it to start and when a report will exist; never "unknown job" and
never the accounting view's ``GPUs: N/A`` for a job that asked for GPUs.
The controller's record is a recorded ``scontrol -o show job`` line."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from gsrun.facts.slurm import parse_job_record
from gsrun.report.render import render_text
from gsrun.report.summary import pending_summary
from gsrun.wrapper import gseff

RECORD = ("JobId=66 JobName=train.py UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=1 Nice=0 "
          "Account=(null) QOS=normal JobState=PENDING Reason={reason} Dependency=(null) Requeue=1 Restarts=0 "
          "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A "
          "SubmitTime=2025-06-02T10:00:00 EligibleTime=2025-06-02T10:00:00 AccrueTime=2025-06-02T10:00:00 "
          "StartTime={start} EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
          "LastSchedEval=2025-06-02T10:00:01 Scheduler=Main Partition=gpu AllocNode:Sid=login01:31337 "
          "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=4-4 NumCPUs=16 NumTasks=16 CPUs/Task=1 "
          "ReqB:S:C:T=0:0:*:* ReqTRES=cpu=16,mem=64000M,node=4,billing=16,gres/gpu=16 AllocTRES=(null) "
          "Socks/Node=* NtasksPerN:B:S:C=4:0:*:* CoreSpec=* MinCPUsNode=4 MinMemoryNode=16000M MinTmpDiskNode=0 "
          "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
          "Command=(null) WorkDir=/home/alice StdErr=/home/alice/slurm-66.out StdIn=/dev/null "
          "StdOut=/home/alice/slurm-66.out Power= TresPerNode=gres/gpu:4")


pytestmark = pytest.mark.usefixtures("utc_tz")      # the records' times read as UTC


def _rec(reason="Resources", start="2025-06-02T11:00:00"):
    return parse_job_record(RECORD.format(reason=reason, start=start), "66")


def test_a_pending_job_reads_like_every_other_report():
    text = render_text(pending_summary(_rec()))
    assert text.splitlines() == [
        "gsrun report: job 66 (train.py) PENDING",
        "",
        "Findings",
        "  -  The job is pending (Resources); Slurm expects it to start at 2025-06-02",
        "     11:00. A report exists once it starts (gseff 66 shows it as it runs)",
        "     and the full one when it ends.",
        "",
        "Job",
        "  User alice, partition gpu, exit code N/A",
        "  Submitted 2025-06-02 10:00, time limit 01:00:00",
        "  Asked for 16 CPUs, 16 GPUs",
        "",
        "GPUs",
        "  16 GPUs asked for; figures once the job runs"]


def test_a_reason_that_will_not_change_is_a_warning_with_what_to_do():
    s = pending_summary(_rec("PartitionConfig", "Unknown"))
    (f,) = s.findings
    assert (f.code, f.severity) == ("deferred", "warn")
    assert f.text == ("The job is pending (PartitionConfig), and will not start as it is: it asks for more "
                      "than the partition has (nodes, GPUs per node or CPUs).")
    assert f.action.startswith("scancel 66, then ask for what exists: sinfo -o '%P %D %G %l'")
    text = render_text(s)
    assert text.startswith("gsrun report: job 66 (train.py) PENDING\nNext time: scancel 66, then ask")
    assert "expects it to start" not in text


def test_gseff_asks_the_controller_before_accounting(monkeypatch, tmp_path):
    monkeypatch.setattr(gseff, "show_job", lambda job_id, timeout_s: _rec())
    monkeypatch.setattr(gseff, "load_accounting", lambda *a: pytest.fail("accounting asked for a pending job"))
    res = CliRunner().invoke(gseff.cli, ["66", "--spool-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("gsrun report: job 66 (train.py) PENDING\n")
    assert "unknown job" not in res.output and "GPUs: N/A" not in res.output
    # a job the controller does not hold (ended long ago): accounting answers, as before
    monkeypatch.setattr(gseff, "show_job", lambda job_id, timeout_s: None)
    monkeypatch.setattr(gseff, "load_accounting", lambda *a: {"job_id": "66"})
    monkeypatch.setattr(gseff, "render_accounting", lambda rec: f"accounting view of {rec['job_id']}\n")
    res = CliRunner().invoke(gseff.cli, ["66", "--spool-dir", str(tmp_path)])
    assert res.output == "accounting view of 66\n", res.output
