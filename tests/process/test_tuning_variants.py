"""Variants 5 and 6 of the recorded hosts, through the real ``gsrun-node prolog`` /
``epilog`` (child processes, fake host root):

- variant 5: a CPU whose ``scaling_governor`` cannot be read (EINVAL on
  some intel_pstate boxes; here the file is a directory, which the reader
  cannot read either). Before: its prior was journaled as "", it was
  switched to performance, the verify failed, everything was rolled back
  and that CPU was left in performance. After: it is skipped and reported,
  the other CPUs and settings proceed, and after the epilog every file of
  the host is byte-identical to before;
- variant 6: THP only at RHEL 6's ``redhat_transparent_hugepage``. Before:
  "not supported here". After: tuned and restored there; doctor reads it.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers.node_site import TUNE, host_only, kill_fakes, make_site, nvml_devices, run_node, snapshot
from helpers.tuning_tree import diff

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
RECORD = "JobId=4242 JobName=train UserId=nobody(65534) OverSubscribe=NO Comment=(null)"
GOV = "sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor"


@pytest.fixture
def site():
    s = make_site(nvml=nvml_devices(1))
    yield s
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def _prolog_epilog(site, tune=TUNE):
    env = site.env(spank={"SPANK_GS_TUNE": tune, "SPANK_GS_EXCLUSIVE": "1"}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    mid = host_only(snapshot(site.host))
    ep = run_node(["epilog"], dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmd"))
    assert ep.returncode == 0, ep.stderr
    return cp, rec["steps"]["tuning"], mid


@root_only
def test_unreadable_governor_skipped_rest_proceeds_restored_byte_identical(site):
    bad = site.host / GOV.format(2)
    bad.unlink()
    bad.mkdir()                               # reading it fails like EINVAL does
    before = host_only(snapshot(site.host))
    cp, tuning, mid = _prolog_epilog(site)
    # the request proceeds: governor applied on the readable CPUs, the rest applied too
    assert tuning["failed"] == [] and tuning["rolled_back"] == []
    assert set(tuning["applied"]) >= {"governor", "swappiness", "thp", "dirty_ratio"}
    item = next(i for i in tuning["items"] if i["key"] == "governor")
    assert "skipped cpu2" in item["reason"] and "never written" in item["reason"]
    assert "cpu2" not in item["prior"] and item["prior"]["cpu0"] == "powersave"
    assert "tune: job 4242: governor: skipped cpu2: value unreadable" in cp.stderr
    # during the job: readable CPUs performance, cpu2 untouched
    assert mid[GOV.format(0)] == b"performance\n" and mid[GOV.format(3)] == b"performance\n"
    assert bad.is_dir() and not any(bad.iterdir())
    # after the epilog: every setting byte-identical to before
    assert diff(before, host_only(snapshot(site.host))) == []


@root_only
def test_thp_at_rhel6_path_tuned_and_restored(site):
    mm = site.host / "sys/kernel/mm"
    (mm / "transparent_hugepage").rename(mm / "redhat_transparent_hugepage")
    (mm / "redhat_transparent_hugepage/enabled").write_text("[always] madvise never\n")
    before = host_only(snapshot(site.host))
    cp, tuning, mid = _prolog_epilog(site, "thp=never,thp_defrag=never")
    assert tuning["applied"] == ["thp", "thp_defrag"] and tuning["unsupported"] == []
    assert mid["sys/kernel/mm/redhat_transparent_hugepage/enabled"] == b"always madvise [never]\n"
    assert b"[never]" in mid["sys/kernel/mm/redhat_transparent_hugepage/defrag"]
    assert diff(before, host_only(snapshot(site.host))) == []


@root_only
def test_thp_rhel6_path_in_doctor(site):
    mm = site.host / "sys/kernel/mm"
    (mm / "transparent_hugepage").rename(mm / "redhat_transparent_hugepage")
    cp = run_node(["doctor", "--json", "--host-root", str(site.host)], site.env())
    checks = {c["name"]: c for c in json.loads(cp.stdout)["checks"]}
    assert checks["thp"]["status"] == "ok", checks["thp"]
    assert "redhat_transparent_hugepage" in checks["thp"]["detail"]
    assert checks["thp"]["data"]["enabled"] == "madvise"
