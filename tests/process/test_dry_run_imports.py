"""``gsrun --dry-run`` imports only what it uses (issue 24, item 6).

What users wait on at every submit: beyond the interpreter and click
(~3.6x the interpreter floor by itself), the dry run was 1.7x more, mostly
modules it did not need: ``dataclasses`` (JobSpec, Python), ``shutil``
(``which``: ``bz2``, ``lzma``, ``fnmatch``), ``pathlib``, ``locale`` (click's
help option text through gettext), the Slurm query module and regexes compiled
at import. A real child process runs the dry run (what ``gsrun`` runs after
the console script's ``import re``) and reports ``sys.modules`` at exit; a
module ``import click`` alone loads in the same interpreter (an editable
install's finder loads ``pathlib``) is not held against it. Except what click
imports ``inspect`` for (``ast``, ``dis``, ``tokenize``, ``linecache``: ~4 ms):
``inspect`` stays a placeholder that never runs
(:func:`gsrun.base.deferred.defer_import`), checked against the bare
interpreter. The dry run ends by ``os._exit`` (no interpreter teardown,
~3.5 ms; :func:`gsrun.base.errors.exit_now`). The time itself:
``tests/bench/bench_epilog.py`` (``dry_run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.fake_install import fake_bin

# modules the dry run must not load; each one was loaded before the fix (or is heavy and unused)
NOT_IMPORTED = ("dataclasses", "shutil", "bz2", "lzma", "fnmatch", "pathlib", "locale", "tomllib",
                "jinja2", "gsrun.facts.slurm", "gsrun.base.proc", "gsrun.request.mps_share",
                "gsrun.wrapper.submit", "subprocess")
# modules click imports only through `inspect`, which the dry run must leave unexecuted
NOT_RUN_FOR_CLICK = ("ast", "dis", "tokenize", "linecache", "opcode", "token")

REPORT = """
import atexit, json, os, sys
def report(how):
    ran = "inspect" in sys.modules and "cleandoc" in vars(sys.modules["inspect"])
    sys.stdout.write("\\nMODULES " + json.dumps([how, ran, sorted(sys.modules)]))
    sys.stdout.flush()
exit_now = os._exit
os._exit = lambda rc: (report("os._exit"), exit_now(rc))
atexit.register(report, "exit")
{body}
"""
CLI = "import re, sys\nfrom gsrun.wrapper.cli import main\nmain(sys.argv[1:])"


@pytest.fixture
def site(tmp_path):
    """A fake installation dir (gsrun, gsrun-bind, python3, sinfo, sbatch that refuses), no config
    file (built-in defaults, no TOML parse), a train.py in the working directory."""
    bindir = fake_bin(tmp_path, "#!/bin/sh\necho 'gpu:h200:8(S:0-1)'\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GSRUN_PYTHON", "GSRUN_CONFIG", "VIRTUAL_ENV", "CONDA_PREFIX", "SLURM_CONF", "PYTHONPATH")}
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    return {"bin": bindir, "work": work, "env": env}


def _run(code: str, args, site) -> tuple[str, str, bool, set[str]]:
    """(stdout before the report, how the process ended: "os._exit" or "exit",
    whether inspect's code ran, the modules at the end)."""
    cp = subprocess.run([sys.executable, "-P", "-c", REPORT.format(body=code), *args], cwd=site["work"],
                        env=site["env"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    out, _, report = cp.stdout.rpartition("\nMODULES ")
    how, inspect_ran, mods = json.loads(report)
    return out, how, inspect_ran, set(mods)


def _modules(code: str, args, site) -> tuple[str, set[str]]:
    out, _how, _ran, mods = _run(code, args, site)
    return out, mods


def test_dry_run_imports_only_what_it_uses(site):
    if os.path.exists("/etc/gsrun/gsrun.toml"):
        pytest.skip("this host has /etc/gsrun/gsrun.toml: the dry run parses it (tomllib)")
    _, bare = _modules("import re, sys", [], site)
    _, baseline = _modules("import re, sys, click", [], site)
    assert {"inspect", *NOT_RUN_FOR_CLICK} <= baseline               # what click alone imports
    script, how, inspect_ran, loaded = _run(CLI, ["--dry-run", "--gpus", "2", "--gpus-per-node", "2", "train.py",
                                                  "--lr", "3"], site)
    # the script is the real one: the task line runs the gsrun-bind beside nothing here (argv[0] is -c),
    # found on PATH, with the first python3 on PATH and the script's absolute path
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n#SBATCH --gres=gpu:2\n" in script
    assert (f"srun --kill-on-bad-exit=1 --export=ALL $cpu_bind {site['bin']}/gsrun-bind -- {site['bin']}/python3 "
            f"{site['work']}/train.py --lr 3\n") in script
    unwanted = sorted(m for m in NOT_IMPORTED if m in loaded and m not in baseline)
    assert unwanted == [], f"gsrun --dry-run imports {unwanted}"
    unwanted = sorted(m for m in NOT_RUN_FOR_CLICK if m in loaded and m not in bare)
    assert unwanted == [] and not inspect_ran, f"gsrun --dry-run runs inspect: {unwanted}"
    assert how == "os._exit"                                          # no interpreter teardown


def test_help_page_runs_inspect_and_is_click_s(site):
    """The deferred inspect runs where click needs it (the help page cleans the
    command's docstring) and the page lists every option with its text."""
    page, how, inspect_ran, loaded = _run(CLI, ["--help"], site)
    assert inspect_ran and {"ast", "tokenize"} <= loaded and how == "os._exit"
    words = " ".join(page.split())
    assert words.startswith("Usage: gsrun [OPTIONS] SCRIPT [ARGS]... | -m MODULE [ARGS]... | -- CMD [ARGS]... "
                            "Run SCRIPT [ARGS...] (or -m MODULE, or -- CMD) as one task per GPU on Slurm. Options: "
                            "--gpus INTEGER Total GPUs (one task per GPU). ")
    assert words.endswith(" --dry-run Print the sbatch script; submit nothing. --wait Follow the job, stream its "
                          "output, exit with its exit code. -h, --help Show this message and exit.")


def test_cluster_query_and_options_import_their_modules_where_they_run(site):
    """The lazy imports still happen when needed: no --gpus-per-node asks sinfo
    (gsrun.facts.slurm), --mps-share checks the percentage."""
    script, loaded = _modules(CLI, ["--dry-run", "--gpus", "8", "--mps-share", "30", "train.py"], site)
    assert "#SBATCH --gres=gpu:8\n" in script and "#SBATCH --comment=gsrun:mps=30\n" in script
    assert {"gsrun.facts.slurm", "gsrun.request.mps_share"} <= loaded


def test_help_option_as_click_made_it(site):
    """gsrun makes its -h/--help option itself (click's imports locale): same
    line, last in the list, and usage errors still point to it."""
    env = site["env"]
    for flag in ("-h", "--help"):
        cp = subprocess.run([sys.executable, "-P", "-c", CLI, flag], cwd=site["work"], env=env,
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0 and cp.stdout.startswith("Usage: gsrun [OPTIONS] SCRIPT [ARGS]...")
        assert cp.stdout.rstrip().splitlines()[-1].split() == ["-h,", "--help", "Show", "this", "message", "and",
                                                               "exit."]
    cp = subprocess.run([sys.executable, "-P", "-c", CLI, "--gpus", "1", "--bogus"], cwd=site["work"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "Try 'gsrun --help' for help." in cp.stderr
    assert "Error: No such option '--bogus'" in cp.stderr


@pytest.mark.parametrize("closed", ["1", "2", "1 2"])
def test_the_fast_exit_keeps_the_exit_status_with_stdout_or_stderr_closed(closed):
    """A hook or gsrun started with fd 1 or 2 closed (cron, ``>&-``) has
    sys.stdout/sys.stderr None: the fast exit still ends with the caller's status."""
    import subprocess
    import sys

    redirs = " ".join(f"{fd}>&-" for fd in closed.split())
    cp = subprocess.run(["/bin/sh", "-c", f'"$0" -P -c "from gsrun.base.errors import exit_now; exit_now(3)" {redirs}',
                         sys.executable], capture_output=False)
    assert cp.returncode == 3
