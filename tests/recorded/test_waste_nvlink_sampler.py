"""A hung collective told without GPM through the real Sampler, its NVML answers
from an ``nvml.json`` under a host root (the recorded H200, ``h200-real``, with the
readings of a hang put in: GPM off as on a pre-Hopper GPU or a VM, utilization
100 %, 92 W of its 700 W limit, PCIe ~50 kB/s, the NVLink data counters standing
still). Variant: the same GPU moving 4 GB/s over NVLink is not stuck."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gsrun.facts.hostfs import HostFS
from gsrun.node.sampler import Sampler
from gsrun.request.waste import STUCK, IdleConfig

from helpers.sampler_sim import SimClock, run_job

pytestmark = pytest.mark.recorded

REC = Path(__file__).resolve().parents[1] / "data" / "hosts" / "h200-real" / "nvml.json"
INTERVAL_S = 5.0
POLLS = 40                                       # 0 .. 195 s
IDLE = IdleConfig(stuck_after_min=2.0)
KIB_PER_POLL_4GBS = int(4e9 * INTERVAL_S / 1024)


def _root(tmp_path, nvlink) -> HostFS:
    rec = json.loads(REC.read_text())
    dev = copy.deepcopy(rec["devices"][0])
    dev["gpm_supported"] = {"ok": 0}
    dev["util_samples"] = {"error": "Not Supported", "code": 3}
    dev["utilization"] = {"ok": {"gpu": 100, "memory": 0}}
    dev["power_mw"] = {"ok": 92_000}
    dev["pcie_tx_kbs"], dev["pcie_rx_kbs"] = {"ok": 30}, {"ok": 19}
    dev["nvlink_kib"] = nvlink
    rec["devices"] = [dev]
    root = tmp_path / "root"
    root.mkdir()
    (root / "nvml.json").write_text(json.dumps(rec))
    return HostFS(str(root))


def _run(tmp_path, nvlink) -> dict:
    clock = SimClock()
    s = Sampler(_root(tmp_path, nvlink), "4242", 1000, "n1", [0], str(tmp_path / "sampler.json"), INTERVAL_S,
                1e9, 100, clock=clock, usage=lambda: (None, None, None, "test"), idle=IDLE)
    return run_job(s, POLLS)


def test_hang_with_quiet_nvlink_and_pcie_is_stuck_and_says_which_signals(tmp_path):
    st = _run(tmp_path, {"ok": {"tx": 7_340_032_000, "rx": 7_340_031_000}})
    found = st["waste_findings"]
    assert [f["code"] for f in found] == [STUCK]
    ev = found[0]["evidence"]
    assert ev["signals"] == "nvml_counters" and ev["power_limit_w"] == 700.0
    assert ev["basis"][-3:] == ["power_vs_limit", "nvlink_traffic", "pcie_traffic"]
    assert ev["nvlink_max_kbs"] == 0.0 and ev["pcie_max_kbs"] == 49.0
    assert ev["text"] == "util 100 %, power 92 W of 700 W limit, NVLink max 0 B/s, PCIe max 50.2 kB/s " \
                         "over 120 s; no GPM"
    g = st["gpus"][0]
    assert g["metrics"]["nvlink_tx_bytes_s"]["max"] == 0.0 and g["metrics"]["nvlink_tx_bytes_s"]["n"] == POLLS - 1
    assert "nvlink_kib" not in g.get("not_polled", [])


def test_nvlink_moving_data_is_not_stuck(tmp_path):
    seq = [{"ok": {"tx": 10 ** 9 + KIB_PER_POLL_4GBS * k, "rx": 10 ** 9 + KIB_PER_POLL_4GBS * k}}
           for k in range(POLLS + 1)]
    st = _run(tmp_path, {"seq": seq})
    assert st["waste_findings"] == []
    m = st["gpus"][0]["metrics"]["nvlink_rx_bytes_s"]
    assert m["min"] == pytest.approx(4e9, rel=1e-6) and m["n"] == POLLS - 1


def test_gpu_without_nvlink_decides_on_pcie_alone(tmp_path):
    """``nvlink_kib`` absent from the recording (as on the h200-real VM): Not Supported."""
    st = _run(tmp_path, {"error": "Not Supported", "code": 3})
    ev = st["waste_findings"][0]["evidence"]
    assert ev["basis"][-2:] == ["power_vs_limit", "pcie_traffic"] and ev["nvlink_max_kbs"] is None
    assert "NVLink not read, PCIe max 50.2 kB/s" in ev["text"]
    g = st["gpus"][0]
    assert "nvlink_kib" in g["not_polled"] and "nvlink_tx_bytes_s" not in g["metrics"]
