"""Findings: plain-language lines with the real number behind each, from
synthetic streams through the sampler (known answers)."""

from __future__ import annotations

import pytest

from gsrun import SUMMARY_SCHEMA
from gsrun.request.config import Config, SETTINGS
from gsrun.facts.nvml import FakeNvml, Seq
from gsrun.report.findings import finding_records
from gsrun.report.records import JobInfo, JobSummary, NodeSummary
from gsrun.report.render import render_text
from gsrun.report.summary import job_summary

from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data, job_of, make_sampler,
                                  node_of, run_job, util_sample_stream)

H = 3600.0
N = 721        # polls at t = 0 .. 3600 every 5 s

# real H200 figures (shared/data/hosts/h200-vm/README.md, GPM over 2 s windows)
TINY = {"util": 15, "sm_active_pct": 0.2, "sm_occupancy_pct": 0.0, "tensor_active_pct": 0.0, "dram_bw_pct": 0.0,
        "power_w": 104}
BIG = {"util": 99, "sm_active_pct": 95.7, "sm_occupancy_pct": 14.1, "tensor_active_pct": 92.9, "dram_bw_pct": 15.9,
       "power_w": 688}


def _gpm(load):
    return Seq([{"error": "first GPM sample", "code": None}] + [
        {"ok": {k: load[k] for k in ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct")}}
        for _ in range(N)])


def _codes(job):
    return [f.code for f in job.findings]


def _f(job, code):
    fs = [f for f in job.findings if f.code == code]
    assert len(fs) == 1, job.findings
    return fs[0]


def test_idle_gpu_text_with_real_number(tmp_path):
    """GPU 3 of 4 busy only in the last 2 % of the job."""
    fake = FakeNvml(h200_data(4))
    for i in range(3):
        fake.set(i, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 85)))
    fake.set(3, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 100 if t >= 0.98 * H else 0)))
    clock = SimClock()
    st = run_job(make_sampler(tmp_path, fake, [0, 1, 2, 3], clock, usage=cpu_usage(clock, 4.0, 8 * GIB)), N)
    job = job_of([node_of(st, H, gpus=[0, 1, 2, 3])], H, cpus_alloc=8, mem_req_bytes=16 * GIB, gpus_alloc=4)
    g3 = job.gpu.devices[3]
    assert g3.util_mean_pct == pytest.approx(2.0, abs=0.05)
    assert g3.util_idle_frac == pytest.approx(705 / 720, abs=1e-3)
    f = _f(job, "idle_gpu")
    assert f.value == pytest.approx(97.9, abs=0.05)
    assert f.text == "GPU 3 on n1 was idle 98% of the time (mean utilization 2%): ask for 3 GPUs (--gpus 3)."
    assert f.action == "ask for 3 GPUs (--gpus 3)"
    assert "idle_gpu" in _codes(job) and "low_sm_activity" not in _codes(job)


def test_all_gpus_idle_does_not_say_ask_for_zero(tmp_path):
    fake = FakeNvml(h200_data(2))
    for i in range(2):
        fake.set(i, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 0)))
    st = run_job(make_sampler(tmp_path, fake, [0, 1], SimClock()), N)
    job = job_of([node_of(st, H, gpus=[0, 1])], H)
    texts = [f.text for f in job.findings if f.code == "idle_gpu"]
    # one finding for both GPUs (grouped across GPUs)
    assert texts == ["GPUs 0, 1 on n1 were idle 100% of the time (mean utilization 0%): check that the code "
                     "runs on the GPU at all (model and data moved to 'cuda')."]
    assert not any("ask for 0" in t or "ask for 1 GPU" in t for t in texts)


def test_tiny_kernel_sm_activity_far_below_utilization(tmp_path):
    """64x64 bf16 matmul loop on the H200: duty-cycle 15 %, GPM SM activity
    0.2 %. The 8192x8192 loop (99 % / 95.7 %) draws no such finding."""
    fake = FakeNvml(h200_data(2))
    for i, load in enumerate((TINY, BIG)):
        fake.set(i, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t, u=load["util"]: u)))
        fake.set(i, "gpm", _gpm(load))
        fake.set(i, "energy_mj", Seq(energy_stream(N, 5.0, lambda t, p=load["power_w"]: p)))
    st = run_job(make_sampler(tmp_path, fake, [0, 1], SimClock()), N)
    job = job_of([node_of(st, H, gpus=[0, 1])], H)
    tiny, big = job.gpu.devices
    assert tiny.util_mean_pct == 15.0 and tiny.sm_active_mean_pct == 0.2
    assert big.sm_active_mean_pct == 95.7 and big.tensor_active_mean_pct == 92.9
    assert tiny.power_mean_w == pytest.approx(104.0) and big.power_mean_w == pytest.approx(688.0)
    f = _f(job, "low_sm_activity")
    assert f.value == 0.2
    assert f.text.startswith("GPU 0 on n1: SM activity 0.2% is far below the utilization 15%: ")
    text = render_text(job).splitlines()
    assert "  !  GPU 0 on n1: SM activity 0.2% is far below the utilization 15%: kernels" in text
    # the per-GPU block (two GPUs on one node: one block each), SM activity 0.2% not rounded to 0%
    i = text.index("  n1 GPU 0, NVIDIA H200")
    assert text[i + 1:i + 3] == ["    busy 15%, SM active 0.2%, tensor active 0%",
                                 "    memory peak 0.6 of 140.4 GiB, power 104 W, energy 104 Wh"]


def test_low_sm_not_flagged_when_sm_close_to_util(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 12)))
    fake.set(0, "gpm", _gpm({"sm_active_pct": 10.0, "sm_occupancy_pct": 5.0, "tensor_active_pct": 0.0,
                             "dram_bw_pct": 1.0}))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), N)
    assert "low_sm_activity" not in _codes(job_of([node_of(st, H)], H))


def _cpu_job(tmp_path, gpu_util, cores_busy):
    fake = FakeNvml(h200_data(2))
    for i in range(2):
        fake.set(i, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: gpu_util)))
    clock = SimClock()
    st = run_job(make_sampler(tmp_path, fake, [0, 1], clock, usage=cpu_usage(clock, cores_busy, 30 * GIB)), N)
    return job_of([node_of(st, H, cpus=8, gpus=[0, 1])], H, cpus_alloc=8, mem_req_bytes=32 * GIB, gpus_alloc=2)


def test_cpu_bound_input_pipeline(tmp_path):
    job = _cpu_job(tmp_path, 30, 7.6)
    assert job.cpu.efficiency_pct == 95.0
    f = _f(job, "cpu_bound")
    assert f.value == 95.0
    assert "CPUs were 95% busy while the GPUs were busy only 30%" in f.text
    assert "DataLoader workers" in f.text and "pin_memory=True" in f.text


def test_cpu_saturated_but_gpus_busy_is_not_cpu_bound(tmp_path):
    assert "cpu_bound" not in _codes(_cpu_job(tmp_path, 80, 7.6))


def test_cpu_bound_threshold_from_site_config(tmp_path):
    job = _cpu_job(tmp_path, 30, 6.0)               # 75 %: under the default 90 %
    assert "cpu_bound" not in _codes(job)
    vals = {s.key: s.default for s in SETTINGS}
    vals["findings.cpu_saturated_pct"] = 70.0
    cfg = Config(vals)
    rec = dict(job.job.to_json(), elapsed_s=H)
    nodes = [NodeSummary(schema=SUMMARY_SCHEMA, kind="node", job_id="4242", node="n1", start_time=0, end_time=H,
                         elapsed_s=H, cpus_alloc=8, cpu_time_s=job.cpu.time_s, cpu_source="x",
                         mem_peak_bytes=30 * GIB, mem_source="x", gpu_available=True, gpu_reason=None,
                         gpus=job.gpu.devices, notes=())]
    again = job_summary(JobInfo(**rec), nodes, cfg)
    assert _f(again, "cpu_bound").value == 75.0


def test_memory_overrequest_and_idle_cpus(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 90)))
    clock = SimClock()
    st = run_job(make_sampler(tmp_path, fake, [0], clock, usage=cpu_usage(clock, 0.5, 4 * GIB)), N)
    job = job_of([node_of(st, H, cpus=16, gpus=[0])], H, cpus_alloc=16, mem_req_bytes=64 * GIB, gpus_alloc=1)
    f = _f(job, "mem_overrequest")
    assert f.value == 6.2 and "at most 6% of the host memory" in f.text
    c = _f(job, "cpu_idle")
    assert c.value == pytest.approx(3.1) and "3% of 16 allocated cores" in c.text


def test_gpu_memory_low(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 90)))
    fake.set(0, "memory", {"total": 150754820096, "used": 7 * GIB, "free": 0})
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), N)
    f = _f(job_of([node_of(st, H)], H), "gpu_mem_low")
    assert f.value == pytest.approx(5.0, abs=0.05) and "at most 5% of its memory" in f.text


def test_pending_and_cancelled_jobs():
    base = {"schema": SUMMARY_SCHEMA, "kind": "job", "cpu": {"efficiency_pct": None},
            "memory": {"efficiency_pct": None}, "gpu": {"available": False, "devices": [], "reason": None}}

    def first_code(job):
        return finding_records(JobSummary.from_json(dict(base, job=dict(job, id="1"))))[0].code
    assert first_code({"state": "PENDING", "elapsed_s": 0}) == "deferred"
    assert first_code({"state": "CANCELLED by 1000", "elapsed_s": 0}) == "never_started"


def test_low_gpu_util_grouped_warn_below_25_info_below_50(tmp_path):
    """Low-but-not-idle use. GPUs at 10 %, 20 % (under the warn
    threshold 25 %), 30 %, 40 % (under the note threshold 50 %), 60 %
    (fine): two findings, each naming its GPUs once."""
    fake = FakeNvml(h200_data(5))
    for i, u in enumerate((10, 20, 30, 40, 60)):
        fake.set(i, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t, u=u: u)))
    st = run_job(make_sampler(tmp_path, fake, [0, 1, 2, 3, 4], SimClock()), N)
    job = job_of([node_of(st, H, gpus=[0, 1, 2, 3, 4])], H)
    low = [f for f in job.findings if f.code == "low_gpu_util"]
    assert [(f.severity, f.value) for f in low] == [("warn", 10.0), ("info", 30.0)]
    assert low[0].text.startswith("GPUs 0, 1 on n1 were busy only 10-20% of the time (target 50%): ")
    assert low[1].text.startswith("GPUs 2, 3 on n1 were busy only 30-40% of the time (target 50%): ")
    assert low[0].action == "feed the GPU faster (DataLoader num_workers, pin_memory, larger batches)"
    assert "idle_gpu" not in _codes(job)


def test_low_gpu_util_thresholds_come_from_the_site_config(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(N, 5.0, lambda t: 30)))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), N)
    job = job_of([node_of(st, H)], H)
    assert _f(job, "low_gpu_util").severity == "info"
    vals = {s.key: s.default for s in SETTINGS}
    assert vals["findings.low_util_note_pct"] == 50.0 and vals["findings.low_util_warn_pct"] == 25.0
    vals["findings.low_util_warn_pct"] = 35.0
    assert [f.severity for f in finding_records(job, Config(vals)) if f.code == "low_gpu_util"] == ["warn"]
    vals["findings.low_util_warn_pct"], vals["findings.low_util_note_pct"] = 25.0, 20.0
    assert "low_gpu_util" not in [f.code for f in finding_records(job, Config(vals))]


@pytest.mark.parametrize("elapsed_s, limit_s, text", [
    (3600.0, 8 * 3600.0, "The job ran 01:00:00 of its 08:00:00 time limit (12%): ask for less time "
                         "(--time 01:30:00). A shorter limit lets Slurm start the job sooner (backfill)."),
    (600.0, 3 * 3600.0, "The job ran 00:10:00 of its 03:00:00 time limit (6%): ask for less time "
                        "(--time 00:45:00). A shorter limit lets Slurm start the job sooner (backfill)."),
    (3600.0, 3 * 3600.0, None),          # 33 % used: at or above time_limit_used_pct (25 %)
    (600.0, 2000.0, None),               # 30 % used but 1400 s to spare: under the 30 min slack
    (600.0, 3000.0, "The job ran 00:10:00 of its 00:50:00 time limit (20%): ask for less time "
                    "(--time 00:45:00). A shorter limit lets Slurm start the job sooner (backfill)."),
])
def test_time_limit_high(elapsed_s, limit_s, text):
    job = JobSummary.from_json({
        "schema": SUMMARY_SCHEMA, "kind": "job",
        "job": {"id": "1", "state": "COMPLETED", "elapsed_s": elapsed_s, "time_limit_s": limit_s},
        "gpu": {"available": False, "devices": [], "reason": None},
        "cpu": {"efficiency_pct": None}, "memory": {"efficiency_pct": None}})
    got = [f for f in finding_records(job) if f.code == "time_limit_high"]
    if text is None:
        assert got == []
    else:
        assert [(f.severity, f.text) for f in got] == [("info", text)]
        assert got[0].value == round(100 * elapsed_s / limit_s, 1)
