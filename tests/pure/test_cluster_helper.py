"""The real-Slurm tier's reading of a job's end (``helpers.cluster.Cluster``),
on recorded ``scontrol``/``sacct`` answers: a job that died fails the test
with its state, exit code and output tail; a record that aged out of
slurmctld is read from accounting; a step from ``sacct -j ID.STEP``."""

from __future__ import annotations

import subprocess

import pytest

from helpers.cluster import Cluster

RECORD = ("JobId={id} JobName=train UserId=gsrun-test(1001) GroupId=gsrun-test(1001) JobState={state} "
          "Reason=NonZeroExitCode Dependency=(null) ExitCode={code} DerivedExitCode={derived} RunTime=00:00:03 "
          "NodeList=gpu01 StdErr={out} StdIn=/dev/null StdOut={out} Power=")


class Answers(Cluster):
    """A Cluster whose root commands get recorded answers: argv -> (rc, stdout, stderr)."""

    def __init__(self, root, answers):
        super().__init__(root)
        self.answers = answers
        self.asked = []

    def as_root(self, argv, timeout=120, check=True):
        self.asked.append(argv)
        rc, out, err = self.answers(argv)
        return subprocess.CompletedProcess(argv, rc, out, err)


def _scontrol(job, **fields):
    def answer(argv):
        if argv[0] == "scontrol":
            return 0, RECORD.format(id=job, **fields) + "\n", ""
        raise AssertionError(argv)
    return answer


def test_completed_job_passes(tmp_path):
    c = Answers(tmp_path, _scontrol("42", state="COMPLETED", code="0:0", derived="0:0", out="/dev/null"))
    end = c.assert_job_end("42")
    assert (end.state, end.exit_code, end.derived, end.source) == ("COMPLETED", "0:0", "0:0", "scontrol")


def test_job_killed_by_signal_6_fails_with_state_code_and_output_tail(tmp_path):
    out = tmp_path / "work" / "main-42.out"
    out.parent.mkdir()
    out.write_text("".join(f"line {i}\n" for i in range(30)) + "free(): invalid pointer\n")
    c = Answers(tmp_path, _scontrol("42", state="FAILED", code="0:6", derived="0:0",
                                    out=str(tmp_path / "work" / "main-%j.out")))
    with pytest.raises(AssertionError) as e:
        c.assert_job_end("42")
    msg = str(e.value)
    assert "job 42 ended FAILED ExitCode=0:6 DerivedExitCode=0:0 (from scontrol), expected COMPLETED ExitCode=0:0" \
        in msg
    assert msg.endswith("line 29\nfree(): invalid pointer") and "line 10\n" not in msg


def test_expected_failure_is_exact(tmp_path):
    c = Answers(tmp_path, _scontrol("7", state="FAILED", code="3:0", derived="0:0", out="/dev/null"))
    assert c.assert_job_end("7", "FAILED", "3:0").exit_code == "3:0"
    with pytest.raises(AssertionError, match=r"ended FAILED ExitCode=3:0 .*expected FAILED ExitCode=143:0"):
        c.assert_job_end("7", "FAILED", "143:0")


def test_cancelled_by_uid_is_the_state_word(tmp_path):
    c = Answers(tmp_path, _scontrol("8", state="CANCELLED", code="0:15", derived="0:0", out="/dev/null"))
    assert c.assert_job_end("8", "CANCELLED", "0:15").state == "CANCELLED"


def test_forged_record_of_another_job_is_not_read(tmp_path):
    """The product's record parser: a record that is not this job's is no end."""
    c = Answers(tmp_path, _scontrol("99", state="COMPLETED", code="0:0", derived="0:0", out="/dev/null"))
    with pytest.raises(AssertionError, match="job 42 not ended after 0 s"):
        c.job_end("42", timeout_s=0)


def test_aged_out_record_is_read_from_accounting(tmp_path):
    def answer(argv):
        if argv[0] == "scontrol":
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        assert argv[:5] == ["sacct", "-n", "-P", "-o", "JobID,State,ExitCode"] and argv[-1] == "42"
        return 0, "42|CANCELLED by 0|0:15\n42.batch|CANCELLED|0:15\n42.extern|COMPLETED|0:0\n", ""
    end = Answers(tmp_path, answer).assert_job_end("42", "CANCELLED", "0:15")
    assert end.source == "sacct" and end.derived is None


def test_step_from_accounting_or_none_without_it(tmp_path):
    def answer(argv):
        if argv[0] == "scontrol":
            return 0, RECORD.format(id="5", state="COMPLETED", code="0:0", derived="0:0", out="/dev/null"), ""
        assert argv[-1] == "5.0"
        return 0, "5.0|FAILED|0:6\n", ""
    c = Answers(tmp_path, answer)
    cp = subprocess.CompletedProcess(["srun"], 0, "", "")
    with pytest.raises(AssertionError, match=r"step 5.0 ended FAILED ExitCode=0:6"):
        c.assert_srun_ok(cp, "5")
    with pytest.raises(AssertionError, match=r"srun \(job 5\) -> 134"):
        c.assert_srun_ok(subprocess.CompletedProcess(["srun"], 134, "", "Aborted"), "5")

    def no_accounting(argv):
        if argv[0] == "sacct":
            return 1, "", "sacct: error: Slurm accounting storage is disabled\n"
        return answer(argv)
    c = Answers(tmp_path, no_accounting)
    assert c.step_end("5") is None
    c.assert_srun_ok(cp, "5")
