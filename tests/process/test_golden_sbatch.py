"""Golden sbatch scripts: ``gsrun ... --dry-run`` through the click command.

Each case runs the real CLI (``gsrun.wrapper.cli.cli``) with ``--dry-run``
and compares the printed script with ``tests/data/golden/sbatch/<case>.sh``;
every golden script must also pass ``bash -n``. Regenerate with
``GSRUN_REGEN_GOLDEN=1`` (see ``tests/data/golden/README.md``).

Inputs fixed by the test (nothing of this machine reaches the script):

- ``GSRUN_CONFIG`` is an empty file, so the site config is the built-in
  defaults (no ``/etc/gsrun/gsrun.toml`` of this host); ``GSRUN_PYTHON``,
  ``VIRTUAL_ENV`` and ``CONDA_PREFIX`` are unset, so a ``.py`` script runs
  with the first ``python3`` on ``PATH``: a fake ``@TMP@/bin/python3``
  (cases in ``CASE_ENV`` set ``VIRTUAL_ENV`` to ``@TMP@/venv``, which has a
  ``bin/python3``);
- the cluster's GPUs per node come from a fake ``sinfo`` first on ``PATH``
  (prints ``gpu:h200:8(S:0-1)``, a node of 8 GPUs, or ``$GSRUN_TEST_GRES``),
  as ``gsrun`` asks when neither ``--nodes`` nor ``--gpus-per-node`` is
  given; a fake ``sbatch`` refuses, so nothing can ever be submitted from here;
- the scripts the cases name (``train.py``, ``argv.py``, an executable
  ``run.sh``) exist in the working directory (gsrun refuses a missing one);
- ``sys.argv[0]`` is ``@TMP@/bin/gsrun`` next to an executable
  ``@TMP@/bin/gsrun-bind``, so the script runs that ``gsrun-bind`` (as an
  installed gsrun finds the one beside it);
- the working directory is ``@TMP@/work`` (a ``.py`` script becomes an
  absolute path there).

Normalised in the output (placeholders that are plain shell words, so the
golden scripts still pass ``bash -n``):

- ``@PYTHON@``: ``sys.executable`` (gsrun's own interpreter);
- ``@TMP@``: the test's temporary directory (``gsrun-bind`` path, cwd).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gsrun.wrapper.cli import cli
from helpers.fake_install import fake_bin
from helpers.golden import check_text
from helpers.paths import DATA

GOLDEN = DATA / "golden" / "sbatch"
HOSTILE_NAME = "bert base 'single' \"double\" $(id) `id` #not-a-comment; a&b | \\ end"
HOSTILE = ["$(touch /tmp/pwned)'; echo x", "it's", '"double" quotes', "`id`", "line1\nline2", "#not-a-comment",
           "a b\tc", "$HOME", "--gpus", "*"]

CASES = {
    # name: gsrun arguments (the test puts --dry-run first)
    "plain": ["--gpus", "8", "train.py"],
    # a bare --mps is a flag: train.py is the script, not the percentage
    "mps": ["--gpus", "8", "--mps", "train.py"],
    "mps-50": ["--gpus", "8", "--mps=50", "train.py"],
    "mps-share": ["--gpus", "8", "--mps-share", "30", "train.py"],
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
    # the user's interpreter: an active virtualenv (CASE_ENV), and --python naming one on PATH
    "user-venv": ["--gpus", "8", "train.py"],
    "python-flag-name": ["--gpus", "8", "--python", "python3", "train.py"],
    # any command after --, and -m MODULE with the user's interpreter
    "cmd-python-m": ["--gpus", "8", "--", "python", "-m", "pkg.train", "--lr", "3e-4"],
    "module": ["--gpus", "8", "-m", "pkg.train", "--lr", "3e-4"],
    # one torchrun per node, its workers bound by gsrun-bind
    "torchrun": ["--gpus", "8", "--gpus-per-node", "4", "--launcher", "torchrun", "train.py", "--epochs", "1"],
    "torchrun-cpus": ["--gpus", "8", "--launcher", "torchrun", "--cpus-per-task", "6", "-m", "pkg.train"],
    # site sbatch options, first-class and through --sbatch
    "site-options": ["--gpus", "8", "-A", "proj123", "-q", "high", "-C", "h200&ib", "--mem", "512G",
                     "--reservation", "maint", "-d", "afterok:1234", "--signal", "B:USR1@120", "--requeue",
                     "--sbatch=--licenses=fluent:2", "--sbatch=--nice", "--sbatch=--begin=now+1hour", "train.py"],
    # a job name as Slurm takes it: spaces, quotes, $(), backticks, # -- one safe #SBATCH line
    "job-name-hostile": ["--gpus", "8", "-J", HOSTILE_NAME, "train.py"],
    # --gpus 6 on nodes of 4 GPUs (CASE_ENV): 2 nodes x 3
    "gpus-6-on-4": ["--gpus", "6", "train.py"],
    # the allocator preloaded by every task, found on the node at run time (jemalloc: MALLOC_CONF;
    # tcmalloc: TCMALLOC_*); the site's PYTORCH_CUDA_ALLOC_CONF (CASE_CONFIG) in the tcmalloc case
    "malloc-jemalloc": ["--gpus", "8", "--malloc", "jemalloc", "train.py"],
    "malloc-tcmalloc": ["--gpus", "8", "--malloc", "tcmalloc", "train.py"],
    # the user's own comment beside gsrun's requests: quotes, #, ; and $() survive as one #SBATCH word
    "comment": ["--gpus", "8", "--mps", "--comment", "run 7: \"lr\" #3; $(id) it's", "train.py"],
    "comment-sbatch": ["--gpus", "8", "--sbatch=--comment=sweep a;b", "train.py"],
    # the user's memory choice replaces gsrun's default (none): exactly one memory option
    "mem-per-cpu": ["--gpus", "8", "--sbatch=--mem-per-cpu=4G", "train.py"],
}

CASE_ENV = {
    "user-venv": {"VIRTUAL_ENV": "@TMP@/venv"},
    "gpus-6-on-4": {"GSRUN_TEST_GRES": "gpu:h200:4(S:0-1)"},
}
# site config text of a case (others: the empty file, built-in defaults)
CASE_CONFIG = {
    "malloc-tcmalloc": '[malloc]\npytorch_cuda_alloc_conf = "expandable_segments:True"\n',
}


@pytest.fixture
def gsrun_env(tmp_path, monkeypatch):
    """Fake installation dir, fake sinfo, empty config, cwd; returns a normaliser."""
    bindir = fake_bin(tmp_path, "#!/bin/sh\necho \"${GSRUN_TEST_GRES:-gpu:h200:8(S:0-1)}\"\n")
    work = tmp_path / "work"
    work.mkdir()
    for name in ("train.py", "argv.py", "run.sh"):
        (work / name).write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python3").write_text("#!/bin/sh\nexit 99\n")
    (tmp_path / "venv" / "bin" / "python3").chmod(0o755)
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", [str(bindir / "gsrun")])
    for var in ("GSRUN_PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "GSRUN_TEST_GRES", "SLURM_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")

    def normalise(text: str) -> str:
        return text.replace(sys.executable, "@PYTHON@").replace(str(tmp_path), "@TMP@")
    normalise.tmp = str(tmp_path)
    return normalise


def render(args, env=None) -> str:
    res = CliRunner().invoke(cli, ["--dry-run", *args], env=env)   # before SCRIPT: later words are its arguments
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_sbatch(case, gsrun_env):
    args = CASES[case]
    if "--dry-run" in args:
        raise AssertionError("--dry-run is added by the test")
    env = {k: v.replace("@TMP@", gsrun_env.tmp) for k, v in CASE_ENV.get(case, {}).items()}
    if case in CASE_CONFIG:
        cfg = os.path.join(gsrun_env.tmp, "case.toml")
        with open(cfg, "w") as f:
            f.write(CASE_CONFIG[case])
        env["GSRUN_CONFIG"] = cfg
    got = gsrun_env(render(args, env))
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


REFUSALS = {
    # gsrun arguments: (what the first line says, what the hint names)
    "missing-script": (["--gpus", "8", "trian.py"], "gsrun: submit: no such script: 'trian.py'", "relative to"),
    "torchrun-as-cmd": (["--gpus", "8", "--", "torchrun", "--nproc-per-node=8", "train.py"],
                        "gsrun: submit: torchrun would start", "--launcher torchrun"),
    "torchrun-as-script": (["--gpus", "8", "torchrun", "train.py"], "gsrun: submit: torchrun would start",
                           "--launcher torchrun"),
    "python-m-torch-run": (["--gpus", "8", "-m", "torch.distributed.run", "train.py"],
                           "gsrun: submit: torchrun would start", "--launcher torchrun"),
    "sbatch-job-name": (["--gpus", "8", "--sbatch=--job-name=x", "train.py"],
                        "gsrun: submit: bad --sbatch: --job-name: gsrun renders --job-name itself", "-J/--job-name"),
    "sbatch-newline": (["--gpus", "8", "--sbatch=--x\n#SBATCH --uid=0", "train.py"],
                       "gsrun: submit: bad --sbatch: '--x\\n#SBATCH --uid=0'", "no newline"),
    "job-name-newline": (["--gpus", "8", "-J", "a\n#SBATCH --uid=0", "train.py"], "gsrun: submit: bad --job-name",
                         "no control characters"),
    "gpus-7-on-4": (["--gpus", "7", "train.py"], "gsrun: submit: GPUs do not fill whole nodes",
                    "--gpus 8 (2 node(s) x 4)"),
    "bad-mem": (["--gpus", "8", "--mem", "lots", "train.py"], "gsrun: submit: bad --mem", "64G"),
    "bad-mps-share": (["--gpus", "8", "--mps=150", "train.py"], "gsrun: submit: --mps-share: --mps='150'", "1 to 100"),
    "two-memory": (["--gpus", "8", "--mem", "64G", "--sbatch=--mem-per-cpu=4G", "train.py"],
                   "gsrun: submit: two memory requests: --mem and --sbatch=--mem-per-cpu", "choose one of --mem"),
    "two-memory-sbatch": (["--gpus", "8", "--sbatch=--mem-per-gpu=4G", "--sbatch=--mem-per-cpu=4G", "train.py"],
                          "gsrun: submit: two memory requests", "choose one"),
    "comment-newline": (["--gpus", "8", "--comment", "a\n#SBATCH --uid=0", "train.py"], "gsrun: submit: bad --comment",
                        "no control characters"),
    "comment-forged-request": (["--gpus", "8", "--comment", "x gsrun:tune=swappiness=0", "train.py"],
                               "gsrun: submit: bad --comment", "without 'gsrun:'"),
    "two-comments": (["--gpus", "8", "--comment", "a", "--sbatch=--comment=b", "train.py"],
                     "gsrun: submit: two comments: --comment and --sbatch=--comment", "give one"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_say_what_and_hint(case, gsrun_env):
    args, first, hint = REFUSALS[case]
    res = CliRunner().invoke(cli, ["--dry-run", *args], env={"GSRUN_TEST_GRES": "gpu:h200:4(S:0-1)"})
    assert res.exit_code != 0 and res.exception is not None
    msg = str(res.exception)
    assert msg.startswith(first), msg
    assert "\nhint: " in msg and hint in msg.split("\nhint: ", 1)[1], msg


def test_spread_is_said_and_bare_mps_takes_the_script(gsrun_env):
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "6", "train.py"], env={"GSRUN_TEST_GRES": "gpu:h200:4"})
    assert res.exit_code == 0, res.output
    assert "gsrun: submit: note: --gpus 6 does not fill nodes of 4 GPUs: 2 nodes x 3 GPUs" in res.stderr
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "8", "--mps", "train.py", "--x"])
    assert res.exit_code == 0, res.output
    assert "#SBATCH --comment=gsrun:mps=\n" in res.stdout and "/work/train.py --x\n" in res.stdout


def test_warns_when_gsrun_own_python_lacks_torch(gsrun_env, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "8", "--python", sys.executable, "train.py"])
    assert res.exit_code == 0, res.output
    assert "gsrun: submit: warning:" in res.stderr and "cannot import torch" in res.stderr
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "8", "train.py"])   # the fake python3 on PATH
    assert "cannot import torch" not in res.stderr


def test_comment_reaches_slurm_as_typed(gsrun_env):
    """sbatch's script parser reads the comment word back as typed (its quoting rules:
    :func:`gsrun.wrapper.spec.sbatch_word`), gsrun's requests first."""
    from gsrun.wrapper.environ import script_options

    typed = "run 7: \"lr\" #3; $(id) it's"
    text = render(["--gpus", "8", "--mps", "--comment", typed, "train.py"])
    assert script_options(text)["comment"] == f"gsrun:mps= {typed}"
    from gsrun.facts.slurm import parse_comment_request

    assert parse_comment_request(script_options(text)["comment"]) == {"mps": ""}


def test_dry_run_says_what_the_environment_would_override(gsrun_env):
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "8", "-p", "h200", "train.py"],
                             env={"SBATCH_PARTITION": "debug"})
    assert res.exit_code == 0, res.output
    assert ("gsrun: submit: note: SBATCH_PARTITION from your environment would override what gsrun asks for: "
            "passed --partition=h200 on the sbatch command line") in res.stderr
    res = CliRunner().invoke(cli, ["--dry-run", "--gpus", "8", "train.py"], env={"SBATCH_GPUS": "2"})
    assert res.exit_code != 0 and str(res.exception).startswith("gsrun: submit: SBATCH_GPUS is set: ")
