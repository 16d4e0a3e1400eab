"""The epilog handed to the job's sampler (gsrun.epilog.handoff,
item 1): the epilog process only connects and waits, the sampler runs the
steps with the epilog's environment; every way the handoff can fail ends in
the epilog running the steps itself, never in both running them."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time

import pytest

from gsrun.base import pids
from gsrun.epilog import handoff
from helpers.node_site import TUNE, host_only, make_site, run_node, samplers_of

_STARTED: list = []      # (site, job id) of every sampler a test started
from helpers.tuning_tree import snapshot


@pytest.fixture(autouse=True)
def _no_sampler_left():
    """A test that fails half-way must not leave its job's sampler polling."""
    yield
    while _STARTED:
        site, job_id = _STARTED.pop()
        for pid in samplers_of(job_id, site.state):
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _started(site, job_id: str, tuned: bool = False, interval_s: float = 0.2):
    """A prolog's sampler of ``job_id`` listening -> (env, pid record, state dir);
    ``tuned``: a job holding the node that asked for node tuning."""
    site.config.write_text(site.config.read_text().replace("interval_s = 0.2", f"interval_s = {interval_s}"))
    kw = dict(spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
              FAKE_SCONTROL_RECORD=f"JobId={job_id} JobName=t UserId=nobody(65534) OverSubscribe=NO "
                                   "Comment=(null)") if tuned else {}
    env = site.env(job_id=job_id, **kw)
    _STARTED.append((site, job_id))
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    sdir = site.state / "jobs" / job_id
    deadline = time.monotonic() + 20
    while not ((sdir / "sampler.json").exists() and (sdir / handoff.SOCKET_NAME).exists()) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (sdir / handoff.SOCKET_NAME).exists()
    return env, json.loads((sdir / "sampler.pid.json").read_text()), sdir


def _gone(info, wait_s: float = 10.0) -> bool:
    deadline = time.monotonic() + wait_s
    while pids.is_same(info["pid"], info["create_time"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not pids.is_same(info["pid"], info["create_time"])


def test_epilog_runs_in_the_sampler_with_the_same_results():
    site = make_site()
    env, info, sdir = _started(site, "4901")
    st = os.stat(sdir / handoff.SOCKET_NAME)
    assert stat.S_ISSOCK(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    # the epilog process printed what the sampler's run of the steps logged
    assert "(in the job's sampler" in cp.stderr
    assert "node summary: written by the sampler at its final flush" in cp.stderr
    assert "tuning: end" in cp.stderr and "done in" in cp.stderr
    # as when the epilog stopped the sampler by signal: it has exited when the epilog returns
    assert not pids.is_same(info["pid"], info["create_time"])
    node = json.loads((site.spool / "jobs" / "4901" / "node-gpu-node01.json").read_text())
    assert node["sampler_stop"] == "stopped" and node["samples"] >= 2 and node["gres_gpus"] == [0]
    assert node["elapsed_s"] == round(node["end_time"] - node["start_time"], 3) > 0
    assert node["gpu_available"] is True and node["request"] is not None
    user = site.spool / "jobs" / "4901" / "user-node-gpu-node01.json"
    assert user.stat().st_uid == 0 and stat.S_IMODE(user.stat().st_mode) == 0o440
    assert not sdir.exists()         # forgotten after a clean epilog, socket with it


def test_tuning_restored_by_the_handed_over_epilog_is_byte_exact():
    site = make_site()
    before = host_only(snapshot(site.host))
    env, info, sdir = _started(site, "4902", tuned=True)
    during = host_only(snapshot(site.host))
    changed = sorted(k for k in before if during.get(k) != before[k])
    assert len(changed) >= 3, changed        # governor, swappiness, THP, dirty ratio
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0 and "(in the job's sampler" in cp.stderr, cp.stderr
    assert "restored" in cp.stderr or "tuning: end" in cp.stderr
    assert host_only(snapshot(site.host)) == before


def test_a_stale_socket_of_a_killed_sampler_means_the_full_epilog():
    site = make_site()
    env, info, sdir = _started(site, "4903")
    os.kill(info["pid"], signal.SIGKILL)
    assert _gone(info)
    assert (sdir / handoff.SOCKET_NAME).exists()       # nobody removed it
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert "(in the job's sampler" not in cp.stderr
    assert "node summary: computed from sampler.json (sampler: not running)" in cp.stderr


def test_a_wedged_sampler_is_killed_before_the_epilog_runs_the_steps(monkeypatch):
    """SIGSTOP stands for a sampler hung in an NVML call: the connection is queued but
    never accepted; the epilog must not run the steps while it could still wake up."""
    site = make_site()
    env, info, sdir = _started(site, "4904")
    os.kill(info["pid"], signal.SIGSTOP)
    monkeypatch.setattr(handoff, "ACCEPT_TIMEOUT_S", 0.5)
    rc, why = handoff.try_handoff(env, None, str(site.state), None)
    assert rc is None and "did not take the epilog within 0.5 s: killed" in why
    assert _gone(info, 1.0)
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert "computed from sampler.json (sampler: not running)" in cp.stderr


def test_a_request_for_another_job_is_refused_and_sampling_goes_on():
    site = make_site()
    env, info, sdir = _started(site, "4905")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(sdir / handoff.SOCKET_NAME))
    s.sendall(handoff.encode_request({**env, "SLURM_JOB_ID": "4999"}, None, None, None))
    s.shutdown(socket.SHUT_WR)
    assert s.recv(100) == b"refused request for another job\n"
    s.close()
    time.sleep(0.5)
    assert pids.is_same(info["pid"], info["create_time"])     # still sampling
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0 and "(in the job's sampler" in cp.stderr, cp.stderr
    assert _gone(info)


def test_the_sampler_ignores_a_connection_that_is_not_roots(tmp_path):
    d = tmp_path / "jobs" / "4906"
    d.mkdir(parents=True)
    lst = handoff.Listener()
    assert lst.open(d) is not None
    os.chmod(d, 0o755)
    os.chmod(d / handoff.SOCKET_NAME, 0o666)
    pid = os.fork()
    if pid == 0:     # the child: an ordinary user sending a well-formed request
        try:
            os.setgid(65534)
            os.setuid(65534)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(d / handoff.SOCKET_NAME))
            c.sendall(handoff.encode_request({"SLURM_JOB_ID": "4906"}, None, None, None))
            c.shutdown(socket.SHUT_WR)
            c.recv(10)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 5
        took = False
        while time.monotonic() < deadline and not took:
            took = lst.accept()
            if lst.conn is None:
                time.sleep(0.02)
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    pid = None
                    break
        assert not took and lst.conn is None
    finally:
        lst.close()
        if pid:
            os.waitpid(pid, 0)


def test_no_sampler_no_state_dir_means_no_handoff(tmp_path):
    assert handoff.try_handoff({"SLURM_JOB_ID": "4907"}, None, str(tmp_path), None) == (None, None)
    assert handoff.try_handoff({"SLURM_JOB_ID": "../x"}, None, str(tmp_path), None) == (None, None)
    assert handoff.try_handoff({"SLURM_JOB_ID": "4907", "GSRUN_FAULT_AT": "x"}, None, str(tmp_path),
                               None) == (None, None)


def test_requests_round_trip_and_malformed_ones_are_refused():
    env = {"SLURM_JOB_ID": "12_3", "A": "x=y", "EMPTY": ""}
    data = handoff.encode_request(env, "/h", None, "/s")
    assert handoff.decode_request(data) == ("/h", None, "/s", env)
    for bad in (b"", b"gsrun-epilog 2\0\0\0\0", data[:-1], b"gsrun-epilog 1\0a\0b\0", data + b"NOEQ\0",
                b"gsrun-epilog 1\0\0\0\0=v\0", b"x" * (handoff.MAX_REQUEST_BYTES + 1)):
        with pytest.raises(ValueError):
            handoff.decode_request(bad)


def test_a_long_state_dir_path_uses_the_directory_fd(tmp_path):
    """sun_path holds 107 bytes: a deeper state dir still gets its socket."""
    d = tmp_path / ("x" * 60) / ("y" * 60) / "jobs" / "4908"
    d.mkdir(parents=True)
    lst = handoff.Listener()
    try:
        assert lst.open(d) is not None
        assert stat.S_ISSOCK(os.stat(d / handoff.SOCKET_NAME).st_mode)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff._at(c, c.connect, str(d))
        c.close()
    finally:
        lst.close()


def test_the_sampler_running_the_epilog_never_signals_itself():
    """Handed over, the sampler's own summary can be missing (write_summary failed and
    returned None): the summary step must still not stop the recorded sampler -- itself.
    SIGTERM only sets its loop's flag, so pids.stop waited 5 s on its own exit and then
    SIGKILLed it in the middle of the epilog it was running."""
    import io

    from gsrun.epilog import main as epilog_main
    from gsrun.base.log import JobLog
    from gsrun.base.paths import Paths
    from gsrun.facts.hostfs import HostFS
    from gsrun.facts.jobenv import job_from_env

    site = make_site()
    env = site.env(job_id="4909")
    paths = Paths(str(site.state), str(site.spool), str(site.mps))
    sdir = paths.make_state_job("4909")
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:     # the child stands for the sampler: the recorded PID, a SIGTERM handler that only notes it
        code = 1
        try:
            os.close(r)
            signal.signal(signal.SIGTERM, lambda *a: None)
            me = os.getpid()
            (sdir / "sampler.pid.json").write_text(json.dumps({"pid": me, "create_time": pids.start_time(me)}))
            out = epilog_main._summary(job_from_env(env), paths, sdir, HostFS.from_env(str(site.host)),
                                       JobLog("4909", "epilog", stream=io.StringIO(), use_syslog=False), None)
            os.write(w, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    took_s = time.monotonic() - t0
    with os.fdopen(r, "rb") as f:
        out = f.read()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
        f"the sampler ended by signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else None} after {took_s:.1f} s"
    assert took_s < 4.0
    res = json.loads(out)
    assert res["sampler"] == "stopped" and res["summary"].endswith("node-gpu-node01.json")


def test_a_request_whose_epilog_gave_up_is_not_served(tmp_path):
    """A sampler that wakes up late (hung in a poll past ACCEPT_TIMEOUT_S, and not killed: no
    pidfd, a PID not visible) still finds the request queued on the socket, whole, after the
    epilog that sent it closed its end and ran the steps itself: it must not run them a second
    time (and it keeps sampling, so its final flush is not lost); a request whose epilog still
    waits is taken."""
    d = tmp_path / "jobs" / "4910"
    d.mkdir(parents=True)
    lst = handoff.Listener()
    assert lst.open(d) is not None
    try:
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.connect(str(d / handoff.SOCKET_NAME))
        gone.sendall(handoff.encode_request({"SLURM_JOB_ID": "4910"}, None, None, None))
        gone.shutdown(socket.SHUT_WR)
        gone.close()                            # the epilog fell back
        assert lst.accept() is False and lst.conn is None
        waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting.connect(str(d / handoff.SOCKET_NAME))
        waiting.sendall(handoff.encode_request({"SLURM_JOB_ID": "4910"}, None, None, None))
        waiting.shutdown(socket.SHUT_WR)
        assert lst.accept() is True and lst.request[3] == {"SLURM_JOB_ID": "4910"}
        waiting.close()
    finally:
        lst.close()


def test_a_wedged_sampler_is_killed_without_pidfds_too(monkeypatch):
    """Kernels before 5.3 have no pidfd_open (ENOSYS): the wedged sampler is still
    killed (by PID) before the epilog runs the steps, not reported 'already gone'."""
    import errno

    site = make_site()
    env, info, sdir = _started(site, "4911")
    os.kill(info["pid"], signal.SIGSTOP)

    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(handoff, "ACCEPT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    try:
        rc, why = handoff.try_handoff(env, None, str(site.state), None)
    finally:
        monkeypatch.undo()
    assert rc is None and "did not take the epilog within 0.5 s: killed" in why
    assert _gone(info, 1.0)
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr


def test_a_second_epilog_of_the_job_waits_for_the_first(monkeypatch, capsys):
    """One epilog of a job at a time (handoff.lock_job): a second one (by hand, while
    slurmd's is handed over) waits for the lock instead of finding the sampler busy,
    killing it after ACCEPT_TIMEOUT_S and running the steps alongside the first."""
    import fcntl
    import subprocess
    import sys

    from helpers.node_site import LAUNCH

    site = make_site()
    env, info, sdir = _started(site, "4920")
    first = os.open(sdir / handoff.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)    # the first epilog
    fcntl.flock(first, fcntl.LOCK_EX)
    try:
        # a wedged first epilog: the second gives up after the wait, exit 1 (slurmd drains), sampler untouched
        monkeypatch.setattr(handoff, "LOCK_WAIT_S", 0.3)
        assert handoff.run_epilog(env, None, str(site.state), None) == 1
        err = capsys.readouterr().err
        assert "gsrun: epilog: job 4920: another epilog of this job still holds epilog.lock after 0.3 s" in err
        assert "hint: " in err
        assert pids.is_same(info["pid"], info["create_time"])
        second = subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "epilog"], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
        time.sleep(handoff.ACCEPT_TIMEOUT_S / 5 + 0.5)
        assert second.poll() is None                           # waiting for the lock
        assert pids.is_same(info["pid"], info["create_time"])  # nobody touched the sampler
    finally:
        os.close(first)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert "(in the job's sampler" in err                      # then handed over as usual
    assert _gone(info, 1.0)
    assert not sdir.exists()                                   # the job's state forgotten


def test_no_job_directory_means_no_lock(tmp_path):
    assert handoff.lock_job({"SLURM_JOB_ID": "77"}, str(tmp_path)) == (None, None)
    assert handoff.lock_job({"SLURM_JOB_ID": "x/../y"}, str(tmp_path)) == (None, None)
