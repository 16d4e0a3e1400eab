"""Removing the SPANK plugin leaves gsrun working through gsrun-bind.

Restarts the cluster without the plugin, runs a job, then brings the cluster
back as tests/run left it (plugin + accounting), whatever the outcome: the
tests around it see the same cluster in any order.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _up(*flags) -> None:
    env = dict(os.environ)
    cp = subprocess.run([str(REPO / "tests" / "cluster" / "up"), "--no-install", *flags], env=env,
                        capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr[-2000:]


def test_gsrun_works_without_the_plugin(cluster):
    _up("--no-spank", "--accounting")
    try:
        assert (cluster.dir / "etc" / "plugstack.conf").read_text().strip() == ""
        cp = cluster.as_user(["sbatch", "--gs-mps=50", "--wrap", "true"])
        assert cp.returncode != 0 and "gs-mps" in cp.stderr      # the option is gone with the plugin
        (cluster.work / "aff.sh").write_text("#!/bin/bash\necho \"aff $SLURMD_NODENAME $LOCAL_RANK "
                                             "$(grep Cpus_allowed_list /proc/self/status | cut -f2)\"\n")
        (cluster.work / "aff.sh").chmod(0o755)
        cp = cluster.as_user(["gsrun", "--gpus", "4", "--gpus-per-node", "2", "--wait",
                              "--output", "nospank-%j.out", str(cluster.work / "aff.sh")])
        assert cp.returncode == 0, cp.stdout + cp.stderr
        cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
        rows = sorted(ln.split()[1:] for ln in cp.stdout.splitlines() if ln.startswith("aff "))
        assert [(n, r) for n, r, _ in rows] == [("gpu01", "0"), ("gpu01", "1"), ("gpu02", "0"), ("gpu02", "1")]
        assert all(cpus == r for _n, r, cpus in rows)   # 2 ranks per node on 2 CPUs: one each
    finally:
        _up("--accounting")
