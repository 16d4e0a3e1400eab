"""gsrun at first contact, on the real local cluster: a user's own venv with
torch (gsrun installed elsewhere), ``--launcher torchrun``, site sbatch
options and a hostile job name as Slurm records them, ``--wait`` while
pending, quiet output, and gseff with only ``SLURM_CONF`` set."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers.cluster import USER, VENV

REPO = Path(__file__).resolve().parents[2]


def _copy_train(cluster) -> str:
    dst = cluster.work / "train.py"
    shutil.copy(REPO / "examples" / "train.py", dst)
    shutil.chown(dst, USER)
    return "train.py"


@pytest.fixture(scope="module")
def user_venv(cluster) -> Path:
    """The test user's own venv (python3 -m venv) with the CPU torch from the
    wheelhouse tests/cluster/up keeps; gsrun is not installed in it. Where the
    system Python has torch (a release root: Debian's python3-torch, no wheel for
    its Python on PyPI) the venv sees it instead (``--system-site-packages``), as
    at a site whose torch comes with the OS."""
    venv = cluster.work / "user-venv"
    wheels = cluster.dir / "wheels"
    system_torch = not list(wheels.glob("torch-*.whl")) and \
        cluster.as_user(["/usr/bin/python3", "-c", "import torch"]).returncode == 0
    if not (venv / "bin" / "python3").exists():
        cluster.as_user(["/usr/bin/python3", "-m", "venv", *(["--system-site-packages"] if system_torch else []),
                         str(venv)], check=True)
    if cluster.as_user([str(venv / "bin" / "python3"), "-c", "import torch"]).returncode != 0:
        if not list(wheels.glob("torch-*.whl")):
            pytest.skip(f"no torch wheel in {wheels} (tests/cluster/up keeps one) and none in the system Python")
        cluster.as_user([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(wheels),
                         "torch"], timeout=900, check=True)
    assert cluster.as_user([str(venv / "bin" / "python3"), "-c", "import gsrun"]).returncode != 0
    return venv


def _activated(venv: Path) -> dict:
    """What `source venv/bin/activate` sets, with gsrun from its own venv after it on PATH."""
    return {"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:{VENV}/bin:/usr/bin:/bin"}


STORE_PROBE = ("import datetime, torch.distributed as d; "
               "d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, "
               "timeout=datetime.timedelta(seconds=5))")


def _torchrun_env(cluster, venv: Path) -> dict:
    """What torchrun's c10d rendezvous needs from the environment with this venv's torch:
    ``{}`` for a torch with libuv (PyPI's); ``{"USE_LIBUV": "0"}`` for one built without it
    whose store honours that variable; the test skips when the store cannot be made at all
    (Debian's python3-torch on 13 and sid: no libuv, and torchrun's c10d backend asks for it)."""
    env = _activated(venv)
    py = str(venv / "bin" / "python3")
    if cluster.as_user([py, "-c", STORE_PROBE], timeout=60, **env).returncode == 0:
        return {}
    if cluster.as_user([py, "-c", STORE_PROBE], timeout=60, USE_LIBUV="0", **env).returncode == 0:
        return {"USE_LIBUV": "0"}
    pytest.skip("this torch cannot make torchrun's c10d store: built without libuv (Debian's "
                "python3-torch on 13 and sid), with or without USE_LIBUV=0")


def _ranks(stdout: str) -> list[list[str]]:
    return [ln.split() for ln in stdout.splitlines() if ln.startswith("rank ")]


def _check_eight_bound_ranks(stdout: str, prefix: str) -> None:
    ranks = _ranks(stdout)
    assert len(ranks) == 8, stdout
    seen = set()
    for f in ranks:
        node, local = f[3], f[5]
        cpus = f[f.index("cpus") + 1]
        seen.add((node, local))
        # as planned: 2 real CPUs, 4 workers per node share them round-robin
        assert cpus in ("0", "1") and int(local) % 2 == int(cpus), " ".join(f)
        assert f[f.index("python") + 1] == prefix, " ".join(f)
    assert seen == {(n, str(i)) for n in ("gpu01", "gpu02") for i in range(4)}


def test_own_venv_eight_ranks(cluster, user_venv):
    script = _copy_train(cluster)
    env = _activated(user_venv)
    dry = cluster.as_user(["gsrun", "--gpus", "8", "--dry-run", script], check=True, **env).stdout
    assert f"# python: {user_venv}/bin/python3: the active virtualenv ($VIRTUAL_ENV)" in dry
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--wait", "--output", "venv-%j.out", script, "--seconds", "2"],
                         **env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
    _check_eight_bound_ranks(cp.stdout, str(user_venv))
    assert "trained" in cp.stdout
    assert "cannot import torch" not in cp.stderr


def test_own_venv_torchrun_two_nodes_four_workers(cluster, user_venv):
    script = _copy_train(cluster)
    store_env = _torchrun_env(cluster, user_venv)
    env = {**_activated(user_venv), **store_env}
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--launcher", "torchrun", "--wait", "--output", "trun-%j.out",
                          script, "--seconds", "2"], **env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    _check_eight_bound_ranks(cp.stdout, str(user_venv))
    ranks = _ranks(cp.stdout)
    assert sorted(int(f[1].split("/")[0]) for f in ranks) == list(range(8))   # torchrun's global ranks
    assert all(f[1].endswith("/8") for f in ranks)
    assert "trained" in cp.stdout
    rec = cluster.as_root(["scontrol", "-o", "show", "job", job]).stdout
    assert "NumTasks=2 " in rec or "NumTasks=2\n" in rec, rec


def test_demo_output_quiet_no_repeated_lines(cluster):
    """No srun cpu-binding note, each binding warning once per node."""
    script = _copy_train(cluster)
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--wait", "--output", "quiet-%j.out", script, "--seconds", "1"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
    out = cp.stdout + cp.stderr
    assert "lacks support for cpu binding" not in out
    warn = [ln for ln in out.splitlines() if "warning" in ln]
    assert len(warn) == len(set(warn)), warn
    assert all(re.search(r"warning: gpu0[12]: ", ln) for ln in warn if ln.startswith("gsrun: bind:")), warn


def test_site_options_and_hostile_job_name_reach_slurm(cluster):
    script = _copy_train(cluster)
    name = "bert base 'q' \"d\" $(touch /tmp/pwned-name) `id` #1; a&b"
    Path("/tmp/pwned-name").unlink(missing_ok=True)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "-J", name, "--mem", "100M", "--signal", "B:USR1@60",
                          "--sbatch=--nice=5", "--wait", "--output", "site-%j.out", script, "--seconds", "0.5"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    rec = cluster.as_root(["scontrol", "-o", "show", "job", job]).stdout
    m = re.search(r"JobName=(.*) UserId=", rec)
    assert m and m.group(1) == name, rec
    assert "Nice=5" in rec and re.search(r"MinMemoryNode=100M", rec), rec
    assert not Path("/tmp/pwned-name").exists()


def test_refusals_on_the_cluster(cluster):
    cp = cluster.as_user(["gsrun", "--gpus", "8", "no-such-script.py"])
    assert cp.returncode == 2 and "gsrun: submit: no such script" in cp.stderr and "hint:" in cp.stderr
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--", "torchrun", "train.py"])
    assert cp.returncode == 2 and "--launcher torchrun" in cp.stderr
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--sbatch=--job-name=x", "train.py"])
    assert cp.returncode == 2 and "gsrun renders --job-name" in cp.stderr
    cp = cluster.as_user(["gsrun", "--gpus", "8", "--sbatch=--x\n#SBATCH --uid=0", "train.py"])
    assert cp.returncode == 2 and "bad --sbatch" in cp.stderr and "hint:" in cp.stderr


def test_gpus_six_spread_over_two_nodes(cluster):
    script = _copy_train(cluster)
    cp = cluster.as_user(["gsrun", "--gpus", "6", "--wait", "--output", "six-%j.out", script, "--seconds", "1"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
    assert "2 nodes x 3 GPUs" in cp.stderr
    assert len(_ranks(cp.stdout)) == 6


def test_wait_says_why_pending(cluster):
    """A job that holds both nodes first: gsrun --wait prints a pending line with Slurm's reason."""
    blocker = cluster.as_user(["sbatch", "--parsable", "-N2", "--exclusive", "-o", "/dev/null",
                               "--wrap", "sleep 15"], check=True).stdout.strip().split(";")[0]
    try:
        for _ in range(60):
            if cluster.job_state(blocker) == "RUNNING":
                break
            time.sleep(0.5)
        script = _copy_train(cluster)
        cp = cluster.as_user(["gsrun", "--gpus", "8", "--wait", "--output", "pend-%j.out", script,
                              "--seconds", "0.5"])
        assert cp.returncode == 0, cp.stdout + cp.stderr
        pend = [ln for ln in cp.stderr.splitlines() if ": pending" in ln]
        assert any(re.search(r"pending \((Resources|Priority|ReqNodeNotAvail[^)]*)\), waited \d+ s", ln)
                   for ln in pend), cp.stderr
        assert len(pend) <= 3, pend   # one line per reason change, not one per poll
        cluster.assert_job_end(cluster.job_id_from(cp.stderr), "COMPLETED", "0:0")
        # the job could start only once the blocker had left both nodes: its sleep ran out
        cluster.assert_job_end(blocker, "COMPLETED", "0:0")
    finally:
        cluster.as_root(["scancel", blocker], check=False)


def test_gseff_with_only_slurm_conf(cluster):
    """gsrun.toml beside slurm.conf: gseff finds the spool as root and as the job's user, no GSRUN_CONFIG."""
    script = _copy_train(cluster)
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--output", "eff-%j.out", script, "--seconds", "0.5"])
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    assert cluster.wait_file(cluster.spool / "jobs" / job / "user-summary.json", 60)
    env = ["env", "-i", f"PATH={VENV}/bin:/usr/bin:/bin", f"SLURM_CONF={cluster.conf}", "LANG=C.UTF-8"]
    cp = subprocess.run([*env, "gseff", job], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and f"job {job}" in cp.stdout, cp.stderr
    cp = subprocess.run(["runuser", "-u", USER, "--", *env, f"HOME={cluster.work}", "gseff", job],
                        capture_output=True, text=True, timeout=120, cwd=cluster.work)
    assert cp.returncode == 0 and f"job {job}" in cp.stdout, cp.stderr


WORLD = ("import os; e = os.environ; print('world', *(e.get(k) for k in ('RANK', 'SLURM_PROCID', 'LOCAL_RANK', "
         "'SLURM_LOCALID', 'WORLD_SIZE', 'SLURM_NTASKS', 'SLURM_NPROCS', 'SLURM_STEP_NUM_TASKS')))")


def test_torchrun_workers_see_one_world(cluster, user_venv):
    """Each torchrun worker's Slurm task variables agree with torchrun's RANK/LOCAL_RANK/WORLD_SIZE."""
    store_env = _torchrun_env(cluster, user_venv)
    cluster.as_user(["sh", "-c", "cat > world.py"], check=True, input_text=WORLD + "\n")
    cp = cluster.as_user(["gsrun", "--gpus", "4", "--gpus-per-node", "2", "--launcher", "torchrun", "--wait",
                          "--output", "world-%j.out", "world.py"], **_activated(user_venv), **store_env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    cluster.assert_job_end(job, "COMPLETED", "0:0")
    rows = sorted(ln.split()[1:] for ln in cp.stdout.splitlines() if ln.startswith("world "))
    assert len(rows) == 4, cp.stdout
    for rank, procid, local, localid, world, ntasks, nprocs, step_tasks in rows:
        assert procid == rank and localid == local and world == ntasks == nprocs == step_tasks == "4", rows
    assert sorted(r[0] for r in rows) == ["0", "1", "2", "3"]
