"""The sampler's state is O(1) in job length: a simulated 7-day job at 5 s
(120960 polls, simulated clock, no sleeping) keeps the state file and the
timelines bounded, and its figures still right."""

from __future__ import annotations

import json

import pytest

from gsrun.facts.nvml import FakeNvml

from gsrun.node.sampler import state_to_json
from helpers.sampler_sim import GIB, T0, SimClock, cpu_usage, h200_data, make_sampler, node_of, run_job

WEEK_S = 7 * 86400
INTERVAL = 5.0


class ClockedNvml(FakeNvml):
    """FakeNvml whose utilization buffer and energy counter follow the
    simulated clock (a Seq of 120960 items would cost more than the sampler):
    busy 3 s of every 10 s (30 %), 250 W."""

    def __init__(self, data, clock):
        super().__init__(data)
        self.clock = clock
        self.calls = _NoList()

    def get(self, index, key, **kw):
        t = self.clock() - T0
        if key == "util_samples":
            since = kw.get("since_us", 0) / 1e6 - T0
            lo = max(int(since) + 1, int(t) - 20)
            return [[int((T0 + s) * 1e6), 100 if s % 10 < 3 else 0] for s in range(lo, int(t) + 1)]
        if key == "energy_mj":
            return int(1_000_000 + 250_000 * t)
        if key == "memory":
            used = int((10 + 20 * ((t // 3600) % 2)) * GIB)
            return {"total": 150754820096, "used": used, "free": 150754820096 - used}
        return super().get(index, key, **kw)


class _NoList(list):
    def append(self, _x):       # do not keep 1.7 million call records
        pass


def _run(tmp_path, seconds: float, n_gpus: int = 2):
    clock = SimClock()
    fake = ClockedNvml(h200_data(n_gpus), clock)
    s = make_sampler(tmp_path, fake, list(range(n_gpus)), clock, interval_s=INTERVAL, flush_s=86400.0,
                     usage=cpu_usage(clock, 3.0, 4 * GIB), node=f"n{int(seconds)}")
    st = run_job(s, int(seconds / INTERVAL) + 1)
    return st, clock


def test_seven_day_job_state_is_bounded(tmp_path):
    day, clock_d = _run(tmp_path, 86400)
    week, clock_w = _run(tmp_path, WEEK_S)
    assert week["samples"] == WEEK_S / INTERVAL + 2          # + the stop poll
    assert week["last_time"] - week["start_time"] == WEEK_S
    size_day = len(json.dumps(day))
    size_week = len(json.dumps(week))
    # O(1): 7x the polls, not 7x the state (timelines hold between 1/2 and 1 x max_points,
    # so two runs of any lengths differ by at most ~2x)
    assert size_week < 2.0 * size_day, (size_day, size_week)
    assert size_week < 400_000, size_week                     # 2 GPUs, 4 timelines each + CPU
    for g in week["gpus"]:
        assert g["timeline"]["sm_active_pct"]["points"] == []     # no GPM in this recording's fake
        for k, tl in g["timeline"].items():
            if k == "sm_active_pct":
                continue
            assert 250 <= len(tl["points"]) <= 1000, (k, len(tl["points"]))
            # every poll is in a bucket: util has none for the baseline poll and the stop poll
            # (no new driver samples), memory has one for every poll
            n_in = sum(p[3] for p in tl["points"])
            assert n_in == {"util_pct": week["samples"] - 2, "mem_used_bytes": week["samples"]}.get(k, n_in)
            assert tl["points"][-1][0] <= WEEK_S
        m = g["metrics"]["util_pct"]
        # windows of 5 driver samples hold 2 or 1 busy ones: 40 % and 20 %, half the time each
        assert m["hist_s"][4] == pytest.approx(WEEK_S / 2) and m["hist_s"][2] == pytest.approx(WEEK_S / 2)
        assert m["above_s"]["5.0"] == pytest.approx(WEEK_S) and "50.0" not in m["above_s"]
    assert len(week["cpu_timeline"]["points"]) <= 1000
    # and the figures are still right after 120960 polls
    summ = node_of(week, WEEK_S, cpus=4, gpus=[0, 1])
    for g in summ["gpus"]:
        assert g["util_mean_pct"] == pytest.approx(30.0, abs=0.2)
        assert g["energy_j"] == pytest.approx(250 * WEEK_S, rel=1e-9)
        assert g["power_mean_w"] == pytest.approx(250.0, abs=0.01)
        assert g["mem_peak_bytes"] == 30 * GIB
        assert g["covered_s"] == WEEK_S
    assert summ["cpu_time_s"] == pytest.approx(3.0 * WEEK_S)
    # the timeline's mean over the week matches the aggregate's mean
    pts = week["gpus"][0]["timeline"]["util_pct"]["points"]
    assert sum(p[1] * p[3] for p in pts) / sum(p[3] for p in pts) == pytest.approx(30.0, abs=0.3)


def test_state_file_written_atomically_and_bounded_on_flush(tmp_path):
    clock = SimClock()
    fake = ClockedNvml(h200_data(1), clock)
    s = make_sampler(tmp_path, fake, [0], clock, flush_s=30.0, timeline_points=100)
    run_job(s, 5000)
    d = json.loads((tmp_path / "sampler-n1.json").read_text())
    assert d["done"] is True and d["samples"] == 5001
    assert all(len(t["points"]) < 100 for t in d["gpus"][0]["timeline"].values())


def test_every_flush_writes_the_live_state(tmp_path):
    """Each flush writes the state as it is, timelines included; the final one is marked done."""
    clock = SimClock()
    fake = ClockedNvml(h200_data(2), clock)
    s = make_sampler(tmp_path, fake, [0, 1], clock, flush_s=30.0)
    path = tmp_path / "sampler-n1.json"
    for k in range(1, 40):
        s.sample_once()
        clock.sleep(5.0)
        if k % 6 == 0:
            s.flush()
            d = json.loads(path.read_text())
            assert d["samples"] == k and d["done"] is False
            assert d == json.loads(json.dumps(state_to_json(s.state)))
            for g in d["gpus"]:
                assert set(g["timeline"]) == {"util_pct", "sm_active_pct", "mem_used_bytes", "power_w"}
                assert len(g["timeline"]["mem_used_bytes"]["points"]) == k
    s.flush(done=True)
    d = json.loads(path.read_text())
    assert d["done"] is True and d == json.loads(json.dumps(state_to_json(s.state)))
