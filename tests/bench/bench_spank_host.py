#!/usr/bin/env python3
"""What the SPANK plugin costs per process, in the fake SPANK host of
``tests/process/test_spank_build.py`` (``tests/helpers/spank_harness.c``: a C
program that answers the spank_* calls and dlopen()s the real
``gsrun_spank.so`` RTLD_LOCAL like Slurm), for two builds side by side: the
plugin and hooks of a git revision (``--before``, default ``main``) and those
of this checkout. No cluster, no root.

Each build gets a production-like ``pythonpath=``: a folder holding the
build's ``gsrun`` package, then this venv's site-packages as symlinks without
an editable install's files (``tests/cluster/up`` installs gsrun non-editable;
``distutils-precedence.pth`` of setuptools stays). Remote contexts see the
recorded H200 VM (``tests/data/hosts/h200-vm``: sysfs ``numa_node`` -1, so the
plan asks NVML, here its recording) as host root, or ``--host-root NAME``
(``server-2s8g``: sysfs decides every GPU's node, NVML is not opened), and a site
config written here (``--config`` plugstack argument), with the config
cache in a temporary state dir.

Cases (processes of the harness, wall time, medians):

* ``floor``: the host in the ``slurmd`` context (loads the plugin, runs nothing);
* ``alloc``: ``sbatch --wrap true`` (allocator, no ``--gs-*``);
* ``alloc-gs``: ``sbatch --gs-mps=50 --gs-report=none``;
* ``local-gs``: ``srun --gs-report=none`` (the client side);
* ``remote-bind``: slurmstepd of a normal step, the site binds (2 tasks forked);
* ``remote-gs``: the same with ``--gs-report=none`` forwarded.

The order of (case, build) rotates every round. Prints JSON: medians per
case and build, ``after/before`` ratios, and the added time over ``floor``.

    python -P tests/bench/bench_spank_host.py --before main --rounds 21
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST_ROOT = REPO / "tests" / "data" / "hosts" / "h200-vm"
SITE_CONFIG = """\
[paths]
state_dir = "{state}"
spool_dir = "{state}/spool"
"""

CASES = {   # name: (context, FAKE_OPTS, FAKE_GETOPT)
    "floor": ("slurmd", "", ""),
    "alloc": ("allocator", "", ""),
    "alloc-gs": ("allocator", "gs-mps=50;gs-report=none", ""),
    "local-gs": ("local", "gs-report=none", ""),
    "remote-bind": ("remote", "", ""),
    "remote-gs": ("remote", "", "gs-report=none"),
}


def export_tree(rev: str, dest: Path) -> Path:
    """``rev``'s spank_py/ and gsrun/ (git archive) under ``dest``."""
    dest.mkdir(parents=True)
    arch = subprocess.run(["git", "-C", str(REPO), "archive", rev, "spank_py", "gsrun"],
                          check=True, capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True, timeout=120)
    return dest


def compile_bytecode(tree: Path) -> None:
    """pip compiles an installed package; the embedded interpreter never writes
    bytecode, so an uncompiled tree would be measured compiling its sources."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "gsrun"), str(tree / "spank_py")],
                   check=True, timeout=300)


def build_plugin(tree: Path, out: Path) -> Path:
    """Build ``tree``'s plugin with ``tree``'s spank_py/build.py."""
    spec = importlib.util.spec_from_file_location(f"_bench_build_{abs(hash(str(tree)))}",
                                                  tree / "spank_py" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(str(out), python=sys.executable)


def site_dirs(tree: Path, d: Path) -> list[str]:
    """``pythonpath=`` folders: ``tree``'s gsrun package, then this venv's
    site-packages without editable installs and without gsrun."""
    pkg = d / "pkg"
    (pkg / "gsrun").mkdir(parents=True)
    (pkg / "_sub").mkdir()
    os.symlink(tree / "spank_py", pkg / "_sub" / "spank_py")
    for entry in (tree / "gsrun").iterdir():
        os.symlink(entry, pkg / "gsrun" / entry.name)
    os.unlink(pkg / "gsrun" / "__init__.py")
    (pkg / "gsrun" / "__init__.py").write_text(
        (tree / "gsrun" / "__init__.py").read_text() + f"\n__path__.append({str(pkg / '_sub')!r})\n")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(pkg / "gsrun" / "__init__.py")], check=True,
                   timeout=120)
    purelib = Path(sysconfig.get_path("purelib"))
    farm = d / "site-packages"
    farm.mkdir()
    for entry in purelib.iterdir():
        if entry.name.startswith(("__editable__", "gsrun")):
            continue
        os.symlink(entry, farm / entry.name)
    return [str(pkg), str(farm)]


def compile_harness(d: Path) -> Path:
    exe = d / "spank_harness"
    subprocess.run(["cc", "-O1", "-Wall", "-rdynamic", str(REPO / "tests" / "helpers" / "spank_harness.c"),
                    "-o", str(exe), "-ldl"], check=True, timeout=120)
    return exe


def run_once(harness: Path, so: Path, paths: list[str], config: Path, case: str, check: bool = False,
             host_root: Path = HOST_ROOT) -> float:
    ctx, opts, getopt = CASES[case]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FAKE_OPTS": opts, "GSRUN_HOST_ROOT": str(host_root),
           "GSRUN_STATE_DIR": str(config.parent / "state")}
    if getopt:
        env["FAKE_GETOPT"] = getopt
    argv = [str(harness), str(so), ctx, *(f"pythonpath={p}" for p in paths), f"config={config}"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/")
    dt = time.perf_counter() - t0
    # the recorded host has 16 CPUs: binding to CPUs this machine lacks fails (EINVAL), and is reported
    errors = [ln for ln in p.stdout.splitlines() if ln.startswith("ERROR") and "sched_setaffinity" not in ln]
    if check and (p.returncode != 0 or "DONE" not in p.stdout or errors):
        raise SystemExit(f"{case} with {so}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="main", help="git revision to compare against (default main)")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--host-root", default=HOST_ROOT.name,
                    help="recorded host under tests/data/hosts for the remote cases (default h200-vm)")
    a = ap.parse_args()
    host_root = HOST_ROOT.parent / a.host_root
    if not (host_root / "sys").is_dir():
        raise SystemExit(f"--host-root {a.host_root}: no recorded tree at {host_root}")
    cases = a.cases.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="gsrun-bench-spank-"))
    try:
        harness = compile_harness(tmp)
        state = tmp / "state"
        (state / "spool").mkdir(parents=True)
        config = tmp / "gsrun.toml"
        config.write_text(SITE_CONFIG.format(state=state))
        builds = {}
        for name, tree in (("before", export_tree(a.before, tmp / "before-tree")), ("after", REPO)):
            compile_bytecode(tree)
            so = build_plugin(tree, tmp / f"{name}-so")
            builds[name] = (so, site_dirs(tree, tmp / f"{name}-site"))
        for case in cases:                               # check once, unmeasured (warms caches)
            for name, (so, paths) in builds.items():
                run_once(harness, so, paths, config, case, check=True, host_root=host_root)
        runs = [(c, b) for c in cases for b in builds]
        res: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
        for r in range(a.rounds):
            k = r % len(runs)
            for case, b in runs[k:] + runs[:k]:
                so, paths = builds[b]
                res[(case, b)].append(run_once(harness, so, paths, config, case, host_root=host_root))
        med = {r: statistics.median(v) * 1000 for r, v in res.items()}
        out = {"before": a.before, "rounds": a.rounds, "host_root": a.host_root, "load_avg": os.getloadavg()[0],
               "median_ms": {c: {b: round(med[(c, b)], 1) for b in builds} for c in cases},
               "after_over_before": {c: round(med[(c, "after")] / med[(c, "before")], 2) for c in cases}}
        if "floor" in cases:
            out["added_over_floor_ms"] = {c: {b: round(med[(c, b)] - med[("floor", b)], 1) for b in builds}
                                          for c in cases if c != "floor"}
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
