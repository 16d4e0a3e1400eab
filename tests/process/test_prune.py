"""``gsrun-node prune`` over a real spool, while an epilog
writes into it, and doctor's retention check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers.node_site import LAUNCH, kill_fakes, make_site, nvml_devices, run_node

pytestmark = pytest.mark.process

DAY = 86400


def age(path, days: float) -> None:
    """Set ``path`` and its direct entries ``days`` back (links themselves, not their targets)."""
    t = time.time() - days * DAY
    for p in ([*path.iterdir()] if path.is_dir() and not path.is_symlink() else []):
        os.utime(p, (t, t), follow_symlinks=False)
    os.utime(path, (t, t), follow_symlinks=False)


def job_dir(site, name: str, days: float, stored: bool | None = True):
    d = site.spool / "jobs" / name
    d.mkdir(parents=True, mode=0o755)
    (d / "summary.json").write_text('{"kind": "job"}')
    if stored is not None:
        (d / "accounting.json").write_text(json.dumps({"admin_comment": "stored" if stored else "failed"}))
    age(d, days)
    return d


@pytest.fixture
def site():
    s = make_site(nvml=nvml_devices(4))
    (s.spool / "jobs").mkdir(parents=True, mode=0o711)
    yield s
    kill_fakes(s)
    shutil.rmtree(s.base, ignore_errors=True)


def prune(site, *args) -> dict:
    cp = run_node(["prune", "--json", *args], site.env())
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_prune_dry_run_then_for_real_then_force(site):
    for i in range(5):
        job_dir(site, str(100 + i), 40)
    job_dir(site, "200", 40, stored=False)
    job_dir(site, "201", 40, stored=None)
    job_dir(site, "300", 5)
    job_dir(site, "evil", 40)
    outside = site.base / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    (site.spool / "jobs" / "400").symlink_to(outside)
    age(site.spool / "jobs" / "400", 40)
    names = lambda: sorted(p.name for p in (site.spool / "jobs").iterdir())  # noqa: E731

    before = names()
    out = prune(site, "--older-than", "30", "--dry-run")
    assert names() == before
    assert sorted(r["job"] for r in out["jobs"] if r.get("result") == "dry run") == [str(100 + i) for i in range(5)]

    out = prune(site, "--older-than", "30")
    assert names() == ["200", "201", "300", "400", "evil"]
    assert (outside / "keep.txt").exists()      # a link is never followed
    out = prune(site, "--older-than", "30", "--force")
    assert names() == ["300", "400", "evil"]
    # default age from spool.retention_days (180): nothing else is that old
    assert all(r["action"] == "keep" for r in prune(site)["jobs"])


def test_prune_refuses_a_planted_jobs_dir(site):
    shutil.rmtree(site.spool / "jobs")
    (site.spool / "jobs").symlink_to(site.base)
    cp = run_node(["prune", "--older-than", "1"], site.env())
    assert cp.returncode == 2 and "gsrun: prune: refusing the jobs directory" in cp.stderr
    assert site.host.exists()


def test_prune_while_an_epilog_writes(site):
    """Epilog of job 4242 (whose old directory is eligible) runs while prune
    runs again and again: whatever the interleaving, the epilog's node summary
    survives, the other old directories go, nothing is left aside."""
    for i in range(30):
        job_dir(site, str(500 + i), 40)
    job_dir(site, "4242", 40)
    env = site.env(gpus="0")
    epi = subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "epilog"], env=env, cwd="/",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = 0
    while epi.poll() is None or runs < 2:
        prune(site, "--older-than", "30")
        runs += 1
    assert epi.returncode == 0, epi.stderr.read()
    left = sorted(p.name for p in (site.spool / "jobs").iterdir())
    assert left == ["4242"], left
    assert (site.spool / "jobs" / "4242" / "node-gpu-node01.json").exists()
    # a fresh write keeps the directory out of reach even of --older-than 0 --force
    prune(site, "--older-than", "0", "--force")
    assert (site.spool / "jobs" / "4242" / "node-gpu-node01.json").exists()


def test_doctor_warns_about_old_job_dirs(site):
    env = site.env()
    run = lambda: json.loads(run_node(["doctor", "--json", "--check", "retention"], env).stdout)  # noqa: E731
    r = run()
    checks = {c["name"]: c for c in r["checks"]} if isinstance(r, dict) else {c["name"]: c for c in r}
    assert checks["retention"]["status"] == "ok", checks
    job_dir(site, "77", 400)
    r = run()
    checks = {c["name"]: c for c in r["checks"]} if isinstance(r, dict) else {c["name"]: c for c in r}
    assert checks["retention"]["status"] == "warn" and "oldest 400 days" in checks["retention"]["detail"]
