"""``gsrun --wait`` against a busy controller: transient errors retried with
backoff and said once, a give-up that says the job may still run, squeue
then sacct once the job aged out (an empty sacct is "not yet"), ``-M`` on
every query, and one shared ``squeue`` for the waiters of one user. Fake
``squeue``/``sacct``/``sbatch`` on PATH (tests/helpers/fake_slurm.py) that
fail with Slurm's own messages; the real Watcher runs them as processes."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from gsrun.base.errors import SlurmError
from gsrun.wrapper.submit import Watcher, follow_to_end, submit
from helpers.fake_slurm import FakeSlurm


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    f = FakeSlurm(tmp_path / "bin", {"jobs": {}})
    monkeypatch.setenv("PATH", f.path())
    return f


def _follow(job, cluster=None, cache_dir=None, **kw):
    t = [0.0]
    err = io.StringIO()
    w = Watcher(job, cluster, cache_dir=cache_dir or "", since=0.0)
    w.timeout_s = 5.0
    rc = follow_to_end(job, out=io.StringIO(), err=err, poller=lambda j: w.poll(), clock=lambda: t[0],
                sleep=lambda s: t.__setitem__(0, t[0] + s), jitter=lambda: 1.0, **kw).rc
    return rc, err.getvalue(), t[0]


def test_transient_errors_are_retried_and_said_once(fake):
    fake.set_plan({"jobs": {"101": {"state": "FAILED", "exit": "3:0"}},
                   "fail": ["timeout", "again", "rate", "contact", "kill"]})
    rc, err, waited = _follow("101")
    assert rc == 3
    lines = err.splitlines()
    said = [ln for ln in lines if "Slurm did not answer" in ln]
    assert len(said) == 1 and "Socket timed out on send/recv operation" in said[0], err
    assert said[0].startswith("gsrun: wait: job 101: ")
    assert [ln for ln in lines if "answers again" in ln] == [
        "gsrun: wait: job 101: Slurm answers again (after 5 failed queries)"]
    assert len(fake.calls("squeue")) == 6
    # backoff 2, 4, 8, 16, 32 s (+ the 1 s output reads between): never a tight loop
    assert 62 <= waited <= 70, waited


def test_gives_up_only_after_the_documented_silence(fake):
    fake.set_plan({"jobs": {"101": {}}, "always_fail": "contact"})
    with pytest.raises(SlurmError) as ei:
        _follow("101", give_up_s=600.0)
    msg = str(ei.value)
    assert msg.startswith("gsrun: wait: no answer from Slurm for 6") and "job 101 may still be running" in msg
    assert "hint: look with: squeue -j 101; sacct -j 101" in msg
    n = len(fake.calls("squeue"))
    assert 10 <= n <= 20, n          # 2, 4, ... 60 s apart over 600 s, not one a second


def test_aged_out_job_is_read_from_sacct_and_empty_sacct_is_not_yet(fake):
    fake.set_plan({"jobs": {"101": {"in_queue": False, "in_acct": False, "exit": "0:0"}}})
    t = [0.0]
    w = Watcher("101", cache_dir="", since=0.0)
    polls = []

    def poller(_job):
        polls.append(1)
        if len(polls) == 3:           # slurmdbd caught up
            fake.set_plan({"jobs": {"101": {"in_queue": False, "exit": "0:0"}}})
        return w.poll()
    rc = follow_to_end("101", out=io.StringIO(), err=io.StringIO(), poller=poller, clock=lambda: t[0],
                sleep=lambda s: t.__setitem__(0, t[0] + s), jitter=lambda: 1.0).rc
    assert rc == 0
    assert len(fake.calls("squeue")) == 1          # out of the controller: never asked again
    sacct = fake.calls("sacct")
    assert len(sacct) == 3
    assert sacct[0][2:] == ["-X", "-n", "-P", "-j", "101", "-o", "JobID,State,ExitCode,Elapsed,NodeList"]


def test_clusters_submission_followed_on_that_cluster(fake):
    fake.set_plan({"jobs": {"101": {"in_queue": False, "state": "COMPLETED", "exit": "0:0"}},
                   "sbatch": "101;gpu"})
    assert submit("#!/bin/bash\n", args=["--clusters=gpu"]) == ("101", "gpu")
    rc, _err, _ = _follow("101", cluster="gpu")
    assert rc == 0
    assert fake.calls("squeue")[0][2:4] == ["-M", "gpu"]
    assert fake.calls("sacct")[0][2:4] == ["-M", "gpu"]
    assert "--local" not in fake.calls("squeue")[0]


def test_forty_waiters_share_one_squeue(fake, tmp_path):
    """40 waiter processes of one user on one host, each following its own job
    for ~12 s through the real follow_to_end(): the fake controller counts the calls."""
    now = time.time()
    jobs = {str(200 + i): {"run_s": 12, "exit": "0:0"} for i in range(40)}
    fake.set_plan({"jobs": jobs, "submitted": {j: now for j in jobs}})
    code = ("import sys, io\nfrom gsrun.wrapper.submit import follow_to_end\n"
            "sys.exit(follow_to_end(sys.argv[1], out=io.StringIO(), err=io.StringIO()).rc)")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-P", "-c", code, j], env=env) for j in jobs]
    rcs = [p.wait(timeout=120) for p in procs]
    wall = time.time() - t0
    assert rcs == [0] * 40
    calls = fake.calls("squeue")
    assert (tmp_path / "gsrun").is_dir()
    # one squeue per ~3 s for all 40 (not 40 per 3 s): at most one per 2.4 s of wall time, + the last round
    assert len(calls) <= wall / 2.4 + 3, (len(calls), wall)
    assert not fake.calls("sacct")


def _waiter(fake, tmp_path, job="101"):
    """A real ``follow_to_end()`` in its own process (the main thread: SIGINT is its
    own), stderr on a pipe; waits for its first status line."""
    code = ("import sys, io\nfrom gsrun.wrapper.submit import follow_to_end\n"
            "sys.exit(follow_to_end(sys.argv[1], out=io.StringIO()).rc)")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-P", "-c", code, job], env=env, stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()
    assert first.startswith(f"gsrun: job {job}: running"), first
    return p


def test_first_ctrl_c_says_how_to_stop_and_keeps_following(fake, tmp_path):
    fake.set_plan({"jobs": {"101": {"run_s": 4, "exit": "0:0"}}, "submitted": {"101": time.time()}})
    p = _waiter(fake, tmp_path)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=30) == 0                   # followed to the end
    assert ("gsrun: wait: job 101 still runs; scancel 101 to stop it (Ctrl-C again within 1 s cancels it)\n"
            in rest), rest
    assert not fake.calls("scancel")


def test_second_ctrl_c_within_the_window_cancels_the_job(fake, tmp_path):
    fake.set_plan({"jobs": {"101": {"run_s": 600, "exit": "0:0"}}, "submitted": {"101": time.time()}})
    p = _waiter(fake, tmp_path)
    p.send_signal(signal.SIGINT)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=30) == 130
    assert [c[2:] for c in fake.calls("scancel")] == [["101"]]
    assert "gsrun: wait: job 101 still runs; scancel 101 to stop it" in rest
    assert rest.endswith("gsrun: wait: job 101: cancelled (scancel 101)\n"), rest


def test_ctrl_c_presses_further_apart_do_not_cancel(fake, tmp_path):
    fake.set_plan({"jobs": {"101": {"run_s": 5, "exit": "0:0"}}, "submitted": {"101": time.time()}})
    p = _waiter(fake, tmp_path)
    p.send_signal(signal.SIGINT)
    time.sleep(1.6)
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=30) == 0
    assert rest.count("still runs; scancel 101 to stop it") == 2
    assert not fake.calls("scancel")
