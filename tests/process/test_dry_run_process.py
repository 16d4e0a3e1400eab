"""``gsrun`` as a real child process: the dry run prints the script the
installed command would submit, the help page and the ``-h``/``--help``
option are click's, and a finished run keeps its exit status when stdout or
stderr is closed (:func:`gsrun.base.errors.exit_now`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.fake_install import fake_bin

CLI = "import sys\nfrom gsrun.wrapper.cli import main\nmain(sys.argv[1:])"


@pytest.fixture
def site(tmp_path):
    """A fake installation dir (gsrun, gsrun-bind, python3, sinfo, sbatch that refuses), no config
    file (built-in defaults), a train.py in the working directory."""
    bindir = fake_bin(tmp_path, "#!/bin/sh\necho 'gpu:h200:8(S:0-1)'\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GSRUN_PYTHON", "GSRUN_CONFIG", "VIRTUAL_ENV", "CONDA_PREFIX", "SLURM_CONF", "PYTHONPATH")}
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    return {"bin": bindir, "work": work, "env": env}


def _run(args, site) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-c", CLI, *args], cwd=site["work"], env=site["env"],
                          capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_script(site):
    cp = _run(["--dry-run", "--gpus", "2", "--gpus-per-node", "2", "train.py", "--lr", "3"], site)
    assert cp.returncode == 0, cp.stderr
    script = cp.stdout
    # the script is the real one: the task line runs the gsrun-bind beside nothing here (argv[0] is -c),
    # found on PATH, with the first python3 on PATH and the script's absolute path
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:2\n" in script
    assert (f"srun --kill-on-bad-exit=1 --export=ALL $cpu_bind {site['bin']}/gsrun-bind -- {site['bin']}/python3 "
            f"{site['work']}/train.py --lr 3\n") in script


def test_dry_run_asks_the_cluster_and_checks_the_options(site):
    """No --gpus-per-node asks sinfo (the fake one: 8 GPUs a node); --mps-share checks the percentage."""
    cp = _run(["--dry-run", "--gpus", "8", "--mps-share", "30", "train.py"], site)
    assert cp.returncode == 0, cp.stderr
    assert "#SBATCH --gres=gpu:8\n" in cp.stdout and "#SBATCH --comment=gsrun:mps=30\n" in cp.stdout


def test_help_page_lists_every_option_with_its_text(site):
    cp = _run(["--help"], site)
    assert cp.returncode == 0, cp.stderr
    words = " ".join(cp.stdout.split())
    assert words.startswith("Usage: gsrun [OPTIONS] SCRIPT [ARGS]... | -m MODULE [ARGS]... | -- CMD [ARGS]... "
                            "Run SCRIPT [ARGS...] (or -m MODULE, or -- CMD) as one task per GPU on Slurm. Options: "
                            "--gpus INTEGER Total GPUs (one task per GPU). ")
    assert words.endswith(" --dry-run Print the sbatch script; submit nothing. --wait Follow the job, stream its "
                          "output, exit with its exit code. --version Show the version and exit. "
                          "-h, --help Show this message and exit.")


def test_help_option_and_usage_errors(site):
    """-h and --help print the page, the option is last in the list, and a
    usage error points to it."""
    env = site["env"]
    for flag in ("-h", "--help"):
        cp = subprocess.run([sys.executable, "-P", "-c", CLI, flag], cwd=site["work"], env=env,
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0 and cp.stdout.startswith("Usage: gsrun [OPTIONS] SCRIPT [ARGS]...")
        assert cp.stdout.rstrip().splitlines()[-1].split() == ["-h,", "--help", "Show", "this", "message", "and",
                                                               "exit."]
    cp = subprocess.run([sys.executable, "-P", "-c", CLI, "--gpus", "1", "--bogus"], cwd=site["work"], env=env,
                        capture_output=True, text=True, timeout=60)
    # click's wording differs by release (8.3: "Try 'gsrun -h'", "No such option: --bogus";
    # 8.5: "Try 'gsrun --help'", "No such option '--bogus'")
    assert cp.returncode == 2 and re.search(r"Try 'gsrun (-h|--help)' for help\.", cp.stderr), cp.stderr
    assert re.search(r"Error: No such option:? '?--bogus", cp.stderr), cp.stderr


@pytest.mark.parametrize("closed", ["1", "2", "1 2"])
def test_the_fast_exit_keeps_the_exit_status_with_stdout_or_stderr_closed(closed):
    """A hook or gsrun started with fd 1 or 2 closed (cron, ``>&-``) has
    sys.stdout/sys.stderr None: the fast exit still ends with the caller's status."""
    redirs = " ".join(f"{fd}>&-" for fd in closed.split())
    cp = subprocess.run(["/bin/sh", "-c", f'"$0" -P -c "from gsrun.base.errors import exit_now; exit_now(3)" {redirs}',
                         sys.executable], capture_output=False)
    assert cp.returncode == 3
