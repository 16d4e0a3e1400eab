"""The epilog's wait for the sampler: the sampler leaves
its wait at SIGTERM, writes its final state, and the epilog counts an exited
process as gone even before anyone reaps it (a zombie)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from gsrun.base import pids
from gsrun.admin.node_entry import parse_hook_args
from helpers.node_site import make_site, run_node


def test_start_time_is_psutils_create_time():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert abs(pids.start_time(p.pid) - psutil.Process(p.pid).create_time()) < 0.05
        assert pids.is_same(p.pid, psutil.Process(p.pid).create_time())
        assert not pids.is_same(p.pid, psutil.Process(p.pid).create_time() - 100)   # a reused PID
    finally:
        p.kill()
        p.wait()


def test_stop_counts_an_unreaped_exit_as_stopped():
    # our own child: once it exits it stays a zombie until we wait() -- as a detached
    # sampler does until slurmd's PID 1 reaps it
    p = subprocess.Popen(["sleep", "30"])
    ct = pids.start_time(p.pid)
    try:
        assert pids.stop(p.pid, ct, timeout_s=5.0) == "stopped"
        assert psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE   # never reaped by stop()
        assert pids.stop(p.pid, ct, timeout_s=5.0) == "not running"
    finally:
        p.wait()
    assert p.returncode == -signal.SIGTERM


def test_stop_kills_what_ignores_sigterm():
    p = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, "
                          "signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        assert pids.stop(p.pid, pids.start_time(p.pid), timeout_s=0.3) == "killed"
    finally:
        p.wait()
    assert p.returncode == -signal.SIGKILL


def test_scan_finds_by_command_line():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--job-id", "4711x"])
    try:
        time.sleep(0.2)
        import os

        found = pids.scan(lambda argv: "4711x" in argv, os.geteuid())
        assert [pid for pid, _ in found] == [p.pid]
        assert pids.scan(lambda argv: "4711x" in argv, os.geteuid() + 1) == []
    finally:
        p.kill()
        p.wait()


def test_sampler_leaves_a_long_wait_at_sigterm_with_its_final_state():
    """interval 60 s: the sampler sleeps right after its first poll; SIGTERM must cut
    that wait (the old 1 s sleep chunks took up to a second) and the final state is
    written (done) before it exits."""
    site = make_site()
    site.config.write_text(site.config.read_text().replace("interval_s = 0.2", "interval_s = 60")
                           .replace("flush_s = 0.2", "flush_s = 600"))
    env = site.env(job_id="4801")
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    sdir = site.state / "jobs" / "4801"
    info = json.loads((sdir / "sampler.pid.json").read_text())
    deadline = time.monotonic() + 20
    while not (sdir / "sampler.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = json.loads((sdir / "sampler.json").read_text())
    assert state["done"] is False and state["samples"] == 1
    assert pids.stop(info["pid"], info["create_time"], timeout_s=0.5) == "stopped"
    state = json.loads((sdir / "sampler.json").read_text())
    assert state["done"] is True and state["samples"] == 2      # the final sample
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    node = json.loads((site.spool / "jobs" / "4801" / "node-gpu-node01.json").read_text())
    assert node["sampler_stop"] == "not running" and node["samples"] == 2


def test_hook_fast_path_arguments(monkeypatch):
    monkeypatch.setenv("GSRUN_STATE_DIR", "/env/state")
    monkeypatch.delenv("GSRUN_HOST_ROOT", raising=False)
    monkeypatch.delenv("GSRUN_SPOOL_DIR", raising=False)
    assert parse_hook_args(["epilog"]) == {"phase": "epilog", "dry_run": False, "host_root": None,
                                           "state_dir": "/env/state", "spool_dir": None}
    assert parse_hook_args(["prolog", "--dry-run", "--host-root=/h", "--spool-dir", "/s"]) == {
        "phase": "prolog", "dry_run": True, "host_root": "/h", "state_dir": "/env/state", "spool_dir": "/s"}
    assert parse_hook_args(["epilog-ctld", "--spool-dir=/sp"]) == {"phase": "epilog-ctld", "dry_run": False,
                                                                   "spool_dir": "/sp"}
    # everything else goes to click (which has the same options, --help, errors)
    for argv in (["epilog", "--dry-run"], ["prolog", "--help"], ["prolog", "--state-dir"], ["status"],
                 ["prolog", "--state-dir", "/a", "--state-dir", "/b"], ["epilog-ctld", "--wait-s", "5"],
                 ["epilog-ctld", "--state-dir", "/s"], ["epilog-ctld", "--foreground"], []):
        assert parse_hook_args(argv) is None, argv


def _started(site, job_id: str, interval_s: float = 0.2) -> tuple[dict, dict, object]:
    """A prolog's sampler of ``job_id`` running and past its first flush -> (env, pid record, state dir)."""
    site.config.write_text(site.config.read_text().replace("interval_s = 0.2", f"interval_s = {interval_s}"))
    env = site.env(job_id=job_id)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    sdir = site.state / "jobs" / job_id
    deadline = time.monotonic() + 20
    while not (sdir / "sampler.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return env, json.loads((sdir / "sampler.pid.json").read_text()), sdir


def test_epilog_takes_the_summary_the_sampler_wrote_at_sigterm():
    """The prolog starts ``python -m gsrun.epilog.sampler``; at the epilog's SIGTERM it
    writes the node summary after its final flush, and the epilog only completes it."""
    site = make_site()
    env, info, sdir = _started(site, "4811")
    assert info["argv"][:2] == ["--job-id", "4811"]
    assert "gsrun.epilog.sampler" in psutil.Process(info["pid"]).cmdline()
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert "node summary: written by the sampler at its final flush" in cp.stderr
    node = json.loads((site.spool / "jobs" / "4811" / "node-gpu-node01.json").read_text())
    assert node["sampler_stop"] == "stopped" and node["samples"] >= 2
    assert node["gres_gpus"] == [0] and node["elapsed_s"] == round(node["end_time"] - node["start_time"], 3)
    assert node["end_time"] >= node["start_time"] and node["gpu_available"] is True
    assert not sdir.exists()     # state dir forgotten after a clean epilog


def test_epilog_computes_the_summary_when_the_sampler_was_killed():
    """A sampler killed (SIGKILL, OOM) writes no summary: the epilog falls back to its last flushed state."""
    site = make_site()
    env, info, sdir = _started(site, "4812")
    os.kill(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids.is_same(info["pid"], info["create_time"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    flushed = json.loads((sdir / "sampler.json").read_text())
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert "node summary: computed from sampler.json (sampler: not running)" in cp.stderr
    node = json.loads((site.spool / "jobs" / "4812" / "node-gpu-node01.json").read_text())
    assert node["sampler_stop"] == "not running" and node["samples"] == flushed["samples"] >= 1
    assert node["start_time"] == flushed["start_time"]


def test_epilog_stops_an_older_prologs_sampler_and_computes_the_summary():
    """A sampler started by an older prolog (``python -m gsrun.node.sampler``: no summary at its
    end) is stopped and its final state summarised by the epilog; the summary an earlier sampler
    of the job left is not taken for it (another PID and start time)."""
    site = make_site()
    env, info, sdir = _started(site, "4813")
    assert pids.stop(info["pid"], info["create_time"], timeout_s=5) == "stopped"
    stale = json.loads((sdir / "node-summary.json").read_text())
    assert stale["pid"] == info["pid"]
    from gsrun.base.proc import ROOT_CWD, root_python

    p = subprocess.Popen(root_python("-m", "gsrun.node.sampler", *info["argv"]), cwd=ROOT_CWD,
                         env={k: v for k, v in env.items() if k in ("PATH", "GSRUN_HOST_ROOT", "GSRUN_CONFIG",
                                                                    "GSRUN_STATE_DIR", "GSRUN_SPOOL_DIR")},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = json.loads((sdir / "sampler.json").read_text())
            if st["done"] is False:
                break
            time.sleep(0.05)
        assert st["done"] is False and st["start_time"] > stale["summary"]["start_time"]
        (sdir / "sampler.pid.json").write_text(json.dumps({"pid": p.pid, "create_time": pids.start_time(p.pid),
                                                            "argv": info["argv"]}))
        cp = run_node(["epilog"], env)
        assert cp.returncode == 0, cp.stderr
        assert "node summary: computed from sampler.json (sampler: stopped)" in cp.stderr
        node = json.loads((site.spool / "jobs" / "4813" / "node-gpu-node01.json").read_text())
        assert node["sampler_stop"] == "stopped" and node["start_time"] == st["start_time"]
        assert p.wait(5) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _busy(job_id: str, node: str = "gpu-node01"):
    """A process of job ``job_id`` (its environment, as slurmstepd gives it) that burns CPU."""
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURMD_NODENAME=node)
    return subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile True:\n    pass\n"], env=env)


def test_job_procs_final_poll_rereads_known_processes_only():
    """Without a job cgroup the sampler finds the job's processes by their
    environment; its final poll (known_only) re-reads the ones it knows and
    does not scan for new ones, and CPU time of a process that ended is kept."""
    from gsrun.node.sampler import JobProcs

    job = "987654"
    procs = JobProcs(job, os.getuid(), "gpu-node01")
    a = _busy(job)
    other = _busy("111")            # another job's process: never counted
    b = None
    try:
        time.sleep(0.3)
        cpu0, rss0 = procs.poll()
        assert procs.current == {a.pid} and rss0 > 0
        time.sleep(0.4)
        b = _busy(job)              # started after the last full poll
        time.sleep(0.3)
        cpu1, _ = procs.poll(known_only=True)
        a_cpu = sum(psutil.Process(a.pid).cpu_times()[:2])
        assert procs.current == {a.pid}           # b is not looked for
        # a kept burning CPU and was re-read: its own CPU time now (however loaded the machine)
        assert cpu0 < cpu1 <= a_cpu + 0.01 and cpu1 >= a_cpu - 0.1
        a.kill()
        a.wait()
        cpu2, rss2 = procs.poll(known_only=True)
        assert procs.current == set() and rss2 == 0
        assert cpu2 == cpu1                       # an ended process keeps its last value
        cpu3, _ = procs.poll()                    # a full poll finds b
        assert procs.current == {b.pid} and cpu3 > cpu2
    finally:
        for p in (a, other, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_prolog_stops_the_earlier_sampler_of_its_job_and_nothing_else(tmp_path):
    """The prolog stops the sampler a record of its job names, before starting its own
    -- only when the record proves that process is it (its start time): a record
    without one (a sampler gone before it was recorded: start_time None) names a PID
    that may belong to anything by now, and root must not SIGTERM/SIGKILL that."""
    from gsrun.prolog.main import _stop_earlier_sampler

    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        earlier, reused, other = procs
        for p, ct in ((earlier, pids.start_time(earlier.pid)), (reused, None),
                      (other, pids.start_time(other.pid) - 100)):
            (tmp_path / "sampler.pid.json").write_text(json.dumps({"pid": p.pid, "create_time": ct}))
            _stop_earlier_sampler(tmp_path)
        assert earlier.wait(timeout=10) == -signal.SIGTERM
        assert reused.poll() is None and other.poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
