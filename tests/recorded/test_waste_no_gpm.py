"""A hung collective told without GPM/DCGM profiling fields: the real H200 traces
(tests/data/traces/, recorded by tests/gpu/record_traces.py) replayed with GPM taken
out, as a pre-Hopper GPU, a VM or a MIG slice reads them (no ``gpm`` key, ``gpm``
False), through the sampler's own fold into GpuWatch. Variants (link traffic, NVLink,
unknown power limit) are built from those recordings; each says how."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from gsrun.request.waste import STUCK, GpuWatch, IdleConfig

from helpers.traces import load, replay, trace_files

pytestmark = pytest.mark.recorded

FILES = {p.stem: p for p in trace_files()}
CFG = dataclasses.replace(IdleConfig(), warn_after_min=0.75, stuck_after_min=0.5)


def _trace(name: str) -> dict:
    if name not in FILES:
        pytest.skip(f"trace {name} not recorded (tests/data/traces/README.md)")
    return load(FILES[name])


def _no_gpm(trace: dict, power_limit_w="keep", pcie_kbs: int | None = None) -> dict:
    t = copy.deepcopy(trace)
    t["gpu"]["gpm"] = False
    if power_limit_w != "keep":
        t["gpu"]["power_limit_w"] = power_limit_w
    for p in t["polls"]:
        p["r"].pop("gpm", None)
        if pcie_kbs is not None:
            p["r"]["pcie_tx_kbs"] = p["r"]["pcie_rx_kbs"] = pcie_kbs
    return t


def test_spinning_gpu_without_gpm_is_stuck_with_the_signals_named():
    """tiny_kernels (real H200: util 99 %, 127 W of 700 W, PCIe ~3.9 MB/s): without GPM it
    cannot be told from a hung collective, and is said stuck on NVML's counters."""
    found, watch, figs = replay(_no_gpm(_trace("tiny_kernels")), CFG)
    assert [f["code"] for f in found] == [STUCK]
    ev = found[0]["evidence"]
    assert ev["signals"] == "nvml_counters"
    assert ev["basis"] == ["utilization", "power", "processes", "power_vs_limit", "pcie_traffic"]
    assert ev["sm_active_max_pct"] is None and ev["power_limit_w"] == 700.0
    assert ev["util_mean_pct"] >= 90.0
    assert 120.0 <= ev["power_mean_w"] <= 140.0       # 18-20 % of the 700 W limit
    assert 3000.0 <= ev["link_max_kbs"] <= CFG.stuck_link_max_kbs
    assert any("tiny kernels" in x for x in ev["limits"])


def test_training_without_gpm_is_busy():
    """train (real H200: 690 W, PCIe ~23 MB/s): no finding."""
    found, _, _ = replay(_no_gpm(_trace("train")), CFG)
    assert found == []


def test_data_moving_over_pcie_is_not_stuck():
    """Variant of tiny_kernels: PCIe at 1 GB/s each way (a collective moving data)."""
    found, _, _ = replay(_no_gpm(_trace("tiny_kernels"), pcie_kbs=1_000_000), CFG)
    assert found == []


def test_nvlink_traffic_counts_when_read():
    """Variant: the tiny_kernels figures with 2 GB/s of NVLink traffic (an NVLink all-reduce
    whose PCIe is quiet): not stuck; with 0 NVLink traffic it is, and the basis names NVLink."""
    _, _, figs = replay(_no_gpm(_trace("tiny_kernels")), CFG)
    for nvlink, want in ((2e9, []), (0.0, [STUCK])):
        w = GpuWatch("0", CFG, None, 10.0, 700.0)
        found = []
        for f in figs:
            f = dict(f, nvlink_tx_bytes_s=nvlink / 2, nvlink_rx_bytes_s=nvlink / 2)
            found += w.update(f.pop("t_s"), f)
        assert [x["code"] for x in found] == want
        if want:
            assert found[0]["evidence"]["basis"][-2:] == ["nvlink_traffic", "pcie_traffic"]


def test_unknown_power_limit_or_links_decide_no_stuck():
    """Variants: no enforced power limit read; the synthetic hang (no PCIe figures in it)."""
    found, w, _ = replay(_no_gpm(_trace("tiny_kernels"), power_limit_w=None), CFG)
    assert found == [] and any("power limit unknown" in x for x in w.limits)
    found, _, _ = replay(_no_gpm(_trace("stuck_collective_synthetic")), CFG)
    assert found == []


def test_idle_without_gpm_is_still_idle():
    found, _, _ = replay(_no_gpm(_trace("idle_after_busy")), CFG)
    assert [f["code"] for f in found] == ["gpu_idle"]
