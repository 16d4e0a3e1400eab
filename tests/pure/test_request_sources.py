"""Where the prolog learns a job's gsrun requests without asking slurmctld
(gsrun.request.job): SPANK_GS_* or the job comment in slurmd's environment."""

from __future__ import annotations

import pytest

from gsrun.request.job import comment_from_env, request_from_comment, request_from_job_record

RECORDED = {"SLURM_JOB_ID": "1", "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_NTASKS": "8",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}   # shape of shared/data/slurm-22.05/prolog_slurmd.env


@pytest.mark.parametrize("env,want", [
    (RECORDED, ""),                                              # credential fields, no comment: none
    ({**RECORDED, "SLURM_JOB_COMMENT": "gsrun:mps=50"}, "gsrun:mps=50"),
    ({**RECORDED, "SLURM_JOB_COMMENT": ""}, ""),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_COMMENT": "x"}, "x"),      # a comment is a comment
    ({"SLURM_JOB_ID": "1"}, None),                               # older Slurm: cannot tell, ask slurmctld
])
def test_comment_from_env(env, want):
    assert comment_from_env(env) == want


def test_request_from_comment_is_a_request_never_exclusivity():
    req = request_from_comment("my run gsrun:tune=swappiness=10;mps=;exclusive=1", "prolog environment")
    assert (req.tune, req.mps, req.mig, req.exclusive, req.source, req.comment_from) == \
        ("swappiness=10", "", None, None, "job comment", "prolog environment")
    assert req.needs_exclusivity()


@pytest.mark.parametrize("comment", ["", "just notes", "gsrunx:tune=a=1", "gsrun:colour=blue"])
def test_comment_without_gsrun_requests_is_no_request(comment):
    req = request_from_comment(comment, "prolog environment")
    assert req.source == "none" and not req.needs_exclusivity() and req.mps is None


def test_job_record_keeps_its_source_and_reads_exclusivity():
    line = "JobId=7 JobName=t OverSubscribe=NO Comment=gsrun:mig=7x1g.18gb"
    rec = {"JobId": "7", "JobName": "t", "OverSubscribe": "NO", "Comment": "gsrun:mig=7x1g.18gb"}
    req = request_from_job_record(rec, line)
    assert (req.mig, req.exclusive, req.source, req.exclusive_source, req.comment_from) == \
        ("7x1g.18gb", True, "job comment", "job record OverSubscribe", "job record")
