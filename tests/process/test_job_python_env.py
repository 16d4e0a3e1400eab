"""The user's Python in the job, through the rendered script's own lines run
by bash (no Slurm): a conda env activated by path through conda's hook (its
activate.d scripts run), a venv exported, the interpreter's ``sys.prefix``
checked before the user's command, at hostile paths. The conda is a fake
whose ``shell.bash hook`` defines ``conda activate`` the way conda's does
(export CONDA_PREFIX, PATH first, source ``etc/conda/activate.d/*.sh``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gsrun.wrapper.cli import cli
from helpers.fake_install import FAKE_CONDA, fake_bin

HOSTILE_DIR = "env it's \"q\" $(touch pwned-env); x"



@pytest.fixture()
def work(tmp_path, monkeypatch):
    bindir = fake_bin(tmp_path, "#!/bin/sh\necho gpu:4\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(sys, "argv", [str(bindir / "gsrun")])
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    for var in ("GSRUN_PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_EXE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return tmp_path


def _env(prefix: Path, pyvenv_cfg: bool = True) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    if not pyvenv_cfg:
        (prefix / "pyvenv.cfg").unlink()
    return prefix


def _prelude(env: dict) -> str:
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "1", "train.py"], env=env)
    assert res.exit_code == 0, (res.output, res.exception)
    text = res.stdout
    start = text.index("set -eu\n")
    return text[start:text.index("# torch.distributed rendezvous")]


def _run(prelude: str, then: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}      # what --export=NONE leaves, no ~/.bashrc read
    return subprocess.run(["bash", "-c", prelude + then], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=60)


def test_conda_env_activated_by_path_through_its_hook(work):
    prefix = _env(work / HOSTILE_DIR)
    (prefix / "etc" / "conda" / "activate.d").mkdir(parents=True)
    (prefix / "etc" / "conda" / "activate.d" / "xla.sh").write_text(
        'export XLA_FLAGS="--xla_gpu_cuda_data_dir=$CONDA_PREFIX/lib"\n')
    conda = work / "miniforge" / "bin" / "conda"
    conda.parent.mkdir(parents=True)
    conda.write_text(FAKE_CONDA)
    conda.chmod(0o755)
    prelude = _prelude({"CONDA_PREFIX": str(prefix), "CONDA_EXE": str(conda)})
    r = _run(prelude, 'echo "XLA=$XLA_FLAGS"; echo "PREFIX=$CONDA_PREFIX"; python3 -c "import sys; print(sys.prefix)"\n',
             work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"XLA=--xla_gpu_cuda_data_dir={prefix}/lib", f"PREFIX={prefix}", str(prefix)]
    assert not (work / "pwned-env").exists() and not Path("pwned-env").exists()
    # the env moved away after submit: the job stops before the user's command with gsrun's message
    shutil.move(str(prefix), work / "moved")
    r = _run(prelude, "echo user-command-ran\n", work)
    assert r.returncode == 1 and "user-command-ran" not in r.stdout
    assert "gsrun: job: python: " in r.stderr and f"not the environment found at submit, {prefix}" in r.stderr, \
        r.stderr


def test_venv_exported_and_its_prefix_checked(work):
    prefix = _env(work / HOSTILE_DIR)
    prelude = _prelude({"VIRTUAL_ENV": str(prefix)})
    r = _run(prelude, 'echo "VENV=$VIRTUAL_ENV"; command -v python3\n', work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"VENV={prefix}", f"{prefix}/bin/python3"]
    assert not (work / "pwned-env").exists()


def test_venv_without_pyvenv_cfg_stops_the_job_naming_both_paths(work):
    prefix = _env(work / "broken-venv", pyvenv_cfg=False)
    prelude = _prelude({"VIRTUAL_ENV": str(prefix)})
    r = _run(prelude, "echo user-command-ran\n", work)
    assert r.returncode == 1 and "user-command-ran" not in r.stdout
    first, hint = r.stderr.splitlines()[:2]
    base = os.path.realpath(sys.base_prefix)
    assert first.startswith(f"gsrun: job: python: {prefix}/bin/python3 runs with sys.prefix {base} on ")
    assert first.endswith(f"not the environment found at submit, {prefix}")
    assert hint.startswith("hint: recreate the environment")


def test_no_env_active_is_said_once(work):
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "1", "train.py"])
    notes = [ln for ln in res.stderr.splitlines() if "no virtualenv or conda env is active" in ln]
    assert len(notes) == 1 and f"the job runs {work}/bin/python3 " in notes[0], res.stderr
