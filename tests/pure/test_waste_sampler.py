"""The waste detector inside the real Sampler (FakeNvml + simulated clock):
the watches live in the state, detections land in ``waste_findings``, a
restarted sampler continues the idle stretch from the state file."""

from __future__ import annotations

import json

import pytest

from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import NA, FakeNvml, Seq
from gsrun.node.sampler import Sampler
from gsrun.request.waste import IdleConfig

from helpers.sampler_sim import SimClock, energy_stream, h200_data, run_job, util_sample_stream

pytestmark = pytest.mark.pure

INTERVAL = 5.0
N = 61                       # t = 0 .. 300 s
BUSY_UNTIL_S = 120.0         # busy windows up to t = 120, then idle with the context held


def _fake() -> FakeNvml:
    fake = FakeNvml(h200_data(2))
    busy = lambda t: 100 if t <= BUSY_UNTIL_S else 0  # noqa: E731
    ts = [k * INTERVAL for k in range(N)]
    gpm = [{"error": "first GPM sample", "code": None}] + [
        {"ok": {"sm_active_pct": 70.0 if t <= BUSY_UNTIL_S else 0.0, "sm_occupancy_pct": 10.0,
                "tensor_active_pct": 60.0 if t <= BUSY_UNTIL_S else 0.0, "dram_bw_pct": 5.0}} for t in ts[1:]]
    power = [{"ok": 83000}] + [{"ok": 420000 if t <= BUSY_UNTIL_S else 128000} for t in ts[1:]]
    fake.set(0, "util_samples", Seq(util_sample_stream(N, INTERVAL, busy)))
    fake.set(0, "gpm", Seq(gpm))
    fake.set(0, "power_mw", Seq(power))
    fake.set(0, "energy_mj", Seq(energy_stream(N, INTERVAL, lambda t: 400.0)))
    # GPU 1: never touched (bare idle, 83 W)
    fake.set(1, "util_samples", Seq(util_sample_stream(N, INTERVAL, lambda t: 0)))
    fake.set(1, "gpm", Seq([{"error": "first GPM sample", "code": None}] + [
        {"ok": {"sm_active_pct": 0.0, "sm_occupancy_pct": 0.0, "tensor_active_pct": 0.0, "dram_bw_pct": 0.0}}] * (N - 1)))
    fake.set(1, "power_mw", 83000)
    return fake


def _sampler(tmp_path, fake, clock):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return Sampler(HostFS(str(root)), "4242", 1000, "n1", [0, 1], str(tmp_path / "sampler.json"), INTERVAL,
                   1e9, 1000, clock=clock, nvml=fake,
                   usage=lambda: (None, None, None, "test"), idle=IdleConfig(warn_after_min=1))


def test_detections_in_the_state(tmp_path):
    clock = SimClock()
    st = run_job(_sampler(tmp_path, _fake(), clock), N)
    got = [(f["code"], f["gpu"], f["since_s"], f["detected_s"]) for f in st["waste_findings"]]
    assert got == [("gpu_never_used", "1", 0.0, 60.0), ("gpu_idle", "0", 120.0, 180.0)]
    idle = st["waste_findings"][1]["evidence"]
    assert idle["power_idle_w"] == 83.0 and idle["power_mean_w"] == 128.0
    assert idle["sm_active_max_pct"] == 0.0 and idle["job_processes"] is None      # PIDs unknown here
    assert idle["basis"] == ["utilization", "sm_activity", "power"]
    assert [w["stretch"]["kind"] for w in st["watch"]] == ["idle", "idle"]
    on_disk = json.loads((tmp_path / "sampler.json").read_text())
    assert on_disk["waste_findings"] == st["waste_findings"]


def test_restart_continues_the_stretch(tmp_path):
    fake, clock = _fake(), SimClock()
    s = _sampler(tmp_path, fake, clock)
    for _ in range(31):                 # t = 0 .. 150 s: idle since 120, not yet 1 min
        s.sample_once()
        clock.sleep(INTERVAL)
    s.flush()
    assert s.state["waste_findings"][0]["code"] == "gpu_never_used"
    assert len(s.state["waste_findings"]) == 1
    saved = json.loads((tmp_path / "sampler.json").read_text())
    saved["watch"][0]["max_gap_s"] = 10.0         # an older gsrun's state: this gsrun's carry applies
    (tmp_path / "sampler.json").write_text(json.dumps(saved))
    s2 = _sampler(tmp_path, fake, clock)          # a restarted sampler reads the state file
    assert s2.state["watch"][0].idle_since_s == 120.0 and s2.state["watch"][0].max_gap_s == 30.0
    st = run_job(s2, N - 31)
    assert [(f["code"], f["since_s"], f["detected_s"]) for f in st["waste_findings"]] == \
        [("gpu_never_used", 0.0, 60.0), ("gpu_idle", 120.0, 180.0)]


def test_nvml_down_detects_nothing(tmp_path):
    from gsrun.facts.nvml import NvmlUnavailable

    def boom():
        raise NvmlUnavailable("DRIVER_NOT_LOADED", "no driver")
    clock = SimClock()
    st = run_job(_sampler(tmp_path, boom, clock), N)
    assert st["waste_findings"] == []
    assert all(w["stretch"] is None and w["kind"] is None for w in st["watch"])


def test_gpu_without_gpm_says_so(tmp_path):
    fake = _fake()
    fake.set(1, "gpm", NA("Not Supported", 3))
    clock = SimClock()
    st = run_job(_sampler(tmp_path, fake, clock), N)
    never = [f for f in st["waste_findings"] if f["gpu"] == "1"][0]
    assert never["code"] == "gpu_never_used"
    assert never["evidence"]["basis"] == ["utilization", "power"]
    assert never["evidence"]["limits"][0].startswith("SM activity unknown (no GPM on this GPU)")


def test_detections_reach_the_final_report(tmp_path):
    from helpers.sampler_sim import job_of, node_of

    clock = SimClock()
    st = run_job(_sampler(tmp_path, _fake(), clock), N)
    node = node_of(st, 300.0, gpus=[0, 1])
    assert [(w["node"], w["code"], w["gpu"], w["since_s"], w["detected_s"], w["until_s"]) for w in node["waste"]] == \
        [("n1", "gpu_never_used", "1", 0.0, 60.0, 300.0), ("n1", "gpu_idle", "0", 120.0, 180.0, 300.0)]
    job = job_of([node], 300.0)
    assert [w.code for w in job.waste] == ["gpu_never_used", "gpu_idle"]
    by = {f["code"]: f for f in job.to_json()["findings"]}
    assert by["gpu_never_used"]["text"].startswith(
        "GPU 1 on n1 was held but never used (detected while the job ran, from 00:00:00 into the job, "
        "for at least 5 min): no process of the job ran on it since the job started.")
    assert by["gpu_idle"]["text"].startswith("GPU 0 on n1 was idle while the job ran (detected while the job "
                                             "ran, from 00:02:00 into the job, for at least 3 min)")
    assert by["gpu_idle"]["value"] == 3.0 and by["gpu_never_used"]["value"] == 5.0 and by["gpu_never_used"]["severity"] == "warn"


@pytest.mark.parametrize("pause_s, found", [
    (20.0, [("gpu_never_used", 0.0)]),                           # a daemon restart, a stalled node: one alert
    (40.0, [("gpu_never_used", 0.0), ("gpu_idle", 48.0)]),      # longer than STRETCH_CARRY_S: a new stretch
])
def test_a_pause_in_the_polls_is_carried_over_up_to_stretch_carry_s(tmp_path, pause_s, found):
    # interval 1 s (as the test cluster's): two missed polls must not start a second idle stretch
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", NA("Not Supported", 3))
    fake.set(0, "utilization", {"gpu": 0, "memory": 0})
    fake.set(0, "power_mw", 70000)
    clock = SimClock()
    s = Sampler(HostFS(str(tmp_path)), "4242", 1000, "n1", [0], str(tmp_path / "sampler.json"), 1.0, 1e9, 100,
                clock=clock, nvml=fake, usage=lambda: (None, None, None, "test"),
                idle=IdleConfig(warn_after_min=0.1))
    for k in range(80):
        s.sample_once()
        clock.sleep(pause_s if k == 8 else 1.0)
    assert [(f["code"], f["since_s"]) for f in s.state["waste_findings"]] == found
