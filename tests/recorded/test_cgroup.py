"""gsrun.facts.cgroup against fake trees in tests/data/cgroup/ (field case 22 in
docs/field-cases.md) and the real H200 VM recording."""

import shutil
from pathlib import Path

import pytest

from gsrun.facts.cgroup import (
    CgroupMounts, find_job_cgroup, parse_mountinfo, read_cpuset, read_mounts, read_pids, read_usage,
)
from gsrun.base.errors import InputError
from gsrun.facts.hostfs import HostFS
from gsrun.facts.sacct import cpu_efficiency

DATA = Path(__file__).resolve().parent.parent / "data" / "cgroup"
GiB = 1024 ** 3


def fs(name):
    return HostFS(DATA / name)


# ----------------------------------------------------------------- detection

def test_mountinfo_v2_real_h200_recording():
    m = read_mounts(fs("h200-vm"))
    assert m.version == 2 and m.v2 == ("/sys/fs/cgroup", "/") and m.v1 == {}
    # no Slurm job on that VM
    assert find_job_cgroup(fs("h200-vm"), "4242", 1000) is None


def test_mountinfo_v1_separate_vs_combined():
    sep = read_mounts(fs("v1-separate"))
    assert sep.version == 1
    assert sep.v1["cpu"][0] == "/sys/fs/cgroup/cpu"
    assert sep.v1["cpuacct"][0] == "/sys/fs/cgroup/cpuacct"
    assert sep.v2 == ("/sys/fs/cgroup/unified", "/")          # hybrid: unified has no controllers
    assert "systemd" not in sep.v1 and "name=systemd" not in sep.v1
    comb = read_mounts(fs("v1-combined"))
    assert comb.v1["cpu"][0] == comb.v1["cpuacct"][0] == "/sys/fs/cgroup/cpu,cpuacct"


def test_mountinfo_edge_cases():
    assert parse_mountinfo("") == CgroupMounts(None)
    assert parse_mountinfo(None).version is None
    m = parse_mountinfo("40 1 0:5 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\ngarbage line\n")
    assert m.version == 2 and m.v2 == ("/mnt/my cg", "/")


# ----------------------------------------------------------------- field case 22

@pytest.mark.parametrize("layout", ["v2", "v1-separate", "v1-combined", "v2-multi-slurmd"])
def test_case22_cpu_time_and_efficiency(layout):
    h = fs(layout)
    jcg = find_job_cgroup(h, "4242", 1000)
    assert jcg is not None and jcg.job_id == "4242"
    u = read_usage(h, jcg)
    assert u.cpu_time_s == 7200.0
    pct, label, anomaly = cpu_efficiency(u.cpu_time_s, 4, 3600)
    assert (pct, label, anomaly) == (50.0, None, False)
    assert u.mem_current_bytes == 3 * GiB


def test_case22_v2_paths_and_missing_peak():
    h = fs("v2")
    jcg = find_job_cgroup(h, "4242", 1000)
    assert jcg.version == 2
    assert jcg.cpu_dir == "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242"
    u = read_usage(h, jcg)
    assert u.source == "cgroup2:/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242"
    assert u.mem_peak_bytes is None
    assert any("sample memory.current" in n for n in u.notes)


def test_case22_v2_bounded_search_multi_slurmd_with_peak():
    h = fs("v2-multi-slurmd")
    jcg = find_job_cgroup(h, "4242", None)
    assert jcg.cpu_dir == "sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_4242"
    u = read_usage(h, jcg)
    assert u.mem_peak_bytes == 6 * GiB and u.notes == []
    assert read_cpuset(h, jcg) == [4, 5, 6, 7]
    assert read_pids(h, jcg) == [3001]
    assert find_job_cgroup(h, "4242", None).pids_dir == jcg.pids_dir
    # depth bound: nothing found when the search may only look at the mount itself
    from gsrun.facts import cgroup as cg
    assert cg._search(h, "sys/fs/cgroup", "job_4242", max_depth=2) is None
    assert cg._search(h, "sys/fs/cgroup", "job_4242", max_dirs=1) is None


def test_case22_v1_separate_reads_cpuacct_mount_not_cpu():
    h = fs("v1-separate")
    jcg = find_job_cgroup(h, "4242", 1000)
    assert jcg.version == 1 and jcg.uid == 1000
    assert jcg.cpu_dir == "sys/fs/cgroup/cpuacct/slurm/uid_1000/job_4242"
    assert jcg.memory_dir == "sys/fs/cgroup/memory/slurm/uid_1000/job_4242"
    u = read_usage(h, jcg)
    assert u.source == "cgroup1:/sys/fs/cgroup/cpuacct/slurm/uid_1000/job_4242"
    assert u.mem_peak_bytes == 6 * GiB
    assert read_cpuset(h, jcg) == [0, 1, 2, 3]


def test_case22_v1_uid_unknown_is_found_and_reported():
    jcg = find_job_cgroup(fs("v1-separate"), "4242", None)
    assert jcg.uid == 1000 and jcg.cpu_dir.endswith("uid_1000/job_4242")
    assert find_job_cgroup(fs("v1-separate"), "4242", 1001) is None
    assert find_job_cgroup(fs("v1-separate"), "9999", None) is None


def test_v1_combined_no_peak_file_and_pids_from_cpuacct():
    h = fs("v1-combined")
    jcg = find_job_cgroup(h, "4242", 1000)
    assert jcg.cpu_dir == "sys/fs/cgroup/cpu,cpuacct/slurm/uid_1000/job_4242"
    assert jcg.cpuset_dir is None and read_cpuset(h, jcg) is None
    u = read_usage(h, jcg)
    assert u.mem_peak_bytes is None and any("memory.usage_in_bytes" in n for n in u.notes)
    assert read_pids(h, jcg) == [4096]


# ----------------------------------------------------------------- pids, cpuset, devices

def test_v2_namespace_rooted_at_job_dir(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(DATA / "v2/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242",
                    root / "sys/fs/cgroup")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "32 23 0:28 /system.slice/slurmstepd.scope/job_4242 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    h = HostFS(root)
    jcg = find_job_cgroup(h, "4242", None)
    assert jcg.cpu_dir == "sys/fs/cgroup" and read_usage(h, jcg).cpu_time_s == 7200.0
    assert find_job_cgroup(h, "4243", None) is None


def test_pids_recursive_and_bounded():
    h = fs("v2")
    jcg = find_job_cgroup(h, "4242", 1000)
    assert read_pids(h, jcg) == [900, 1001, 2001, 2002]          # not 555 (outside), not job_4243
    assert len(read_pids(h, jcg, max_pids=2)) == 2
    assert read_pids(h, jcg, max_dirs=1) == []                   # job dir itself is empty
    v1 = fs("v1-separate")
    assert read_pids(v1, find_job_cgroup(v1, "4242", 1000)) == [1001, 2001, 2002]


def test_cpuset_v2():
    h = fs("v2")
    assert read_cpuset(h, find_job_cgroup(h, "4242", 1000)) == [0, 1, 2, 3]


# ----------------------------------------------------------------- input checks

@pytest.mark.parametrize("bad", ["15053872_1491", "../../etc", "4242/..", "", "12a", "４２"])
def test_bad_job_id_refused(bad):
    with pytest.raises(InputError) as ei:
        find_job_cgroup(fs("v2"), bad, 1000)
    assert "bad job id" in str(ei.value)


def test_bad_uid_refused():
    with pytest.raises(InputError):
        find_job_cgroup(fs("v1-separate"), "4242", -1)


def test_missing_files_give_none_not_errors(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(DATA / "v2", root)
    jdir = root / "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242"
    (jdir / "cpu.stat").unlink()
    (jdir / "memory.current").unlink()
    h = HostFS(root)
    u = read_usage(h, find_job_cgroup(h, "4242", 1000))
    assert u.cpu_time_s is None and u.mem_current_bytes is None
    assert any("usage_usec" in n for n in u.notes)


