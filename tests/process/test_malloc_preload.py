"""``gsrun --malloc``: the rendered preload snippet run by bash with fake library
directories and a fake ``ldconfig`` (what a node would find at run time), and
the allow-lists that keep every value out of the shell's reach.

The snippet is cut from the real rendered script (from the ``# --malloc`` comment
to ``srun``), so what runs here is byte for byte what a job runs; ``srun`` is
replaced by printing the environment the tasks would inherit.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from click.testing import CliRunner

from gsrun.base.errors import InputError
from gsrun.request.config import parse_config
from gsrun.request.malloc import JEMALLOC_CONF, malloc_env, parse_malloc
from gsrun.wrapper.render import render_script
from gsrun.wrapper.spec import JobSpec

pytestmark = pytest.mark.process


def spec(malloc="jemalloc", dirs=("/nonexistent",), env=None, cuda=None) -> JobSpec:
    if env is None:
        env = malloc_env(malloc, JEMALLOC_CONF, {"TCMALLOC_RELEASE_RATE": "2.5"}) if malloc else ()
    return JobSpec(gpus=1, nodes=1, gpus_per_node=1, command=("true",), job_name="t", malloc=malloc,
                   malloc_env=env, malloc_lib_dirs=tuple(dirs), cuda_alloc_conf=cuda)


def snippet(script: str) -> str:
    start = script.index("# --malloc ")
    end = script.index("\nsrun ")
    return ("set -eu\n" + script[start:end]
            + '\nprintf "LD_PRELOAD=%s\\n" "$LD_PRELOAD"; env | grep -E "^(MALLOC_CONF|TCMALLOC_)" | sort'
            + '\necho reached-srun\n')


def run_snippet(tmp_path, script: str, ldconfig_out: str = "", env_extra=None):
    """Run the snippet with a fake ``ldconfig`` first on PATH printing ``ldconfig_out``."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "ldconfig").write_text(f"#!/bin/sh\n[ \"$1\" = -p ] || exit 2\ncat <<'EOF'\n{ldconfig_out}EOF\n")
    (fake / "ldconfig").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    env.update(env_extra or {})
    p = subprocess.run(["bash", "-c", snippet(script)], capture_output=True, text=True, timeout=30, env=env)
    return p.returncode, p.stdout, p.stderr


def libdir(tmp_path, name, *libs):
    d = tmp_path / name
    d.mkdir()
    for lib in libs:
        (d / lib).write_bytes(b"\x7fELF fake")
    return str(d)


def test_found_in_the_first_directory_that_has_it(tmp_path):
    empty = libdir(tmp_path, "empty")
    first = libdir(tmp_path, "a", "libjemalloc.so.2")
    second = libdir(tmp_path, "b", "libjemalloc.so.2")
    rc, out, err = run_snippet(tmp_path, render_script(spec(dirs=(empty, first, second))))
    assert rc == 0, err
    assert f"LD_PRELOAD={first}/libjemalloc.so.2\n" in out
    assert f"MALLOC_CONF={JEMALLOC_CONF}\n" in out
    assert out.endswith("reached-srun\n")


def test_the_jobs_own_preload_and_malloc_conf_are_kept(tmp_path):
    d = libdir(tmp_path, "a", "libjemalloc.so.2")
    rc, out, err = run_snippet(tmp_path, render_script(spec(dirs=(d,))),
                               env_extra={"LD_PRELOAD": "/opt/x/libmine.so", "MALLOC_CONF": "narenas:2"})
    assert rc == 0, err
    assert f"LD_PRELOAD={d}/libjemalloc.so.2:/opt/x/libmine.so\n" in out
    assert "MALLOC_CONF=narenas:2\n" in out


def test_ldconfig_cache_when_no_directory_has_it_64_bit_entry(tmp_path):
    empty = libdir(tmp_path, "empty")
    cache = ("3 libs found in cache `/etc/ld.so.cache'\n"
             "\tlibjemalloc.so.2 (libc6) => /usr/lib/i386-linux-gnu/libjemalloc.so.2\n"
             "\tlibjemalloc.so.2 (libc6,x86-64) => /opt/site/lib/libjemalloc.so.2\n"
             "\tlibjemalloc.so (libc6,x86-64) => /opt/other/libjemalloc.so\n")
    rc, out, err = run_snippet(tmp_path, render_script(spec(dirs=(empty,))), cache)
    assert rc == 0, err
    assert "LD_PRELOAD=/opt/site/lib/libjemalloc.so.2\n" in out


@pytest.mark.parametrize("malloc,package", [("jemalloc", "libjemalloc2"), ("tcmalloc", "libtcmalloc-minimal4")])
def test_absent_library_stops_before_srun_naming_the_package(tmp_path, malloc, package):
    empty = libdir(tmp_path, "empty")
    rc, out, err = run_snippet(tmp_path, render_script(spec(malloc, dirs=(empty,))),
                               "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n")
    assert rc == 1
    assert "reached-srun" not in out
    lines = err.splitlines()
    assert lines[0].startswith(f"gsrun: job: --malloc {malloc}: ")
    assert f"not found on {os.uname().nodename} (searched {empty} and ldconfig -p)" in lines[0]
    assert lines[1].startswith(f"hint: install {package} (Debian/Ubuntu)")


def test_tcmalloc_prefers_minimal_and_exports_its_tuning(tmp_path):
    full_only = libdir(tmp_path, "full", "libtcmalloc.so.4")
    rc, out, err = run_snippet(tmp_path, render_script(spec("tcmalloc", dirs=(full_only,))))
    assert rc == 0, err
    assert f"LD_PRELOAD={full_only}/libtcmalloc.so.4\n" in out
    both = libdir(tmp_path, "both", "libtcmalloc.so.4", "libtcmalloc_minimal.so.4")
    rc, out, err = run_snippet(tmp_path, render_script(spec("tcmalloc", dirs=(full_only, both))))
    # directory order first: the full library of the earlier directory wins over a later minimal
    assert f"LD_PRELOAD={full_only}/libtcmalloc.so.4\n" in out
    rc, out, err = run_snippet(tmp_path, render_script(spec("tcmalloc", dirs=(both,))))
    assert f"LD_PRELOAD={both}/libtcmalloc_minimal.so.4\n" in out
    assert "TCMALLOC_RELEASE_RATE=2.5\n" in out
    assert "MALLOC_CONF" not in out


def test_a_real_preload_runs_when_the_node_has_the_library(tmp_path):
    """The real library of this machine, if installed: a program starts with it preloaded."""
    libs = [p for p in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2")
            if os.path.exists(p)]
    if not libs:
        pytest.skip("libjemalloc2 is not installed on this machine")
    d = os.path.dirname(libs[0])
    script = render_script(spec(dirs=(d,))).replace("\nsrun ", "\n/bin/true; srun ")
    rc, out, err = run_snippet(tmp_path, script)
    assert rc == 0 and f"LD_PRELOAD={libs[0]}" in out, err
    p = subprocess.run(["cat", "/proc/self/maps"], capture_output=True, text=True,
                       env={"LD_PRELOAD": libs[0], "PATH": "/usr/bin:/bin"}, timeout=30)
    assert "libjemalloc.so.2" in p.stdout


def test_hostile_values_never_reach_the_script():
    for bad in (spec(env=(("MALLOC_CONF", "a:$(id)"),)), spec(env=(("LD_LIBRARY_PATH", "/tmp"),)),
                spec("tcmalloc", env=(("TCMALLOC_X", "1;id"),)), spec(dirs=("/usr/lib; id",)),
                spec(dirs=("relative",)), spec(dirs=()), spec(cuda="x:1 y"), spec(cuda="")):
        with pytest.raises(InputError):
            render_script(bad)
    with pytest.raises(InputError):
        render_script(JobSpec(gpus=1, nodes=1, gpus_per_node=1, command=("true",), job_name="t",
                              malloc="mimalloc"))
    with pytest.raises(InputError):
        parse_malloc("jemalloc;id")
    for text in ('[malloc]\ndefault = "mimalloc"', '[malloc]\njemalloc_conf = "a:b c"',
                 '[malloc]\ntcmalloc_env = { TCMALLOC_X = "$(id)" }', '[malloc]\nlib_dirs = ["/a/../etc"]',
                 '[malloc]\npytorch_cuda_alloc_conf = "expandable_segments:True\\nid"'):
        with pytest.raises(Exception, match="malloc"):
            parse_config(text)


def test_without_malloc_nothing_is_rendered_and_bash_n_passes(tmp_path):
    plain = render_script(spec(None))
    assert "LD_PRELOAD" not in plain and "MALLOC_CONF" not in plain and "PYTORCH_CUDA_ALLOC_CONF" not in plain
    with_all = render_script(spec(dirs=("/usr/lib64",), cuda="expandable_segments:True,max_split_size_mb:512"))
    assert "export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True," \
           "max_split_size_mb:512}\n" in with_all
    for text in (plain, with_all):
        f = tmp_path / "s.sh"
        f.write_text(text)
        p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr


def test_site_default_and_none_through_the_cli(tmp_path, monkeypatch):
    from gsrun.wrapper.cli import cli

    cfg = tmp_path / "gsrun.toml"
    cfg.write_text('[malloc]\ndefault = "tcmalloc"\n')
    (tmp_path / "train.sh").write_text("#!/bin/sh\n")
    (tmp_path / "train.sh").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    base = ["--dry-run", "--gpus", "1", "--gpus-per-node", "1"]
    res = CliRunner().invoke(cli, [*base, "./train.sh"])
    assert res.exit_code == 0, res.output
    assert "# --malloc tcmalloc:" in res.stdout
    res = CliRunner().invoke(cli, [*base, "--malloc", "none", "./train.sh"])
    assert res.exit_code == 0 and "LD_PRELOAD" not in res.stdout
    res = CliRunner().invoke(cli, [*base, "--malloc", "jemalloc", "./train.sh"])
    assert "# --malloc jemalloc:" in res.stdout and "libjemalloc.so.2" in res.stdout
