"""The end of a job's sampling: the epilog asks the node monitor to end the job
(its final sample and flush, at once whatever the interval) and writes the node
summary from the final state, or from the last flush when the monitor does not
answer; the sampler's final poll of the job's processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time


from gsrun.admin.node_entry import parse_hook_args
from helpers.node_site import LAUNCH, kill_fakes, make_site, monitor_pid, run_node, samplers_of, stop_daemon


def test_end_takes_the_final_sample_at_once_in_a_long_interval():
    """interval 60 s: the monitor waits in its loop right after the job's first poll; the
    epilog's end is answered at once, with the final sample, and the final state is flushed
    (done) before the summary is written from it."""
    site = make_site()
    site.config.write_text(site.config.read_text().replace("interval_s = 0.2", "interval_s = 60")
                           .replace("flush_s = 0.2", "flush_s = 600"))
    env = site.env(job_id="4801")
    try:
        cp = run_node(["prolog"], env)
        assert cp.returncode == 0, cp.stderr
        sdir = site.state / "jobs" / "4801"
        assert _first_flush(sdir)                   # right after the answer to the prolog
        state = json.loads((sdir / "sampler.json").read_text())
        assert state["done"] is False and state["samples"] == 1
        t0 = time.monotonic()
        cp = run_node(["epilog"], env)
        assert cp.returncode == 0, cp.stderr
        assert time.monotonic() - t0 < 10
        node = json.loads((site.spool / "jobs" / "4801" / "node-gpu-node01.json").read_text())
        assert node["sampler_stop"] == "stopped" and node["samples"] == 2      # the final sample
        assert not sdir.exists()
    finally:
        kill_fakes(site)


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


def _started(site, job_id: str) -> tuple[dict, object]:
    """A job the node monitor samples, past its first flush -> (env, state dir)."""
    env = site.env(job_id=job_id)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    sdir = site.state / "jobs" / job_id
    assert (sdir / "monitor.json").exists()
    assert _first_flush(sdir)
    return env, sdir


def _first_flush(sdir, timeout_s: float = 10.0) -> bool:
    """The job's first poll and flush come right after the monitor answered the prolog."""
    deadline = time.monotonic() + timeout_s
    while not (sdir / "sampler.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return (sdir / "sampler.json").exists()


def test_epilog_ends_the_sampling_and_writes_the_summary_from_the_final_state():
    site = make_site()
    try:
        env, sdir = _started(site, "4811")
        time.sleep(0.5)
        cp = run_node(["epilog"], env)
        assert cp.returncode == 0, cp.stderr
        assert not samplers_of("4811", site.state)
        node = json.loads((site.spool / "jobs" / "4811" / "node-gpu-node01.json").read_text())
        assert node["sampler_stop"] == "stopped" and node["samples"] >= 2
        assert node["gres_gpus"] == [0] and node["end_time"] >= node["start_time"] and node["gpu_available"]
        assert not sdir.exists()     # state dir forgotten after a clean epilog
        cp = run_node(["epilog"], env)          # again (slurmd retried it): nothing to end
        assert cp.returncode == 0, cp.stderr
    finally:
        kill_fakes(site)


def test_epilog_writes_the_summary_from_the_last_flush_when_the_monitor_does_not_answer():
    """The monitor SIGKILLed and its daemon gone; what listens on monitor.sock closes
    every connection unanswered (a monitor dying while it answers): the epilog says so
    and summarises the last flushed state."""
    site = make_site()
    listener = None
    try:
        env, sdir = _started(site, "4812")
        time.sleep(0.5)
        pid = monitor_pid(site.state)
        os.kill(pid, signal.SIGKILL)
        stop_daemon(site.state, kill=True)
        flushed = json.loads((sdir / "sampler.json").read_text())
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(site.state / "monitor.sock"))
        listener.listen(8)

        def hang_up():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.close()
        threading.Thread(target=hang_up, daemon=True).start()
        cp = subprocess.run([sys.executable, "-P", "-c", LAUNCH, "epilog"], env=env, capture_output=True,
                            text=True, timeout=120, cwd="/")      # not run_node: it would start a daemon
        assert cp.returncode == 0, cp.stderr
        assert "the summary has the figures of the last flush" in cp.stderr
        node = json.loads((site.spool / "jobs" / "4812" / "node-gpu-node01.json").read_text())
        assert node["sampler_stop"].startswith("monitor not answering: ")
        assert node["samples"] == flushed["samples"] >= 1 and node["start_time"] == flushed["start_time"]
    finally:
        if listener is not None:
            listener.close()
        kill_fakes(site)


def _busy(job_id: str, node: str = "gpu-node01"):
    """A process of job ``job_id`` (its environment, as slurmstepd gives it) that burns CPU."""
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURMD_NODENAME=node)
    return subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile True:\n    pass\n"], env=env)


def test_job_procs_count_the_jobs_processes_and_keep_an_ended_ones_cpu():
    """Without a job cgroup the sampler finds the job's processes by their
    environment (a process started later too); another job's are never
    counted, and CPU time of a process that ended is kept."""
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
        a.kill()
        a.wait()
        b = _busy(job)              # started after the first poll
        time.sleep(0.3)
        cpu1, rss1 = procs.poll()
        assert procs.current == {b.pid} and rss1 > 0
        assert cpu1 > cpu0          # a's last value kept, b's added
    finally:
        for p in (a, other, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
