"""Pure tests of gsrun.facts.sacct against the field cases 23-26 (described in
docs/field-cases.md; the exact input values come from the shared
``cases/FIELD_CASES.md`` beside the checkout) and the recorded-format fixtures
in tests/data/sacct/. ``test_caseN...`` names and ``caseN_*.txt`` fixtures
refer to field case N."""

from pathlib import Path

import pytest

from gsrun.base.errors import SlurmError
from gsrun.facts.sacct import (
    SACCT_FORMAT, cpu_efficiency, efficiency_from_sacct, group_jobs, job_efficiency, parse_mem, parse_sacct, parse_time_s, parse_tres, tres_gpus,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "sacct"
KiB, MiB, GiB, TiB = 1024, 1024 ** 2, 1024 ** 3, 1024 ** 4


def load(name):
    """A fixture file: ``# format=...`` line gives the format; other ``#`` lines are comments."""
    fmt, lines = None, []
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("# format="):
            fmt = line[len("# format="):].split(",")
        elif not line.startswith("#"):
            lines.append(line)
    assert fmt, name
    return "\n".join(lines) + "\n", fmt


def effs(text, fmt):
    """Every job of a sacct output, in order."""
    return [job_efficiency(j) for j in group_jobs(parse_sacct(text, fmt))]


def eff(name, jobid=None):
    text, fmt = load(name)
    return efficiency_from_sacct(text, fmt, jobid=jobid)


# ----------------------------------------------------------------- time strings (field case 26)

@pytest.mark.parametrize("text,seconds", [
    ("00:00.001", 0.001),
    ("06:57.815", 6 * 60 + 57.815),
    ("00:26:34", 26 * 60 + 34),
    ("1-16:59:47", 86400 + 16 * 3600 + 59 * 60 + 47),
    ("451-06:00:24", 38_988_024),
    ("12-14:16:39", 1_088_199),
    ("01:00:00", 3600),
    ("00:05.079", 5.079),
    ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),
])
def test_parse_time(text, seconds):
    assert parse_time_s(text) == pytest.approx(seconds, abs=1e-9)


def test_parse_time_exact_and_missing():
    assert parse_time_s("451-06:00:24") == 38988024.0
    assert parse_time_s("00:00.001") == 0.001
    for missing in ("", "  ", None, "INVALID", "UNLIMITED", "Unknown"):
        assert parse_time_s(missing) is None
    for bad in ("abc", "1:2:3:4", "-5:00", "12.5"):
        with pytest.raises(ValueError):
            parse_time_s(bad)


# ----------------------------------------------------------------- memory zoo (field case 24)

@pytest.mark.parametrize("text,bytes_,per", [
    ("0c", 0, "cpu"),
    ("1Mc", MiB, "cpu"),
    ("1.50Gn", 3 * GiB // 2, "node"),
    ("16000Mn", 16000 * MiB, "node"),
    ("8G", 8 * GiB, None),
    ("191846Mn", 191846 * MiB, "node"),
    ("0n", 0, "node"),
    ("655G", 655 * GiB, None),
    ("4G", 4 * GiB, None),
    ("60G", 60 * GiB, None),
    ("2P", 2 * 1024 ** 5, None),
])
def test_parse_reqmem(text, bytes_, per):
    mv = parse_mem(text)
    assert (mv.bytes, mv.per, mv.warning) == (bytes_, per, None)


def test_parse_mem_unknown_suffix_warns_not_zero():
    mv = parse_mem("1Me")
    assert mv.bytes == MiB and mv.per is None
    assert "unknown memory suffix 'e'" in mv.warning


def test_parse_maxrss_units():
    assert parse_mem("1947276K", bare_unit="").bytes == 1947276 * KiB
    assert parse_mem("1.50T", bare_unit="").bytes == 3 * TiB // 2
    assert parse_mem("0", bare_unit="").bytes == 0
    assert parse_mem("4096", bare_unit="").bytes == 4096           # usage: bare = bytes
    assert parse_mem("4096").bytes == 4096 * MiB                   # request: bare = MiB
    assert parse_mem("").bytes is None                             # missing, not 0
    assert parse_mem("   ").bytes is None
    junk = parse_mem("lots")
    assert junk.bytes is None and "unparsable" in junk.warning


def test_parse_tres_and_gpus():
    t = parse_tres("cpu=8,mem=32G,gres/gpu=4,node=1")
    assert t == {"cpu": "8", "mem": "32G", "gres/gpu": "4", "node": "1"}
    assert tres_gpus(t) == 4
    assert tres_gpus(parse_tres("cpu=8,gres/gpu:h100=2,gres/gpu:a100=1")) == 3
    assert tres_gpus(parse_tres("cpu=8,mem=1G")) is None
    u = parse_tres("cpu=05:00:00,mem=10G")
    assert parse_time_s(u["cpu"]) == 5 * 3600 and parse_mem(u["mem"], "").bytes == 10 * GiB
    assert parse_tres("") == {} and parse_tres(None) == {}


# ----------------------------------------------------------------- parsing

def test_default_format_parses_and_keeps_pipe_in_job_name():
    text, fmt = load("default_format_gpu_job.txt")
    assert [f.lower() for f in fmt] == [f.lower() for f in SACCT_FORMAT]
    rows = parse_sacct(text, fmt)
    assert [r.step for r in rows] == ["", "batch", "extern", "0"]
    assert rows[0].job_name == "train|a;$(id)"
    assert rows[3].ntasks == 2 and rows[3].max_rss_bytes == 3145728 * KiB
    e = efficiency_from_sacct(text)          # default fmt
    assert e.alloc_gpus == 2 and e.alloc_cpus == 4 and e.nodes == 1
    # sum over steps: 1800 + 0.002 + 5400
    assert e.cpu_time_s == pytest.approx(7200.002)
    assert e.cpu_eff_pct == pytest.approx(7200.002 / (4 * 3600) * 100)
    # step .0 TRESUsageInTot mem (sum of 2 tasks) is the peak
    assert e.mem_peak_bytes == 6291456 * KiB and e.mem_peak_source == "TRESUsageInTot mem"
    assert e.mem_req_bytes == 16 * GiB
    assert e.mem_eff_pct == pytest.approx(6 / 16 * 100)
    assert e.outcome == "finished" and not e.deferred


def test_trailing_delimiter_and_width_suffix():
    rows = parse_sacct("1|COMPLETED|\n1.batch|COMPLETED|\n", ["JobID%20", "state"])
    assert [(r.job_id, r.step, r.state) for r in rows] == [("1", "", "COMPLETED"),
                                                          ("1", "batch", "COMPLETED")]


def test_column_mismatch_is_slurm_error():
    with pytest.raises(SlurmError) as ei:
        parse_sacct("1|COMPLETED|4|extra\n", ["JobID", "State"])
    assert "unexpected number of columns" in str(ei.value) and "hint:" in str(ei.value)
    with pytest.raises(SlurmError):
        parse_sacct("1\n", ["State"])


def test_efficiency_errors():
    with pytest.raises(SlurmError, match="no accounting record"):
        efficiency_from_sacct("", ["JobID"])
    text, fmt = load("case23_zero_divisors.txt")
    with pytest.raises(SlurmError, match="several jobs"):
        efficiency_from_sacct(text, fmt)
    with pytest.raises(SlurmError, match="job not in output"):
        efficiency_from_sacct(text, fmt, jobid="999")


def test_bad_time_becomes_note_not_crash():
    e = efficiency_from_sacct("7|COMPLETED|2|garbage\n", ["JobID", "State", "AllocCPUS", "Elapsed"])
    assert e.elapsed_s is None and e.cpu_eff_pct is None
    assert any("elapsed" in n and "garbage" in n for n in e.notes)


# ----------------------------------------------------------------- field case 23

def test_case23_array_task_cancelled_before_start():
    e = eff("case23_zero_divisors.txt", jobid="15053872_1491")
    assert e.job_id == "15053872_1491" and e.job_id_raw == "15055386"
    assert e.state == "CANCELLED" and e.cancelled_by == 1000
    assert e.outcome == "cancelled_before_start" and not e.deferred
    assert e.cpu_eff_pct is None and "AllocCPUS=0" in e.cpu_eff_na
    assert e.mem_eff_pct is None and e.mem_eff_na
    assert e.mem_req_bytes == 4 * GiB and e.mem_peak_bytes is None
    # the raw id finds the same job
    assert eff("case23_zero_divisors.txt", jobid="15055386").job_id == "15053872_1491"


def test_case23_failed_at_zero_seconds():
    e = eff("case23_zero_divisors.txt", jobid="13421658")
    assert e.state == "FAILED" and e.outcome == "finished"
    assert e.cpu_time_s == 0.001 and e.alloc_cpus == 8
    assert e.cpu_eff_pct is None and "Elapsed" in e.cpu_eff_na
    assert e.mem_eff_pct is None and "MaxRSS empty" in e.mem_eff_na


def test_case23_allocation_line_0n():
    e = eff("case23_zero_divisors.txt", jobid="41305312")
    assert e.mem_req_bytes == 0
    assert e.cpu_eff_pct is None and "AllocCPUS=0" in e.cpu_eff_na
    assert e.mem_eff_pct is None
    assert e.outcome == "not_started"


def test_case23_reqmem_zero_and_alloctres_mem_0K():
    e = eff("case23_zero_divisors.txt", jobid="20")
    assert e.cpu_eff_pct == pytest.approx(600 / 790 * 100)     # 75.95 %
    assert e.mem_req_bytes == 0 and e.mem_eff_pct is None
    e2 = eff("case23_alloctres_mem0.txt")
    assert e2.mem_req_bytes == 0 and e2.mem_peak_bytes == 1200 * KiB
    assert e2.mem_eff_pct is None and "no memory allocated" in e2.mem_eff_na
    assert e2.cpu_eff_pct == pytest.approx(600 / 790 * 100)


def test_case23_all_lines_no_exception():
    text, fmt = load("case23_zero_divisors.txt")
    jobs = effs(text, fmt)
    assert [x.job_id for x in jobs] == ["15053872_1491", "13421658", "41305312", "20"]
    assert [x.cpu_eff_pct is None for x in jobs] == [True, True, True, False]
    assert all(x.mem_eff_pct is None for x in jobs)


def test_case23_pending_and_requeued_are_deferred():
    text, fmt = load("case23_pending.txt")
    p, r = effs(text, fmt)
    assert (p.outcome, p.deferred) == ("pending", True)
    assert (r.outcome, r.deferred) == ("requeued", True)
    assert any("deferred" in n for n in r.notes)


# ----------------------------------------------------------------- field case 24

def test_case24_2108_total_not_divided_by_cpus():
    for name in ("case24_reqmem_2108.txt", "case24_reqmem_2108_alloctres.txt"):
        e = eff(name)
        assert e.mem_req_bytes == 8 * GiB, name                 # NOT 409.6 MB
        assert e.mem_peak_bytes == 4 * GiB
        assert e.mem_eff_pct == pytest.approx(50.0)             # NOT 1228.85 %
        assert e.alloc_cpus == 20


def test_case24_per_cpu_and_unknown_suffix():
    text, fmt = load("case24_percpu_old.txt")
    a, b = effs(text, fmt)
    assert a.mem_req_bytes == 4 * MiB and a.mem_eff_pct == pytest.approx(50.0)
    assert b.mem_req_bytes == MiB and b.mem_eff_pct == pytest.approx(50.0)
    assert any("unknown memory suffix 'e'" in n for n in b.notes)


def test_case24_per_node_times_nodes():
    e = eff("case26c_mpi20.txt")
    assert e.mem_req_bytes == 20 * 191846 * MiB


# ----------------------------------------------------------------- field case 25

def test_case25a_peak_is_max_over_steps():
    e = eff("case25a_steps.txt")
    assert e.mem_peak_bytes == 39538757 * KiB                   # .1, not .batch's 6044K
    assert e.mem_peak_bytes / GiB == pytest.approx(37.71, abs=0.005)
    assert e.mem_req_bytes == 655 * GiB
    assert e.mem_eff_pct == pytest.approx(39538757 * KiB / (655 * GiB) * 100)
    assert round(e.mem_eff_pct, 1) == 5.8


def test_case25b_tresusageintot_sum_of_tasks():
    e = eff("case25b_tresusage.txt")
    assert e.mem_peak_bytes == 15578208 * KiB and not e.mem_peak_estimated
    assert e.mem_peak_bytes / GiB == pytest.approx(14.86, abs=0.005)
    assert e.mem_req_bytes == 16000 * MiB
    assert e.mem_eff_pct == pytest.approx(15578208 / 16384000 * 100)
    assert round(e.mem_eff_pct) == 95                           # not 11.9 %


def test_case25b_estimated_from_maxrss_times_ntasks():
    e = eff("case25b_no_tresusage.txt")
    assert e.mem_peak_bytes == 1947276 * 8 * KiB
    assert e.mem_peak_estimated and e.mem_peak_source == "MaxRSS x NTasks"
    assert any("estimated" in n for n in e.notes)
    assert round(e.mem_eff_pct) == 95


def test_case25_minus_X_output_has_no_peak():
    text, fmt = load("case25a_steps.txt")
    job_line_only = text.splitlines()[0] + "\n"                  # what sacct -X gives
    e = efficiency_from_sacct(job_line_only, fmt)
    assert e.mem_peak_bytes is None and e.mem_eff_pct is None and "MaxRSS" in e.mem_eff_na


# ----------------------------------------------------------------- field case 26

def test_case26a_empty_totalcpu_uses_tresusage_cpu():
    for name in ("case26a_2505_steponly.txt", "case26a_2505.txt"):
        e = eff(name)
        assert e.cpu_time_s == 5 * 3600, name
        assert e.alloc_cpus == 8 and e.elapsed_s == 3600
        assert e.cpu_eff_pct == pytest.approx(62.5)
        assert "TRESUsageInTot cpu" in e.cpu_time_source
        assert e.mem_peak_bytes == 10 * GiB and e.mem_req_bytes == 32 * GiB
    assert eff("case26a_2505.txt").alloc_gpus == 4


def test_case26b_sum_over_steps_and_anomaly_note():
    e = eff("case26b_1808.txt")
    assert e.job_id == "15715316_9734"
    assert e.cpu_time_s == 5.079
    assert e.elapsed_s == 1594
    assert e.cpu_eff_pct == pytest.approx(5.079 / (2 * 1594) * 100)
    assert round(e.cpu_eff_pct, 2) == 0.16                      # not 4629 %
    assert any(n.startswith("accounting anomaly") for n in e.notes)


def test_case26b_job_line_alone_is_clamped_and_flagged():
    text, fmt = load("case26b_1808.txt")
    e = efficiency_from_sacct(text.splitlines()[0], fmt)
    assert e.cpu_time_s == 147587
    assert e.cpu_eff_pct == 100.0 and e.cpu_anomaly
    assert any("accounting anomaly" in n and "4629%" in n for n in e.notes)


def test_case26c_20_nodes_only_batch_accounted():
    e = eff("case26c_mpi20.txt")
    assert e.cpu_time_s == 38_988_024 and e.elapsed_s == 1_088_199
    assert e.alloc_cpus == 720 and e.nodes == 20
    assert e.cpu_eff_pct == pytest.approx(38_988_024 / (720 * 1_088_199) * 100)
    assert round(e.cpu_eff_pct, 2) == 4.98
    assert any("only 1 of 20 nodes" in n for n in e.notes)
    assert e.mem_peak_bytes == 33824748 * KiB


# ----------------------------------------------------------------- shared math

def test_cpu_efficiency_math():
    assert cpu_efficiency(7200, 4, 3600) == (50.0, None, False)     # field case 22
    assert cpu_efficiency(None, 4, 3600)[0] is None
    assert cpu_efficiency(10, 0, 3600)[:2] == (None, "N/A: no CPUs allocated (AllocCPUS=0)")
    assert cpu_efficiency(10, None, 3600)[0] is None
    assert cpu_efficiency(10, 4, 0)[0] is None
    pct, label, anomaly = cpu_efficiency(200, 1, 100)
    assert pct == 100.0 and anomaly and "200%" in label


def test_group_jobs_keeps_order_and_steps():
    text, fmt = load("case25a_steps.txt")
    (j,) = group_jobs(parse_sacct(text, fmt))
    assert j.job.step == "" and [s.step for s in j.steps] == ["batch", "extern", "0", "1", "2"]
