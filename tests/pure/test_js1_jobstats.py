"""What Princeton jobstats shows from the JS1 blob gsrun stores: real blobs of an 8-GPU job, of jobs whose GPU figures are
unavailable (NVML could not start; GPUs emulated without NVML), of a
CPU-only job and of a two-node job with NVML down on one node, checked
value by value and through the headlines jobstats prints for them
(:func:`helpers.jobstats_layout.jobstats_gpu_headlines`)."""

from __future__ import annotations

import json

from gsrun.facts.nvml import FakeNvml
from gsrun.report.records import JobInfo, JobSummary, NodeSummary
from gsrun.report.summary import decode_js1, job_summary, js1_blob
from helpers.jobstats_layout import CPU_KEYS, check_jobstats_layout, jobstats_gpu_headlines
from helpers.paths import DATA
from helpers.sampler_sim import GIB, SimClock, cpu_usage, h200_data, job_of, make_sampler, node_of, run_job

GOLDEN_8GPU = DATA / "golden" / "summaries" / "job-8gpu.json"
FIX = DATA / "summaries"


def test_8gpu_job_every_gpu_with_its_figures():
    s = JobSummary.from_json(json.loads(GOLDEN_8GPU.read_text()))
    raw = decode_js1(js1_blob(s))
    check_jobstats_layout(raw, gpus=True)
    assert raw["gpus"] == 8 and raw["total_time"] == 7200
    d = raw["nodes"]["gpu-b07"]
    assert (d["cpus"], d["total_time"], d["used_memory"]) == (96, 288000.0, 30 * GIB)
    assert d["total_memory"] == 512 * GIB                  # the job's --mem, all on its one node
    assert d["gpu_utilization"] == {str(g.index): g.util_mean_pct for g in s.gpu.devices}
    assert d["gpu_utilization"]["0"] == 87.0 and d["gpu_utilization"]["7"] == 0.0
    assert d["gpu_used_memory"] == {str(i): (10 + 15 * i) * GIB for i in range(8)}
    assert d["gpu_total_memory"] == {str(i): 150754820096 for i in range(8)}
    assert raw["gsrun"]["lost"] == {"gpu-b07:5": 3600.0}
    # mean of 87, 82.5, 73.3, 64.2, 45.8, 27.5, 4.5, 0 = 48.1 %; 500 GiB of 8 x 150754820096 B = 44.5 %
    assert jobstats_gpu_headlines(raw) == ("48%", "45%")


def test_nvml_down_gpu_figures_unknown_never_zero():
    s = JobSummary.from_json(json.loads((FIX / "nvml-fail" / "summary.json").read_text()))
    assert [g.status for g in s.gpu.devices] == ["unavailable"]
    raw = decode_js1(js1_blob(s))
    check_jobstats_layout(raw, gpus=True)
    assert raw["gpus"] == 1 and raw["total_time"] == 60
    assert raw["nodes"] == {"n1": {"cpus": 8, "total_time": 0.0, "used_memory": 3 * GIB,
                                   "total_memory": 16 * GIB, "gpu_utilization": {}}}
    assert raw["gsrun"]["unknown"] == {"n1": ["total_time"]} and raw["gsrun"]["energy_j"] is None
    # no GPU memory pair: "malformed" is jobstats' only non-failing rendering without figures
    # ({} pairs divide by a zero total; 0 figures would be invented)
    assert jobstats_gpu_headlines(raw) == ("GPU utilization is unknown", "(JSON is malformed)")


def test_emulated_gpus_without_nvml(tmp_path):
    """The test cluster's gres GPUs without an NVIDIA device behind them."""
    clock = SimClock()
    s = make_sampler(tmp_path, None, list(range(8)), clock, nvml=lambda: FakeNvml(h200_data(0)),
                     usage=cpu_usage(clock, 4.0, GIB, 2 * GIB))
    node = node_of(run_job(s, 13), 60, cpus=16, gpus=list(range(8)))
    assert {g["status"] for g in node["gpus"]} == {"emulated"}
    raw = decode_js1(js1_blob(job_of([node], 60, cpus_alloc=16, mem_req_bytes=32 * GIB, gpus_alloc=8)))
    check_jobstats_layout(raw, gpus=True)
    assert raw["gpus"] == 8
    assert raw["nodes"] == {"n1": {"cpus": 16, "total_time": 240.0, "used_memory": 2 * GIB,
                                   "total_memory": 32 * GIB, "gpu_utilization": {}}}
    assert jobstats_gpu_headlines(raw) == ("GPU utilization is unknown", "(JSON is malformed)")


def test_cpu_only_job_has_no_gpu_keys(tmp_path):
    clock = SimClock()
    s = make_sampler(tmp_path, None, [], clock, node="c1", usage=cpu_usage(clock, 2.0, GIB, 3 * GIB))
    node = node_of(run_job(s, 13), 60, cpus=4, gpus=[], node="c1")
    raw = decode_js1(js1_blob(job_of([node], 60, cpus_alloc=4, mem_req_bytes=8 * GIB, gpus_alloc=0)))
    check_jobstats_layout(raw, gpus=False)
    assert raw["gpus"] == 0 and raw["total_time"] == 60
    assert raw["nodes"] == {"c1": {"cpus": 4, "total_time": 120.0, "used_memory": 3 * GIB,
                                   "total_memory": 8 * GIB}}
    assert set(raw["nodes"]["c1"]) == CPU_KEYS


def test_nvml_down_on_one_node_of_two_keeps_the_others_gpu_memory():
    """jobstats reads GPU memory only when every node has the pair: the node
    without figures carries it empty, so the other node's GPUs still show."""
    a = NodeSummary.from_json(json.loads((FIX / "two-nodes" / "node-gpu-a01.json").read_text()))
    n1 = NodeSummary.from_json(json.loads((FIX / "nvml-fail" / "node-n1.json").read_text()))
    job = job_summary(JobInfo(**{"id": "4242", "state": "COMPLETED", "elapsed_s": 3600.0, "nodes": ["gpu-a01", "n1"],
                       "cpus_alloc": 16, "mem_req_bytes": 64 * GIB, "gpus_alloc": 3}), [a, n1])
    raw = decode_js1(js1_blob(job))
    check_jobstats_layout(raw, gpus=True)
    ga, gn = raw["nodes"]["gpu-a01"], raw["nodes"]["n1"]
    assert ga["gpu_utilization"] == {"0": 50.0, "1": 50.0}
    assert ga["gpu_used_memory"] == {"0": 20 * GIB, "1": 20 * GIB}
    assert ga["gpu_total_memory"] == {"0": 150754820096, "1": 150754820096}
    assert {k: gn[k] for k in gn if k.startswith("gpu_")} == {
        "gpu_utilization": {}, "gpu_used_memory": {}, "gpu_total_memory": {}}
    # 40 GiB of 2 x 150754820096 B = 14.2 %; the GPU without figures is left out, not counted as 0
    assert jobstats_gpu_headlines(raw) == ("50%", "14%")
