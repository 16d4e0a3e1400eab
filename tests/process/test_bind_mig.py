"""MIG layouts: the MIG devices the prolog created reach the job's tasks."""

import json
import os

from gsrun.bind.plan import mig_visible_devices, read_job_mig_devices

A, B, C = ("MIG-11111111-2222-3333-4444-555555555555", "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
           "MIG-GPU-11111111-2222-3333-4444-555555555555/1/0")


def test_entry_local_rank_is_the_ranks_own_device():
    for r in range(3):
        vis = mig_visible_devices([A, B, C], r).split(",")
        assert vis[r] == [A, B, C][r] and sorted(vis) == sorted([A, B, C])
    assert mig_visible_devices([A, B], 5).split(",")[1] == B          # more ranks than devices: r % n
    assert mig_visible_devices([A, B, C], 1, gpu_isolation=True) == B


def test_hostile_or_empty_device_lists_give_nothing():
    assert mig_visible_devices([], 0) is None
    assert mig_visible_devices(["0", "GPU-x", "MIG-$(id)", "MIG-a,b"], 0) is None


def test_reads_the_users_copy_and_refuses_symlinks(tmp_path):
    d = tmp_path / "jobs" / "42"
    d.mkdir(parents=True)
    (d / "user-mig-gpu01.json").write_text(json.dumps({"devices": [A, B], "layout": "3g.71gb+3g.71gb"}))
    assert read_job_mig_devices(str(tmp_path), "42", "gpu01") == [A, B]
    assert read_job_mig_devices(str(tmp_path), "42", "gpu02") is None
    assert read_job_mig_devices(str(tmp_path), "42/../x", "gpu01") is None
    os.symlink(d / "user-mig-gpu01.json", d / "user-mig-gpu03.json")
    assert read_job_mig_devices(str(tmp_path), "42", "gpu03") is None


def test_gsrun_bind_exports_the_jobs_mig_devices(tmp_path):
    """Exec path: a task of job 42 on gpu01 whose prolog cut its GPU into two MIG devices."""
    import sys

    from helpers.bind_run import CHILD, clean_env, run_bind

    spool = tmp_path / "spool"
    d = spool / "jobs" / "42"
    d.mkdir(parents=True)
    (d / "user-mig-gpu01.json").write_text(json.dumps({"devices": [A, B]}))
    conf = tmp_path / "gsrun.toml"
    conf.write_text(f'[paths]\nspool_dir = "{spool}"\n')
    env = clean_env(SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="0", SLURM_LOCALID="1", SLURM_TASKS_PER_NODE="2",
                    SLURM_NODEID="0", SLURM_JOB_ID="42", SLURMD_NODENAME="gpu01", GSRUN_CONFIG=str(conf))
    r = run_bind(["--", sys.executable, "-c", CHILD], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["env"]["CUDA_VISIBLE_DEVICES"] == f"{A},{B}"   # entry 1 = rank 1's own
    env["SLURMD_NODENAME"] = "gpu02"                                             # no MIG layout there
    r = run_bind(["--", sys.executable, "-c", CHILD], env)
    assert json.loads(r.stdout)["env"]["CUDA_VISIBLE_DEVICES"] == "0"

