"""The GPU memory "used" before a job's processes start, for GPUs whose
NVML binding has only the v1 memory call (which counts the driver's
reservation as used): read by the prolog, handed to the sampler as
``--mem-baseline GRES=BYTES,...``, subtracted by the sampler
(:mod:`gsrun.node.sampler`). Apart from the sampler so that the prolog does not
import the sampler's state types."""

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


def format_mem_baseline(b: dict[int, int]) -> str:
    """``{0: 650000000}`` -> ``"0=650000000"`` (the ``--mem-baseline`` form)."""
    return ",".join(f"{k}={v}" for k, v in sorted(b.items()))


def parse_mem_baseline(text: str | None) -> dict[int, int]:
    """Inverse of :func:`format_mem_baseline`; malformed entries are dropped
    (no baseline is better than a wrong one)."""
    out = {}
    for part in (text or "").split(","):
        k, _, v = part.partition("=")
        if k.isdigit() and v.isdigit():
            out[int(k)] = int(v)
    return out
