#!/usr/bin/env python3
"""``gsrun-report`` over generated accounting rows (docs/history/benchmarks-log.md, "Cluster report").

    python3 -P tests/bench/bench_report.py [--jobs 50000,200000] [--keep DIR]

Per size, writes ``sacct -P -n -X --format=<REPORT_FORMAT>`` lines for that
many jobs over 7 days (:mod:`helpers.fleet_rows`: 70 % gsrun blobs, 20 %
jobstats blobs, 5 % ``JS1:Short``, 5 % foreign comments; a tenth CPU-only
jobs) to a file, then runs in a fresh process each:

- ``bare_parse``: :func:`gsrun.facts.sacct.parse_sacct` of the whole file
  (the cost of just reading the rows, the way gseff parses sacct);
- ``report``: the whole report as ``gsrun-report`` runs it (the file's lines
  streamed into :func:`gsrun.wrapper.gsreport.run_report` as sacct's stdout,
  blobs decoded, every table built and rendered as text, digests planned).

Each child prints its wall seconds, CPU seconds (user + system: what a
busy shared machine does not inflate) and peak RSS (``ru_maxrss``). Targets:
200,000 jobs in <= 30 s and <= 500 MB; ``flat``: the report's peak RSS at
the largest size is within 1.5x of the smallest (memory does not grow with
the window). Prints JSON lines; exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from helpers import fleet_rows  # noqa: E402

BARE = r"""
import resource, sys, time
from gsrun.facts.sacct import parse_sacct
from gsrun.report.fleet_source import REPORT_FORMAT
t = time.perf_counter()
rows = parse_sacct(open(sys.argv[1]).read(), REPORT_FORMAT)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t, ru.ru_maxrss * 1024, len(rows), ru.ru_utime + ru.ru_stime)
"""

REPORT = r"""
import resource, sys, time
sys.path.insert(0, sys.argv[2])
from helpers import fleet_rows
from gsrun.request.config import parse_config
from gsrun.report.fleet import parse_sinfo_nodes
from gsrun.report.fleet_render import Scope, report_text
from gsrun.report import fleet_mail
from gsrun.wrapper.gsreport import run_report
t = time.perf_counter()
cfg = parse_config('[mail]\ndefault_domain = "example.org"\n')
s, e = fleet_rows.window()
scope = Scope(s, e)
def lines_of(argv):
    # what sacct -S/-E answers for this chunk: the jobs that ran in it (written per chunk beforehand)
    with open(f"{sys.argv[1]}.{argv[argv.index('-S') + 1]}") as f:
        yield from f
rep = run_report(scope, cfg, lines_of=lines_of, shares=parse_sinfo_nodes(fleet_rows.SINFO), digests=True)
text = report_text(rep.tables(), scope, rep.clusters)
out, skipped = fleet_mail.plan_digests(rep.digests(), scope, cfg, {}, e)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(time.perf_counter() - t, ru.ru_maxrss * 1024, rep.jobs, len(out), ru.ru_utime + ru.ru_stime)
"""


def split_chunks(path: Path, start_s: float, end_s: float) -> None:
    """``<path>.<chunk start>``: per day chunk, the jobs sacct -S/-E lists for it (those that ran
    in it: ended in it, or started in it and ended later), as the report asks sacct."""
    from gsrun.facts.sacct import epoch_or_none
    from gsrun.report.fleet_source import REPORT_FORMAT, _slurm_time, chunks

    cs = chunks(start_s, end_s, 86400.0)
    outs = [open(f"{path}.{_slurm_time(a)}", "w") for a, _ in cs]
    i_start, i_end = REPORT_FORMAT.index("Start"), REPORT_FORMAT.index("End")
    with open(path) as f:
        for line in f:
            p = line.split("|", i_end + 1)
            st, en = epoch_or_none(p[i_start]), epoch_or_none(p[i_end])
            for (a, b), out in zip(cs, outs):
                if st < b and en >= a:
                    out.write(line)
    for out in outs:
        out.close()


def child(code: str, *args: str) -> list[str]:
    cp = subprocess.run([sys.executable, "-P", "-c", code, *args], capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        raise SystemExit(f"gsrun: bench: child failed: {cp.stderr[-2000:]}")
    return cp.stdout.split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="50000,200000")
    ap.add_argument("--keep", default=None)
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.jobs.split(",")]
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="gsrun-bench-report-"))
    tmp.mkdir(parents=True, exist_ok=True)
    s, e = fleet_rows.window()
    results = []
    for n in sizes:
        path = tmp / f"sacct-{n}.txt"
        if not path.exists():
            with open(path, "w") as f:
                f.writelines(fleet_rows.rows(n, s, e))
            split_chunks(path, s, e)
        bare = child(BARE, str(path))
        rep = child(REPORT, str(path), str(HERE.parent))
        r = {"jobs": n, "rows_bytes": path.stat().st_size,
             "bare_parse_s": round(float(bare[0]), 2), "bare_parse_rss_mb": round(int(bare[1]) / 1e6, 1),
             "report_s": round(float(rep[0]), 2), "report_rss_mb": round(int(rep[1]) / 1e6, 1),
             "bare_parse_cpu_s": round(float(bare[3]), 2), "report_cpu_s": round(float(rep[4]), 2),
             "report_jobs": int(rep[2]), "digests": int(rep[3])}
        r["met"] = r["report_s"] <= 30 and r["report_rss_mb"] <= 500 if n >= 200000 else None
        results.append(r)
        print(json.dumps(r), flush=True)
    if len(results) > 1:
        flat = results[-1]["report_rss_mb"] <= 1.5 * results[0]["report_rss_mb"]
        print(json.dumps({"flat": flat, "rss_mb": [r["report_rss_mb"] for r in results]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
