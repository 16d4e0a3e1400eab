"""gsrun-report on recorded sacct outputs (Slurm 24.11-style rows with gsrun's and jobstats'
blobs, a JS1:Short stub, a lowercased blob, a foreign comment with '|'; Slurm 22.05 with a
-M CLUSTER header, a step line and ReqMem per node; a mixed cluster of A100s, V100s and T4s):
the parser, every table's golden text, CSV and JSON."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gsrun.report.fleet import NodeShare, mig_fit, parse_sinfo_models, parse_sinfo_nodes
from gsrun.report.fleet_render import Scope, report_csv, report_json, table_text
from gsrun.report.fleet_source import blob_figures, parse_line, window_jobs
from gsrun.request.config import parse_config
from gsrun.wrapper.gsreport import run_report
from helpers.golden import check_text

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden" / "cluster_report"
START, END = (datetime(2024, 4, 30, tzinfo=timezone.utc).timestamp(),
              datetime(2024, 5, 1, tzinfo=timezone.utc).timestamp())
SHARES = {"gpu": NodeShare(64, 512 << 30, 4)}
pytestmark = pytest.mark.usefixtures("utc_tz")      # the goldens print UTC


def _lines(name):
    return (DATA / "sacct" / name).read_text().splitlines(True)


def test_parse_2411_rows():
    rows = [parse_line(ln) for ln in _lines("report_2411.txt")]
    assert [r.job_id for r in rows] == ["4101", "4102", "4103", "4104_7", "4105", "4106"]
    a = rows[0]
    assert (a.user, a.account, a.partition, a.gpus, a.gpu_type, a.cpus) == ("alice", "physics", "gpu", 1, "a100", 8)
    assert a.mem_req_bytes == 64 << 30 and a.elapsed_s == 7200 and a.time_limit_s == 86400
    assert a.start_s - a.submit_s == 3600
    assert rows[3].state == "CANCELLED" and rows[3].time_limit_s is None
    assert rows[3].comment == "ticket 7 | reset by admin"       # a '|' in AdminComment stays in it
    assert rows[4].gpus == 0


def test_blob_figures_jobstats_gsrun_and_failures():
    rows = [parse_line(ln) for ln in _lines("report_2411.txt")]
    js, why = blob_figures(rows[0].comment)
    assert why is None and js.source == "jobstats"
    assert js.gpu_util_pct == [12.5] and js.gpu_mem_used_bytes == [4 << 30] and js.energy_j is None
    assert js.cpu_time_s == 3600.2 and js.host_mem_used_bytes == 8 << 30
    gs, why = blob_figures(rows[1].comment)
    assert gs.source == "gsrun" and gs.gpu_util_pct == [0.0, 55.0] and gs.energy_j == 720000.0
    assert gs.sm_active_pct == 15.0 and gs.alerts == 2
    assert blob_figures(rows[2].comment) == (None, "jobstats stub")
    assert blob_figures(rows[3].comment) == (None, "no blob")
    assert blob_figures(rows[5].comment) == (None, "lowercased")
    assert blob_figures("JS1:AAAA") == (None, "corrupt")


def test_parse_2205_header_steps_and_per_node_mem():
    rows = [parse_line(ln) for ln in _lines("report_2205.txt")]
    assert rows[0] is None and rows[2] is None       # CLUSTER: header, step line
    assert rows[1].job_id == "812" and rows[1].mem_req_bytes == 64 << 30   # AllocTRES mem first


def test_window_keeps_each_job_once():
    # the same answer for two chunks: each job counted in the chunk its End falls in
    lines = _lines("report_2411.txt")
    jobs = list(window_jobs(START, END, 12 * 3600, 5, lines_of=lambda argv: iter(lines)))
    assert sorted(j.job_id for j in jobs) == ["4101", "4102", "4103", "4104_7", "4105", "4106"]


def test_mig_fit_uses_the_gpus_profiles():
    m = 150754820096
    assert mig_fit(4 << 30, m, 10.0, 20.0) == "1g.18gb"
    assert mig_fit(20 << 30, m, 10.0, 20.0) == "1g.35gb"
    assert mig_fit(40 << 30, m, 35.0, 20.0) == "3g.71gb"
    assert mig_fit(100 << 30, m, 10.0, 20.0) is None          # only the whole GPU holds it
    assert mig_fit(4 << 30, 85899345920, 10.0, 20.0) == "1g.10gb"
    assert mig_fit(4 << 30, 16 << 30, 10.0, 20.0) is None      # no MIG on that GPU


def test_mig_table_matches_nvml_h200():
    from gsrun.node.mig import profile_table
    from gsrun.report.fleet import MIG_PROFILES

    rec = json.loads((DATA / "nvml" / "h200-mig.json").read_text())
    t = profile_table(rec["devices"][0]["gpu_instance_profiles"])
    nvml = {(p.name, p.slice_count, p.memory_mb) for p in t.profiles if "+" not in p.name}
    assert set(MIG_PROFILES[0][1]) == nvml


def test_sinfo_shares():
    s = parse_sinfo_nodes("CLUSTER: della\ngpu*|64|512000|gpu:a100:4(S:0-1)\ngpu|96|512000|gpu:a100:4\n"
                          "cpu|128|256000|(null)\n")
    assert s == {"gpu": NodeShare(64, 512000 << 20, 4)}


@pytest.fixture(scope="module")
def report(utc_tz):
    cfg = parse_config('[mail]\ndefault_domain = "example.org"\n')
    lines = _lines("report_2411.txt")
    rep = run_report(Scope(START, END, ("della",)), cfg, lines_of=lambda argv: iter(lines), shares=SHARES,
                     digests=True)
    return rep


def test_figures(report):
    assert report.jobs == 6 and report.gpu_jobs == 5 and report.gpu_no_figures == 3
    assert report.no_figures_why == {"jobstats stub": 1, "lowercased": 1, "no blob": 1}
    t = {t.key: t for t in report.tables()}
    # bob: job 4102, 2 GPUs x 1 h, one GPU at 0 % -> 1 GPU-hour at 0 %, alerts 2
    assert t["zero_util_user"].rows == [["bob", 1.0, pytest.approx(2 + 35 / 3600), pytest.approx(100 / (2 + 35 / 3600)),
                                         1, "4102", 2]]
    assert t["energy_user"].rows[0][:2] == ["bob", 0.2]       # 720 kJ
    # jobstats' blob has no SM activity: utilization 12.5 % + 20 % headroom needs 2 of 7 slices
    assert t["mig_fit"].rows[0][0] == "alice" and t["mig_fit"].rows[0][3] == "1x2g.20gb"


@pytest.mark.parametrize("fmt", ["text", "csv", "json"])
def test_golden(report, fmt):
    scope = Scope(START, END, ("della",))
    tables = report.tables()
    if fmt == "text":
        for t in tables:
            check_text(GOLDEN / f"{t.key}.txt", table_text(t, scope), f"table {t.key}")
    elif fmt == "csv":
        check_text(GOLDEN / "report.csv", report_csv(tables, scope), "report CSV")
    else:
        check_text(GOLDEN / "report.json", report_json(tables, scope, {"jobs": report.jobs}), "report JSON")


MIXED_SINFO = ("gpu*|64|512000|gpu:a100:4(S:0-1)\ngpu-v100|32|192000|gpu:v100:4\ngpu-t4|16|96000|gpu:t4:2\n"
               "gpu-l40s|48|384000|gpu:l40s:8,gpu:tmp:1\ncpu|128|256000|(null)\n")


@pytest.fixture(scope="module")
def mixed(utc_tz):
    cfg = parse_config("")
    lines = _lines("report_mixed.txt")
    return run_report(Scope(START, END, ("mix",)), cfg, lines_of=lambda argv: iter(lines),
                      shares=parse_sinfo_nodes(MIXED_SINFO), models=parse_sinfo_models(MIXED_SINFO))


def test_sinfo_models():
    assert parse_sinfo_models(MIXED_SINFO) == ["a100", "l40s", "t4", "tmp", "v100"]
    assert parse_sinfo_models("gpu|4|4096|gpu:4\n") == []


def test_smaller_model_on_a_mixed_cluster(mixed):
    t = {t.key: t for t in mixed.tables()}["model_fit"]
    # 5001: 6 GiB + 20 % -> 8 GiB, SM 5 %: a T4 (15 GiB) holds it; 5002: 20 GiB + 20 % -> 24 GiB:
    # a V100 (32 GiB); 5003 is busy; 5004 (jobstats: utilization 5 %) fits a T4; 5005 is on the
    # smallest model; 5006 names no model; 5007 has no blob
    assert [r[:5] for r in t.rows] == [["carol", "v100", "t4", 1, pytest.approx(1 + 3 / 60)],
                                       ["alice", "a100", "v100", 1, pytest.approx(1 + 1 / 60)],
                                       ["alice", "a100", "t4", 1, pytest.approx(1.0)]]      # by GPU-hours
    assert [r[5] for r in t.rows] == ["5004", "5002", "5001"]
    assert t.jobs == 7 and t.no_figures == 2
    assert t.notes == ["GPU models: a100 (80 GiB), t4 (15 GiB), v100 (32 GiB)",
                       "models sinfo names without a job with figures (memory unknown): l40s, tmp"]


def test_smaller_model_golden(mixed):
    t = {t.key: t for t in mixed.tables()}["model_fit"]
    check_text(GOLDEN / "model_fit_mixed.txt", table_text(t, Scope(START, END, ("mix",))), "table model_fit (mixed)")
