"""The waste detector on GPU traces (tests/data/traces/, README there): the real
H200 recordings of tests/gpu/record_traces.py and the synthetic stuck-collective
trace, each replayed poll by poll through the sampler's own fold
(update_gpu) into GpuWatch, against the expected findings and times in
tests/data/traces/expect.json (times from the workload's own phase marks)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gsrun.request.waste import IdleConfig

from helpers.paths import load_data_module
from helpers.traces import TRACES, load, phase_start, replay, trace_files

pytestmark = pytest.mark.recorded

EXPECT = json.loads((TRACES / "expect.json").read_text())
FILES = {p.stem: p for p in trace_files()}


def _cfg(name: str) -> IdleConfig:
    over = dict(EXPECT["config"], **(EXPECT["traces"].get(name, {}).get("config") or {}))
    return dataclasses.replace(IdleConfig(), **{k: float(v) for k, v in over.items()})


def test_every_trace_has_expectations():
    missing = sorted(set(FILES) - set(EXPECT["traces"]))
    assert not missing, f"traces without expectations in tests/data/traces/expect.json: {missing}"


@pytest.mark.parametrize("name", sorted(EXPECT["traces"]))
def test_trace_findings_and_times(name):
    if name not in FILES:
        pytest.skip(f"trace {name} not recorded yet (tests/gpu/run --steps traces on the H200; "
                    "tests/data/traces/README.md)")
    trace = load(FILES[name])
    cfg = _cfg(name)
    found, watch, _figs = replay(trace, cfg)
    want = EXPECT["traces"][name]["findings"]
    assert [f["code"] for f in found] == [w["code"] for w in want], (name, found)
    for f, w in zip(found, want):
        since = phase_start(trace, w["since_phase"])
        assert abs(f["since_s"] - since) <= w["tolerance_s"] + 1e-6, (name, f, since)
        thr = 60.0 * (cfg.stuck_after_min if f["code"] == "gpu_stuck_collective" else cfg.warn_after_min)
        assert thr <= f["detected_s"] - f["since_s"] <= thr + trace["interval_s"] + 1e-6, (name, f)
        if "exact" in w:    # the recorded H200 traces: the poll times the detector decides on, pinned
            assert [f["since_s"], f["detected_s"]] == w["exact"], (name, f)


def test_stuck_trace_evidence_and_no_idle():
    """The synthetic hang: stuck from the end of training, never idle, with the model's figures."""
    trace = load(FILES["stuck_collective_synthetic"])
    found, watch, _ = replay(trace, _cfg("stuck_collective_synthetic"))
    ev = found[0]["evidence"]
    assert (found[0]["since_s"], found[0]["detected_s"]) == (120.0, 1020.0)
    assert ev["util_mean_pct"] == 100.0 and ev["sm_active_max_pct"] == 0.6 and ev["tensor_active_max_pct"] == 0.0
    assert 128.0 <= ev["power_mean_w"] <= 136.0 and ev["job_processes"] == 1
    assert ev["power_idle_w"] == 128.0      # lowest reading of the job (the hang itself: no bare-idle poll)
    assert watch.idle_since_s is None and watch.ever_used
    # the same hang with SM activity above sm_idle_pct (many NCCL channels) is not called stuck
    found2, _, _ = replay(trace, dataclasses.replace(_cfg("stuck_collective_synthetic"), sm_idle_pct=0.5))
    assert found2 == []


def test_synthetic_trace_is_what_its_generator_writes():
    mod = load_data_module(TRACES / "make_synthetic.py", "make_synthetic")
    assert (TRACES / "stuck_collective_synthetic.json").read_text() == mod.dump(mod.trace())
