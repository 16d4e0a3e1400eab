"""``gsrun --malloc``: the job script only names the allocator; ``gsrun-bind``
finds the library on the node (directories with ELF headers built per elf(5):
x86-64 and aarch64 shared objects, an executable, a non-ELF file; ``ldconfig
-p`` text in glibc's format with a stale and a foreign-machine line), puts it
first in ``LD_PRELOAD`` of the task's command only, and proves it mapped in
the task's ``/proc/<pid>/maps`` (a real shared object of this host copied
under the allocator's name: no jemalloc needs to be installed); plus the
allow-lists that keep every value out of the shell's reach."""

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


LIB = "/lib/x86_64-linux-gnu/libbz2.so.1.0"     # a real x86-64 shared object of this host, standing in


def header(ei_class=2, ei_data=1, e_type=3, e_machine=62) -> bytes:
    """An ELF header as elf(5) lays it out (64 bytes; the fields gsrun reads set)."""
    order = "little" if ei_data == 1 else "big"
    return (b"\x7fELF" + bytes([ei_class, ei_data, 1, 0]) + bytes(8) + e_type.to_bytes(2, order)
            + e_machine.to_bytes(2, order) + bytes(44))


def libdir(tmp_path, name, libs: dict) -> str:
    d = tmp_path / name
    d.mkdir()
    for lib, head in libs.items():
        (d / lib).write_bytes(head)
    return str(d)


# `ldconfig -p` as glibc 2.36 (Debian 12) prints it on an x86-64 node with a multiarch aarch64 copy
LDCONFIG = ("1234 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibjemalloc.so.2 (libc6,AArch64) => {arm}\n"
            "\tlibjemalloc.so.2 (libc6,x86-64) => {stale}\n"
            "\tlibjemalloc.so.2 (libc6,x86-64) => {good}\n"
            "\tlibjemalloc.so (libc6,x86-64) => {good}\n")


def test_the_script_sets_no_preload_for_itself_srun_or_torchrun():
    for s in (spec(), JobSpec(gpus=2, nodes=1, gpus_per_node=2, command=("true",), job_name="t",
                              malloc="jemalloc", launcher="torchrun", python="/usr/bin/python3")):
        text = render_script(s)
        assert [ln for ln in text.splitlines() if "LD_PRELOAD" in ln and not ln.startswith("#")] == []
        assert "export GSRUN_MALLOC=jemalloc\n" in text and "export GSRUN_MALLOC_LIB_DIRS=/nonexistent\n" in text \
            or "export GSRUN_MALLOC_LIB_DIRS=/usr/lib/x86_64-linux-gnu:" in text


def test_found_in_the_first_directory_whose_library_fits_the_node(tmp_path):
    from gsrun.bind.malloc import find_allocator
    arm = libdir(tmp_path, "arm", {"libjemalloc.so.2": header(e_machine=183)})
    fake = libdir(tmp_path, "fake", {"libjemalloc.so.2": b"\x7fELF fake"})
    exe = libdir(tmp_path, "exe", {"libjemalloc.so.2": header(e_type=2)})
    good = libdir(tmp_path, "good", {"libjemalloc.so.2": header()})
    path, looked, rejected = find_allocator("jemalloc", (arm, fake, exe, good), lambda: "", machine="x86_64")
    assert path == f"{good}/libjemalloc.so.2" and looked == [arm, fake, exe, good]
    assert rejected == [f"{arm}/libjemalloc.so.2: ELF 64-bit aarch64, this node is x86_64",
                        f"{fake}/libjemalloc.so.2: not an ELF file",
                        f"{exe}/libjemalloc.so.2: ELF 64-bit x86-64 is not a shared object (e_type 2)"]
    # the same aarch64 library is the one to use on an aarch64 node
    assert find_allocator("jemalloc", (arm,), lambda: "", machine="aarch64")[0] == f"{arm}/libjemalloc.so.2"


def test_ldconfig_lines_are_checked_not_trusted(tmp_path):
    from gsrun.bind.malloc import find_allocator
    arm = libdir(tmp_path, "arm", {"libjemalloc.so.2": header(e_machine=183)}) + "/libjemalloc.so.2"
    good = libdir(tmp_path, "good", {"libjemalloc.so.2": header()}) + "/libjemalloc.so.2"
    text = LDCONFIG.format(arm=arm, stale=str(tmp_path / "gone/libjemalloc.so.2"), good=good)
    empty = libdir(tmp_path, "empty", {})
    path, looked, rejected = find_allocator("jemalloc", (empty,), lambda: text, machine="x86_64")
    assert path == good and looked == [empty, "ldconfig -p"]
    assert rejected == [f"ldconfig -p: {arm}: ELF 64-bit aarch64, this node is x86_64",
                        f"ldconfig -p: {tmp_path}/gone/libjemalloc.so.2: No such file or directory"]


def test_tcmalloc_prefers_minimal(tmp_path):
    from gsrun.bind.malloc import find_allocator
    both = libdir(tmp_path, "both", {"libtcmalloc.so.4": header(), "libtcmalloc_minimal.so.4": header()})
    assert find_allocator("tcmalloc", (both,), lambda: "", "x86_64")[0] == f"{both}/libtcmalloc_minimal.so.4"


def test_existing_preloads_are_kept_after_it():
    from gsrun.bind.malloc import preload_value
    assert preload_value("/l/libjemalloc.so.2", None) == "/l/libjemalloc.so.2"
    assert preload_value("/l/libjemalloc.so.2", "/opt/a.so /opt/b.so") == "/l/libjemalloc.so.2:/opt/a.so:/opt/b.so"
    assert preload_value("/l/libjemalloc.so.2", "/opt/a.so:/l/libjemalloc.so.2") == "/l/libjemalloc.so.2:/opt/a.so"


def test_maps_match_by_inode_or_path():
    from gsrun.bind.malloc import maps_has
    line = "7f1c2a000000-7f1c2a02a000 r--p 00000000 fd:01 1234567    /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    assert maps_has(line, (os.makedev(0xfd, 1), 1234567), "/elsewhere/libjemalloc.so.2")
    assert maps_has(line, None, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert not maps_has(line, (os.makedev(0xfd, 2), 1234567), "/x/libjemalloc.so.2")


# the task lives a second after it printed: the watcher reads its maps while it runs (a task that
# ends before the watcher looks is reported "not verified: the task ended", honestly)
TASK = ("import os, json, time; m = open('/proc/self/maps').read(); "
        "print(json.dumps({'preload': os.environ.get('LD_PRELOAD'), 'mapped': 'libjemalloc.so.2' in m}), "
        "flush=True); time.sleep(1.0)")


def bind_env(tmp_path, dirs, **extra):
    from helpers.bind_run import clean_env
    spool = tmp_path / "spool"
    (spool / "jobs/4242/task-gpu01").mkdir(parents=True)
    return clean_env(GSRUN_MALLOC="jemalloc", GSRUN_MALLOC_LIB_DIRS=":".join(dirs), GSRUN_SPOOL_DIR=str(spool),
                     SLURM_JOB_ID="4242", SLURMD_NODENAME="gpu01", SLURM_LOCALID="0", GSRUN_CONFIG="/nonexistent",
                     PATH="/usr/sbin:/usr/bin:/bin", **extra), spool / "jobs/4242/task-gpu01/bind.json"


@pytest.mark.skipif(os.uname().machine != "x86_64" or not os.path.exists(LIB), reason="needs x86-64 libbz2")
def test_gsrun_bind_preloads_the_task_command_and_proves_it_mapped(tmp_path):
    import json
    import shutil
    import sys
    import time
    from helpers.bind_run import run_bind
    d = tmp_path / "lib"
    d.mkdir()
    shutil.copyfile(LIB, d / "libjemalloc.so.2")      # a real shared object under the allocator's name
    env, notes = bind_env(tmp_path, (str(tmp_path / "none"), str(d)), LD_PRELOAD=LIB)
    r = run_bind(["--", sys.executable, "-c", TASK], env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {"preload": f"{d}/libjemalloc.so.2:{LIB}", "mapped": True}
    assert "malloc" not in r.stderr and "memlock" not in r.stderr      # nothing on the user's terminal
    for _ in range(300):
        if notes.exists():
            break
        time.sleep(0.02)
    n = json.loads(notes.read_text())
    assert n["malloc"]["state"] == "verified" and n["malloc"]["path"] == f"{d}/libjemalloc.so.2"
    assert n["malloc"]["detail"].startswith("mapped in local rank 0's /proc/")
    assert set(n["memlock"]) == {"soft", "hard", "rdma", "problem"}


def test_gsrun_bind_without_the_library_warns_where_it_looked_and_runs(tmp_path):
    import json
    import sys
    from helpers.bind_run import run_bind
    empty = libdir(tmp_path, "empty", {})
    env, notes = bind_env(tmp_path, (empty,), LD_PRELOAD="")
    env["PATH"] = str(tmp_path / "nobin")      # no ldconfig to ask either
    r = run_bind(["--", sys.executable, "-c", TASK], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"preload": "", "mapped": False}
    assert (f"gsrun: bind: warning: gpu01: --malloc jemalloc: libjemalloc.so.2 not found (looked in {empty}, "
            "ldconfig -p): the job runs without it; hint: install libjemalloc2") in r.stderr
    n = json.loads(notes.read_text())
    assert n["malloc"] == {"name": "jemalloc", "state": "not found", "path": None,
                           "detail": f"libjemalloc.so.2 not found (looked in {empty}, ldconfig -p)"}


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
