"""A job's elapsed time is one figure everywhere: Slurm's (StartTime to
EndTime less any time suspended), as ``squeue`` TimeUsed, ``scontrol``
RunTime and ``sacct`` Elapsed give it.

One job (``tests/data/elapsed``: its records; its node summaries are
``tests/data/summaries/two-nodes``): slurmctld says 01:00:02 (3602 s), the
samplers covered 01:00:00 (3600 s). The last line of ``gsrun --wait`` (from
``squeue``, then from ``sacct``), the job summary EpilogSlurmctld writes,
``gseff`` (text and ``--json``), the JS1 blob and the mail all say 3602 s;
without a job record the report says what it has, the sampled span,
labelled "(sampled)"."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gsrun.base.paths import Paths
from gsrun.epilog.ctld import job_from_record, merge, write_summary
from gsrun.facts.slurm import accounting_argv, parse_job_record, queue_argv
from gsrun.report import mail
from gsrun.report.records import JobSummary
from gsrun.report.render import render_text
from gsrun.report.summary import decode_js1, js1_blob
from gsrun.wrapper import gseff
from gsrun.wrapper.submit import Ended, Watcher, exit_line, status_line
from helpers.paths import DATA

REC = DATA / "elapsed"
NODES = DATA / "summaries" / "two-nodes"
JOB = "4242"
SLURM_S, SLURM_CLOCK = 3602.0, "01:00:02"       # RunTime / TimeUsed / Elapsed of the records
SAMPLED_CLOCK = "01:00:00"                       # the node summaries' span (08:53:20 to 09:53:20 UTC)
pytestmark = pytest.mark.usefixtures("utc_tz")   # the records' times read as UTC


class _Slurm(Watcher):
    """``gsrun --wait``'s watcher answered from the recorded files."""

    def __init__(self, squeue: str | None):
        super().__init__(JOB, cache_dir="", since=0.0)
        self.squeue = squeue

    def run(self, argv):
        if argv == queue_argv():
            return (REC / self.squeue).read_text() if self.squeue else ""
        assert argv == accounting_argv(JOB), argv
        return (REC / "sacct.txt").read_text()


def _epilog_ctld(tmp_path, rec) -> tuple[Paths, JobSummary]:
    """What EpilogSlurmctld does with the record: the job fields, the merge
    of the node summaries in the spool, the summary written (root's copy)."""
    spool = tmp_path / "spool"
    paths = Paths(str(tmp_path / "nonexistent"), str(spool), str(tmp_path / "nonexistent"))
    d = paths.make_spool_job(JOB)
    for node in ("gpu-a01", "gpu-a02"):
        shutil.copy(NODES / f"node-{node}.json", d / f"node-{node}.json")
    job = job_from_record(JOB, rec, {"SLURM_JOB_USER": "alice"})
    summary = merge(paths, job, None, wait_s=0.0)
    write_summary(paths, summary, None, None)
    return paths, summary


def _gseff(paths: Paths, *args: str) -> str:
    res = CliRunner().invoke(gseff.cli, [JOB, "--spool-dir", str(paths.spool_dir), *args])
    assert res.exit_code == 0, res.output
    return res.output


def _mail_text(summary: JobSummary) -> tuple[str, str]:
    msg = mail.build_message(summary, render_text(summary), None, "alice@example.org", "gsrun@example.org",
                             date=1_760_010_000.0)
    text = msg.get_body(("plain",)).get_content()
    html = msg.get_body(("html",)).get_content()
    return text, html


def test_the_wait_line_reads_slurms_elapsed_from_squeue_then_sacct():
    running = _Slurm("squeue-running.txt").poll()
    assert running.elapsed == "59:58"                          # squeue prints M:SS below an hour
    assert status_line(JOB, running, 0) == "gsrun: job 4242: running 00:59:58"
    completing = _Slurm("squeue-completing.txt").poll()
    assert status_line(JOB, completing, 0) == f"gsrun: job 4242: completing {SLURM_CLOCK}"
    for squeue in ("squeue-completed.txt", None):          # None: aged out of slurmctld, sacct answers
        st = _Slurm(squeue).poll()
        assert (st.state, st.elapsed) == ("COMPLETED", "1:00:02" if squeue else "01:00:02")
        assert status_line(JOB, st, 0) == f"gsrun: job 4242: completed {SLURM_CLOCK}"
        assert exit_line(JOB, Ended(0, st.state, st.elapsed, st.stdout_path)) == (
            f"gsrun: job 4242: COMPLETED after {SLURM_CLOCK}"
            + ("; output: /home/alice/slurm-4242.out" if squeue else "") + "; report: gseff 4242")


def test_summary_gseff_json_text_js1_and_mail_give_slurms_elapsed(tmp_path):
    rec = parse_job_record((REC / "scontrol-epilog-ctld.txt").read_text(), JOB)
    paths, summary = _epilog_ctld(tmp_path, rec)
    job = summary.job
    # slurmctld's figures, not the samplers' (1760000000.0 .. 1760003600.0)
    assert (job.elapsed_s, job.start_time, job.end_time) == (SLURM_S, 1759999995.0, 1760003597.0)
    assert "sampled_s" not in job.to_json()
    assert [n.elapsed_s for n in summary.nodes_detail] == [3600.0, 3600.0]
    assert summary.cpu.efficiency_pct == round(100.0 * 21600.0 / (16 * SLURM_S), 1) == 37.5
    assert summary.gpu.gpu_hours_alloc == round(4 * SLURM_S / 3600.0, 4) == 4.0022

    as_json = json.loads(_gseff(paths, "--json"))
    assert as_json["job"]["elapsed_s"] == SLURM_S and "sampled_s" not in as_json["job"]

    text = _gseff(paths)
    assert text.startswith(f"gsrun report: job 4242 (train-llm) COMPLETED after {SLURM_CLOCK} on gpu-a01 and 1\n")
    assert f"CPU time 06:00:00 of 16 cores x {SLURM_CLOCK};" in text
    assert "  Ran 2025-10-09 08:53 to 09:53, time limit 02:00:00\n" in text
    assert SAMPLED_CLOCK not in text and "(sampled)" not in text

    assert decode_js1(js1_blob(summary))["total_time"] == 3602

    view = mail.mail_view(summary, render_text(summary), False, "cid")
    assert view["elapsed"] == SLURM_CLOCK
    mail_text, html = _mail_text(summary)
    assert f"COMPLETED after {SLURM_CLOCK} on gpu-a01" in mail_text           # the text part is the report
    assert f"CPU time 06:00:00 of 16 cores x {SLURM_CLOCK};" in mail_text
    assert f"COMPLETED after {SLURM_CLOCK}</h1>" in html and f"({SLURM_CLOCK} of 02:00:00 limit)" in html
    assert SAMPLED_CLOCK not in mail_text + html


def test_without_a_job_record_the_sampled_span_is_labelled_as_sampled(tmp_path):
    """EpilogSlurmctld could not read the record (scontrol failed): Slurm's
    elapsed time is unknown (null), the figures are over the sampled span,
    which every output names as sampled."""
    paths, summary = _epilog_ctld(tmp_path, None)
    job = summary.job
    assert job.elapsed_s is None and job.sampled_s == 3600.0
    assert summary.cpu.efficiency_pct == 37.5 and summary.gpu.gpu_hours_alloc == 4.0
    assert json.loads(_gseff(paths, "--json"))["job"]["sampled_s"] == 3600.0
    text = _gseff(paths)
    assert f" after {SAMPLED_CLOCK} (sampled) on gpu-a01" in text.splitlines()[0]
    assert f"CPU time 06:00:00 of 16 cores x {SAMPLED_CLOCK} (sampled);" in text
    assert mail.mail_view(summary, text, False, "cid")["elapsed"] == f"{SAMPLED_CLOCK} (sampled)"
    assert decode_js1(js1_blob(summary))["total_time"] == 3600
