"""Known-answer tests: synthetic NVML streams through the real Sampler
(FakeNvml + simulated clock) -> node summary -> job summary -> findings.

The field cases named in section comments are described in docs/field-cases.md."""

from __future__ import annotations

import pytest

from gsrun.facts.nvml import NA, FakeNvml, NvmlUnavailable, Seq, return_na
from gsrun.report.render import render_text
from gsrun.node.sampler import THROTTLE_CAUSES

from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data, job_of, make_sampler,
                                  node_of, run_job, util_sample_stream)

INTERVAL = 5.0


def burst(period_s=4.0, busy_s=2.0):
    return lambda t: 100 if (t % period_s) < busy_s - 1e-9 else 0


# ----------------------------------------------------------------- utilization

def test_burst_load_50pct_duty_cycle_from_driver_buffer(tmp_path):
    """GPU busy 2 s of every 4 s; polled every 5 s. The instantaneous reading
    (set to 100 here: polls that always land in a burst) must not be used: the
    driver's buffer between polls gives 50 %."""
    n = 721                                   # t = 0 .. 3600 s
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(n, INTERVAL, burst())))
    fake.set(0, "utilization", {"gpu": 100, "memory": 10})
    clock = SimClock()
    st = run_job(make_sampler(tmp_path, fake, [0], clock), n)
    g = node_of(st, 3600)["gpus"][0]
    assert g["util_mean_pct"] == pytest.approx(50.0, abs=0.5)
    assert g["util_gap_s"] == 0
    assert g["covered_s"] == 3600
    assert g["util_busy_s"] == pytest.approx(1800, abs=20)
    assert ("util_pct" in st["gpus"][0]["metrics"]) and (0, "utilization") not in fake.calls


def test_burst_load_aliasing_poll_period(tmp_path):
    """Bursts of 5 s every 10 s, polled every 5 s in phase: every instantaneous
    reading would be 100 % or every one 0 %; the buffer gives 50 %."""
    n = 361
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(n, INTERVAL, burst(10.0, 5.0), period_s=1 / 6)))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    assert node_of(st, 1800)["gpus"][0]["util_mean_pct"] == pytest.approx(50.0, abs=2.0)


def test_util_samples_deduplicated_by_timestamp(tmp_path):
    """The driver repeats samples already seen (overlap); each timestamp counts once."""
    ts = [int(1e6 * k) for k in range(1, 40)]
    polls = [
        {"ok": [[ts[0], 100]]},                                     # t=0: baseline only
        {"ok": [[ts[0], 100], [ts[1], 100], [ts[2], 0]]},          # ts[0] is old
        {"ok": [[ts[2], 0], [ts[2], 0], [ts[3], 0], [ts[4], 0]]},   # ts[2] old; ts[3], ts[4] new
        {"ok": [[ts[4], 0], [ts[5], 100]]},
    ]
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(polls))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 4)
    m = st["gpus"][0]["metrics"]["util_pct"]
    # windows: (100+0)/2=50, (0+0)/2=0, 100 -> each over 5 s; the final (repeat) poll adds nothing new
    assert m["wsum"] / m["weight_s"] == pytest.approx(50.0)
    assert m["weight_s"] == 15.0
    assert st["gpus"][0]["last_sample_us"] == ts[5]
    # first poll sets the baseline without counting pre-job samples
    assert m["max"] == 100 and m["min"] == 0 and m["n"] == 3


def test_fallback_to_utilization_rates_when_buffer_unsupported(tmp_path):
    n = 13
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", NA("Not Supported", 3))
    fake.set(0, "utilization", Seq([{"ok": {"gpu": 20 if k % 2 else 60, "memory": 0}} for k in range(n)]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    g = node_of(st, 60)["gpus"][0]
    assert g["util_mean_pct"] == pytest.approx(40.0)   # 6 x 20 + 6 x 60 over 12 intervals


def test_na_samples_are_gap_time_not_zero(tmp_path):
    """Polls 100-243 (144 polls x 5 s = 720 s) answer N/A: util is the mean of
    the rest (80 %), not 80 x 0.8 = 64 %, and 720 s show as gap."""
    n = 721
    stream = util_sample_stream(n, INTERVAL, lambda t: 80)
    err = {"error": "Unknown Error", "code": 999}
    for k in range(100, 244):
        stream[k] = err
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(stream))
    fake.set(0, "utilization", NA("Unknown Error", 999))   # the fallback, asked only when the buffer fails
    mem = [{"ok": {"total": 150754820096, "used": 40 * GIB, "free": 0}} for _ in range(n)]
    for k in range(100, 244):
        mem[k] = err
    fake.set(0, "memory", Seq(mem))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    summ = node_of(st, 3600)
    g = summ["gpus"][0]
    assert g["util_mean_pct"] == pytest.approx(80.0)
    assert g["util_gap_s"] == pytest.approx(720.0)
    assert g["util_busy_s"] == pytest.approx(0.8 * (3600 - 720))
    assert st["gpus"][0]["metrics"]["mem_used_bytes"]["gap_s"] == pytest.approx(720.0)
    assert g["mem_peak_bytes"] == 40 * GIB
    text = render_text(job_of([summ], 3600))
    # durations in one unit (clock), in the GPU's block
    assert "    no utilization reading for 00:12:00 (left out of the mean)" in text.splitlines()
    assert "GPU busy        80%  good             share of time a kernel ran" in text.splitlines()


# ----------------------------------------------------------------- energy

def test_energy_counter_delta_with_reset_midway(tmp_path):
    """300 W for 1 h; the counter resets (driver reload) 2 s after the poll at
    t=1795 (600 J accrued before the reset are lost), then restarts from 0."""
    n = 721
    stream = energy_stream(n, INTERVAL, lambda t: 300.0)
    base = stream[360]["ok"]           # reading the t=1800 poll would have had
    for k in range(360, n):
        # after the reset the counter holds only what accrued since it: 3 s at 300 W at t=1800
        stream[k] = {"ok": stream[k]["ok"] - base + 900_000}
    fake = FakeNvml(h200_data(1))
    fake.set(0, "energy_mj", Seq(stream))
    fake.set(0, "power_mw", 300_000)
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    g = node_of(st, 3600)["gpus"][0]
    assert g["energy_counter_resets"] == 1
    assert g["energy_j"] == pytest.approx(300 * 3600 - 600, abs=0.5)
    assert g["power_mean_w"] == pytest.approx((300 * 3600 - 600) / 3600, abs=0.05)
    job = job_of([node_of(st, 3600)], 3600)
    assert job.gpu.energy_kwh == pytest.approx((300 * 3600 - 600) / 3.6e6, abs=1e-6)


def test_energy_gap_in_counter_reads_loses_nothing(tmp_path):
    n = 121
    stream = energy_stream(n, INTERVAL, lambda t: 200.0)
    for k in range(30, 60):
        stream[k] = {"error": "Unknown Error", "code": 999}
    fake = FakeNvml(h200_data(1))
    fake.set(0, "energy_mj", Seq(stream))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    g = node_of(st, 600)["gpus"][0]
    assert g["energy_j"] == pytest.approx(200 * 600, abs=0.5)
    assert g["energy_counter_resets"] == 0


# ----------------------------------------------------------------- GPU lost (field case 16)

def test_gpu_lost_midway_4_gpus_every_10s(tmp_path):
    """4 GPUs every 10 s; GPU 2 falls off the bus at t = 1800 s (Xid 79 seen
    at t = 1790, then every call answers GPU_IS_LOST). GPUs 0, 1, 3 keep going;
    GPU 2's figures cover t < 1800 s only; the finding says hardware event."""
    interval, n = 10.0, 361            # t = 0 .. 3600
    fake = FakeNvml(h200_data(4))
    utils = {0: 90, 1: 70, 2: 60, 3: 40}
    for i, u in utils.items():
        fake.set(i, "util_samples", Seq(util_sample_stream(n, interval, lambda t, u=u: u)))
        fake.set(i, "energy_mj", Seq(energy_stream(n, interval, lambda t: 500.0)))
    fake.set(2, "xid_events", Seq([{"ok": [79] if k == 179 else []} for k in range(n)]))
    clock = SimClock()
    mark = []

    def fall_off():
        fake.data["devices"][2]["lost"] = True
        mark.append(len(fake.calls))
    clock.at(1800, fall_off)
    s = make_sampler(tmp_path, fake, [0, 1, 2, 3], clock, interval_s=interval)
    st = run_job(s, n)                  # must not raise
    summ = node_of(st, 3600, gpus=[0, 1, 2, 3])
    by = {g["index"]: g for g in summ["gpus"]}
    assert by[2]["lost_at_s"] == 1800 and by[2]["status"] == "lost"
    assert by[2]["lost_reason"] == "GPU is lost"
    assert by[2]["covered_s"] == 1790
    assert by[2]["util_mean_pct"] == pytest.approx(60)
    assert by[2]["util_busy_s"] == pytest.approx(0.6 * 1790, abs=1)
    assert by[2]["energy_j"] == pytest.approx(500 * 1790, abs=0.5)
    assert by[2]["xid"] == [79]
    for i in (0, 1, 3):
        assert by[i]["lost_at_s"] is None and by[i]["covered_s"] == 3600
        assert by[i]["util_mean_pct"] == pytest.approx(utils[i])
        assert by[i]["energy_j"] == pytest.approx(500 * 3600, abs=0.5)
    # the lost GPU is asked once (the poll that finds it lost), then never again
    after = [k for idx, k in fake.calls[mark[0]:] if idx == 2]
    assert after.count("memory") == 1 and len(after) <= 15
    assert [k for idx, k in fake.calls[mark[0]:] if idx == 3].count("memory") == 182   # t=1800..3600 + stop
    job = job_of([summ], 3600, gpus_alloc=4)
    lost = [f for f in job.findings if f.code == "gpu_lost"]
    assert len(lost) == 1 and lost[0].severity == "alert"
    assert lost[0].text == ("Hardware event: GPU 2 on n1 was lost 00:30:00 into the job (Xid 79: fallen off "
                            "the bus) and the node was flagged for the admins. Its figures cover only the "
                            "time before; if the job failed then, resubmit it.")
    assert not [f for f in job.findings if f.code == "xid"]     # Xid 79 is told once, with the loss
    assert job.gpu.gpu_hours_used == pytest.approx((0.9 + 0.7 + 0.4) + 0.6 * 1790 / 3600, abs=1e-3)
    assert job.gpu.gpu_hours_alloc == 4.0
    text = render_text(job)
    assert "    lost 00:30:00 into the job; Xid 79" in text.splitlines()
    # one unit everywhere: the alert line under the title, the finding and the GPU's note
    assert text.count("lost 00:30:00 into the job") == 3 and "1800 s" not in text
    assert text.splitlines()[1] == "!! GPU 2 on n1 was lost 00:30:00 into the job (Xid 79: fallen off the bus)"


def test_lost_on_first_poll_never_crashes(tmp_path):
    fake = FakeNvml(h200_data(2))
    fake.data["devices"][1]["lost"] = True
    st = run_job(make_sampler(tmp_path, fake, [0, 1], SimClock()), 5)
    g = node_of(st, 20, gpus=[0, 1])["gpus"][1]
    assert g["status"] == "lost" and g["lost_at_s"] == 0
    assert g["util_mean_pct"] is None and g["covered_s"] is None
    job = job_of([node_of(st, 20, gpus=[0, 1])], 20)
    assert [f.code for f in job.findings] == ["gpu_lost", "short_job"]


# ----------------------------------------------------------------- NVML init failure (field case 15)

def test_nvml_init_failure_keeps_cpu_and_memory(tmp_path):
    data = h200_data(1)
    data["init"] = {"error": "Driver/library version mismatch", "code": 18}
    clock = SimClock()
    s = make_sampler(tmp_path, None, [0, 1], clock, nvml=lambda: FakeNvml(data),
                     usage=cpu_usage(clock, 4.0, 8 * GIB, 12 * GIB))
    st = run_job(s, 721)
    summ = node_of(st, 3600, cpus=8, gpus=[0, 1])
    assert summ["gpu_available"] is False
    assert summ["gpu_reason"] == "NVML init failed: LIB_RM_VERSION_MISMATCH"
    assert [g["status"] for g in summ["gpus"]] == ["unavailable", "unavailable"]
    assert summ["cpu_time_s"] == pytest.approx(4 * 3600)
    job = job_of([summ], 3600, cpus_alloc=8, mem_req_bytes=32 * GIB, gpus_alloc=2)
    assert job.cpu.efficiency_pct == 50.0
    assert job.memory.peak_bytes == 12 * GIB
    text = render_text(job)
    assert "unavailable (NVML init failed: LIB_RM_VERSION_MISMATCH)" in text
    lines = text.splitlines()
    assert "CPU efficiency  50%  good             of 8 cores" in lines
    assert "Host memory     38%  could be better  peak 12.0 of 32.0 GiB requested" in lines
    assert "  CPU time 04:00:00 of 8 cores x 01:00:00; host memory peak 12.0 GiB" in lines
    assert not any(ln.startswith("GPU ") for ln in lines)         # no GPU verdict without GPU figures
    assert "idle" not in text
    assert any(f.code == "gpu_unavailable" for f in job.findings)


def test_nvml_unavailable_exception_from_factory(tmp_path):
    def boom():
        raise NvmlUnavailable("LIB_RM_VERSION_MISMATCH", "Driver/library version mismatch")
    st = run_job(make_sampler(tmp_path, None, [0], SimClock(), nvml=boom), 3)
    assert st["nvml_error"] == "NVML init failed: LIB_RM_VERSION_MISMATCH"
    assert any("Driver/library version mismatch" in n for n in st["notes"])


@pytest.mark.parametrize("nvml_works", [True, False])
def test_cpu_only_job_has_no_gpu_finding_and_says_none(tmp_path, nvml_works):
    """A job without GPUs, on a GPU node or on one without NVIDIA's library:
    no "No GPU figures" finding, the report says it asked for none, the mail
    has no GPU headline or section. A GPU job whose node cannot open NVML
    still gets the finding."""
    from gsrun.report.mail.view import mail_view
    from gsrun.report.summary import node_record

    def boom():
        raise NvmlUnavailable("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1: cannot open shared object file")
    fake = FakeNvml(h200_data(1)) if nvml_works else None
    st = run_job(make_sampler(tmp_path, fake, [], SimClock(), **({} if nvml_works else {"nvml": boom})), 5)
    job = job_of([node_of(st, 3600, gpus=[])], 3600, gpus_alloc=0, cpus_alloc=8)
    assert "gpu_unavailable" not in [f.code for f in job.findings]
    text = render_text(job, color=False)
    assert "none: the job asked for no GPUs" in text and "unavailable" not in text
    view = mail_view(job, text, False, "cid")
    assert view["gpu_section"] is False and view["gpu_headline"] == ""
    (tmp_path / "g").mkdir()
    st = run_job(make_sampler(tmp_path / "g", None, [0], SimClock(), nvml=boom), 5)
    job = job_of([node_of(st, 3600, gpus=[0])], 3600, gpus_alloc=1, cpus_alloc=8)
    assert "gpu_unavailable" in [f.code for f in job.findings]
    # no GPU count from Slurm (AllocTRES without gres/gpu) and a node without sampler state: its gres count
    job = job_of([node_record(None, {"node": "n1", "job_id": "4242", "gpus": [0, 1]}, 100.0).to_json()], 3600,
                 gpus_alloc=None)
    assert job.job.gpus_alloc == 2 and "gpu_unavailable" in [f.code for f in job.findings]
    assert "none: the job asked for no GPUs" not in render_text(job, color=False)


# ----------------------------------------------------------------- MIG (field case 12)

def test_mig_utilization_is_na_mig_never_zero(tmp_path):
    """A MIG GPU: utilization NOT_SUPPORTED on every poll, memory works
    (9.5 GiB of 9.75 GiB). Utilization is N/A (MIG), not 0 %, and nothing says
    the GPU was unused."""
    fake = FakeNvml(h200_data(1))
    fake.set(0, "mig_mode", [1, 1])
    fake.set(0, "util_samples", NA("Not Supported", 3))
    fake.set(0, "utilization", NA("Not Supported", 3))
    fake.set(0, "memory", {"total": int(9.75 * GIB), "used": int(9.5 * GIB), "free": int(0.25 * GIB)})
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 721)
    summ = node_of(st, 3600)
    g = summ["gpus"][0]
    assert g["mig"] is True and g["util_mean_pct"] is None and g["util_na_reason"] == "MIG"
    assert g["mem_peak_bytes"] == int(9.5 * GIB) and g["mem_peak_pct"] == pytest.approx(97.4, abs=0.1)
    job = job_of([summ], 3600, gpus_alloc=1, cpus_alloc=8)
    codes = [f.code for f in job.findings]
    assert "idle_gpu" not in codes and "util_na" in codes
    text = render_text(job)
    assert "N/A (MIG)" in text
    assert "    memory peak 9.5 of 9.8 GiB, power 0 W, energy 0.0 Wh" in text.splitlines()
    assert "GPU memory      97%  good             peak 9.5 of 9.8 GiB" in text.splitlines()
    assert "busy 0%" not in text
    assert "0.0%" not in text.split("GPUs")[1].split("Findings")[0]
    flat = " ".join(text.split())          # findings are wrapped
    assert "GPU busy N/A not reported (MIG or driver): does not mean unused" in flat   # the verdict row
    assert "did not use" not in flat and "unused" not in flat.replace("does not mean the GPU was unused", "") \
        .replace("does not mean unused", "")
    assert "GPU 0 on n1: utilization N/A (MIG)" in flat
    assert job.gpu.gpu_hours_used is None


# ----------------------------------------------------------------- short job

def test_ten_second_job_gets_short_job_and_no_lecture(tmp_path):
    clock = SimClock()
    fake = FakeNvml(h200_data(2))        # idle GPUs, idle CPU: would draw advice on a long job
    st = run_job(make_sampler(tmp_path, fake, [0, 1], clock, usage=cpu_usage(clock, 0.01, GIB)), 3)
    assert st["samples"] == 4 and st["last_time"] - st["start_time"] == 10
    summ = node_of(st, 10, gpus=[0, 1])
    job = job_of([summ], 10, cpus_alloc=8, mem_req_bytes=64 * GIB, gpus_alloc=2)
    codes = [f.code for f in job.findings]
    assert codes == ["short_job"]
    assert "10 s" in job.findings[0].text and "no advice" in job.findings[0].text


def test_short_job_still_reports_hardware_events(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "xid_events", Seq([{"ok": []}, {"ok": [48]}, {"ok": []}]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 3)
    job = job_of([node_of(st, 10)], 10)
    codes = [f.code for f in job.findings]
    assert codes == ["xid", "short_job"]
    assert "48 (double-bit ECC error)" in job.findings[0].text


# ----------------------------------------------------------------- memory, throttling, GPM

def test_memory_high_water_vs_total(tmp_path):
    n = 101
    used = [min(k, 100 - k) * 2 * GIB for k in range(n)]     # ramps to 100 GiB at k=50, back down
    fake = FakeNvml(h200_data(1))
    fake.set(0, "memory", Seq([{"ok": {"total": 150754820096, "used": u, "free": 150754820096 - u}}
                               for u in used]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    g = node_of(st, 500)["gpus"][0]
    assert g["mem_peak_bytes"] == 100 * GIB
    assert g["mem_total_bytes"] == 150754820096
    assert g["mem_peak_pct"] == pytest.approx(100 * 100 * GIB / 150754820096, abs=0.05)
    text = render_text(job_of([node_of(st, 500)], 500)).splitlines()
    assert "    memory peak 100.0 of 140.4 GiB, power 0 W, energy 0.0 Wh" in text
    assert "GPU memory      71%  good             peak 100.0 of 140.4 GiB" in text


def test_throttle_seconds_per_cause(tmp_path):
    """power cap for polls 1-100 (500 s), thermal for 101-150 (250 s), both
    (power brake + HW thermal) for 151-160 (50 s each), idle after."""
    n = 721
    reasons = []
    for k in range(n):
        if 1 <= k <= 100:
            reasons.append(0x4)
        elif 101 <= k <= 150:
            reasons.append(0x20)
        elif 151 <= k <= 160:
            reasons.append(0x80 | 0x40)
        else:
            reasons.append(0x1)
    fake = FakeNvml(h200_data(1))
    fake.set(0, "throttle_reasons", Seq([{"ok": r} for r in reasons]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), n)
    g = node_of(st, 3600)["gpus"][0]
    assert g["throttle_s"] == {"power": 550.0, "thermal": 300.0, "hw_slowdown": 0.0, "sync_boost": 0.0}
    assert set(g["throttle_s"]) == set(THROTTLE_CAUSES)
    job = job_of([node_of(st, 3600)], 3600)
    f = {str(x.code): x for x in job.findings}
    assert f["throttle_power"].value == 550.0 and "15% of the time" in f["throttle_power"].text
    assert "throttle_thermal" not in f           # 300 s of 3600 s is under 10 %


def test_gpm_first_sample_and_unsupported(tmp_path):
    """GPM's first call has no interval (NA "first GPM sample"): not an
    'unsupported' mark and no value; later calls give the interval's figures.
    A GPU without GPM support is never asked for GPM."""
    n = 5
    fake = FakeNvml(h200_data(2))
    gpm = [{"error": "first GPM sample", "code": None}] + [
        {"ok": {"sm_active_pct": v, "sm_occupancy_pct": 10.0, "tensor_active_pct": v / 2, "dram_bw_pct": 5.0}}
        for v in (40.0, 60.0, 80.0, 80.0)]
    fake.set(0, "gpm", Seq(gpm))
    fake.set(1, "gpm_supported", 0)
    st = run_job(make_sampler(tmp_path, fake, [0, 1], SimClock()), n)
    a, b = node_of(st, 20, gpus=[0, 1])["gpus"]
    assert "gpm" not in a["unsupported"]
    # polls at t=5..20 carry 5 s each (t=20 repeats the last item); the stop poll adds 0 s
    assert a["sm_active_mean_pct"] == pytest.approx((40 + 60 + 80 + 80) / 4)
    assert a["tensor_active_mean_pct"] == pytest.approx((20 + 30 + 40 + 40) / 4)
    assert (1, "gpm") not in fake.calls and b["sm_active_mean_pct"] is None


def test_pcie_from_gpm_without_the_blocking_call(tmp_path):
    """With GPM, PCIe throughput is the interval's GPM metric (KB/s as NVML
    gives it, x 1024 to bytes/s): nvmlDeviceGetPcieThroughput, which blocks
    ~20 ms per call, is asked only while GPM has no interval yet (the monitor's
    first poll of the GPU); the final sample takes PCIe from GPM too."""
    fake = FakeNvml(h200_data(1))
    fake.set(0, "gpm", Seq([{"error": "first GPM sample", "code": None}]
                           + [{"ok": {"sm_active_pct": 50.0, "pcie_tx_kbs": 2048.0, "pcie_rx_kbs": 1024.0}}]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 5)
    m = st["gpus"][0]["metrics"]
    assert [c for c in fake.calls if c[1] in ("pcie_tx_kbs", "pcie_rx_kbs")] == [(0, "pcie_tx_kbs"), (0, "pcie_rx_kbs")]
    assert m["pcie_tx_bytes_s"]["max"] == m["pcie_tx_bytes_s"]["min"] == 2048 * 1024
    assert m["pcie_tx_bytes_s"]["n"] == 5       # polls 2 to 5 and the final sample
    assert m["pcie_rx_bytes_s"]["max"] == 1024 * 1024


def test_first_poll_of_a_job_keeps_no_gpm_span_from_before_it(tmp_path):
    """The monitor keeps a GPU's last GPM sample between jobs: a later job's
    first GPM interval began before the job (an earlier job's 99 % here), so
    that poll is a baseline only: no SM or PCIe figure, min/max or point."""
    fake = FakeNvml(h200_data(1))
    fake.set(0, "gpm", Seq([{"ok": {"sm_active_pct": 99.0, "pcie_tx_kbs": 9e6, "pcie_rx_kbs": 9e6}}]
                           + [{"ok": {"sm_active_pct": 50.0, "pcie_tx_kbs": 2048.0, "pcie_rx_kbs": 1024.0}}]))
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 5)
    g = st["gpus"][0]
    assert g["metrics"]["sm_active_pct"]["max"] == 50.0 and g["metrics"]["pcie_tx_bytes_s"]["max"] == 2048 * 1024
    assert g["timeline"]["sm_active_pct"]["points"][0][1] == 50.0
    assert "gpm" not in g["unsupported"] and not [c for c in fake.calls if c[1] == "pcie_tx_kbs"]


def test_gpm_metric_refused_is_unsupported_and_pcie_falls_back(tmp_path):
    """A GPM metric NVML refuses (its own nvmlReturn) has no figure and its
    reason in ``unsupported``; a refused PCIe metric is read the blocking way."""
    fake = FakeNvml(h200_data(1))
    fake.set(0, "gpm", Seq([{"error": "first GPM sample", "code": None}]
                           + [{"ok": {"sm_active_pct": 50.0, "tensor_active_pct": return_na(3),
                                      "pcie_tx_kbs": return_na(3), "pcie_rx_kbs": 1024.0}}]))
    fake.set(0, "pcie_tx_kbs", 512)
    st = run_job(make_sampler(tmp_path, fake, [0], SimClock()), 5)
    g = st["gpus"][0]
    assert g["unsupported"]["tensor_active_pct"] == "Not Supported" and "pcie_tx_kbs" not in g["unsupported"]
    assert g["metrics"]["pcie_tx_bytes_s"]["max"] == 512 * 1024
    assert g["metrics"]["tensor_active_pct"]["max"] is None and g["metrics"]["sm_active_pct"]["max"] == 50.0
    # the first poll (GPM has no interval yet) asks both; later polls, the final one too, only the refused one
    assert [c for c in fake.calls if c[1] in ("pcie_tx_kbs", "pcie_rx_kbs")] == [(0, "pcie_tx_kbs"), (0, "pcie_rx_kbs")] \
        + [(0, "pcie_tx_kbs")] * 5


# ----------------------------------------------------------------- sampler restart

def test_restarted_sampler_continues_and_counts_downtime_as_gap(tmp_path):
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq(util_sample_stream(400, INTERVAL, lambda t: 70)))
    clock = SimClock()
    s1 = make_sampler(tmp_path, fake, [0], clock, flush_s=0.0)
    for _ in range(100):
        s1.sample_once()
        s1.flush()
        clock.sleep(INTERVAL)
    clock.sleep(595)                    # sampler dead for ~10 minutes
    # util samples resume after the downtime: skip the stream ahead
    fake.set(0, "util_samples", Seq([{"ok": [[int((clock.t + k * 5) * 1e6), 70]]} for k in range(60)]))
    s2 = make_sampler(tmp_path, fake, [0], clock)
    st = run_job(s2, 50)
    assert any("restarted" in x for x in st["notes"])
    assert st["gap_s"] == pytest.approx(595.0)
    g = node_of(st, st["last_time"] - st["start_time"])["gpus"][0]
    assert g["util_mean_pct"] == pytest.approx(70.0)
    assert g["util_gap_s"] == pytest.approx(595.0)
