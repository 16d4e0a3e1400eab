"""One home for Slurm job states (gsrun.facts.slurm) and the TRES/memory
parsers the EpilogSlurmctld shares with sacct (gsrun.facts.sacct)."""

import pytest

from gsrun.epilog.ctld import job_from_record
from gsrun.facts.slurm import (ACTIVE_STATES, ENDED_HELD_STATES, FAILED_STATES, TERMINAL_STATES, parse_state,
                               state_word)

# squeue(1) JOB STATE CODES
ALL_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE", "FAILED", "NODE_FAIL",
              "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD",
              "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED",
              "TIMEOUT"}


def test_every_slurm_state_is_in_exactly_one_set():
    sets = (TERMINAL_STATES, ACTIVE_STATES, ENDED_HELD_STATES)
    assert set().union(*sets) == ALL_STATES | {"REQUEUE_CRON"}
    assert sum(len(s) for s in sets) == len(set().union(*sets))
    assert FAILED_STATES < TERMINAL_STATES
    assert {"COMPLETED", "CANCELLED", "PREEMPTED"}.isdisjoint(FAILED_STATES)


@pytest.mark.parametrize("text,want", [
    ("CANCELLED by 1000", ("CANCELLED", 1000)), ("CANCELLED by 0", ("CANCELLED", 0)),
    ("completed", ("COMPLETED", None)), (" RUNNING ", ("RUNNING", None)), ("", ("", None)), (None, ("", None)),
    ("CANCELLED by x", ("CANCELLED", None)), ("CANCELLED by ４２", ("CANCELLED", None)),
])
def test_parse_state(text, want):
    assert parse_state(text) == want
    assert state_word(text) == want[0]


def test_ctld_job_from_record_uses_the_shared_parsers():
    rec = {"JobState": "CANCELLED by 1000", "AllocTRES": "cpu=16,mem=16G,node=2,billing=16,gres/gpu=8",
           "RunTime": "1-00:00:05", "ExitCode": "0:15", "NodeList": "gpu[01-02]"}
    job = job_from_record("42", rec, {})
    assert job.state == "CANCELLED"
    assert job.gpus_alloc == 8 and job.cpus_alloc == 16
    assert job.mem_req_bytes == 16 << 30
    assert job.elapsed_s == 86405.0 and job.nodes == ("gpu01", "gpu02") and job.exit_code == 128 + 15
    typed = job_from_record("42", {"AllocTRES": "cpu=4,mem=512,gres/gpu:h100=2,gres/gpu:a100=1"}, {})
    assert typed.gpus_alloc == 3 and typed.mem_req_bytes == 512 << 20     # bare mem= is MiB
    bad = job_from_record("42", {"AllocTRES": "mem=lots", "RunTime": "soon", "JobState": ""}, {})
    assert bad.mem_req_bytes is None and bad.elapsed_s is None and bad.state is None


def test_ctld_job_from_record_reads_time_limit_submit_and_start(monkeypatch):
    """SubmitTime, StartTime (controller local time) and TimeLimit reach the summary."""
    import time
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        rec = {"JobState": "COMPLETED", "RunTime": "01:00:00", "TimeLimit": "1-00:00:00",
               "SubmitTime": "2025-10-09T08:45:00", "StartTime": "2025-10-09T09:00:00"}
        job = job_from_record("42", rec, {})
        assert job.time_limit_s == 86400.0
        assert job.submit_time == 1759999500.0 and job.start_time == 1760000400.0
        unl = job_from_record("42", {"TimeLimit": "UNLIMITED", "SubmitTime": "Unknown", "StartTime": "None"}, {})
        assert unl.time_limit_s is None and unl.submit_time is None and unl.start_time is None
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
