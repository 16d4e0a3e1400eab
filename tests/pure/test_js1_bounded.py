"""The JS1 blob always fits and always renders: at most
report.js1_max_chars (default 32 KiB) whatever the job size, every node with jobstats' per-node keys
(PrincetonUniversity/jobstats docs/setup/summaries.md), job totals exact
when nodes are pooled, and sacctmgr never sees an argument the kernel refuses."""

from __future__ import annotations

import random

import pytest

from gsrun import SUMMARY_SCHEMA
from gsrun.base.errors import SlurmError
from gsrun.report import accounting
from gsrun.report.records import JobSummary
from gsrun.report.summary import JS1_MAX_CHARS, decode_js1, js1_blob
from helpers.jobstats_layout import check_jobstats_layout, jobstats_gpu_headlines

GIB = 1 << 30


def big_job(n_nodes: int, gpus_per_node: int = 8, seed: int = 1) -> dict:
    """The JSON form of a job summary of ``n_nodes`` nodes (edited by the tests, read with ``JobSummary.from_json``)."""
    rnd = random.Random(seed)
    names = [f"gpu{i:05d}" for i in range(n_nodes)]
    detail = [{"node": n, "cpus_alloc": 64, "cpu_time_s": rnd.uniform(1e5, 5e6), "mem_peak_bytes": rnd.randrange(
        10 * GIB, 900 * GIB), "elapsed_s": 86400.0, "gpu_available": True, "gpu_reason": None,
        "mem_total_bytes": 2048 * GIB} for n in names]
    devs = [{"node": n, "index": i, "status": "ok", "util_mean_pct": round(rnd.uniform(0, 100), 1),
             "mem_peak_bytes": rnd.randrange(GIB, 140 * GIB), "mem_total_bytes": 150754820096,
             "sm_active_mean_pct": 40.0, "tensor_active_mean_pct": 10.0, "lost_at_s": None}
            for n in names for i in range(gpus_per_node)]
    return {"schema": SUMMARY_SCHEMA, "kind": "job",
            "job": {"id": "77", "elapsed_s": 86400.0, "gpus_alloc": n_nodes * gpus_per_node,
                    "mem_req_bytes": None, "nodes": names},
            "cpu": {"efficiency_pct": 50.0}, "nodes_detail": detail,
            "gpu": {"devices": devs, "count": len(devs), "energy_j": 1e9}}


@pytest.mark.parametrize("n_nodes, reduced", [(1, None), (8, None), (64, None), (200, "gpus"), (4000, "nodes")])
def test_blob_fits_and_keeps_jobstats_totals(n_nodes, reduced):
    job = big_job(n_nodes)
    text = js1_blob(JobSummary.from_json(job))
    assert len(text) <= JS1_MAX_CHARS
    raw = decode_js1(text)
    check_jobstats_layout(raw, gpus=True)
    got = raw["gsrun"].get("reduced")
    assert (got or None) == reduced if reduced != "nodes" else got.startswith("nodes:")
    # jobstats' job totals (sums over its nodes) are the job's, pooled or not
    for key, src in (("total_time", "cpu_time_s"), ("used_memory", "mem_peak_bytes"),
                     ("cpus", "cpus_alloc"), ("total_memory", "mem_total_bytes")):
        want = sum(n[src] for n in job["nodes_detail"])
        assert sum(d[key] for d in raw["nodes"].values()) == pytest.approx(want, rel=1e-6), key
    if reduced is None:
        assert len(raw["nodes"]) == n_nodes and len(raw["nodes"]["gpu00000"]["gpu_utilization"]) == 8
    else:
        assert all(set(d["gpu_utilization"]) == {"min", "median", "max"} for d in raw["nodes"].values())
        u = raw["nodes"][sorted(raw["nodes"])[0]]["gpu_utilization"]
        assert u["min"] <= u["median"] <= u["max"]
    assert accounting.valid_js1(text)


def test_4000_nodes_pooled_names_say_which_nodes():
    raw = decode_js1(js1_blob(JobSummary.from_json(big_job(4000))))
    groups = int(raw["gsrun"]["reduced"].split(":")[1])
    assert len(raw["nodes"]) == groups >= 2
    first = sorted(raw["nodes"])[0]
    assert first.startswith("gpu00000..") and first.endswith(" nodes)")
    assert sum(int(k.rsplit("(", 1)[1].split()[0]) for k in raw["nodes"]) == 4000


def test_job_without_gpu_figures_renders_as_unknown():
    job = big_job(2)
    for g in job["gpu"]["devices"]:
        g.update(util_mean_pct=None, mem_peak_bytes=None)
    raw = decode_js1(js1_blob(JobSummary.from_json(job)))
    check_jobstats_layout(raw, gpus=True)
    # jobstats: empty gpu_utilization -> "GPU utilization is unknown" (no error), no memory keys
    assert all(d["gpu_utilization"] == {} and "gpu_used_memory" not in d for d in raw["nodes"].values())


@pytest.mark.parametrize("n_nodes, reduced", [(8, None), (64, None), (250, "gpus"), (4000, "nodes")])
def test_nodes_without_gpu_figures_keep_the_memory_pair(n_nodes, reduced):
    """NVML down on every other node: those nodes carry empty GPU keys (jobstats
    reads GPU memory only when every node has the pair), per GPU, reduced or pooled."""
    job = big_job(n_nodes)
    down = set(job["job"]["nodes"][1::2])
    for g in job["gpu"]["devices"]:
        if g["node"] in down:
            g.update(status="unavailable", util_mean_pct=None, mem_peak_bytes=None, mem_total_bytes=None)
    text = js1_blob(JobSummary.from_json(job))
    assert len(text) <= JS1_MAX_CHARS
    raw = decode_js1(text)
    check_jobstats_layout(raw, gpus=True)
    assert (raw["gsrun"].get("reduced") or "").split(":")[0] == (reduced or "")
    assert all(set(d) >= {"gpu_used_memory", "gpu_total_memory"} for d in raw["nodes"].values())
    if reduced != "nodes":
        for name, d in raw["nodes"].items():
            assert (d["gpu_total_memory"] == {} and d["gpu_utilization"] == {}) == (name in down), name
    util, mem = jobstats_gpu_headlines(raw)
    assert util.endswith("%") and mem.endswith("%")


def test_sacctmgr_argument_is_bounded(monkeypatch):
    calls = []
    monkeypatch.setattr(accounting, "run_slurm", lambda argv, *a, **k: calls.append(argv))
    with pytest.raises(SlurmError, match="too long"):
        accounting._sacctmgr_set("77", "JS1:" + "A" * 200_000, 5.0)
    assert calls == []      # refused before any exec: no E2BIG

    def e2big(argv, *a, **k):
        raise OSError(7, "Argument list too long")

    monkeypatch.setattr(accounting, "run_slurm", e2big)
    with pytest.raises(SlurmError, match="could not start"):
        accounting._sacctmgr_set("77", "JS1:AAAA", 5.0)
