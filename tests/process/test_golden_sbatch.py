"""Golden sbatch scripts: ``gsrun ... --dry-run`` through the click command.

Each case runs the real CLI (``gsrun.wrapper.cli.cli``) with ``--dry-run``
and compares the printed script with ``tests/data/golden/sbatch/<case>.sh``;
every golden script must also pass ``bash -n``. Regenerate with
``GSRUN_REGEN_GOLDEN=1`` (see ``tests/data/golden/README.md``).

Inputs fixed by the test (nothing of this machine reaches the script):

- ``GSRUN_CONFIG`` is an empty file, so the site config is the built-in
  defaults (no ``/etc/gsrun/gsrun.toml`` of this host); ``GSRUN_PYTHON`` is unset;
- the cluster's GPUs per node come from a fake ``sinfo`` first on ``PATH``
  (prints ``gpu:h200:8(S:0-1)``, a node of 8 GPUs), as ``gsrun`` asks when
  neither ``--nodes`` nor ``--gpus-per-node`` is given; a fake ``sbatch``
  refuses, so nothing can ever be submitted from here;
- ``sys.argv[0]`` is ``@TMP@/bin/gsrun`` next to an executable
  ``@TMP@/bin/gsrun-bind``, so the script runs that ``gsrun-bind`` (as an
  installed gsrun finds the one beside it);
- the working directory is ``@TMP@/work`` (a ``.py`` script becomes an
  absolute path there).

Normalised in the output (placeholders that are plain shell words, so the
golden scripts still pass ``bash -n``):

- ``@PYTHON@``: ``sys.executable``, the interpreter a ``.py`` script runs with;
- ``@TMP@``: the test's temporary directory (``gsrun-bind`` path, cwd).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gsrun.wrapper.cli import cli
from helpers.golden import check_text
from helpers.paths import DATA

GOLDEN = DATA / "golden" / "sbatch"
HOSTILE = ["$(touch /tmp/pwned)'; echo x", "it's", '"double" quotes', "`id`", "line1\nline2", "#not-a-comment",
           "a b\tc", "$HOME", "--gpus", "*"]

CASES = {
    # name: gsrun arguments (the test puts --dry-run first)
    "plain": ["--gpus", "8", "train.py"],
    # `--mps train.py` would take train.py as the percentage: a bare --mps goes before another option
    "mps": ["--mps", "--gpus", "8", "train.py"],
    "mps-50": ["--gpus", "8", "--mps=50", "train.py"],
    "mig": ["--gpus", "2", "--exclusive", "--mig", "3g.71gb+3g.71gb", "train.py"],
    "mig-not-exclusive": ["--gpus", "1", "--mig", "7x1g.18gb", "train.py"],
    "hostile-args": ["--gpus", "1", "--gpus-per-node", "1", "argv.py", *HOSTILE],
    "multinode-gpus-per-node": ["--gpus", "16", "--gpus-per-node", "8", "train.py", "--epochs", "3"],
    "multinode-nodes": ["--gpus", "16", "--nodes", "2", "train.py"],
    "tune": ["--gpus", "8", "--exclusive", "--tune", "governor=performance,swappiness=10", "train.py"],
    "exclusive": ["--gpus", "8", "--exclusive", "train.py"],
    "mail": ["--gpus", "8", "--mail-type", "end", "--mail-user", "alice@example.org", "train.py"],
    "all-flags": ["--gpus", "4", "--gpus-per-node", "4", "-J", "llm-sft", "-p", "h200", "--time", "1-00:00:00",
                  "-o", "logs/%x-%j.out", "--cpus-per-task", "12", "--gpu-isolation", "--mps", "--exclusive",
                  "--tune", "thp=always", "--mail-type", "END,FAIL", "--mail-user", "alice",
                  "--python", "/usr/bin/python3", "train.py", "--lr", "3e-4"],
    "not-python": ["--gpus", "2", "--gpus-per-node", "2", "nvidia-smi", "-L"],
    "executable-path": ["--gpus", "1", "--gpus-per-node", "1", "./run.sh", "x"],
}


@pytest.fixture
def gsrun_env(tmp_path, monkeypatch):
    """Fake installation dir, fake sinfo, empty config, cwd; returns a normaliser."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("gsrun", "#!/bin/sh\nexit 99\n"), ("gsrun-bind", "#!/bin/sh\nexit 99\n"),
                       ("sinfo", "#!/bin/sh\necho 'gpu:h200:8(S:0-1)'\n"),
                       ("sbatch", "#!/bin/sh\necho 'fake sbatch: nothing is submitted from tests' >&2; exit 1\n")):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", [str(bindir / "gsrun")])
    monkeypatch.delenv("GSRUN_PYTHON", raising=False)
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")

    def normalise(text: str) -> str:
        return text.replace(sys.executable, "@PYTHON@").replace(str(tmp_path), "@TMP@")
    return normalise


def render(args) -> str:
    res = CliRunner().invoke(cli, ["--dry-run", *args])   # before SCRIPT: later words are its arguments
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_sbatch(case, gsrun_env):
    args = CASES[case]
    if "--dry-run" in args:
        raise AssertionError("--dry-run is added by the test")
    got = gsrun_env(render(args))
    path = GOLDEN / f"{case}.sh"
    check_text(path, got, f"gsrun {' '.join(args)} --dry-run")
    p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"{path} does not pass bash -n: {p.stderr}"


def test_hostile_arguments_reach_the_task_literally(gsrun_env, tmp_path):
    """The golden's srun command (its last lines), parsed by bash, gives back every argument unchanged."""
    text = (GOLDEN / "hostile-args.sh").read_text()
    assert text.count("\nsrun ") == 1
    srun = text[text.index("\nsrun ") + 1:]
    out = subprocess.run(["bash", "-c", 'set -f; eval "set -- ${1#srun }"; printf "%s\\0" "$@"', "_", srun],
                         capture_output=True, timeout=30)
    argv = out.stdout.decode().split("\0")[:-1]
    assert argv[-len(HOSTILE):] == HOSTILE
    assert not os.path.exists("/tmp/pwned") or os.path.getmtime("/tmp/pwned") < os.path.getmtime(tmp_path)
