#!/usr/bin/env python3
"""Pinned host buffers from 2 MiB hugepages vs normal pages, same run.

Run as root on a GPU node with torch (the H200 VM):

    python3 -P tests/bench/bench_hugepages.py [--mib 1024] [--rounds 5] > bench_hugepages.json

Per round, for each kind: ``mmap`` ``--mib`` MiB anonymous memory
(``MAP_HUGETLB`` for "huge", plain for "normal"), touch it, and time
``cudaHostRegister`` (pinning: the driver walks and locks every page) and one
host->device copy into a preallocated GPU tensor. The hugepages come from
``nr_hugepages`` of the GPU's NUMA node, reserved here for the run and put
back to the exact prior value at the end (also on error). Prints JSON with the
median seconds per kind and the ratios normal/huge (> 1: hugepages faster).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import mmap
import statistics
import time
from pathlib import Path

MAP_HUGETLB = 0x40000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import torch

    nbytes = a.mib << 20
    nr = sorted(glob.glob("/sys/devices/system/node/node*/hugepages/hugepages-2048kB/nr_hugepages"))[0]
    prior = Path(nr).read_bytes()
    out: dict = {"mib": a.mib, "rounds": a.rounds, "nr_hugepages_file": nr, "prior": prior.decode().strip()}
    cudart = torch.cuda.cudart()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times: dict[str, dict[str, list[float]]] = {k: {"register_s": [], "h2d_s": []} for k in ("normal", "huge")}
    try:
        Path(nr).write_text(str(int(prior) + a.mib // 2 + 1))
        out["got_pages"] = int(Path(nr).read_text())
        for _ in range(a.rounds):
            for kind in ("normal", "huge"):
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_HUGETLB if kind == "huge" else 0)
                m = mmap.mmap(-1, nbytes, flags=flags)
                chunk = b"\1" * (1 << 20)
                for _ in range(a.mib):                 # touch every page
                    m.write(chunk)
                buf = (ctypes.c_char * nbytes).from_buffer(m)
                ptr = ctypes.addressof(buf)
                t0 = time.perf_counter()
                rc = cudart.cudaHostRegister(ptr, nbytes, 0)
                t1 = time.perf_counter()
                if int(rc) != 0:
                    raise SystemExit(json.dumps({"error": f"cudaHostRegister {kind}: {rc}"}))
                host = torch.frombuffer(buf, dtype=torch.uint8)
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                dev.copy_(host, non_blocking=True)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                cudart.cudaHostUnregister(ptr)
                del host, buf
                m.close()
                times[kind]["register_s"].append(t1 - t0)
                times[kind]["h2d_s"].append(t3 - t2)
    finally:
        Path(nr).write_bytes(prior)
        out["restored_exact"] = Path(nr).read_bytes() == prior
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in times.items()}
    out["median_s"] = med
    out["ratio_normal_over_huge"] = {m: med["normal"][m] / med["huge"][m] for m in ("register_s", "h2d_s")}
    out["h2d_gb_s"] = {k: nbytes / med[k]["h2d_s"] / 1e9 for k in med}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
