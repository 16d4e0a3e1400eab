"""slurmd runs ``gsrun-node prolog`` for every job on every node, so what it
imports is paid per job. The hooks are launched as
``python3 -I -S -c <bootstrap>`` (no ``site``); here the prolog of a job that
asks nothing (config cache warm, the job credential's fields in the
environment: no Slurm command) runs that way, and the modules it imports are
listed. Timings live in tests/bench/ (BENCHMARKS.md); this test pins the
modules that cost most (``subprocess`` ~8 ms, ``dataclasses`` with
``inspect`` ~5.5 ms, ``secrets`` ~3.4 ms, ``typing``, ``shutil``...). A
module the standard library loads by itself on this Python version for the
modules the prolog uses (3.13's ``pathlib`` loads ``contextlib``) is not held
against it (``helpers.import_budget``).

Also the sampler the prolog starts (``os.posix_spawn``): its own session, cwd
``/``, stdin ``/dev/null``, stdout/stderr to ``sampler.log``, and no descriptor
of the prolog's caller beyond 0-2 (an inheritable one left open by slurmd)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import gsrun
import gsrun.epilog
import gsrun.prolog
import gsrun.wrapper
from helpers.import_budget import over_budget, stdlib_drags
from helpers.node_site import make_site, run_node, samplers_of

pytestmark = pytest.mark.process

# gsrun's package dirs as this interpreter finds them (an install, or the checkout's
# package-dir mapping: gsrun.prolog is <repo>/prolog), for a child without `site`
_ROOTS = [os.path.dirname(os.path.dirname(m.__file__)) for m in (gsrun, gsrun.prolog, gsrun.wrapper, gsrun.epilog)]
# what a plain job's prolog must not import
NOT_IMPORTED = ("subprocess", "selectors", "threading", "locale", "dataclasses", "inspect", "ast", "dis",
                "secrets", "hmac", "hashlib", "random", "typing", "shutil", "bz2", "lzma", "contextlib",
                "tomllib", "gsrun.node.mps", "gsrun.node.mig", "gsrun.bind.plan", "gsrun.request.waste")
CREDENTIAL = {"SLURM_JOB_RESTART_COUNT": "0"}   # slurmd's credential fields: the job has no comment


def _launch(out: str, extra: str = "") -> str:
    return (f"import sys\nsys.path[:0] = [{_ROOTS[0]!r}]\nimport gsrun\n"
            f"gsrun.__path__.extend(d for d in {_ROOTS[1:]!r} if d not in gsrun.__path__)\n"
            "import os\nbefore = set(sys.modules)\n"
            f"{extra}"
            "def record():\n"
            f"    open({out!r}, 'w').write('\\n'.join(sorted(set(sys.modules) - before)))\n"
            # a hook that finished ends by os._exit (gsrun.base.errors.exit_now): record on the way out
            "exit_now = os._exit\nos._exit = lambda rc: (record(), exit_now(rc))\n"
            "from gsrun.wrapper.node_entry import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "finally:\n    record()\n")


@pytest.fixture
def site():
    s = make_site()
    yield s
    for job in ("4301", "4302", "4303"):
        for pid in samplers_of(job, s.state):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(s.base, ignore_errors=True)


def _hook(site, phase: str, job: str, out: str, extra: str = "", **kw) -> subprocess.CompletedProcess:
    env = site.env(job_id=job, **CREDENTIAL)
    return subprocess.run([sys.executable, "-I", "-S", "-c", _launch(out, extra), phase], env=env,
                          capture_output=True, text=True, timeout=120, cwd="/", **kw)


def test_plain_prolog_imports_only_what_it_uses(site):
    runs = []
    for job in ("4301", "4302"):
        out = str(site.base / f"modules-{job}")
        cp = _hook(site, "prolog", job, out)
        assert cp.returncode == 0, cp.stderr
        rec = json.loads((site.spool / "jobs" / job / "prolog-gpu-node01.json").read_text())
        assert rec["slurm_calls"] == [] and rec["request"]["source"] == "none"
        assert rec["steps"]["sampler"]["pid"] > 0
        runs.append(set(open(out).read().split()))
        assert _hook(site, "epilog", job, os.devnull).returncode == 0
        assert not samplers_of(job, site.state)
    assert (site.state / "config-cache.marshal").exists()
    assert "tomllib" in runs[0]                           # the first prolog parsed the file
    assert {"gsrun.prolog.main", "gsrun.node.tuning", "json"} <= runs[1]
    assert over_budget(runs[1], NOT_IMPORTED, ("-I", "-S")) == []


@pytest.mark.parametrize("extra", ["subprocess", "typing", "shutil", "gsrun.bind.plan"])
def test_the_budget_counts_a_module_gsrun_imports_beyond_it(site, extra):
    """The same warm prolog with one more module imported on its way: the
    budget names it, whatever this Python's standard library loads by itself."""
    for job in ("4301", "4302"):
        out = str(site.base / f"modules-{job}")
        assert _hook(site, "prolog", job, out, extra=f"import {extra}\n" if job == "4302" else "").returncode == 0
        assert _hook(site, "epilog", job, os.devnull).returncode == 0
    assert extra in over_budget(set(open(out).read().split()), NOT_IMPORTED, ("-I", "-S"))


def test_the_budget_leaves_out_what_the_standard_library_loads_itself():
    """Whatever this version's pathlib and json load (glob and contextlib on
    3.13, fnmatch and urllib on 3.11...) is theirs, not the command's."""
    start = stdlib_drags([])
    loaded = stdlib_drags(["pathlib", "json"])
    dragged = sorted(loaded - start - {"pathlib", "json"})
    assert dragged
    assert over_budget(loaded, dragged) == []
    assert over_budget(loaded | {"subprocess"}, [*dragged, "subprocess"]) == ["subprocess"]


def test_sampler_is_detached_in_root_cwd_without_inherited_fds(site):
    marker = site.base / "inherited-fd"
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.set_inheritable(fd, True)
        cp = _hook(site, "prolog", "4303", os.devnull, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert cp.returncode == 0, cp.stderr
    info = json.loads((site.state / "jobs/4303/sampler.pid.json").read_text())
    pid = info["pid"]
    try:
        assert samplers_of("4303", site.state) == [pid]
        assert os.getsid(pid) == pid                      # its own session
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        fds = {}
        for n in os.listdir(f"/proc/{pid}/fd"):
            try:
                fds[int(n)] = os.readlink(f"/proc/{pid}/fd/{n}")
            except FileNotFoundError:
                pass                                      # closed meanwhile by the sampler
        assert fds[0] == "/dev/null"
        assert fds[1] == fds[2] == str(site.state / "jobs/4303/sampler.log")
        assert str(marker) not in fds.values()
    finally:
        assert run_node(["epilog"], site.env(job_id="4303", **CREDENTIAL)).returncode == 0
    assert not samplers_of("4303", site.state)


def test_the_sampler_reads_the_hooks_config_cache(site):
    """The job's sampler starts with the config the prolog just cached
    (config-cache.marshal in the state dir): no TOML parser at every job's start."""
    out = str(site.base / "modules-4302")
    assert _hook(site, "prolog", "4301", os.devnull).returncode == 0      # writes the cache
    assert _hook(site, "epilog", "4301", os.devnull).returncode == 0
    assert (site.state / "config-cache.marshal").exists()
    code = ("import sys\n"
            "from gsrun.node.sampler import main\n"
            "main(sys.argv[1:])\n"
            f"open({out!r}, 'w').write('\\n'.join(sorted(sys.modules)))\n")
    env = site.env(job_id="4302", **CREDENTIAL)
    cp = subprocess.run([sys.executable, "-P", "-c", code, "--job-id", "4302", "--uid", "65534", "--node",
                         "gpu-node01", "--gpus", "0", "--state-dir", str(site.state), "--spool-dir",
                         str(site.spool), "--host-root", str(site.host), "--max-samples", "1"],
                        env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert cp.returncode == 0, cp.stderr
    mods = set(open(out).read().split())
    assert "gsrun.node.sampler" in mods and "tomllib" not in mods
