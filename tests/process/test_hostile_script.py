"""Hostile script arguments, working directories, job names, --output and
environment values in the rendered sbatch script: the script passes
``bash -n``, and *run for real* (fake ``scontrol``/``srun``/``gsrun-bind``
that exec what they are given) every argument reaches the program byte
for byte and no marker file is ever created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gsrun.base.errors import InputError
from gsrun.wrapper.command import Python, build_command
from gsrun.wrapper.render import render_script
from gsrun.wrapper.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
FAKE_BIN = REPO / "tests" / "data" / "fake-bin"

# each must reach argv literally; MARK is the file that must never appear
HOSTILE_ARGS = [
    "'", '"', "a b", "a\nb", "a\r\nb", "\t", " ", "", "-", "--", "--gpus=8", "-c",
    "$(touch MARK)", "`touch MARK`", "; touch MARK", "&& touch MARK", "|| touch MARK", "| touch MARK",
    "> MARK", "< /etc/passwd", "$(touch MARK)'\"`touch MARK`", "'; touch MARK; '", "\"; touch MARK; \"",
    "*", "?", "[a-z]*", "~", "~root", "{a,b}", "$HOME", "${IFS}", "$'\\x41'", "$((1+1))", "!!", "!$",
    "\\", "\\n", "#", "#SBATCH --exclusive", "%j", "\x01\x02\x1b[31m", "é€😀",
    "\udcff\udcfe non-utf8",        # non-UTF-8 bytes b"\xff\xfe" (surrogateescape, as Python gets argv)
    "x" * 100_000,                  # 100 kB
    "\nsrun touch MARK\n",
]


def spec_for(command, **kw) -> JobSpec:
    base = dict(gpus=1, nodes=1, gpus_per_node=1, command=tuple(command), job_name="hostile",
                bind_exe=str(FAKE_BIN / "gsrun-bind"), mps="", tune="swappiness=10",
                nccl_env=(("NCCL_DEBUG", "WARN $(touch MARK)"),),
                extra_env=(("GS_TEST", "`touch MARK`\n; touch MARK"),))
    base.update(kw)
    return JobSpec(**base)


def run_script(text: str, tmp_path: Path, dump: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "job.sh"
    script.write_bytes(text.encode("utf-8", "surrogateescape"))
    env = {"PATH": f"{FAKE_BIN}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "42",
           "SLURM_NTASKS": "1", "FAKE_SLURM": "record", "FAKE_SCONTROL_RECORD": "NodeName=n1 NodeAddr=10.0.0.1",
           "DUMP": str(dump), "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, timeout=60)


DUMPER = ("import json, os, sys\n"
          "json.dump({'argv': [os.fsencode(a).hex() for a in sys.argv[1:]],"
          " 'env': os.environ.get('GS_TEST'), 'nccl': os.environ.get('NCCL_DEBUG')},"
          " open(os.environ['DUMP'], 'w'))\n")


def test_hostile_arguments_reach_the_program_literally(tmp_path):
    prog = tmp_path / "dump.py"
    prog.write_text(DUMPER)
    args = list(HOSTILE_ARGS)
    text = render_script(spec_for([sys.executable, str(prog), *args]))
    bn = subprocess.run(["bash", "-n"], input=text.encode("utf-8", "surrogateescape"), capture_output=True)
    assert bn.returncode == 0, bn.stderr
    dump = tmp_path / "argv.json"
    cp = run_script(text, tmp_path, dump)
    assert cp.returncode == 0, cp.stderr
    got = json.loads(dump.read_text())
    assert [bytes.fromhex(h) for h in got["argv"]] == [os.fsencode(a) for a in args]
    assert got["env"] == "`touch MARK`\n; touch MARK" and got["nccl"] == "WARN $(touch MARK)"
    assert not list(tmp_path.rglob("MARK")) and not Path("/MARK").exists()


@pytest.mark.parametrize("dirname", ["a b", "it's", 'say "hi"', "$(touch MARK)", "`touch MARK`", "x;touch MARK",
                                     "*", "new\nline", "\udcff"])
def test_hostile_working_directory_and_script_name(tmp_path, dirname):
    d = tmp_path / dirname
    d.mkdir()
    prog = d / "prog $(touch MARK).py"
    prog.write_text(DUMPER)
    old = os.getcwd()
    os.chdir(d)
    try:
        command = build_command("script", ("./prog $(touch MARK).py", "arg;touch MARK"), Python(sys.executable, "given"))
    finally:
        os.chdir(old)
    assert command[1] == str(prog)
    dump = tmp_path / "argv.json"
    cp = run_script(render_script(spec_for(command)), tmp_path, dump)
    assert cp.returncode == 0, cp.stderr
    assert [bytes.fromhex(h) for h in json.loads(dump.read_text())["argv"]] == [b"arg;touch MARK"]
    assert not list(tmp_path.rglob("MARK"))


@pytest.mark.parametrize("field,value", [
    ("job_name", "a\ntouch MARK"), ("job_name", "x\r#SBATCH --uid=0"), ("job_name", "\x1b[31m"),
    ("job_name", "x" * 300), ("job_name", ""),
    ("output", "out\ntouch MARK"), ("output", "out\r"), ("output", "\udcff"), ("output", ""),
    ("partition", "gpu\n#SBATCH --exclusive"), ("time", "1:00\ntouch MARK"),
    ("mail_user", "a@b\ntouch MARK"), ("mail_type", "END\nALL"),
    ("extra_env", (("A B", "x"),)), ("extra_env", (("A;touch MARK;B", "x"),)), ("extra_env", (("", "x"),)),
    ("nccl_env", (("X=$(id)", "x"),)),
    ("tune", "swappiness=10\ntouch MARK"), ("tune", "a b"),
])
def test_hostile_fields_are_refused_naming_the_field(field, value):
    with pytest.raises(InputError) as ei:
        render_script(spec_for(["true"], **{field: value}))
    assert "bad" in str(ei.value)


def test_hostile_job_name_is_one_comment_line(tmp_path):
    """Slurm takes any printable job name: the #SBATCH line stays one line, bash
    sees a comment, and running the script creates no marker."""
    name = "a b $(touch MARK) `touch MARK` ; touch MARK # 'q' \"d\" \\"
    text = render_script(spec_for(["true"], job_name=name))
    lines = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --job-name=")]
    quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'   # sbatch reads it back as typed
    assert lines == ["#SBATCH --job-name=" + quoted]
    assert subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True).returncode == 0
    cp = run_script(text, tmp_path, tmp_path / "dump.json")
    assert cp.returncode == 0, cp.stderr
    assert not list(tmp_path.rglob("MARK"))


def test_output_pattern_allowed_but_spaces_refused(tmp_path):
    text = render_script(spec_for(["true"], output="logs/%x-%j.out"))
    assert "#SBATCH --output=logs/%x-%j.out\n" in text
    # red-team finding: a space starts another #SBATCH option (--error=/tmp/x, --gs-tune=...)
    with pytest.raises(InputError) as ei:
        render_script(spec_for(["true"], output="x.txt --error=/tmp/injected-%j.err --time=1"))
    assert "bad --output" in str(ei.value)
