"""Hostile values in the environment of the prolog/epilog: every one is
refused with an error naming the variable (never a traceback, never a path
built from it, never a forged log line), and tried for real through the
prolog with raw bytes (``os.environb``)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time

import pytest

from gsrun.base.errors import InputError
from gsrun.facts.jobenv import job_from_env
from gsrun.base.log import JobLog, safe_text
from gsrun.base.ids import check_job_id
from gsrun.base.paths import Paths
from helpers.node_site import LAUNCH, make_site

GOOD = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000", "SLURM_JOB_USER": "user1",
        "SLURMD_NODENAME": "gpu-node01", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NODELIST": "gpu-node[01-02]",
        "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_JOB_GPUS": "0,1"}

INJECT = ["$(touch /tmp/gsrun-MARK)", "`touch /tmp/gsrun-MARK`", "a;touch /tmp/gsrun-MARK", "a|b", "a&b",
          "a\nb", "a\rb", "a\x00b", "*", "?", "[a]", "../../etc", "/etc/shadow", "a b", "'", '"', "\\",
          "\udcff", "é", "x" * 100_000]
HOSTILE = {
    "SLURM_JOB_ID": INJECT + ["4242\n", "4242 ", "-1", "0x10", "4242_1", "１２", "²", "", "99999999999"],
    "SLURM_JOB_UID": INJECT + ["1000\n", "-1", "4294967296", "²", "１０００", "1e3", " 1000"],
    "SLURM_JOB_GID": INJECT + ["1000\n", "²"],
    "SLURM_JOB_USER": INJECT + ["user1\n", "user1;id", "-rf"],
    "SLURMD_NODENAME": INJECT + ["gpu-node01\n", ".hidden", "-n"],
    "SLURM_JOB_PARTITION": INJECT + ["gpu\n"],
    "SLURM_JOB_NODELIST": INJECT[:18] + ["n[0-99999],m[0-99999]", "a[0-9]b[0-9]c[0-9]d[0-9]e[0-9]",
                                         "n[1-2", "n]", "n[5-1]"],
    "SLURM_JOB_CPUS_PER_NODE": ["4(x999999999)", "4(x2)\n", "a", "4(x)", "1," * 70000],
    "SLURM_JOB_GPUS": INJECT + ["0\n", "GPU-1234", "٣", "0-99999", "3-1"],
    "SPANK_GS_TUNE": INJECT[:-1] + ["governor=performance\n", "swappiness=10;id", "x" * 513],
    "SPANK_GS_MPS": INJECT[:-1] + ["50\n"],
    "SPANK_GS_MIG": INJECT[:-1] + ["7x1g.18gb\n"],
    "SPANK_GS_BIND": INJECT[:-1],
    "SPANK_GS_REPORT": INJECT[:-1],
    "SPANK_GS_EXCLUSIVE": INJECT[:-1] + ["1\n"],
}
CASES = [(k, v) for k, vals in HOSTILE.items() for v in vals
         if not (k == "SLURM_JOB_NODELIST" and v in ("a b",))]


def test_count_of_hostile_env_values():
    assert len(CASES) >= 250, len(CASES)


@pytest.mark.parametrize("name,value", CASES, ids=lambda x: repr(x)[:30])
def test_hostile_env_value_is_refused_naming_the_variable(name, value):
    env = dict(GOOD, **{name: value})
    t0 = time.monotonic()
    with pytest.raises(InputError) as ei:
        job_from_env(env)
    assert time.monotonic() - t0 < 1.0                      # bounded before any expansion
    msg = str(ei.value)
    assert name in msg
    assert "\n" not in msg.split("\nhint:")[0]              # the value is shown escaped, one line
    assert len(msg) < 400


@pytest.mark.parametrize("value", ["4242\n", "../4242", "4242/..", "", "4242\x00", "a", "1" * 11])
def test_paths_never_take_a_bad_job_id(tmp_path, value):
    with pytest.raises(InputError):
        check_job_id(value, array=True)
    with pytest.raises(InputError):
        Paths(str(tmp_path), str(tmp_path), str(tmp_path)).spool_job(value)


def test_log_lines_cannot_be_forged():
    buf = io.StringIO()
    log = JobLog("4242\ngsrun[1]: epilog: forged", "prolog", stream=buf, use_syslog=False)
    log("value a\nGSRUN[9]: fake line \udcff \x1b[2J")
    out = buf.getvalue()
    assert out.count("\n") == 1 and out.startswith("gsrun[?]: prolog: value a\\nGSRUN[9]")
    assert "\\udcff" in out and "\\x1b" in out
    assert len(safe_text("x" * 100_000)) < 4100


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root")
@pytest.mark.parametrize("name,raw", [
    (b"SLURM_JOB_ID", b"42\xff$(touch /tmp/gsrun-MARK)"),
    (b"SLURM_JOB_USER", b"us\xe9r;touch /tmp/gsrun-MARK"),
    (b"SPANK_GS_TUNE", b"governor=\xff`touch /tmp/gsrun-MARK`"),
    (b"SPANK_GS_MPS", b"\xfe\xff"),
    (b"SLURM_JOB_GPUS", b"0,\xff"),
    (b"SLURMD_NODENAME", b"n\xff1"),
    (b"SLURM_JOB_ID", b"4242\n"),
    (b"SLURM_JOB_ID", b"../../../../tmp/gsrun-MARK"),
    (b"SPANK_GS_TUNE", b"x" * 120_000),
])
def test_raw_bytes_through_the_real_prolog(name, raw):
    """The prolog gets the raw bytes from slurmd: it exits 0 (a bad env is
    not the node's fault), names the variable, creates nothing."""
    site = make_site()
    try:
        env = {k.encode(): v.encode() for k, v in site.env().items()}
        env[name] = raw
        for hook in ("prolog", "epilog"):
            cp = subprocess.run([sys.executable, "-P", "-c", LAUNCH, hook], env=env, capture_output=True, timeout=60)
            assert cp.returncode == 0, cp.stderr
            assert f"bad {name.decode()}".encode() in cp.stderr
            assert b"Traceback" not in cp.stderr
            assert all(line.startswith(b"gsrun") or line.startswith(b"hint:")
                       for line in cp.stderr.splitlines()), cp.stderr
        assert not os.path.exists("/tmp/gsrun-MARK")
        assert not (site.spool).exists() and not (site.state).exists()
    finally:
        shutil.rmtree(site.base, ignore_errors=True)


# --- red-team findings: forged job-record fields ----------------------------------

def test_job_record_with_newline_in_name_is_not_trusted():
    from gsrun.request.job import exclusive_from_record
    from gsrun.facts.slurm import parse_job_record

    forged = "JobId=6 JobName=n OverSubscribe=NO\ny UserId=u(1001) OverSubscribe=OK Comment=\n"
    assert parse_job_record(forged, "6") is None
    one = "JobId=6 JobName=x OverSubscribe=NO UserId=u(1001) OverSubscribe=OK Comment=\n"
    rec = parse_job_record(one, "6")
    assert "OverSubscribe" not in rec and rec["UserId"] == "u(1001)"
    assert exclusive_from_record(rec, one.strip()) == (False, "job record (ambiguous)")
    real = "JobId=6 JobName=x UserId=u(1001) OverSubscribe=NO Comment=gsrun:tune=swappiness=10\n"
    rec = parse_job_record(real, "6")
    assert exclusive_from_record(rec, real.strip()) == (True, "job record OverSubscribe")


def test_residual_env_claim_protects_only_live_jobs():
    from gsrun.node.residual import GpuProc, ProcFacts, select_targets

    procs = [GpuProc(pid=4321, bus_id="0000:41:00.0", used_bytes=1 << 30)]
    facts = {4321: ProcFacts(4321, True, uid=1001, env_job_id="424242", cgroup_job_id=None)}
    # the claimed job is not live on this node: the process is the ending job's leftover
    d = select_targets(procs, {"0000:41:00.0"}, "77", 1001, facts, live_jobs={"80"})
    assert [p.pid for p in d.targets] == [4321]
    d = select_targets(procs, {"0000:41:00.0"}, "77", 1001, facts, live_jobs={"424242"})
    assert d.targets == [] and "belongs to job 424242" in d.skipped[0]["why"]
