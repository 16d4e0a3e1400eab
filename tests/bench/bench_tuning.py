"""Benchmark (not a test): prolog_tune + epilog_restore on a fake host tree
against ``python3 -c pass``, measured in the same run.

    /opt/gsrun/venv/bin/python tests/bench/bench_tuning.py [--runs 30]

Prints median wall times (ms) of
  - ``python3 -c pass`` (interpreter start, the floor any Python prolog pays),
  - a child process that imports gsrun.node.tuning and runs prolog_tune + epilog_restore
    (what slurmd waits for, minus the CLI),
  - the two calls in-process (the tuning work itself),
and the ratios of the first two to ``python3 -c pass``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/helpers

from gsrun.node import tuning  # noqa: E402
from gsrun.facts.hostfs import HostFS  # noqa: E402
from helpers.tuning_tree import make_tree  # noqa: E402

REQ = "governor=performance,swappiness=10,swap=off,dirty_ratio=40,dirty_background_ratio=5,thp=never,thp_defrag=never"
CHILD = ("import sys; from gsrun.node import tuning; from gsrun.facts.hostfs import HostFS; "
         "h = HostFS(sys.argv[2]); "
         "tuning.prolog_tune(h, sys.argv[3], '1', sys.argv[4], None, None, True, log=lambda m: None); "
         "r = tuning.epilog_restore(h, sys.argv[3], '1', log=lambda m: None); assert r['ok'] and r['last_job']")


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    # the state dir lives on tmpfs in production (/run/gsrun): measure it there too
    tmpfs = "/dev/shm" if Path("/dev/shm").is_dir() else None
    tmp = Path(tempfile.mkdtemp(prefix="gsrun-bench-", dir=tmpfs))
    try:
        root = make_tree(tmp / "host")
        state = tmp / "state"
        host = HostFS(root)
        py = sys.executable

        def bare():
            subprocess.run([py, "-P", "-c", "pass"], check=True)

        def child():
            subprocess.run([py, "-P", "-c", CHILD, str(REPO), str(root), str(state), REQ], check=True)

        def inproc():
            tuning.prolog_tune(host, str(state), "1", REQ, None, None, True, log=lambda m: None)
            r = tuning.epilog_restore(host, str(state), "1", log=lambda m: None)
            assert r["ok"] and r["last_job"]

        for f in (bare, child, inproc):   # warm caches
            f()
        t_bare = median_ms(bare, args.runs)
        t_child = median_ms(child, args.runs)
        t_in = median_ms(inproc, args.runs)
        print(f"runs: {args.runs}, tree+state under {tmp}, request: {REQ}")
        print(f"python3 -c pass                      median {t_bare:8.2f} ms")
        print(f"child: prolog_tune + epilog_restore  median {t_child:8.2f} ms   ratio {t_child / t_bare:5.2f}x")
        print(f"in-process: prolog_tune + epilog     median {t_in:8.2f} ms   ratio {t_in / t_bare:5.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
