#!/usr/bin/env python3
"""EpilogSlurmctld merge and ``gseff`` on generated job spools (docs/history/benchmarks-log.md, "Controller merge").

    python3 -P tests/bench/bench_merge.py [--nodes 100,1000] [--big] [--keep DIR] [--before REV]

Generates, per size, a job spool of N nodes x 8 GPUs with 24 h of samples:
``<spool>/jobs/<id>/node-<node>.json`` in the node epilog's format. The
files are built directly, not through :func:`gsrun.report.summary.node_record`
(running the sampler for 24 h x 8 GPUs x 4,000 nodes would take hours): one
node file of ``tests/data/summaries/two-nodes`` (a real ``node_record``
output) gives the keys, each GPU's timelines are real
:class:`gsrun.facts.aggregate.Timeline` series fed one value per
``sampler.interval_s`` (5 s) for 24 h (so the downsampled size a real
24 h job leaves), and the per-GPU figures vary by node and GPU so rankings
and distributions are not flat.

Then times, each in a fresh process (wall seconds, peak RSS of that process
from ``getrusage(RUSAGE_CHILDREN)`` of a runner that starts only it):

- ``merge``: :func:`gsrun.epilog.ctld.merge` + :func:`~gsrun.epilog.ctld.write_summary` called directly;
- ``ctld``: ``gsrun-node epilog-ctld`` with the EpilogSlurmctld environment
  (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_JOB_USER``,
  ``SLURM_JOB_UID``; no ``scontrol`` answer, ``--wait-s 0``);
- ``gseff``: ``gseff JOBID`` after the merge (and ``gseff --json``);

against ``python3 -P -c pass`` measured in the same run. ``--before REV``
also runs each step with the package as of git revision ``REV`` (``git
archive``, laid out as installed, first on ``PYTHONPATH``) on the same
spool just before the current code, reported as ``before_<step>``, with
``same_output``: whether both wrote the same ``summary.json`` bytes and
printed the same ``gseff --json``. ``--repeat N`` runs every step N times,
before and after alternating (a shared machine's load then falls on both),
and reports the fastest run (``walls_s``: every run's wall).
``--big`` adds 4,000 nodes. Prints JSON lines; the targets (1,000 nodes: merge <= 2 s and
<= 300 MB, gseff <= 1 s; 4,000 nodes: <= 8 s and <= 1 GB) with ``met``.
Exits 0 whatever the figures.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests" / "data" / "summaries" / "two-nodes" / "node-gpu-a01.json"
HOURS = 24
INTERVAL_S = 5.0
GPUS = 8

RUNNER = r"""
import hashlib, json, resource, subprocess, sys, time
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t0 = time.perf_counter()
cp = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,
                  "rc": cp.returncode, "stdout_bytes": len(cp.stdout), "stdout_lines": cp.stdout.count(b"\n"),
                  "stdout_sha256": hashlib.sha256(cp.stdout).hexdigest()[:16],
                  "stderr": cp.stderr.decode(errors="replace")[-400:]}))
"""

MERGE = r"""
import os, sys
import gsrun
want = os.environ.get("BENCH_GSRUN_ROOT")
assert not want or gsrun.__file__.startswith(want), f"{gsrun.__file__} is not under {want}"
from gsrun.base.paths import Paths
from gsrun.epilog.ctld import merge, write_summary
from gsrun.request.config import load_config_or_defaults
n, spool = int(sys.argv[1]), sys.argv[2]
cfg = load_config_or_defaults(None)
paths = Paths.from_config(cfg, None, spool)
job = {"id": "4242", "nodes": [f"n{i:04d}" for i in range(n)], "state": "COMPLETED", "exit_code": 0,
       "elapsed_s": 86400.0, "gpus_alloc": 8 * n, "cpus_alloc": 64 * n, "mem_req_bytes": n * 512 * 2**30,
       "user": "bench", "partition": "gpu"}
import inspect
if "JobInfo" in str(inspect.signature(merge).parameters["job"].annotation):    # the record, not its dict
    from gsrun.report.records import JobInfo
    job = JobInfo(**job)
s = merge(paths, job, cfg, 0.0)
write_summary(paths, s, 0, 0)
bad = [m for m, mod in sys.modules.items() if m.startswith("gsrun") and want
       and not (getattr(mod, "__file__", None) or want).startswith(want)]
assert not bad, f"not from {want}: {bad}"
"""


def _timelines(seed: int) -> dict:
    """One GPU's 24 h timelines, downsampled as the sampler does."""
    from gsrun.facts.aggregate import Timeline

    tl = {k: Timeline() for k in ("util_pct", "sm_active_pct", "mem_used_bytes", "power_w")}
    n = int(HOURS * 3600 / INTERVAL_S)
    for i in range(n):
        t = i * INTERVAL_S
        u = (seed * 13 + i * 7) % 100
        tl["util_pct"].add(t, u)
        tl["sm_active_pct"].add(t, u * 0.6)
        tl["mem_used_bytes"].add(t, 2**30 * (40 + (i + seed) % 50))
        tl["power_w"].add(t, 120.0 + 5.5 * u)
    return {k: [[round(p[0], 1), round(p[1], 3), round(p[2], 3), p[3]] for p in v.points] for k, v in tl.items()}


def make_spool(root: Path, job_id: str, n_nodes: int) -> Path:
    """``root/jobs/<job_id>/node-nNNNN.json`` for ``n_nodes`` nodes; returns the job folder."""
    d = root / "jobs" / job_id
    d.mkdir(parents=True)
    base = json.loads(TEMPLATE.read_text())
    g0 = base["gpus"][0]
    tls = [json.dumps(_timelines(i)) for i in range(GPUS)]
    cpu_tl = json.dumps(_timelines(99)["util_pct"])
    for ni in range(n_nodes):
        node = f"n{ni:04d}"
        gpus = []
        for gi in range(GPUS):
            u = round((ni * 37 + gi * 11) % 1000 / 10.0, 1)
            g = dict(g0, node=node, index=gi, nvml_index=gi, uuid=f"GPU-{ni:08d}-0000-0000-0000-{gi:012d}",
                     pci_bus_id=f"0000:{16 * gi + 16:02x}:00.0", util_mean_pct=u, util_busy_s=round(u * 864, 1),
                     util_idle_frac=round(1 - u / 100, 3), covered_s=86400.0, energy_j=round(86400 * (120 + 5.5 * u), 1),
                     power_mean_w=round(120 + 5.5 * u, 1), mem_peak_pct=round(20 + u * 0.7, 1),
                     mem_peak_bytes=int(150754820096 * (20 + u * 0.7) / 100), timeline=f"@TL{gi}@")
            gpus.append(g)
        doc = dict(base, job_id=job_id, node=node, start_time=1.7e9, end_time=1.7e9 + 86400, elapsed_s=86400.0,
                   cpus_alloc=64, gres_gpus=list(range(GPUS)), cpu_time_s=86400.0 * 20, samples=17280,
                   gpus=gpus, cpu_timeline="@CPU@")
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True)   # as the epilog writes it
        for gi in range(GPUS):
            text = text.replace(f'"@TL{gi}@"', tls[gi], 1)
        text = text.replace('"@CPU@"', cpu_tl, 1)
        (d / f"node-{node}.json").write_text(text)
    return d


def before_tree(rev: str, root: Path) -> Path:
    """The package as of git revision ``rev``, laid out as installed (its
    pyproject's ``package-dir``: ``epilog/`` -> ``gsrun/epilog``...) under
    ``root``; returns the folder to put first on ``PYTHONPATH``."""
    import tomllib

    src, pkg = root / f"before-{rev}-src", root / f"before-{rev}"
    src.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(dirs.items()):       # "gsrun" first, then its subpackages
        shutil.copytree(src / folder, pkg / name.replace(".", "/"), dirs_exist_ok=True)
    shutil.rmtree(src)
    return pkg


def measure(argv: list[str], env: dict) -> dict:
    cp = subprocess.run([sys.executable, "-P", "-c", RUNNER, json.dumps(argv), json.dumps(env)],
                        capture_output=True, text=True, check=True)
    return json.loads(cp.stdout)


def _sha(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.exists() else None


def run_steps(tag: str, env: dict, n: int, spool: Path, jd: Path, py: str, bindir: Path, skip: set) -> dict:
    """The steps on one spool, each in a fresh process; keys prefixed with
    ``tag``. ``merge`` and ``ctld`` carry ``summary_sha256`` (first 16 hex
    digits) of the ``summary.json`` they wrote."""
    res: dict = {}
    if "merge" not in skip:
        r = res[tag + "merge"] = measure([py, "-P", "-c", MERGE, str(n), str(spool)], env)
        r["summary_mb"] = round((jd / "summary.json").stat().st_size / 2**20, 2)
        r["summary_sha256"] = _sha(jd / "summary.json")
    if "ctld" not in skip:
        cenv = dict(env, SLURM_JOB_ID="4242", SLURM_JOB_NODELIST=f"n[0000-{n - 1:04d}]",
                    SLURM_JOB_USER="root", SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_EXIT_CODE2="0:0")
        r = res[tag + "ctld"] = measure([str(bindir / "gsrun-node"), "epilog-ctld", "--spool-dir", str(spool),
                                         "--wait-s", "0"], cenv)
        r["written_mb"] = round(sum((jd / f).stat().st_size for f in ("summary.json", "user-summary.json")
                                    if (jd / f).exists()) / 2**20, 2)
        r["summary_sha256"] = _sha(jd / "summary.json")
    if "gseff" not in skip:
        res[tag + "gseff"] = measure([str(bindir / "gseff"), "4242", "--spool-dir", str(spool)], env)
        res[tag + "gseff_json"] = measure([str(bindir / "gseff"), "4242", "--json", "--spool-dir", str(spool)], env)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="100,1000", help="comma-separated node counts")
    ap.add_argument("--big", action="store_true", help="add 4,000 nodes")
    ap.add_argument("--keep", default=None, help="build the spools under this folder and keep them")
    ap.add_argument("--skip", default="", help="comma-separated steps not to run (merge, ctld, gseff)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each step this many times (before and after alternating); the fastest is reported")
    ap.add_argument("--before", default=None, metavar="REV",
                    help="also run each step with the package of this git revision (the previous implementation)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.nodes.split(",") if x] + ([4000] if a.big else [])
    skip = set(a.skip.split(","))
    bindir = Path(sys.executable).parent
    py = sys.executable
    root = Path(a.keep or tempfile.mkdtemp(prefix="bench-merge-"))
    env0 = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
            "GSRUN_LOG_FILE": str(root / "gsrun.log"), "LANG": "C.UTF-8"}
    before = before_tree(a.before, root) if a.before else None
    floor = min((measure([py, "-P", "-c", "pass"], env0) for _ in range(5)), key=lambda r: r["wall_s"])
    print(json.dumps({"baseline": "python3 -P -c pass", "wall_s": round(floor["wall_s"], 3),
                      "rss_mb": round(floor["rss_mb"], 1)}), flush=True)
    targets = {1000: (2.0, 300.0, 1.0), 4000: (8.0, 1024.0, None)}
    try:
        for n in sizes:
            t0 = time.perf_counter()
            spool = root / f"spool-{n}"
            jd = make_spool(spool, "4242", n)
            size_mb = sum(p.stat().st_size for p in jd.iterdir()) / 2**20
            out = {"nodes": n, "gpus": n * GPUS, "spool_mb": round(size_mb, 1),
                   "generate_s": round(time.perf_counter() - t0, 1)}
            env = dict(env0, GSRUN_SPOOL_DIR=str(spool))
            res = {}
            runs = [("before_", dict(env, PYTHONPATH=str(before), BENCH_GSRUN_ROOT=str(before)))] if before else []
            for _ in range(a.repeat):      # before and after alternate, so both see the same load
                for tag, renv in runs + [("", env)]:
                    for k, r in run_steps(tag, renv, n, spool, jd, py, bindir, skip).items():
                        walls = res[k]["walls_s"] if k in res else []
                        varies = k in res and any(res[k].get(h) != r.get(h)
                                                  for h in ("summary_sha256", "stdout_sha256"))
                        if k not in res or r["wall_s"] < res[k]["wall_s"]:
                            res[k] = r
                        res[k]["walls_s"] = walls + [round(r["wall_s"], 3)]
                        if varies:
                            res[k]["output_varies"] = True      # not the same bytes every run
            if before:      # the same bytes written (and printed by gseff --json) before and after
                out["same_output"] = {k: res[k].get(h) == res["before_" + k].get(h) for k, h in (
                    ("merge", "summary_sha256"), ("ctld", "summary_sha256"), ("gseff_json", "stdout_sha256"))
                    if k in res}
            for k, r in res.items():
                r["wall_s"] = round(r["wall_s"], 3)
                r["rss_mb"] = round(r["rss_mb"], 1)
                r["x_floor_wall"] = round(r["wall_s"] / floor["wall_s"], 1)
                if not r["stderr"].strip() and r["rc"] == 0:
                    del r["stderr"]
                if not k.endswith("gseff_json"):
                    del r["stdout_sha256"]
            out.update(res)
            if n in targets:
                wall_t, rss_t, gseff_t = targets[n]
                met = {f"merge <= {wall_t} s": res.get("ctld", res.get("merge", {})).get("wall_s", 1e9) <= wall_t,
                       f"merge <= {rss_t:.0f} MB": res.get("ctld", res.get("merge", {})).get("rss_mb", 1e9) <= rss_t}
                if gseff_t and "gseff" in res:
                    met[f"gseff <= {gseff_t} s"] = res["gseff"]["wall_s"] <= gseff_t
                out["targets_met"] = met
            print(json.dumps(out), flush=True)
            if not a.keep:
                shutil.rmtree(spool)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
