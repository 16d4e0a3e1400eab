"""jobstats' per-node blob layout (PrincetonUniversity/jobstats docs/setup/summaries.md and
what its reader Jobstats.parse_stats and text formatter need), for tests of stored JS1 blobs."""

from __future__ import annotations

# its formatter needs the four CPU/memory keys on every node (a node without used_memory /
# total_memory makes it fail: float(None)); the GPU memory keys come as a pair keyed alike
CPU_KEYS = {"cpus", "total_time", "used_memory", "total_memory"}
GPU_KEYS = {"gpu_utilization", "gpu_used_memory", "gpu_total_memory"}


def check_jobstats_layout(raw: dict, gpus: bool) -> None:
    """What jobstats' reader (Jobstats.parse_stats) and formatter need of a blob."""
    assert isinstance(raw["nodes"], dict) and raw["nodes"]
    for name, d in raw["nodes"].items():
        assert CPU_KEYS <= set(d) <= CPU_KEYS | GPU_KEYS, name
        assert isinstance(d["cpus"], int) and d["cpus"] >= 1
        for k in ("total_time", "used_memory", "total_memory"):
            assert isinstance(d[k], (int, float)) and d[k] >= 0
        if gpus:
            assert isinstance(d["gpu_utilization"], dict)
            assert all(isinstance(v, (int, float)) for v in d["gpu_utilization"].values())
        assert ("gpu_used_memory" in d) == ("gpu_total_memory" in d)
        if "gpu_total_memory" in d:
            assert set(d["gpu_used_memory"]) == set(d["gpu_total_memory"])
            assert all(v > 0 for v in d["gpu_total_memory"].values())
    # GPU memory is read only when every node has the pair, and then divided by the job's
    # total: all nodes or none, and a pair that is there has some figure
    with_mem = [d for d in raw["nodes"].values() if "gpu_total_memory" in d]
    assert len(with_mem) in (0, len(raw["nodes"]))
    assert not with_mem or sum(v for d in with_mem for v in d["gpu_total_memory"].values()) > 0


def jobstats_gpu_headlines(raw: dict) -> tuple[str, str]:
    """The GPU utilization and GPU memory headlines jobstats' text report prints
    for a blob of a job with GPUs in AllocTRES (its ``gpus`` comes from sacct,
    not from the blob), as jobstats states it:

    - utilization: a node without ``gpu_utilization`` -> ``"(Value is unknown)"``;
      no GPU value on any node -> ``"GPU utilization is unknown"``; else the
      mean over the listed GPUs, rounded, as ``"<n>%"``;
    - memory: a node without the pair -> ``"(JSON is malformed)"``; a total of
      0 -> ``"ZeroDivisionError"`` (it divides without a check); else
      used / total over the listed GPUs, rounded, as ``"<n>%"``.
    """
    nodes = raw["nodes"].values()
    if not all("gpu_utilization" in d for d in nodes):
        util = "(Value is unknown)"
    else:
        vals = [v for d in nodes for v in d["gpu_utilization"].values()]
        util = f"{round(sum(vals) / len(vals))}%" if vals else "GPU utilization is unknown"
    if not all("gpu_used_memory" in d and "gpu_total_memory" in d for d in nodes):
        mem = "(JSON is malformed)"
    else:
        total = sum(v for d in nodes for v in d["gpu_total_memory"].values())
        used = sum(d["gpu_used_memory"][k] for d in nodes for k in d["gpu_total_memory"])
        mem = f"{round(100 * used / total)}%" if total else "ZeroDivisionError"
    return util, mem
