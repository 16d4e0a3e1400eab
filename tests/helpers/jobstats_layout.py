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
