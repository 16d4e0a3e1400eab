"""Job summary: merging node summaries (known answers) and the JS1 blob that
Princeton jobstats and reportseff read from AdminComment."""

from __future__ import annotations

import base64
import gzip
import json

import pytest

from gsrun.facts.nvml import NA, FakeNvml, Seq
from gsrun.report.records import JobInfo, NodeSummary
from gsrun.report.summary import decode_js1, job_summary, js1_blob, node_record
from helpers.jobstats_layout import check_jobstats_layout

from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data, job_of, make_sampler,
                                  node_of, run_job, util_sample_stream)

H = 3600.0


def _node(tmp_path, name, gres, util, cores_busy, mem_peak, power_w=400.0, mig=False):
    n = 721
    fake = FakeNvml(h200_data(len(gres)))
    for i in range(len(gres)):
        fake.set(i, "minor", gres[i])
        if mig:
            fake.set(i, "mig_mode", [1, 1])
            fake.set(i, "util_samples", NA("Not Supported", 3))
            fake.set(i, "utilization", NA("Not Supported", 3))
        else:
            fake.set(i, "util_samples", Seq(util_sample_stream(n, 5.0, lambda t: util)))
        fake.set(i, "energy_mj", Seq(energy_stream(n, 5.0, lambda t: power_w)))
        fake.set(i, "memory", {"total": 150754820096, "used": 20 * GIB, "free": 0})
    clock = SimClock()
    s = make_sampler(tmp_path, fake, gres, clock, node=name,
                     usage=cpu_usage(clock, cores_busy, mem_peak // 2, mem_peak))
    st = run_job(s, n)
    return node_of(st, H, cpus=8, gpus=gres, node=name)


@pytest.fixture
def two_nodes(tmp_path):
    a = _node(tmp_path, "gpu-a01", [0, 1], 50, 4.0, 10 * GIB)       # 8 cores, half busy
    b = _node(tmp_path, "gpu-a02", [2, 3], 50, 2.0, 20 * GIB)       # 8 cores, a quarter busy
    return a, b


def test_merge_two_nodes_known_answers(two_nodes):
    a, b = two_nodes
    job = job_summary(JobInfo(**{"id": "77", "state": "COMPLETED", "elapsed_s": H, "nodes": ["gpu-a01", "gpu-a02"],
                       "cpus_alloc": 16, "mem_req_bytes": 64 * GIB, "gpus_alloc": 4}),
                      map(NodeSummary.from_json, [b, a]))
    # CPU efficiency = CPU time / (allocated cores x elapsed) = (4 + 2) x 3600 / (16 x 3600)
    assert job.cpu.time_s == pytest.approx(6 * H)
    assert job.cpu.efficiency_pct == 37.5
    # host memory: sum of node high waters vs the job's request
    assert job.memory.peak_bytes == 30 * GIB
    assert job.memory.efficiency_pct == pytest.approx(46.9, abs=0.05)
    # GPU-hours: 4 GPUs x 1 h allocated; busy 50 % -> 2.0 used
    assert job.gpu.gpu_hours_alloc == 4.0
    assert job.gpu.gpu_hours_used == pytest.approx(2.0, abs=0.01)
    # energy: 4 GPUs x 400 W x 1 h = 5.76 MJ = 1.6 kWh
    assert job.gpu.energy_j == pytest.approx(4 * 400 * H, abs=1)
    assert job.gpu.energy_kwh == pytest.approx(1.6, abs=1e-6)
    assert [(g.node, g.index) for g in job.gpu.devices] == [
        ("gpu-a01", 0), ("gpu-a01", 1), ("gpu-a02", 2), ("gpu-a02", 3)]
    assert list(job.nodes_missing) == []
    assert [n.node for n in job.nodes_detail] == ["gpu-a01", "gpu-a02"]


def test_cpus_alloc_from_nodes_when_record_lacks_it(two_nodes):
    job = job_of(list(two_nodes), H)
    assert job.job.cpus_alloc == 16 and job.cpu.efficiency_pct == 37.5


def test_missing_node_is_reported(two_nodes):
    a, _b = two_nodes
    job = job_of([a], H, nodes=["gpu-a01", "gpu-a02"])
    assert list(job.nodes_missing) == ["gpu-a02"]
    assert any(f.code == "nodes_missing" and "gpu-a02" in f.text for f in job.findings)


def test_cpu_over_100_is_clamped_and_flagged(two_nodes):
    job = job_of(list(two_nodes), H, cpus_alloc=2)         # 6 cores busy on 2 allocated
    assert job.cpu.efficiency_pct == 100.0 and job.cpu.anomaly is True
    assert any(f.code == "cpu_anomaly" for f in job.findings)


def test_zero_divisors_are_na():
    node = node_record(None, {"node": "n1", "job_id": "5", "cpus_on_node": 0, "prolog_time": 100.0}, 100.0)
    job = job_summary(JobInfo(**{"id": "5", "state": "CANCELLED by 1000", "elapsed_s": 0, "cpus_alloc": 0,
                       "mem_req_bytes": 0}), [node])
    assert job.cpu.efficiency_pct is None and job.memory.efficiency_pct is None
    assert [f.code for f in job.findings] == ["never_started"]
    assert js1_blob(job) is None


# ----------------------------------------------------------------- JS1

def _walk(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    else:
        yield x


def jobstats_view(blob: dict, elapsed_s: int) -> dict:
    """What jobstats computes from the blob's ``nodes`` (written from its
    documented layout, not its code): CPU = sum of node CPU seconds /
    (elapsed x sum of node cores); memory = sum used / sum total; GPU
    utilization = mean over the listed GPUs; GPU memory per GPU = used /
    total, indexed by the keys of gpu_total_memory."""
    nodes = blob["nodes"]
    out = {}
    if all("total_time" in d and "cpus" in d for d in nodes.values()):
        out["cpu_eff"] = 100 * sum(d["total_time"] for d in nodes.values()) / (
            elapsed_s * sum(d["cpus"] for d in nodes.values()))
    if all("used_memory" in d and "total_memory" in d for d in nodes.values()):
        out["mem_eff"] = 100 * sum(d["used_memory"] for d in nodes.values()) / sum(
            d["total_memory"] for d in nodes.values())
    utils = [u for d in nodes.values() for u in d.get("gpu_utilization", {}).values()]
    out["gpu_util"] = sum(utils) / len(utils) if utils else None
    out["gpu_mem"] = {(n, k): d["gpu_used_memory"][k] / d["gpu_total_memory"][k]
                      for n, d in nodes.items() if "gpu_total_memory" in d for k in d["gpu_total_memory"]}
    return out


def test_js1_round_trip_and_jobstats_layout(two_nodes):
    job = job_of(list(two_nodes), H, cpus_alloc=16, mem_req_bytes=64 * GIB, gpus_alloc=4)
    text = js1_blob(job)
    assert text.startswith("JS1:") and text.isascii()
    raw = json.loads(gzip.decompress(base64.b64decode(text[4:])))     # what jobstats does with AdminComment
    assert raw == decode_js1(text)
    assert raw["gpus"] == 4 and raw["total_time"] == 3600
    assert set(raw) == {"gpus", "nodes", "total_time", "gsrun"}
    a = raw["nodes"]["gpu-a01"]
    assert set(a) == {"cpus", "total_time", "used_memory", "total_memory", "gpu_utilization",
                      "gpu_used_memory", "gpu_total_memory"}
    assert a["cpus"] == 8 and a["total_time"] == pytest.approx(4 * H)
    assert a["used_memory"] == 10 * GIB and a["total_memory"] == 32 * GIB
    assert a["gpu_utilization"] == {"0": 50.0, "1": 50.0}
    assert a["gpu_used_memory"] == {"0": 20 * GIB, "1": 20 * GIB}
    assert a["gpu_total_memory"] == {"0": 150754820096, "1": 150754820096}
    assert raw["nodes"]["gpu-a02"]["gpu_utilization"] == {"2": 50.0, "3": 50.0}
    assert None not in list(_walk(raw["nodes"]))
    check_jobstats_layout(raw, gpus=True)
    view = jobstats_view(raw, raw["total_time"])
    assert view["cpu_eff"] == pytest.approx(job.cpu.efficiency_pct)
    assert view["mem_eff"] == pytest.approx(job.memory.efficiency_pct, abs=0.05)
    assert view["gpu_util"] == pytest.approx(50.0)
    assert view["gpu_mem"][("gpu-a02", "3")] == pytest.approx(20 * GIB / 150754820096)
    assert raw["gsrun"]["energy_j"] == pytest.approx(4 * 400 * H, abs=1)


def test_js1_mig_node_has_no_gpu_utilization_but_memory(tmp_path):
    """Field case 12 (docs/field-cases.md) in jobstats' terms: an empty
    gpu_utilization (jobstats: "GPU utilization is unknown"), never 0."""
    node = _node(tmp_path, "mig-01", [0], None, 1.0, GIB, mig=True)
    job = job_of([node], H, cpus_alloc=8, mem_req_bytes=16 * GIB, gpus_alloc=1)
    raw = decode_js1(js1_blob(job))
    d = raw["nodes"]["mig-01"]
    assert d["gpu_utilization"] == {}
    assert d["gpu_used_memory"] == {"0": 20 * GIB} and "0" in d["gpu_total_memory"]
    assert jobstats_view(raw, raw["total_time"])["gpu_util"] is None
    check_jobstats_layout(raw, gpus=True)


def test_js1_nvml_failure_and_unknown_cpu_time_are_flagged(tmp_path):
    """jobstats' formatter needs every node's four CPU/memory keys:
    an unknown one is 0 and named in gsrun.unknown; no GPU figure: an empty
    gpu_utilization (jobstats: unknown, no error), no GPU memory keys."""
    data = h200_data(1)
    data["init"] = {"error": "Driver/library version mismatch", "code": 18}
    clock = SimClock()
    s = make_sampler(tmp_path, None, [0], clock, nvml=lambda: FakeNvml(data),
                     usage=lambda: (None, 3 * GIB, None, "psutil"))
    st = run_job(s, 13)
    job = job_of([node_of(st, 60, gpus=[0])], 60, cpus_alloc=8, mem_req_bytes=16 * GIB, gpus_alloc=1)
    raw = decode_js1(js1_blob(job))
    d = raw["nodes"]["n1"]
    assert d["cpus"] == 8 and d["total_time"] == 0.0
    assert raw["gsrun"]["unknown"] == {"n1": ["total_time"]}         # 0 there means unknown
    assert d["used_memory"] == 3 * GIB and d["total_memory"] == 16 * GIB
    assert {k for k in d if k.startswith("gpu_")} == {"gpu_utilization"} and d["gpu_utilization"] == {}
    check_jobstats_layout(raw, gpus=True)


def test_decode_js1_rejects_garbage():
    with pytest.raises(ValueError):
        decode_js1("not a blob")
    with pytest.raises(ValueError):
        decode_js1("JS1:!!!notbase64")
    with pytest.raises(ValueError):
        decode_js1("JS1:" + base64.b64encode(b"plain text").decode())
