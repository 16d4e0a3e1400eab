"""Generated accounting rows for the cluster report: ``sacct -P -n -X
--format=<REPORT_FORMAT>`` lines with realistic ``AdminComment`` blobs
(gsrun's layout with its ``gsrun`` section, jobstats' without, jobstats'
``JS1:Short`` stubs, foreign comments, CPU-only jobs), deterministic per seed.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import time
from datetime import datetime

GIB = 1 << 30
H200_MEM = 150754820096
USERS = [f"u{i:03d}" for i in range(300)]
ACCOUNTS = [f"acct{i:02d}" for i in range(40)]
PARTITIONS = [("gpu", "h200", 8), ("gpu-short", "h200", 8), ("cpu", None, 0)]


def js1(blob: dict) -> str:
    raw = json.dumps(blob, separators=(",", ":"), sort_keys=True).encode()
    return "JS1:" + base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def blob(rng: random.Random, gpus: int, nodes: list[str], elapsed_s: int, cpus: int, mem_req: int,
         gsrun: bool) -> dict:
    """A job's blob: per node cpus, CPU seconds, host memory used/total; per GPU utilization and memory."""
    per = max(1, gpus // len(nodes))
    style = rng.random()
    out = {"gpus": gpus, "total_time": elapsed_s, "nodes": {}}
    sm, energy = {}, 0.0
    for n in nodes:
        util = {}
        used = {}
        for i in range(per):
            u = 0.0 if style < 0.15 else round(rng.uniform(1, 30) if style < 0.5 else rng.uniform(30, 100), 1)
            util[str(i)] = u
            used[str(i)] = int(rng.uniform(0.5, 12) * GIB) if style < 0.5 else int(rng.uniform(20, 140) * GIB)
            sm[f"{n}:{i}"] = round(u * rng.uniform(0.2, 0.9), 1)
            energy += elapsed_s * (80 + 6 * u)
        out["nodes"][n] = {"cpus": cpus // len(nodes), "total_time": round(elapsed_s * cpus * rng.random(), 1),
                           "used_memory": int(mem_req // len(nodes) * rng.uniform(0.05, 0.9)),
                           "total_memory": mem_req // len(nodes), "gpu_utilization": util,
                           "gpu_used_memory": used, "gpu_total_memory": {k: H200_MEM for k in used}}
    if gsrun:
        out["gsrun"] = {"schema": "gsrun.summary/1", "cpu_eff_pct": 40.0, "energy_j": round(energy, 1),
                        "sm_active_pct": sm, "tensor_active_pct": {}, "lost": {},
                        **({"alerts": 1} if style < 0.15 and rng.random() < 0.5 else {})}
    return out


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def _dur(s: int) -> str:
    d, s = divmod(int(s), 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def rows(n: int, start_s: float, end_s: float, seed: int = 1, pool: int = 3000, cluster: str = "c1"):
    """``n`` lines for jobs ending in ``[start_s, end_s)``, in End order.
    Blobs are drawn from a pool of ``pool`` distinct ones (each still decoded per row)."""
    rng = random.Random(seed)
    blobs = []
    for i in range(pool):
        gpus = rng.choice([1, 1, 1, 2, 4, 8, 16])
        nn = 1 if gpus <= 8 else 2
        if gpus == 4 and rng.random() < 0.2:
            nn = 2
        nodes = [f"gpu{j:03d}" for j in range(nn)]
        cpus = gpus * rng.choice([4, 8, 12, 16, 24])
        mem = gpus * rng.choice([64, 128, 256, 400]) * GIB
        el = rng.randint(60, 2 * 86400)
        kind = rng.random()
        if kind < 0.70:
            c = js1(blob(rng, gpus, nodes, el, cpus, mem, True))
        elif kind < 0.90:
            c = js1(blob(rng, gpus, nodes, el, cpus, mem, False))
        elif kind < 0.95:
            c = "JS1:Short"
        else:
            c = "cleaned by admin | see ticket 42"
        blobs.append((gpus, nn, cpus, mem, el, c))
    step = (end_s - start_s) / n
    for i in range(n):
        end = start_s + i * step + step / 2
        part, gtype, _ = PARTITIONS[0 if i % 10 < 6 else 1 if i % 10 < 9 else 2]
        gpus, nn, cpus, mem, el, c = blobs[rng.randrange(pool)]
        if gtype is None:
            gpus, c, nn = 0, "", 1
        limit = rng.choice([el + 600, el * 2, 86400 * 2, 86400 * 3])
        start = end - el
        submit = start - rng.randint(0, 36 * 3600)
        state = rng.choice(["COMPLETED"] * 7 + ["FAILED", "TIMEOUT", "CANCELLED by 1234"])
        tres = f"billing={cpus},cpu={cpus},mem={mem // (1 << 20)}M,node={nn}" + (
            f",gres/gpu={gpus},gres/gpu:{gtype}={gpus}" if gpus else "")
        nodes = "gpu[000-001]" if nn == 2 else "gpu000"
        yield "|".join([str(100000 + i), str(100000 + i), cluster, part, rng.choice(ACCOUNTS), rng.choice(USERS),
                        state, _ts(submit), _ts(start), _ts(end), _dur(el), _dur(limit), str(cpus), tres,
                        f"{mem // (1 << 20)}M", str(nn), nodes, c]) + "\n"


SINFO = "gpu|96|2000000|gpu:h200:8(S:0-1)\ngpu-short*|96|2000000|gpu:h200:8(S:0-1)\ncpu|128|512000|(null)\n"


def window(days: float = 7.0, end_s: float | None = None) -> tuple[float, float]:
    end = 1_714_521_600.0 if end_s is None else end_s     # 2024-05-01 00:00 UTC
    return end - days * 86400, end


__all__ = ["rows", "window", "SINFO", "js1", "blob", "time"]
