"""NVLink throughput: the NVML reading (``nvlink_kib``, one ``nvmlDeviceGetFieldValues``
call), the sampler's counters-to-bytes/s fold, and the stuck test without GPM that
reads "no NVLink and no PCIe traffic" where NVLink is known, PCIe alone where not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gsrun.facts.nvml import ALL_LINKS, NA, NOT_SUPPORTED, FakeNvml, RealNvml, field_value
from gsrun.facts.sampler_state import GpuRef
from gsrun.node.sampler import (new_gpu_state, nvlink_rates, read_gpu, state_from_json,
                                state_to_json, update_gpu)
from gsrun.request.waste import STUCK, GpuWatch, IdleConfig, fmt_rate_bytes_s

pytestmark = pytest.mark.pure

GIB_KIB = 1 << 20                   # KiB in a GiB
CFG = IdleConfig(stuck_after_min=5.0)


def _g():
    return new_gpu_state(GpuRef(0, 0, "GPU-x", None, "NVIDIA H200", None, False, False), 10)


# ----------------------------------------------------------------------------- the fold

def test_counters_become_bytes_per_second_over_the_poll_interval():
    g = _g()
    assert nvlink_rates(g, {"tx": 5 * GIB_KIB, "rx": 7 * GIB_KIB}, 0.0) == (None, None)   # no baseline yet
    # 10 s later: 20 GiB out, 10 GiB in -> 2 GiB/s and 1 GiB/s
    tx, rx = nvlink_rates(g, {"tx": 25 * GIB_KIB, "rx": 17 * GIB_KIB}, 10.0)
    assert (tx, rx) == (2 * 2.0 ** 30, 1 * 2.0 ** 30)
    assert g["nvlink_prev"] == {"t_s": 10.0, "tx_kib": 25 * GIB_KIB, "rx_kib": 17 * GIB_KIB}
    # a quiet link is a real 0, not unknown
    assert nvlink_rates(g, {"tx": 25 * GIB_KIB, "rx": 17 * GIB_KIB}, 15.0) == (0.0, 0.0)


def test_reset_counter_is_unknown_never_negative():
    g = _g()
    nvlink_rates(g, {"tx": 900_000, "rx": 900_000}, 0.0)
    # driver reload: tx restarted from 0; rx kept counting
    tx, rx = nvlink_rates(g, {"tx": 1_000, "rx": 910_000}, 5.0)
    assert tx is None and rx == 10_000 * 1024 / 5.0
    # the reset value is the new baseline
    assert nvlink_rates(g, {"tx": 6_000, "rx": 910_000}, 10.0) == (5_000 * 1024 / 5.0, 0.0)


def test_na_drops_the_baseline_and_a_poll_without_the_key_keeps_it():
    g = _g()
    nvlink_rates(g, {"tx": 0, "rx": 0}, 0.0)
    assert nvlink_rates(g, None, 5.0) == (None, None) and g["nvlink_prev"]["t_s"] == 0.0
    assert nvlink_rates(g, {"tx": 1024, "rx": 0}, 10.0) == (1024 * 1024 / 10.0, 0.0)
    assert nvlink_rates(g, NA("Unknown Error", 999), 15.0) == (None, None)
    assert g["nvlink_prev"] is None and g["unsupported"]["nvlink_kib"] == "Unknown Error"
    assert nvlink_rates(g, {"tx": "x"}, 20.0) == (None, None)
    assert g["unsupported"]["nvlink_kib"].startswith("unexpected value")


def test_not_supported_is_unknown_and_not_polled_again():
    """A PCIe H100 / L40S (no NVLink): the figure is None, never 0, and the key is not read again."""
    ref = GpuRef(0, 0, "GPU-x", None, "NVIDIA L40S", None, False, False)
    fake = FakeNvml({"devices": [{"minor": {"ok": 0}, "power_mw": {"ok": 90000},
                                  "utilization": {"ok": {"gpu": 100, "memory": 0}}}]})
    g = new_gpu_state(ref, 10)
    for k in range(3):
        r = read_gpu(fake, ref, g["last_sample_us"], set(g["not_polled"]))
        vals = update_gpu(g, r, 5.0 * k, 5.0 if k else 0.0)
        assert vals["nvlink_tx_bytes_s"] is None and vals["nvlink_rx_bytes_s"] is None
    assert "nvlink_kib" in g["not_polled"]
    assert [c for c in fake.calls if c[1] == "nvlink_kib"] == [(0, "nvlink_kib")]
    assert g["metrics"]["nvlink_tx_bytes_s"].n == 0
    assert "nvlink_tx_bytes_s" not in state_to_json({"gpus": [g], "mem": {"sampled": g["metrics"]["power_w"]},
                                                     "cpu": {}, "cpu_timeline": g["timeline"]["power_w"],
                                                     "notes": []})["gpus"][0]["metrics"]


def test_sampler_metrics_and_state_round_trip():
    """An H200 with NVLink through read_gpu/update_gpu: the metrics have the rate, the
    baseline survives the state file (a restarted sampler continues the rate)."""
    ref = GpuRef(0, 0, "GPU-x", None, "NVIDIA H200", None, False, False)
    seq = [{"ok": {"tx": 1000 + 50_000 * k, "rx": 2000 + 25_000 * k}} for k in range(4)]
    fake = FakeNvml({"devices": [{"minor": {"ok": 0}, "nvlink_kib": {"seq": seq}}]})
    g = new_gpu_state(ref, 10)
    for k in range(3):
        update_gpu(g, read_gpu(fake, ref, None, ()), 5.0 * k, 5.0 if k else 0.0)
    m = g["metrics"]["nvlink_tx_bytes_s"]
    assert m.n == 2 and m.max == 50_000 * 1024 / 5.0
    assert g["metrics"]["nvlink_rx_bytes_s"].max == 25_000 * 1024 / 5.0
    st = {"gpus": [g], "mem": {"sampled": g["metrics"]["power_w"]}, "cpu": {},
          "cpu_timeline": g["timeline"]["power_w"], "notes": []}
    js = state_to_json(st)
    assert js["gpus"][0]["nvlink_prev"] == {"t_s": 10.0, "tx_kib": 101_000, "rx_kib": 52_000}
    assert js["gpus"][0]["metrics"]["nvlink_tx_bytes_s"]["n"] == 2
    back = state_from_json(js)["gpus"][0]
    vals = update_gpu(back, read_gpu(fake, ref, None, ()), 15.0, 5.0)
    assert vals["nvlink_tx_bytes_s"] == 50_000 * 1024 / 5.0 and vals["pcie_tx_bytes_s"] is None


# ----------------------------------------------------------------------------- the real backend

def _field(code, value, vtype=3):
    return SimpleNamespace(nvmlReturn=code, valueType=vtype, value=SimpleNamespace(ullVal=value, uiVal=value))


class _Pynvml:
    """The few pynvml names RealNvml's NVLink read uses, answering like the binding."""

    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVMLError = RuntimeError

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def nvmlDeviceGetFieldValues(self, handle, ids):
        self.asked.append(list(ids))
        return self.answers


def _real(answers) -> tuple[RealNvml, _Pynvml]:
    nv = RealNvml.__new__(RealNvml)        # no nvmlInit: the binding is the stub
    nv.nv = _Pynvml(answers)
    nv._handles = {0: object()}
    return nv, nv.nv


def test_real_backend_reads_both_counters_in_one_call_over_all_links():
    nv, stub = _real([_field(0, 123_456), _field(0, 654_321)])
    assert nv.get(0, "nvlink_kib") == {"tx": 123_456, "rx": 654_321}
    assert stub.asked == [[(138, ALL_LINKS), (139, ALL_LINKS)]] and ALL_LINKS == 0xFFFFFFFF


def test_real_backend_field_not_supported_is_na():
    """A GPU without NVLink: the call succeeds, each field carries NOT_SUPPORTED (seen on the
    H200 VM, driver 580.159.04, nvidia-ml-py's binding: return 3, value type 3 for both)."""
    nv, _ = _real([_field(NOT_SUPPORTED, 0), _field(NOT_SUPPORTED, 0)])
    v = nv.get(0, "nvlink_kib")
    assert v == NA("Not Supported", NOT_SUPPORTED)
    assert field_value(_field(0, 7, vtype=1)) == 7
    assert field_value(_field(15, 0)).code == 15


def test_real_backend_without_the_fields_in_the_binding():
    nv, _ = _real([])
    del _Pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    try:
        v = nv.get(0, "nvlink_kib")
    finally:
        _Pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    assert v.code == 13 and "Function Not Found" in v.reason


# ----------------------------------------------------------------------------- the detector

def _hang(nvlink_bytes_s, pcie_bytes_s=50_000.0, polls=61, interval=5.0):
    """A no-GPM H200 (700 W limit) at util 100 %, 92 W, for ``polls`` polls."""
    w = GpuWatch("3", CFG, None, 2 * interval, 700.0)
    found = []
    for k in range(polls):
        r = {"util_pct": 100.0, "power_w": 92.0, "pcie_tx_bytes_s": pcie_bytes_s / 2,
             "pcie_rx_bytes_s": pcie_bytes_s / 2, "mem_used_bytes": 40 << 30}
        if nvlink_bytes_s is not None:
            r["nvlink_tx_bytes_s"] = r["nvlink_rx_bytes_s"] = nvlink_bytes_s / 2
        found += w.update(k * interval, r)
    return found, w


def test_hang_without_gpm_names_nvlink_and_pcie():
    found, _ = _hang(0.0)
    assert [f["code"] for f in found] == [STUCK]
    ev = found[0]["evidence"]
    assert ev["signals"] == "nvml_counters"
    assert ev["basis"][-3:] == ["power_vs_limit", "nvlink_traffic", "pcie_traffic"]
    assert ev["nvlink_max_kbs"] == 0.0 and ev["pcie_max_kbs"] == round(50_000 / 1024, 1)
    assert ev["text"] == "util 100 %, power 92 W of 700 W limit, NVLink max 0 B/s, PCIe max 50.0 kB/s " \
                         "over 300 s; no GPM"


def test_nvlink_traffic_means_not_stuck_even_with_quiet_pcie():
    """An NVLink all-reduce: PCIe quiet, 40 GB/s over NVLink, low power -- busy."""
    found, w = _hang(40e9, pcie_bytes_s=10_000.0)
    assert found == [] and w.kind == "busy"


def test_without_nvlink_pcie_alone_decides_and_the_text_says_so():
    found, _ = _hang(None)
    ev = found[0]["evidence"]
    assert ev["basis"][-2:] == ["power_vs_limit", "pcie_traffic"] and ev["nvlink_max_kbs"] is None
    assert "NVLink not read, PCIe max 50.0 kB/s" in ev["text"]
    found, _ = _hang(None, pcie_bytes_s=2e9)         # PCIe busy: a collective moving data
    assert found == []


def test_watch_state_round_trip_keeps_the_per_link_maxima():
    _, w = _hang(0.0, polls=30)
    back = GpuWatch.from_json(w.to_json(), CFG)
    back.power_limit_w = 700.0
    found = []
    for k in range(30, 61):
        found += back.update(k * 5.0, {"util_pct": 100.0, "power_w": 92.0, "pcie_tx_bytes_s": 25_000.0,
                                       "pcie_rx_bytes_s": 25_000.0, "nvlink_tx_bytes_s": 0.0,
                                       "nvlink_rx_bytes_s": 0.0})
    assert [f["code"] for f in found] == [STUCK]
    assert found[0]["evidence"]["nvlink_max_kbs"] == 0.0


@pytest.mark.parametrize("v, text", [(None, "n/a"), (0, "0 B/s"), (950, "950 B/s"), (3_900_000, "3.9 MB/s"),
                                     (1.2e9, "1.2 GB/s"), (4.5e12, "4500.0 GB/s")])
def test_rate_format(v, text):
    assert fmt_rate_bytes_s(v) == text


def test_report_finding_says_what_a_stuck_gpu_without_gpm_was_decided_on():
    from gsrun.report.findings import _waste
    from gsrun.report.records import WasteDetection

    def text_of(d: dict) -> str:
        return _waste([WasteDetection.from_json(d)])[0].text

    found, _ = _hang(0.0)
    hit = dict(found[0], node="n1", until_s=300.0)
    text = text_of(hit)
    assert "SM and tensor activity" not in text
    assert "with no link traffic (util 100 %, power 92 W of 700 W limit, NVLink max 0 B/s" in text
    with_gpm = dict(hit, evidence={"signals": "gpm", "minutes": 5.0})
    assert "SM and tensor activity were ~0" in text_of(with_gpm)
    odd = dict(hit, evidence=dict(hit["evidence"], text="{0} {it}"))      # a node's file is data, not a template
    assert "({0} {it})" in text_of(odd)


class _GpmPynvml:
    """The pynvml names RealNvml's GPM read uses; metric 2 (tensor) refused, as a GPU may."""

    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_ANY_TENSOR_UTIL = 2, 3, 5
    NVML_GPM_METRIC_DRAM_BW_UTIL, NVML_GPM_METRIC_PCIE_TX_PER_SEC, NVML_GPM_METRIC_PCIE_RX_PER_SEC = 10, 20, 21
    NVML_GPM_METRICS_GET_VERSION, NVML_SUCCESS = 1, 0

    def __init__(self):
        self.live = set()

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)])

    def nvmlGpmSampleAlloc(self):
        s = object()
        self.live.add(s)
        return s

    def nvmlGpmSampleGet(self, handle, sample):
        pass

    def nvmlGpmSampleFree(self, sample):
        self.live.discard(sample)

    def nvmlGpmMetricsGet(self, mg):
        for m in mg.metrics[:mg.numMetrics]:
            m.nvmlReturn, m.value = (3, 0.0) if m.metricId == 5 else (0, float(m.metricId))


def test_real_backend_gpm_interval_refused_metric_and_no_leak():
    """The first GPM call has no interval; later ones give each metric (PCIe's
    MiB/s x 1024 to KB/s), a metric NVML refuses as its NA; one sample stays allocated."""
    nv = RealNvml.__new__(RealNvml)
    nv.nv, nv._handles, nv._gpm_prev = _GpmPynvml(), {0: object()}, {}
    assert nv.get(0, "gpm").reason == "first GPM sample"
    got = nv.get(0, "gpm")
    assert got == {"sm_active_pct": 2.0, "sm_occupancy_pct": 3.0, "tensor_active_pct": NA("Not Supported", 3),
                   "dram_bw_pct": 10.0, "pcie_tx_kbs": 20.0 * 1024, "pcie_rx_kbs": 21.0 * 1024}
    assert len(nv.nv.live) == 1
