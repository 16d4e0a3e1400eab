"""spank_py/build.py and the C shim, for real: compile ``gsrun_spank.so``
against /usr/include/slurm/spank.h and this Python, check its exported
symbols, and load it into a fake SPANK host (a small C program that provides
the spank_* / slurm_* symbols slurmstepd/sbatch would, and dlopen()s the
plugin RTLD_LOCAL like Slurm). The harness prints every call Slurm would see.

Skipped when there is no C compiler or no Slurm headers.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from gsrun.spank_py import build as spank_build

REPO = Path(__file__).resolve().parents[2]
SPANK_H = Path("/usr/include/slurm/spank.h")

pytestmark = pytest.mark.skipif(not SPANK_H.is_file() or not shutil.which("cc"),
                                reason="needs cc and the Slurm headers (libslurm-dev)")

HARNESS_C = (REPO / "tests" / "helpers" / "spank_harness.c").read_text()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("spank-build")
    so = spank_build.build(str(out), python=sys.executable)
    return so


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    d = tmp_path_factory.mktemp("spank-harness")
    src = d / "harness.c"
    src.write_text(HARNESS_C)
    exe = d / "harness"
    subprocess.run(["cc", "-O1", "-Wall", "-rdynamic", str(src), "-o", str(exe), "-ldl"],
                   check=True, timeout=120)
    return exe


def _site(tmp_path: Path, hooks_dir: Path) -> Path:
    """A site dir where ``gsrun`` is the checkout's core and ``gsrun.spank_py``
    is ``hooks_dir`` (the checkout's spank_py/ or a test double)."""
    site = tmp_path / "site"
    (site / "gsrun").mkdir(parents=True)
    (site / "_sub").mkdir()
    os.symlink(hooks_dir, site / "_sub" / "spank_py")
    (site / "gsrun" / "__init__.py").write_text(
        f"exec(open({str(REPO / 'gsrun' / '__init__.py')!r}).read())\n"
        f"__path__ = [{str(REPO / 'gsrun')!r}, {str(site / '_sub')!r}]\n")
    return site


def site_dirs() -> list[str]:
    """Every site directory this interpreter sees: its venv's, and the system's for a venv made
    ``--system-site-packages`` (a release root's, whose click is Debian's)."""
    std = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib")}
    return [p for p in sys.path if p and os.path.isdir(p) and p not in std
            and ("site-packages" in p or p.endswith("dist-packages"))]


def run_harness(harness, so, ctx, site, *args, opts="", env_extra=None, timeout_s=120, purelib=True):
    """The fake SPANK host in context ``ctx`` with ``pythonpath=site`` (and this
    interpreter's site directories unless ``purelib`` is False) -> (rc, stdout lines, stderr)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FAKE_OPTS": opts,
           # must be ignored: the plugin's interpreter is isolated from PYTHON* vars
           "PYTHONPATH": "/nonexistent", "PYTHONHOME": "/nonexistent"}
    env.update(env_extra or {})
    argv = [str(harness), str(so), ctx, f"pythonpath={site}",
            *([f"pythonpath={d}" for d in site_dirs()] if purelib else []), *args]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    return p.returncode, p.stdout.splitlines(), p.stderr


@pytest.fixture
def real_site(tmp_path):
    return _site(tmp_path, REPO / "spank_py")


def double_site(tmp_path, source: str) -> Path:
    d = tmp_path / "double"
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "hooks.py").write_text(source)
    return _site(tmp_path, d)


# ------------------------------------------------------------ the build

def test_exports_only_spank_and_plugin_symbols(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    names.discard("GSRUN_SPANK_1.0")
    assert names, out
    bad = sorted(n for n in names if not (n.startswith("slurm_spank_") or n.startswith("plugin_")))
    assert bad == [], bad
    assert {"plugin_name", "plugin_type", "plugin_version", "slurm_spank_init",
            "slurm_spank_init_post_opt", "slurm_spank_task_init", "slurm_spank_user_init",
            "slurm_spank_exit"} <= names
    # no job prolog/epilog: exporting them would make slurmd start a "slurmstepd spank
    # prolog|epilog" on every node of every job for nothing; no task hook but task_init
    assert not {"slurm_spank_job_prolog", "slurm_spank_job_epilog", "slurm_spank_task_init_privileged",
                "slurm_spank_task_post_fork", "slurm_spank_task_exit"} & names, names


def test_plugin_build_is_reproducible(built, tmp_path):
    """Same sources, same plugin bytes (SONAME the installed name, not the temp output's):
    tests/cluster/up restarts slurmd only when the plugin really changed."""
    again = spank_build.build(str(tmp_path / "again"), python=sys.executable)
    assert again.read_bytes() == built.read_bytes()
    dyn = subprocess.run(["readelf", "-d", str(built)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert "Library soname: [gsrun_spank.so]" in dyn, dyn


def test_the_header_names_the_node_daemons_default_socket():
    """Without plugstack daemon= slurmstepd asks the socket gsrun.daemon.server.default_socket()
    names without GSRUN_STATE_DIR: built into the plugin."""
    from gsrun.base.paths import DEFAULT_STATE_DIR
    from gsrun.daemon import server

    text = spank_build.options_header()
    assert f'#define GSRUN_DEFAULT_DAEMON_SOCKET "{server.default_socket(DEFAULT_STATE_DIR)}"\n' in text
    assert f'#define GSRUN_DAEMON_SOCKET_NAME "{server.SOCKET_NAME}"\n' in text
    assert "GSRUN_FORWARD_" not in text


@pytest.mark.parametrize("half", ["plugin", "python"])
def test_hardened_and_only_the_python_half_linked_to_this_python(built, half):
    """The plugin Slurm loads needs no libpython (it is dlopen()ed with the Python half
    only when Python runs); the Python half is linked to this Python's."""
    so = built if half == "plugin" else built.with_name(spank_build.PY_PART_NAME)
    dyn = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "BIND_NOW" in dyn and "NODELETE" in dyn
    assert (f"[{sysconfig.get_config_var('INSTSONAME')}]" in dyn) == (half == "python"), dyn
    assert "libpython" not in dyn or half == "python"
    hdr = subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "GNU_RELRO" in hdr
    assert "RWE" not in next(line for line in hdr.splitlines() if "GNU_STACK" in line)


def test_python_half_exports_only_its_entry_points(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built.with_name(spank_build.PY_PART_NAME))],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    assert names - {"GSRUN_SPANK_PY_1.0"} == {"gsrun_py_attach", "gsrun_py_dispatch"}


def test_build_records_slurm_version(built):
    num = spank_build.slurm_version_number("/usr/include")
    text = (Path("/usr/include/slurm/slurm_version.h")).read_text()
    assert f"{num:#x}" in text.lower()
    info = spank_build.read_build_info(built)
    assert info["slurm_version_number"] == num
    assert info["slurm_version"] == spank_build.format_slurm_version(num)
    assert info["python_version"] == sys.version.split()[0]
    # also inside the .so itself, without the JSON next to it
    alone = built.parent / "alone" / "gsrun_spank.so"
    alone.parent.mkdir(exist_ok=True)
    shutil.copy(built, alone)
    assert spank_build.read_build_info(alone)["slurm_version_number"] == num


def test_format_slurm_version():
    assert spank_build.format_slurm_version(0x160508) == "22.05.8"
    assert spank_build.format_slurm_version(0x180B01) == "24.11.1"


def test_missing_slurm_headers_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="slurm/spank.h not found") as ei:
        spank_build.find_slurm_include((str(tmp_path),))
    assert "libslurm-dev" in str(ei.value)


# ------------------------------------------------------------ loaded in a fake SPANK host

def test_allocator_registers_validates_and_exports(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "allocator", real_site,
                               opts="gs-mps=50;gs-tune=swappiness=10;gs-report=mail")
    assert rc == 0, (out, err)
    assert f"PLUGIN spank gsrun {spank_build.slurm_version_number('/usr/include'):#x}" in out
    assert "REGISTER gs-mps has_arg=2 arginfo=PCT" in out
    assert [l for l in out if l.startswith("REGISTER")] == [
        "REGISTER gs-mps has_arg=2 arginfo=PCT", "REGISTER gs-mig has_arg=1 arginfo=LAYOUT",
        "REGISTER gs-tune has_arg=1 arginfo=LIST", "REGISTER gs-bind has_arg=1 arginfo=MODE",
        "REGISTER gs-report has_arg=1 arginfo=MODE"]
    assert [l for l in out if l.startswith("JOBCONTROL")] == [
        "JOBCONTROL SPANK_GS_MPS=50", "JOBCONTROL SPANK_GS_TUNE=swappiness=10", "JOBCONTROL SPANK_GS_REPORT=mail"]
    assert "RC slurm_spank_init_post_opt 0" in out and out[-1] == "DONE"
    assert not [l for l in out if l.startswith("ERROR")]


def test_mps_flag_without_value(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "allocator", real_site, opts="gs-mps")
    assert rc == 0, (out, err)
    assert [l for l in out if l.startswith("JOBCONTROL")] == ["JOBCONTROL SPANK_GS_MPS="]


def test_allocator_bad_value_fails_submission(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "allocator", real_site, opts="gs-tune=bogus=1")
    assert rc == 11, (out, err)                         # init_post_opt failed: sbatch stops
    assert "RC slurm_spank_init_post_opt -1" in out
    errors = [l for l in out if l.startswith("ERROR: ")]
    assert errors[0].startswith("ERROR: gsrun: spank: --gs-tune=bogus=1: ")
    assert "bogus" in errors[0] and any("hint:" in e for e in errors)
    assert not [l for l in out if l.startswith("JOBCONTROL")]


def test_remote_binds_in_forked_tasks(built, harness, real_site, node_daemon):
    """slurmstepd asks the node daemon for the step's plan (gsrun.spank_py.hooks.step_actions) in
    user_init, task_init in each forked child applies its rank's part in C: the binding, the MPS
    env for the job, no crash, and no Python in slurmstepd."""
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}", opts="gs-mps=50")
    assert rc == 0, (out, err)
    for t in (0, 1):
        assert f"CHILD {t} exit=0 signaled=0" in out, (out, err)
    assert out.count("RC slurm_spank_task_init 0") == 2
    assert [l for l in out if l.startswith("SETENV LOCAL_RANK=")] == ["SETENV LOCAL_RANK=0", "SETENV LOCAL_RANK=1"]
    assert out.count("SETENV CUDA_MPS_PIPE_DIRECTORY=/run/gsrun/mps/4242/pipe") == 2
    # the affinity the task really has after task_init = the plan's CPUs for its rank
    from gsrun.base.cpulist import parse_cpulist
    planned = [l.split("=", 1)[1] for l in out if l.startswith("SETENV GSRUN_BIND_CPUS=")]
    counts = [int(l.rsplit("cpus=", 1)[1]) for l in out if l.startswith("TASK ")]
    assert len(planned) == 2 and counts == [len(parse_cpulist(p)) for p in planned], out
    assert "LIBPYTHON mapped=0" in out and "PYPART mapped=0" in out
    assert not [l for l in out if l.startswith("ERROR")], out
    assert out[-1] == "DONE"


def test_job_script_context_runs_without_error(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "job_script", real_site)
    # not exported (see test_exports_only_spank_and_plugin_symbols): slurmd would not even start it
    assert rc == 0 and "MISSING slurm_spank_job_prolog" in out, (out, err)
    assert "RC slurm_spank_init 0" in out and "RC slurm_spank_exit 0" in out, (out, err)
    assert not [l for l in out if l.startswith("ERROR")]


def test_slurmd_context_never_starts_python(built, harness, tmp_path):
    site = double_site(tmp_path, "raise RuntimeError('imported in slurmd')\n")
    rc, out, err = run_harness(harness, built, "slurmd", site)
    assert rc == 0 and "RC slurm_spank_init 0" in out, (out, err)
    assert not [l for l in out if l.startswith(("ERROR", "REGISTER"))]


# ------------------------------------------------------------ an unused plugin costs nothing

BROKEN = "raise ImportError('gsrun half installed: broken on purpose')\n"
COMPILED_TABLE = ["REGISTER gs-mps has_arg=2 arginfo=PCT", "REGISTER gs-mig has_arg=1 arginfo=LAYOUT",
                  "REGISTER gs-tune has_arg=1 arginfo=LIST", "REGISTER gs-bind has_arg=1 arginfo=MODE",
                  "REGISTER gs-report has_arg=1 arginfo=MODE"]


@pytest.mark.parametrize("ctx,args,env_extra", [
    ("allocator", (), {}),                                   # sbatch / salloc
    ("local", (), {}),                                       # srun
    ("remote", ("bind=none",), {}),                          # slurmstepd, site does not bind
    ("remote", (), {"FAKE_STEPID": "0xfffffffb"}),          # slurmstepd, batch step: never bound
    ("remote", (), {"FAKE_STEPID": "0xfffffffc"}),          # extern step
    ("job_script", (), {}),                                  # SPANK prolog/epilog
])
def test_no_gs_option_never_starts_python(built, harness, tmp_path, ctx, args, env_extra):
    """Without --gs-* options the Python side is never imported (here it
    cannot be: importing it raises), so a broken install cannot block a job:
    the options are still registered from the compiled-in table."""
    site = double_site(tmp_path, BROKEN)
    rc, out, err = run_harness(harness, built, ctx, site, *args, env_extra=env_extra)
    assert rc == 0, (out, err)
    assert [l for l in out if l.startswith("REGISTER")] == COMPILED_TABLE
    assert "RC slurm_spank_init_post_opt 0" in out and out[-1] == "DONE"
    assert not [l for l in out if l.startswith("ERROR")], out
    assert "LIBPYTHON mapped=0" in out and "PYPART mapped=0" in out     # the process never mapped libpython


def test_gs_option_maps_libpython_and_runs_the_hooks(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "allocator", real_site, opts="gs-mps=50")
    assert rc == 0, (out, err)
    assert "LIBPYTHON mapped=1" in out and out[-1] == "DONE"


def test_missing_python_half_refuses_gs_options_and_passes_plain_jobs(built, harness, real_site, tmp_path):
    """A plugin installed without its Python half: plain jobs as if absent; --gs-* refused, saying why."""
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(built, lone / built.name)
    rc, out, err = run_harness(harness, lone / built.name, "allocator", real_site)
    assert rc == 0 and "LIBPYTHON mapped=0" in out, (out, err)
    rc, out, err = run_harness(harness, lone / built.name, "allocator", real_site, opts="gs-mps=50")
    assert rc == 11, (out, err)
    errors = [l[len("ERROR: "):] for l in out if l.startswith("ERROR: ")]
    assert errors[0].startswith(f"gsrun: spank: python: cannot load {lone / spank_build.PY_PART_NAME}"), errors
    assert errors[1].startswith("hint: install both halves of the plugin side by side"), errors
    assert "gsrun: spank: options: --gs-mps given, but gsrun's Python side cannot be loaded on this host: " \
           "job refused (its options could not be honoured)" in errors


@pytest.mark.parametrize("ctx", ["allocator", "local"])
def test_broken_python_side_refuses_gs_options_with_the_reason(built, harness, tmp_path, ctx):
    site = double_site(tmp_path, BROKEN)
    rc, out, err = run_harness(harness, built, ctx, site, opts="gs-mps=50;gs-tune=swappiness=10")
    assert rc == 11 and "RC slurm_spank_init_post_opt -1" in out, (out, err)   # sbatch/srun stop here
    assert "RC slurm_spank_init 0" in out                                       # init itself never fails
    errors = [l[len("ERROR: "):] for l in out if l.startswith("ERROR: ")]
    assert errors[0].startswith("gsrun: spank: python: cannot import gsrun.spank_py.hooks"), errors
    assert any("ImportError: gsrun half installed: broken on purpose" in e for e in errors), errors
    assert ("gsrun: spank: options: --gs-mps, --gs-tune given, but gsrun's Python side cannot be loaded "
            "on this host: job refused (its options could not be honoured)") in errors
    assert errors[-1] == "hint: submit without --gs-* options, or ask the admin to repair gsrun " \
                         "(gsrun-node doctor names the cause)"
    assert not [l for l in out if l.startswith("JOBCONTROL")]


@pytest.mark.parametrize("args,env_extra", [
    ((), {}),                                                           # a bound step, no option
    ((), {"FAKE_GETOPT": "gs-mps=50"}),                                 # bound, MPS
    ((), {"FAKE_GETOPT": "gs-bind=isolate"}),
    ((), {"FAKE_GETOPT": "gs-report=none"}),                            # an option for the prolog only
    (("bind=none",), {"FAKE_GETOPT": "gs-mps"}),                        # MPS only
    ((), {"FAKE_GETOPT": "gs-mps=50", "FAKE_STEPID": "0xfffffffb"}),   # batch step: MPS only
])
def test_slurmstepd_never_starts_python(built, harness, tmp_path, node_daemon, args, env_extra):
    """Whatever the step: slurmstepd's plan comes from the node daemon, and the plugin never
    starts Python there -- the Python side here cannot even be imported, libpython and the
    plugin's Python half are never mapped, and the harness's own Py_IsInitialized aborts the
    host (PY_INIT ..., SIGABRT) if the plugin asks for the interpreter in slurmstepd."""
    site = double_site(tmp_path, BROKEN)
    rc, out, err = run_harness(harness, built, "remote", site, f"daemon={node_daemon}", *args, env_extra=env_extra)
    assert rc == 0, (out, err)
    assert "CHILD 0 exit=0 signaled=0" in out and "CHILD 1 exit=0 signaled=0" in out, out
    assert not [l for l in out if l.startswith(("PY_INIT", "ERROR"))], out
    assert "LIBPYTHON mapped=0" in out and "PYPART mapped=0" in out, out
    assert [l for l in out if l.startswith("SETENV ")], out
    # the daemon gone: said, the step unbound; never Python instead
    rc, out, err = run_harness(harness, built, "remote", site, f"daemon={node_daemon}.gone", *args,
                               env_extra=env_extra)
    assert rc == 0 and "LIBPYTHON mapped=0" in out and "PYPART mapped=0" in out, (out, err)
    assert not [l for l in out if l.startswith(("PY_INIT", "SETENV ", "UNSETENV "))], out
    assert any(f"gsrun: spank: node daemon not running: {node_daemon}.gone" in l for l in out), out


def test_option_forwarded_to_slurmstepd_gets_the_mps_env_from_the_daemon(built, harness, real_site, node_daemon):
    """bind=none: only the job's own --gs-mps (Slurm forwards it; the shim asks
    spank_option_getopt) makes slurmstepd ask the daemon, for the MPS env."""
    rc, out, err = run_harness(harness, built, "remote", real_site, "bind=none", f"daemon={node_daemon}",
                               env_extra={"FAKE_GETOPT": "gs-mps=50", "FAKE_STEPID": "0xfffffffb"})
    assert rc == 0, (out, err)
    assert "GETOPT gs-mps" in out
    assert out.count("SETENV CUDA_MPS_PIPE_DIRECTORY=/run/gsrun/mps/4242/pipe") == 2
    assert not [l for l in out if l.startswith("SETENV GSRUN_BIND_CPUS=")]   # batch step: not bound
    assert not [l for l in out if l.startswith("ERROR")], out                 # every task: "rank *"


def test_extern_step_never_asks_the_daemon(built, harness, real_site, tmp_path):
    """slurmstepd never runs user_init for the extern step: even with the job's --gs-mps the plugin
    opens no @bind there (a plan process would wait for an @step that never comes)."""
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={tmp_path / 'nobody.sock'}",
                               env_extra={"FAKE_GETOPT": "gs-mps=50", "FAKE_STEPID": "0xfffffffc"})
    assert rc == 0 and "RC slurm_spank_init_post_opt 0" in out, (out, err)
    assert not [l for l in out if l.startswith(("ERROR", "SETENV ", "UNSETENV "))], out


def read_bind_and_step(c) -> bytes:
    """Read the plugin's ``@bind`` frame, then its ``@step`` frame (both may come in one read) -> the
    ``@step`` frame, length prefix included; ``b""`` when the plugin closes instead."""
    def size(buf: bytes, at: int) -> int | None:     # a frame's length with its prefix, once its prefix is there
        return 4 + int.from_bytes(buf[at:at + 4], "big") if len(buf) >= at + 4 else None

    c.settimeout(5)
    buf = b""
    while not ((n := size(buf, 0)) and (m := size(buf, n)) and len(buf) >= n + m):
        if not (chunk := c.recv(1 << 20)):
            break
        buf += chunk
    return buf[size(buf, 0):]


def run_with_plan(harness, built, real_site, tmp_path, plan: bytes):
    """The harness's remote side with a fake node daemon that answers ``plan`` -> (rc, out, err)."""
    def serve(c):
        read_bind_and_step(c)
        c.sendall(plan)

    srv, path, t = fake_daemon(tmp_path, serve, connections=1)
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={path}")
    t.join(30)
    srv.close()
    return rc, out, err


@pytest.mark.parametrize("ntasks", ["2", "5", "0"])
def test_the_step_request_carries_slurmstepds_task_count(built, harness, real_site, tmp_path, ntasks):
    """The plugin's ``@step`` has the 9 fields the daemon reads (gsrun.daemon.server._bind_child), the last
    slurmstepd's task count on the node (the plan's ranks, never the job environment's); without a count
    it asks for no plan and says why."""
    from contextlib import suppress

    from gsrun.daemon import server

    got = []

    def serve(c):
        got.append(read_bind_and_step(c))
        with suppress(OSError):
            c.sendall(b"GSA1\nend\n")

    srv, path, t = fake_daemon(tmp_path, serve, connections=1)
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={path}", env_extra={"FAKE_NTASKS": ntasks})
    t.join(30)
    srv.close()
    assert rc == 0, (out, err)
    if ntasks == "0":
        assert got == [b""], got
        assert any("the step's task count on this node is unknown" in l for l in out), out
        return
    argv, env, _umask = server.parse_request(got[0][4:])
    assert len(argv) == 9 and argv[0] == "@step" and argv[3:5] == ["4242", "0"] and argv[8] == ntasks, argv
    assert env.get("SLURM_STEP_TASKS_PER_NODE") == "2", env


def test_a_plan_is_applied_in_c_per_rank(built, harness, real_site, tmp_path):
    """task_init applies the task's block of the daemon's plan; a rank without one is an error and
    gets the "rank *" block. Failing affinity or memory policy is logged, the task runs."""
    assert os.cpu_count() < 1024
    plan = (b"GSA1\nrank 0\nunset DROP_ME\nset ZERO=0\ncpus 1023\nmems 1000\n"
            b"rank *\nset OTHER=1\nnote planned by a double\nend\n")
    rc, out, err = run_with_plan(harness, built, real_site, tmp_path, plan)
    assert rc == 0, (out, err)
    assert "VERBOSE: gsrun: spank: bind: planned by a double" in out
    t0 = out[out.index("RC slurm_spank_user_init 0") + 1:out.index("CHILD 0 exit=0 signaled=0")]
    assert t0[:3] == ["UNSETENV DROP_ME", "SETENV ZERO=0",
                      "ERROR: gsrun: spank: bind: task 0: sched_setaffinity 1023: Invalid argument"], t0
    assert t0[3].startswith("VERBOSE: gsrun: spank: bind: task 0: set_mempolicy: "), t0
    t1 = out[out.index("CHILD 0 exit=0 signaled=0") + 1:out.index("CHILD 1 exit=0 signaled=0")]
    assert t1[:2] == ["MISSING slurm_spank_task_exit", "ERROR: gsrun: spank: bind: task 1: no such local rank in "
                      "the plan (1 ranks): it runs with Slurm's binding"], t1
    assert t1[2] == "SETENV OTHER=1", t1
    cpus = len(os.sched_getaffinity(0))
    assert [l for l in out if l.startswith("TASK ")] == [f"TASK 0 pid-ok cpus={cpus}", f"TASK 1 pid-ok cpus={cpus}"]


def test_a_plan_for_the_most_ranks_a_node_may_run_is_read_whole(built, harness, real_site, tmp_path):
    """A plan naming every local rank a plan may name (4096, each with the env lines a bound rank
    of an 8-GPU step gets: ~2.5 MiB) reaches task_init whole: each task gets its own block."""
    gpus = ",".join(f"GPU-{g:08x}-1111-2222-3333-444455556666" for g in range(8))
    env = (f"set LOCAL_WORLD_SIZE=4096\nset OMP_NUM_THREADS=1\nset CUDA_VISIBLE_DEVICES={gpus}\n"
           "set CUDA_DEVICE_ORDER=PCI_BUS_ID\nset NCCL_IB_HCA=mlx5_0,mlx5_1\nset NCCL_SOCKET_IFNAME=ib0\n")
    plan = ("GSA1\n" + "".join(f"rank {r}\nset LOCAL_RANK={r}\n{env}cpus 0\nmems 0\n" for r in range(4096))
            + "end\n").encode()
    assert 2 << 20 < len(plan) < 16 << 20
    rc, out, err = run_with_plan(harness, built, real_site, tmp_path, plan)
    assert rc == 0 and not [l for l in out if l.startswith("ERROR")], (out, err)
    assert {l for l in _binding(out) if l.startswith("SETENV LOCAL_RANK=")} == {"SETENV LOCAL_RANK=0",
                                                                             "SETENV LOCAL_RANK=1"}, out
    assert [l for l in out if l.startswith("TASK ")] == ["TASK 0 pid-ok cpus=1", "TASK 1 pid-ok cpus=1"], out


def test_a_step_that_cannot_be_bound_still_gets_the_mps_env(built, harness, real_site, tmp_path, node_daemon):
    empty = tmp_path / "no-host"
    empty.mkdir()
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}",
                               env_extra={"FAKE_GETOPT": "gs-mps=50", "GSRUN_HOST_ROOT": str(empty)})
    assert rc == 0, (out, err)
    assert any(l.startswith("VERBOSE: gsrun: spank: bind: bind: ") and "run with Slurm's binding" in l
               for l in out), out
    assert "CHILD 0 exit=0 signaled=0" in out and "CHILD 1 exit=0 signaled=0" in out, out
    assert out.count("SETENV CUDA_MPS_PIPE_DIRECTORY=/run/gsrun/mps/4242/pipe") == 2
    assert not [l for l in out if l.startswith("SETENV GSRUN_BIND_CPUS=")]


def test_option_table_header_is_generated_from_hooks():
    from gsrun.spank_py import hooks
    text = spank_build.options_header()
    assert f"#define GSRUN_N_OPTS {len(hooks.OPTIONS)}" in text
    for name, arginfo, usage, has_arg in hooks.OPTIONS:
        info = "NULL" if arginfo is None else f'"{arginfo}"'
        assert f'{{ "{name}", {info}, "{usage}", {has_arg} }},' in text


@pytest.mark.parametrize("rows,needle", [
    ([("Bad Name", None, "x", 0)], "row 0: bad or repeated option name 'Bad Name'"),
    ([("gs-a", None, "x", 0), ("gs-a", None, "y", 0)], "row 1: bad or repeated option name 'gs-a'"),
    ([("gs-" + "a" * 73, None, "x", 0)], "bad or repeated option name"),
    ([("gs-a", None, "x", 3)], "--gs-a: has_arg 3 must be 0, 1 or 2"),
    ([("gs-a", None, "tab\there", 0)], "--gs-a usage 'tab\\there' has characters outside printable ASCII"),
    ([("gs-a", None, "x")], "row 0 is not (name, arginfo|None, usage, has_arg)"),
    ([], "0 options; 1 to 32 allowed"),
])
def test_bad_option_table_fails_the_build(rows, needle):
    with pytest.raises(spank_build.NodeError) as ei:
        spank_build.options_header(rows)
    assert needle in str(ei.value)


def test_option_text_is_escaped_for_c():
    text = spank_build.options_header([("gs-a", 'Q"', 'say "hi" \\ bye', 1)])
    assert '{ "gs-a", "Q\\"", "say \\"hi\\" \\\\ bye", 1 },' in text


@pytest.mark.parametrize("args,needle,hint", [
    (["colour=blue"], "unknown plugstack argument 'colour'", "hint: allowed keys: pythonpath="),
    (["on_error=maybe"], "on_error=maybe: must be fail or ignore", None),
    (["bind=spread"], "bind=spread: must be auto or none", None),
    (["pythonpath=relative/dir"], "pythonpath=relative/dir: must be one absolute directory", "hint: repeat"),
    (["justaword"], "is not key=value", "hint: allowed keys: pythonpath="),
])
def test_plugstack_args_are_strict(built, harness, real_site, args, needle, hint):
    rc, out, err = run_harness(harness, built, "remote", real_site, *args)
    assert rc == 10 and "RC slurm_spank_init -1" in out, (out, err)
    assert any(needle in l for l in out if l.startswith("ERROR: gsrun: spank: config: ")), out
    if hint:                                      # the fix on its own line, as gsrun.base.errors prints it
        assert any(l.startswith("ERROR: " + hint) for l in out), out


def test_refuses_other_slurm_release(built, harness, real_site):
    """A release other than the one of the headers it was built with (the harness answers that one
    unless told): refused, whichever Slurm the test runs on."""
    num = spank_build.slurm_version_number("/usr/include")
    other = {"FAKE_MAJOR": str((num >> 16 & 0xff) + 1), "FAKE_MINOR": f"{num >> 8 & 0xff:02d}"}
    rc, out, err = run_harness(harness, built, "allocator", real_site, env_extra=other)
    assert rc == 10, (out, err)
    assert (f"ERROR: gsrun: spank: version: gsrun_spank.so was built for Slurm "
            f"{num >> 16 & 0xff}.{num >> 8 & 0xff:02d} but this is Slurm fake-version; refusing to load") in out
    assert any("gsrun-node spank build" in l for l in out)


RAISING = """
import sys
def slurm_spank_init(ctx, args):
    return 0
def slurm_spank_init_post_opt(ctx, args):
    raise ValueError("boom in post_opt\\nhint: try again")
def slurm_spank_local_user_init(ctx, args):
    sys.exit(3)                       # must not end srun
def slurm_spank_exit(ctx, args):
    import _json, _spank               # a lib-dynload C extension: libpython symbols are global
    assert _spank.option_getopt("gs-report") == "mail"
    _spank.log("info", "exit ok %s" + _spank.context())
    return "not an int"
"""


def test_python_errors_never_crash_the_host(built, harness, tmp_path):
    site = double_site(tmp_path, RAISING)
    rc, out, err = run_harness(harness, built, "local", site, "on_error=ignore", opts="gs-report=mail")
    assert rc == 0, (out, err)
    # on_error=ignore: every failing hook logged, rc 0, nothing crashed
    assert "ERROR: gsrun: spank: slurm_spank_init_post_opt: ValueError: boom in post_opt" in out
    assert "ERROR: hint: try again" in out            # a GsrunError's hint: its own line, as Python prints it
    assert any(l.startswith("ERROR: gsrun: spank: slurm_spank_init_post_opt: Traceback") for l in out)
    assert any("hooks.py" in l and "line 6" in l for l in out if "post_opt" in l)
    assert "ERROR: gsrun: spank: slurm_spank_local_user_init: SystemExit: 3" in out
    assert "RC slurm_spank_local_user_init 0" in out
    assert "ERROR: gsrun: spank: slurm_spank_exit: returned str, expected int or None" in out
    assert "INFO: exit ok %slocal" in out             # user text is never a format string
    assert "RC slurm_spank_exit 0" in out and out[-1] == "DONE"


def test_on_error_fail_makes_remote_hook_fail(built, harness, real_site, tmp_path):
    """slurmstepd with no daemon to plan its step: logged and the step runs unbound (remote default
    on_error=ignore), or the step fails with on_error=fail."""
    gone = f"daemon={tmp_path}/no-daemon.sock"
    rc, out, err = run_harness(harness, built, "remote", real_site, gone)
    assert rc == 0 and "RC slurm_spank_init_post_opt 0" in out, (out, err)
    rc, out, err = run_harness(harness, built, "remote", real_site, gone, "on_error=fail")
    assert rc == 11 and "RC slurm_spank_init_post_opt -1" in out, (out, err)


def test_exception_in_allocator_fails_by_default_and_ignore_overrides(built, harness, tmp_path):
    site = double_site(tmp_path, RAISING)
    rc, out, _ = run_harness(harness, built, "allocator", site, opts="gs-report=mail")
    assert rc == 11
    rc, out, _ = run_harness(harness, built, "allocator", site, "on_error=ignore", opts="gs-report=mail")
    assert rc == 0 and "RC slurm_spank_init_post_opt 0" in out


def test_import_failure_is_reported_with_hint(built, harness, tmp_path):
    site = double_site(tmp_path, "import gsrun_no_such_module\n")
    rc, out, err = run_harness(harness, built, "allocator", site, opts="gs-bind=none")
    assert rc == 11, (out, err)                      # sbatch with --gs-*: fail loudly
    assert any(l.startswith("ERROR: gsrun: spank: python: cannot import gsrun.spank_py.hooks") for l in out)
    assert any("ModuleNotFoundError: No module named 'gsrun_no_such_module'" in l for l in out)
    assert any("hint: install gsrun" in l for l in out)
    rc, out, _ = run_harness(harness, built, "allocator", site)
    assert rc == 0 and not [l for l in out if l.startswith("ERROR")]   # plain sbatch: as if no plugin


# ------------------------------------------------------------ a lean interpreter

SITE_PROBE = """
import sys
def slurm_spank_init_post_opt(ctx, args):
    import _spank
    _spank.log("info", "site imported=%s" % ("site" in sys.modules))
    return 0
"""


def test_site_and_pth_files_are_not_processed_when_gsrun_is_on_pythonpath(built, harness, tmp_path):
    """`site` (and the .pth files' own imports) cost ~2-3 ms per process: not
    imported when the hooks are found on pythonpath= directly."""
    site = double_site(tmp_path, SITE_PROBE)
    (site / "zz_probe.pth").write_text("import sys; sys.stdout.write('PTH RAN\\n')\n")
    rc, out, err = run_harness(harness, built, "allocator", site, opts="gs-report=none")
    assert rc == 0, (out, err)
    assert "INFO: site imported=False" in out
    assert "PTH RAN" not in out


def test_editable_install_reached_through_a_pth_file(built, harness, real_site, tmp_path):
    """gsrun reachable only through a .pth file of a pythonpath= folder (an
    editable install, its dependencies beside it): the .pth files are processed and the import retried."""
    only_pth = tmp_path / "only-pth"
    only_pth.mkdir()
    (only_pth / "gsrun-editable.pth").write_text(f"{real_site}\n" + "".join(f"{d}\n" for d in site_dirs()))
    rc, out, err = run_harness(harness, built, "allocator", only_pth, opts="gs-mps=50", purelib=False)
    assert rc == 0, (out, err)
    assert "JOBCONTROL SPANK_GS_MPS=50" in out
    assert not [l for l in out if l.startswith("ERROR")]


def test_not_found_even_through_pth_files_reports_the_first_error(built, harness, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "other.pth").write_text(f"{tmp_path / 'nowhere'}\n")
    rc, out, err = run_harness(harness, built, "allocator", empty, opts="gs-mps=50", purelib=False)
    assert rc == 11, (out, err)
    errors = [l[len("ERROR: "):] for l in out if l.startswith("ERROR: ")]
    assert errors[0].startswith("gsrun: spank: python: cannot import gsrun.spank_py.hooks"), errors
    assert any("ModuleNotFoundError: No module named 'gsrun'" in e for e in errors), errors
    assert any("job refused" in e for e in errors), errors


# ------------------------------------------------------------ the step's plan from the node daemon

@pytest.fixture
def node_daemon(tmp_path):
    """``gsrun-node daemon run`` of this checkout on a private socket -> its path."""
    from helpers.node_site import LAUNCH

    d = tmp_path / "daemon-run"
    d.mkdir(mode=0o700)
    sock = d / "daemon.sock"
    log = open(tmp_path / "daemon.log", "w")
    p = subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "daemon", "run", "--socket", str(sock)],
                         stdout=log, stderr=subprocess.STDOUT, cwd="/")
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert sock.exists(), (tmp_path / "daemon.log").read_text()
    yield sock
    p.terminate()
    p.wait(timeout=30)


def _binding(out: list[str]) -> list[str]:
    return [l for l in out if l.startswith(("SETENV ", "UNSETENV ", "TASK "))]


def test_without_daemon_argument_slurmstepd_asks_the_default_socket(built, harness, real_site, node_daemon):
    """No plugstack daemon=: the socket gsrun.daemon.server.default_socket() names in slurmstepd --
    <$GSRUN_STATE_DIR>/daemon.sock, else the default built in -- gives the same plan."""
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}")
    assert rc == 0 and "LIBPYTHON mapped=0" in out, (out, err)
    named = _binding(out)
    assert len([l for l in named if l.startswith("SETENV GSRUN_BIND_CPUS=")]) == 2, out
    rc, out, err = run_harness(harness, built, "remote", real_site,
                               env_extra={"GSRUN_STATE_DIR": str(node_daemon.parent)})
    assert rc == 0 and _binding(out) == named and "LIBPYTHON mapped=0" in out, (out, err)
    assert not [l for l in out if l.startswith("ERROR")], out
    from gsrun.base.paths import DEFAULT_STATE_DIR
    from gsrun.daemon import server

    default = server.default_socket(DEFAULT_STATE_DIR)
    if os.path.exists(default):
        pytest.skip(f"{default} exists on this host: a node daemon may serve it")
    rc, out, err = run_harness(harness, built, "remote", real_site)
    assert rc == 0 and "LIBPYTHON mapped=0" in out, (out, err)
    assert not [l for l in _binding(out) if not l.startswith("TASK ")], out
    errors = [l[len("ERROR: "):] for l in out if l.startswith("ERROR: ")]
    assert errors[0].startswith(f"gsrun: spank: node daemon not running: {default}: "), errors
    assert errors[1] == "hint: systemctl start gsrun-daemon on this node; this step runs with Slurm's own binding"


def fake_daemon(tmp_path, serve, connections: int):
    """A stand-in for the node daemon on a fresh socket: ``serve(conn)`` for each of the first
    ``connections`` clients, in a thread -> (listening socket, its path, the thread)."""
    import socket
    import threading

    d = tmp_path / "fake-daemon"
    d.mkdir(mode=0o700)
    path = str(d / "daemon.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)

    def loop():
        for _ in range(connections):
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                serve(c)
            except OSError:
                pass
            finally:
                c.close()
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return srv, path, t


@pytest.mark.parametrize("answer", [b"", b"error InputError: boom\n", b"GSA1\nrank 0\nset 1X=y\nend\n",
                                    b"GSA1\nrank 99999999999\nend\n", b"GSA1\nrank 4096\nend\n",
                                    b"GSA1\nrank -1\nend\n", b"GSA1\nrank 0\nrank 0\nend\n",
                                    b"GSA1\nrank 0\ncpus 0,5000\nend\n", b"GSA1\nrank 0\nunset A-B\nend\n",
                                    b"GSA1\nrank 0\n", b"GSA1\nset A=1\nend\n", b"nope\n"])
def test_a_daemon_that_gives_no_plan_leaves_the_step_unbound_and_says_so(built, harness, real_site, tmp_path,
                                                                        answer):
    """A listener that closes without a plan, answers an error or a plan the plugin must not
    apply (a name that is no environment name, a rank or CPU out of range, a repeated rank, a line
    outside a rank block, no "end", no "GSA1"): the error is logged, the tasks keep Slurm's binding,
    nothing of the bad plan is applied and no Python starts in slurmstepd."""
    def serve(c):
        c.settimeout(5)
        c.recv(1 << 20)     # @bind
        c.recv(1 << 20)     # @step
        c.sendall(answer)

    srv, path, _t = fake_daemon(tmp_path, serve, connections=2)
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={path}")
    srv.close()
    assert rc == 0, (out, err)
    assert not [l for l in _binding(out) if not l.startswith("TASK ")] and "LIBPYTHON mapped=0" in out, out
    assert any("no plan from the node daemon" in l for l in out if l.startswith("ERROR")), out


def test_daemon_argument_must_be_absolute(built, harness, real_site):
    rc, out, err = run_harness(harness, built, "remote", real_site, "daemon=run/daemon.sock")
    assert rc != 0 and any("daemon=run/daemon.sock: must be an absolute path" in l for l in out + err.splitlines())


def test_the_hello_carries_slurmstepds_own_config_variables(built, harness, real_site, tmp_path):
    """@bind carries slurmstepd's GSRUN_HOST_ROOT, GSRUN_STATE_DIR, GSRUN_CONFIG and SLURM_CONF
    (gsrun.daemon.server.STEPD_ENV: the config beside slurm.conf is the site's when GSRUN_CONFIG is unset)."""
    from gsrun.daemon import server

    got = []

    def serve(c):
        argv, env, _umask, fds = server._read_request(c, timeout_s=30)
        for fd in fds:      # the harness's stdout among them: kept open, run_harness never ends
            os.close(fd)
        got.append((argv, env))

    srv, path, t = fake_daemon(tmp_path, serve, connections=1)
    stepd = {"GSRUN_HOST_ROOT": "/", "GSRUN_STATE_DIR": str(tmp_path / "state"),
             "GSRUN_CONFIG": str(tmp_path / "g.toml"), "SLURM_CONF": str(tmp_path / "slurm.conf")}
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={path}", env_extra=stepd)
    t.join(30)
    srv.close()
    assert rc == 0, (out, err)
    argv, env = got[0]
    assert argv == [server.BIND_REQUEST] and env == stepd
    assert set(env) == set(server.STEPD_ENV)


def test_remote_options_are_the_fields_the_plugin_sends():
    """gsrun.spank_py.hooks.REMOTE_OPTIONS (compiled into the plugin) is every option whose value
    the plugin sends with a step's request (option_field): a step given only the others (for the
    prolog) is planned as one without options."""
    import re

    from gsrun.spank_py import hooks

    source = (REPO / "spank_py" / "gsrun_spank.c").read_text()
    sent = set(re.findall(r'option_field\(sp, "([a-z0-9-]+)"', source))
    assert sent == set(hooks.REMOTE_OPTIONS)
    assert set(hooks.REMOTE_OPTIONS) <= {row[0] for row in hooks.OPTIONS}
    assert '#define GSRUN_REMOTE_OPTIONS "gs-mps", "gs-bind", ' in spank_build.options_header()


def test_a_step_with_only_prolog_options_is_planned_as_one_without(built, harness, real_site, node_daemon):
    """--gs-report, --gs-tune...: the prolog's, forwarded to every step of the job; they change
    nothing for the tasks, so the step is planned as one without options, and with bind=none
    slurmstepd does not even ask the daemon. --gs-mps changes the tasks' environment: the
    daemon plans that step with the MPS client environment for every task."""
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}")
    plain = _binding(out)
    assert rc == 0 and plain, (out, err)
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}",
                               env_extra={"FAKE_GETOPT": "gs-report=none"})
    assert rc == 0 and _binding(out) == plain and "LIBPYTHON mapped=0" in out, (out, err)
    rc, out, err = run_harness(harness, built, "remote", real_site, "bind=none", f"daemon={node_daemon}.gone",
                               env_extra={"FAKE_GETOPT": "gs-report=none"})
    assert rc == 0 and "LIBPYTHON mapped=0" in out, (out, err)      # nothing to do: not asked
    assert not [l for l in out if l.startswith(("SETENV ", "UNSETENV ", "ERROR"))], out
    rc, out, err = run_harness(harness, built, "remote", real_site, f"daemon={node_daemon}",
                               env_extra={"FAKE_GETOPT": "gs-mps=50"})
    assert rc == 0 and "LIBPYTHON mapped=0" in out, (out, err)
    assert out.count("SETENV CUDA_MPS_PIPE_DIRECTORY=/run/gsrun/mps/4242/pipe") == 2
    assert [l for l in _binding(out) if "CUDA_MPS" not in l] == plain, out
