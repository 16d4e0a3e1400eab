"""The GPU memory "used" before a job's processes start, for GPUs whose
NVML binding has only the v1 memory call (which counts the driver's
reservation as used): read by the node monitor when the prolog tells it the
job began (kept in the job's ``monitor.json``), subtracted by the sampler
(:mod:`gsrun.node.sampler`). Apart from the sampler so that the hooks, which
the daemon preloads, do not import the sampler's state types."""

from __future__ import annotations

from gsrun.facts.nvml import index_by_minor


def read_mem_baseline(nv, gres_indices: list[int]) -> dict[int, int]:
    """gres index -> GPU memory "used" now, for the GPUs whose binding has
    only the v1 memory call (no ``reserved`` in the answer: v1 counts the
    driver's reservation as used). Read by the prolog before the job's
    processes start; GPUs with v2 or no answer are left out."""
    by_minor, _lost = index_by_minor(nv)
    out = {}
    for g in gres_indices:
        idx = by_minor.get(g)
        if idx is None:
            continue
        m = nv.get(idx, "memory")
        if isinstance(m, dict) and "reserved" not in m and isinstance(m.get("used"), int):
            out[g] = int(m["used"])
    return out
