"""The SPANK plugin on a real Slurm (the local cluster from tests/cluster/up).

Needs ``GSRUN_TEST_CLUSTER`` set, ``SLURM_CONF`` pointing at the cluster,
the plugin in its plugstack.conf, partition ``gpu`` (gpu01, gpu02) and the
lead's prolog, which records the ``SPANK_GS_*`` variables it saw under key
``"spank"`` of ``<spool>/jobs/<jobid>/prolog-<node>.json``. The spool is
``$GSRUN_TEST_SPOOL``, else the config's ``paths.spool_dir``.

Jobs are submitted as the test user ``gsrun-test`` when run as root and that
user exists, else as the caller.
"""

import json
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(not os.environ.get("GSRUN_TEST_CLUSTER"), reason="GSRUN_TEST_CLUSTER not set"),
]

TEST_USER = "gsrun-test"
PARTITION = "gpu"


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        return []
    return ["runuser", "-u", TEST_USER, "--"]


def slurm(argv, env_extra=None, timeout_s=120):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(_as_user() + argv, capture_output=True, text=True, env=env,
                          timeout=timeout_s, cwd="/tmp")


def spool_dir() -> Path:
    if os.environ.get("GSRUN_TEST_SPOOL"):
        return Path(os.environ["GSRUN_TEST_SPOOL"])
    from gsrun.request.config import load_config
    return Path(load_config()["paths.spool_dir"])


def prolog_records(job_id: str, timeout_s: float = 60) -> list[dict]:
    d = spool_dir() / "jobs" / job_id
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = sorted(d.glob("prolog-*.json")) if d.is_dir() else []
        if files:
            return [json.loads(f.read_text()) for f in files]
        time.sleep(0.5)
    pytest.fail(f"no prolog record under {d} after {timeout_s} s")


@pytest.fixture(scope="module", autouse=True)
def cluster_ready():
    if not shutil.which("sbatch") or not os.environ.get("SLURM_CONF"):
        pytest.skip("sbatch / SLURM_CONF missing")
    p = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=60)
    if "--gs-mps" not in p.stdout:
        pytest.fail("the gsrun SPANK plugin is not in plugstack.conf (sbatch --help lists no --gs-mps)")


def test_valid_options_are_accepted_and_reach_the_prolog(cluster):
    p = slurm(["sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null",
               "--gs-mps=50", "--gs-tune=swappiness=10", "--wrap", "true"])
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    assert job_id.isdigit(), p.stdout
    cluster.assert_job_end(job_id, "COMPLETED", "0:0", timeout_s=90)
    recs = prolog_records(job_id)
    for rec in recs:
        spank = rec["spank"]
        assert spank["SPANK_GS_MPS"] == "50", rec
        assert spank["SPANK_GS_TUNE"] == "swappiness=10", rec


def test_sbatch_script_lines_work(cluster):
    script = Path("/tmp") / f"gsrun-spank-test-{os.getpid()}.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gs-report=none\n#SBATCH --gs-bind=isolate\n#SBATCH -o /dev/null\ntrue\n")
    script.chmod(0o755)
    try:
        p = slurm(["sbatch", "--parsable", "-p", PARTITION, str(script)])
    finally:
        script.unlink()
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    assert job_id.isdigit(), p.stdout
    cluster.assert_job_end(job_id, "COMPLETED", "0:0", timeout_s=90)
    spank = prolog_records(job_id)[0]["spank"]
    assert spank.get("SPANK_GS_REPORT") == "none" and spank.get("SPANK_GS_BIND") == "isolate", spank


def test_invalid_value_is_refused_at_submission():
    p = slurm(["sbatch", "-p", PARTITION, "-o", "/dev/null", "--gs-tune=bogus=1", "--wrap", "true"])
    assert p.returncode != 0
    assert "gsrun: spank: --gs-tune=bogus=1:" in p.stderr and "bogus" in p.stderr, p.stderr
    assert "Submitted batch job" not in p.stdout


def test_invalid_value_from_environment_is_refused():
    # Slurm's environment form of a SPANK option: SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<option>
    p = slurm(["sbatch", "-p", PARTITION, "-o", "/dev/null", "--wrap", "true"],
              env_extra={"SLURM_SPANK__SLURM_SPANK_OPTION_gsrun_gs_mps": "500"})
    assert p.returncode != 0 and "--gs-mps=500: must be a percentage 1-100" in p.stderr, p.stderr


def _job_of(p, rows) -> str:
    """The one job id the tasks printed as their last field (their rows without it stay in ``rows``)."""
    jobs = {r.pop() for r in rows}
    assert len(jobs) == 1 and next(iter(jobs)).isdigit(), p.stdout
    return jobs.pop()


def test_srun_tasks_get_the_planned_affinity(cluster):
    p = slurm(["srun", "-p", PARTITION, "-N", "1", "-n", "2", "sh", "-c",
               'echo "$SLURM_LOCALID $GSRUN_BIND_CPUS $(grep Cpus_allowed_list /proc/self/status | cut -f2) '
               '$SLURM_JOB_ID"'])
    assert p.returncode == 0, p.stderr
    from gsrun.base.cpulist import parse_cpulist
    rows = sorted(line.split() for line in p.stdout.splitlines() if line.strip())
    cluster.assert_srun_ok(p, _job_of(p, rows))
    assert [r[0] for r in rows] == ["0", "1"], p.stdout
    for _rank, planned, actual in rows:
        assert parse_cpulist(planned) == parse_cpulist(actual)
    assert not set(parse_cpulist(rows[0][1])) & set(parse_cpulist(rows[1][1]))   # disjoint


def test_srun_eight_tasks_on_two_nodes_get_the_planned_affinity(cluster):
    """With the SPANK plugin loaded, tasks of ``srun -n 8`` report the planned
    CPU affinity (bound by the plugin's task_init, no wrapper in the command)."""
    p = slurm(["srun", "-p", PARTITION, "-N", "2", "-n", "8", "sh", "-c",
               'echo "$SLURMD_NODENAME $SLURM_LOCALID $GSRUN_BIND_CPUS '
               '$(grep Cpus_allowed_list /proc/self/status | cut -f2) $SLURM_JOB_ID"'])
    assert p.returncode == 0, p.stderr
    from gsrun.base.cpulist import parse_cpulist
    rows = sorted(line.split() for line in p.stdout.splitlines() if line.strip())
    cluster.assert_srun_ok(p, _job_of(p, rows))
    assert len(rows) == 8, p.stdout
    assert sorted((r[0], r[1]) for r in rows) == [(n, str(i)) for n in ("gpu01", "gpu02") for i in range(4)]
    for node, local, planned, actual in rows:
        assert parse_cpulist(planned) == parse_cpulist(actual), (node, local, planned, actual)
        # 2 real CPUs, 4 ranks per node: round-robin, one CPU each
        assert parse_cpulist(actual) == [int(local) % 2], (node, local, actual)
