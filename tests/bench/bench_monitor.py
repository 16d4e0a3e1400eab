"""Benchmark (not a test): the node monitor's resident memory with 8 one-GPU jobs on an
8-GPU node over a simulated week, and its CPU per GPU per sample, in the same run as a
bare NVML loop making the same calls.

    /opt/gsrun/venv/bin/python tests/bench/bench_monitor.py [--days 7] [--interval 5] [--flush 30]

One :class:`gsrun.node.monitor.Monitor` in this process (no daemon: its ``tick`` is
what the monitor's loop runs every ``sampler.interval_s``), with the bench's clocked
FakeNvml (tests/bench/bench_sampler.py: the H200 recording x 8, utilization buffer and
energy counter following the simulated clock), one NVML handle for all jobs, 8 jobs
of one GPU each begun through :meth:`Monitor.begin` as a prolog does (their CPU and
memory read from this process, as bench_sampler.py does: no job cgroup here), their states
flushed every ``--flush`` simulated seconds and their live files written every
``live.flush_s`` (30 s). The clock is simulated (no sleeping): a week at 5 s is
120960 ticks.

Prints JSON: RSS (psutil) after the jobs began and at the end of every simulated
day, its growth from day 1 to the last day (target: the whole <= 80 MB, flat within
5 %), CPU microseconds per GPU per tick of the monitor (polls, flushes, live files
and the Prometheus readings amortized) and of the bare loop making the same NVML
calls (:func:`gsrun.node.sampler.read_gpu`), and their ratio (target <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))
from bench_sampler import Clock, ClockedFake, T0, _Quiet, bare_same, job_usage_reader  # noqa: E402
from helpers.tuning_tree import make_tree  # noqa: E402

from gsrun.base.paths import Paths  # noqa: E402
from gsrun.facts.hostfs import HostFS  # noqa: E402
from gsrun.node.monitor import Monitor  # noqa: E402
from gsrun.node.sampler import resolve_gpus  # noqa: E402
from gsrun.request.config import load_config_or_defaults  # noqa: E402


class _Err:
    error = staticmethod(print)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--flush", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--bare-samples", type=int, default=20000)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-monitor-"))
    clock = Clock()
    nv = ClockedFake(a.jobs, clock)
    nv.calls = _Quiet()
    refs = [r for r in resolve_gpus(nv, list(range(a.jobs)))[0] if r.nvml_index is not None]
    bare_s = bare_same(nv, refs, a.bare_samples, clock, a.interval)
    bare_us = 1e6 * bare_s / (a.bare_samples * len(refs))
    clock.t = T0
    conf = tmp / "gsrun.toml"
    conf.write_text(f"[sampler]\ninterval_s = {a.interval}\nflush_s = {a.flush}\n[live]\nflush_s = 30\n")
    os.environ["GSRUN_CONFIG"] = str(conf)
    cfg = load_config_or_defaults(_Err)
    root = make_tree(tmp / "root")
    paths = Paths(str(tmp / "state"), str(tmp / "spool"), str(tmp / "mps"))
    (tmp / "state").mkdir(mode=0o755)
    mon = Monitor(HostFS(str(root)), paths, cfg, nvml=nv, clock=clock, log=lambda m: None, usage=job_usage_reader())
    for j in range(a.jobs):
        mon.begin({"job_id": str(5000 + j), "uid": os.getuid(), "node": "bench", "gpus": [j],
                   "dma_latency_us": None})
    me = psutil.Process()
    rss = {"begun": me.memory_info().rss}
    ticks_per_day = int(86400 / a.interval)
    days = int(a.days)
    c0 = time.process_time()
    for d in range(1, days + 1):
        for _ in range(ticks_per_day):
            clock.t += a.interval
            mon.tick()
        rss[f"day{d}"] = me.memory_info().rss
    cpu_s = time.process_time() - c0
    ticks = days * ticks_per_day
    mon_us = 1e6 * cpu_s / (ticks * a.jobs)
    first, last = rss["day1"], rss[f"day{days}"]
    out = {"jobs": a.jobs, "gpus": a.jobs, "days": days, "interval_s": a.interval, "flush_s": a.flush,
           "ticks": ticks, "rss_mb": {k: round(v / 2 ** 20, 1) for k, v in rss.items()},
           "rss_growth_day1_to_last_pct": round(100.0 * (last - first) / first, 2),
           "cpu_us_per_gpu_per_tick": {"monitor": round(mon_us, 1), "bare_same_calls": round(bare_us, 1),
                                       "ratio": round(mon_us / bare_us, 2)},
           "state_file_kib": round(os.path.getsize(tmp / "state/jobs/5000/sampler.json") / 1024, 1),
           "targets": {"rss_max_mb": 80, "rss_flat_pct": 5, "cpu_ratio_max": 1.2},
           "load_avg": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
