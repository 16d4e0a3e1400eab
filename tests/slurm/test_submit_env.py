"""The environment users submit from, on the real local cluster, as the test
user: a module's SBATCH_* variables against what the user typed, a job
submitted from inside another job, the user's own comment, and --wait
following through squeue. Every job's end state and exit code come from
Slurm (scontrol -o show job)."""

from __future__ import annotations

import re

from gsrun.facts.slurm import parse_oneliner
from helpers.cluster import VENV
from helpers.fake_install import FAKE_CONDA


def _record(cluster, job: str) -> str:
    return cluster.as_root(["scontrol", "-o", "show", "job", job]).stdout


def _ended_ok(cluster, job: str) -> str:
    assert cluster.wait_job_done(job) == "COMPLETED"
    rec = _record(cluster, job)
    assert " ExitCode=0:0 " in rec, rec
    return rec


def test_module_sbatch_variables_do_not_override_what_the_user_typed(cluster):
    module = {"SBATCH_PARTITION": "gpu", "SBATCH_TIMELIMIT": "5", "SBATCH_MEM_PER_NODE": "200M",
              "SBATCH_JOB_NAME": "from-module"}
    cp = cluster.as_user(["gsrun", "--gpus", "1", "-p", "gpu-exempt", "--time", "7", "--mem", "100M", "-J", "typed",
                          "--wait", "--output", "mod-%j.out", "--", "true"], **module)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    note = [ln for ln in cp.stderr.splitlines() if "from your environment would override" in ln]
    assert len(note) == 1 and all(v in note[0] for v in module), cp.stderr
    job = cluster.job_id_from(cp.stderr)
    rec = _ended_ok(cluster, job)
    assert "Partition=gpu-exempt " in rec and "TimeLimit=00:07:00 " in rec and "MinMemoryNode=100M " in rec, rec
    assert re.search(r"JobName=typed UserId=", rec), rec
    # what the user did not type stays the module's: sbatch reads SBATCH_PARTITION as before
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--output", "mod2-%j.out", "--", "true"],
                         SBATCH_PARTITION="gpu-exempt")
    assert cp.returncode == 0 and "would override" not in cp.stderr, cp.stderr
    assert "Partition=gpu-exempt " in _ended_ok(cluster, cluster.job_id_from(cp.stderr))


def test_module_gpu_variable_is_refused_by_name(cluster):
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--", "true"], SBATCH_GPUS_PER_TASK="1")
    assert cp.returncode == 2 and "gsrun: submit: SBATCH_GPUS_PER_TASK is set" in cp.stderr, cp.stderr
    assert "hint: unset SBATCH_GPUS_PER_TASK" in cp.stderr and "submitted job" not in cp.stderr


def test_submitted_from_inside_a_job_gets_its_own_resources(cluster):
    """The parent asks --mem-per-cpu and --cpus-per-task (its tasks see SLURM_MEM_PER_CPU,
    SLURM_CPUS_PER_TASK; 24.11 also SRUN_CPUS_PER_TASK); the job it submits with gsrun sees none of them."""
    inner = (f"{VENV}/bin/gsrun --gpus 1 --gpus-per-node 1 --wait --output inner-%j.out -- "
             "sh -c 'env | grep -E \"^(SLURM_MEM_PER|SRUN_CPUS|SLURM_CPUS_PER_TASK)\" || echo clean'")
    cp = cluster.as_user(["sbatch", "--parsable", "--mem-per-cpu=100", "--cpus-per-task=2", "-o", "outer-%j.out",
                          "--wrap", f"export SRUN_CPUS_PER_TASK=2; {inner}"], check=True)
    outer = cp.stdout.strip().split(";")[0]
    _ended_ok(cluster, outer)
    text = (cluster.work / f"outer-{outer}.out").read_text()
    assert f"inside job {outer}: the parent job's SLURM_*/SRUN_* variables (SLURM_MEM_PER_CPU, " in text, text
    inner_job = cluster.job_id_from(text)
    rec = _ended_ok(cluster, inner_job)
    assert "MinMemoryCPU" not in rec, rec
    out = (cluster.work / f"inner-{inner_job}.out").read_text()
    assert [ln for ln in out.splitlines() if not ln.startswith("gsrun: bind: warning:")] == ["clean"], out


def test_comment_and_wait_through_squeue(cluster):
    typed = "sweep 3: \"lr\" #1; $(id) it's"
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--mps", "--comment", typed, "--wait", "--output", "cm-%j.out",
                          "--", "sh", "-c", "echo out-line; exit 3"])
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "out-line" in cp.stdout
    job = cluster.job_id_from(cp.stderr)
    assert cluster.wait_job_done(job) == "FAILED"
    rec = _record(cluster, job)
    assert " ExitCode=3:0 " in rec
    assert parse_oneliner(rec)["Comment"] == f"gsrun:mps= {typed}", rec


SHOW = ("import os, sys; print('ENV', sys.prefix, os.environ.get('XLA_FLAGS'), os.environ.get('VIRTUAL_ENV'), "
        "os.environ.get('WORLD_SIZE'), os.environ.get('MASTER_ADDR') is not None)")


def _user_env(cluster, name: str):
    prefix = cluster.work / name
    if not (prefix / "bin" / "python3").exists():
        cluster.as_user(["/usr/bin/python3", "-m", "venv", "--without-pip", str(prefix)], check=True)
    return prefix


def test_conda_env_activate_d_runs_in_the_job(cluster):
    """A conda env (a layout whose activate.d sets XLA_FLAGS) activated by path through conda's hook."""
    prefix = _user_env(cluster, "fake-conda-env")
    actd = prefix / "etc" / "conda" / "activate.d"
    cluster.as_user(["mkdir", "-p", str(actd), str(cluster.work / "fake-conda" / "bin")], check=True)
    cluster.as_user(["sh", "-c", f"cat > {actd}/xla.sh"], check=True,
                    input_text='export XLA_FLAGS="--xla_gpu_cuda_data_dir=$CONDA_PREFIX/lib"\n')
    conda = cluster.work / "fake-conda" / "bin" / "conda"
    cluster.as_user(["sh", "-c", f"cat > {conda} && chmod 755 {conda}"], check=True, input_text=FAKE_CONDA)
    cluster.as_user(["sh", "-c", "cat > show_env.py"], check=True, input_text=SHOW + "\n")
    cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--output", "conda-%j.out", "show_env.py"],
                         CONDA_PREFIX=str(prefix), CONDA_EXE=str(conda))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _ended_ok(cluster, cluster.job_id_from(cp.stderr))
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith("ENV ")]
    assert line == [f"ENV {prefix} --xla_gpu_cuda_data_dir={prefix}/lib None 1 True"], cp.stdout


def test_venv_under_export_none(cluster):
    """SBATCH_EXPORT=NONE: the job still runs the venv's python with VIRTUAL_ENV, and srun's tasks get
    what the script set (WORLD_SIZE, MASTER_ADDR)."""
    prefix = _user_env(cluster, "plain-venv")
    cluster.as_user(["sh", "-c", "cat > show_env.py"], check=True, input_text=SHOW + "\n")
    cp = cluster.as_user(["gsrun", "--gpus", "2", "--gpus-per-node", "2", "--wait", "--output", "none-%j.out",
                          "show_env.py"], VIRTUAL_ENV=str(prefix), SBATCH_EXPORT="NONE")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _ended_ok(cluster, cluster.job_id_from(cp.stderr))
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("ENV ")]
    assert lines == [f"ENV {prefix} None {prefix} 2 True"] * 2, cp.stdout


def test_moved_env_stops_the_job_before_the_command(cluster):
    prefix = _user_env(cluster, "venv-to-break")
    cluster.as_user(["sh", "-c", "cat > show_env.py"], check=True, input_text=SHOW + "\n")
    cluster.as_user(["mv", str(prefix / "pyvenv.cfg"), str(prefix / "pyvenv.cfg.off")], check=True)
    try:
        cp = cluster.as_user(["gsrun", "--gpus", "1", "--wait", "--output", "broken-%j.out", "show_env.py"],
                             VIRTUAL_ENV=str(prefix))
    finally:
        cluster.as_user(["mv", str(prefix / "pyvenv.cfg.off"), str(prefix / "pyvenv.cfg")])
    assert cp.returncode == 1, cp.stdout + cp.stderr
    job = cluster.job_id_from(cp.stderr)
    assert cluster.wait_job_done(job) == "FAILED" and " ExitCode=1:0 " in _record(cluster, job)
    assert "ENV " not in cp.stdout
    assert f"gsrun: job: python: {prefix}/bin/python3 runs with sys.prefix /usr on " in cp.stdout, cp.stdout
