"""The node daemon (gsrun.daemon.server) and its C client gsrun-hook: a hook
through the daemon does what the hook's code does -- same exit status, same
stderr, same files -- and every way the daemon can be missing, refuse or die
ends in the hook running at most once, or the client failing with why and a
hint (never running the hook itself)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress

import pytest

import gsrun
from gsrun.daemon import server
from gsrun.node import monitor
from gsrun.admin.node_entry import HOOK_BOOTSTRAP
from helpers.node_site import LAUNCH, make_site, samplers_of, wait_for

SITE_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(gsrun.__file__))))
MISMATCH = {"init": {"error": "Driver/library version mismatch", "code": 18}}


def hook(phase: str) -> list[str]:
    """The command a hook of this installation runs (gsrun.admin.node_entry.hook_argv's shape)."""
    return [sys.executable, "-I", "-S", "-c", HOOK_BOOTSTRAP, SITE_DIR, phase]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    if not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no C compiler (tests/cluster/up installs gcc)")
    from gsrun.daemon import build as hook_client

    return str(hook_client.build(tmp_path_factory.mktemp("hookbin")))


class Running:
    """A node daemon on ``tmp_path/run/daemon.sock``; with ``site``, its node
    monitor is the site's (state dir, host root, config), else it runs none."""

    def __init__(self, tmp_path, site=None, run_dir=None, extra_args=(), extra_env=None):
        d = run_dir or tmp_path / "run"
        d.mkdir(mode=0o700, exist_ok=True)
        self.sock = str(d / "daemon.sock")
        self.log = tmp_path / "server.log"
        args = ["--no-monitor"]
        env = dict(os.environ, **(extra_env or {}))
        if site is not None:
            site.state.mkdir(mode=0o755, parents=True, exist_ok=True)
            args = ["--state-dir", str(site.state), "--host-root", str(site.host), "--metrics-port", "0"]
            env["GSRUN_CONFIG"] = str(site.config)
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "daemon", "run", "--socket", self.sock,
                                          *args, *extra_args], stdout=out, stderr=subprocess.STDOUT, cwd="/",
                                         env=env)
        if site is not None:
            deadline = time.monotonic() + 30
            while not (site.state / "monitor.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock) and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(self.sock), self.log.read_text()

    def children(self) -> list[int]:
        """The daemon's hook children now (its node monitor left out)."""
        import psutil

        try:
            mon = server.ping(self.sock)["monitor_pid"]
        except Exception:  # noqa: BLE001 - a daemon killed by the test answers nothing
            mon = None
        out = []
        for c in psutil.Process(self.proc.pid).children():
            if c.pid == mon:
                continue
            try:
                if c.status() != psutil.STATUS_ZOMBIE:
                    out.append(c.pid)
            except psutil.NoSuchProcess:
                pass        # reaped between the listing and the look
        return out

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        return self.log.read_text()


@pytest.fixture
def running(tmp_path):
    a = Running(tmp_path)
    yield a
    if a.proc.poll() is None:
        a.proc.kill()
        a.proc.wait()


def via(client, sock, argv, env, timeout_s=120) -> subprocess.CompletedProcess:
    return subprocess.run([client, sock, *argv], env=env, capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, cwd="/")


# ------------------------------------------------------------------ protocol (pure)

def test_a_request_round_trips_and_the_first_of_a_repeated_name_wins():
    raw = server.encode_request(["/p", "prolog"], {"A": "1", "B": "x=y", "E": ""}, 0o027)
    assert int.from_bytes(raw[:4], "big") == len(raw) - 4
    argv, env, um = server.parse_request(raw[4:] + b"A=2\0")
    assert argv == ["/p", "prolog"] and env == {"A": "1", "B": "x=y", "E": ""} and um == 0o027


@pytest.mark.parametrize("body", [
    b"GSH0\x00022\x001\x00/p\x00",            # another protocol version
    b"GSH1\x00999\x001\x00/p\x00",            # umask out of range
    b"GSH1\x00022\x000\x00",                  # no argv
    b"GSH1\x00022\x005\x00/p\x00",            # argc past the fields
    b"GSH1\x00022\x001\x00/p\x00NOEQUALS\x00",  # environment entry without a value
    b"GSH1\x00022\x001\x00/p",                # unterminated
])
def test_a_malformed_request_is_refused(body):
    with pytest.raises(server.BadRequest):
        server.parse_request(body)


def test_only_the_hook_command_of_this_installation_is_served(tmp_path):
    py = sys.executable
    assert server.hook_args(hook("prolog"), py, SITE_DIR) == ["prolog"]
    assert server.hook_args(hook("epilog") + ["--state-dir", "/x"], py, SITE_DIR) == ["epilog", "--state-dir", "/x"]
    link = tmp_path / "python-link"
    link.symlink_to(os.path.realpath(py))
    assert server.hook_args([str(link), *hook("prolog")[1:]], py, SITE_DIR) == ["prolog"]   # same interpreter
    node = tmp_path / "gsrun-node"      # this installation's console script (a regular or editable install)
    node.write_text("#!/bin/sh\n")
    assert server.hook_args([str(node), "epilog"], py, SITE_DIR, str(node)) == ["epilog"]
    assert server.hook_args([str(node), "status"], py, SITE_DIR, str(node)) is None
    assert server.hook_args([str(node), "epilog"], py, SITE_DIR, None) is None
    other = tmp_path / "site-packages"
    other.mkdir()
    for argv in (hook("sampler"),                                   # not a hook
                 hook("prolog") + ["--help"],                       # click's, not the fast path's
                 [*hook("prolog")[:5], str(other), "prolog"],       # another installation
                 ["/bin/sh", *hook("prolog")[1:]],                  # another program
                 [py, "-I", "-c", HOOK_BOOTSTRAP, SITE_DIR, "prolog"],
                 [py, "-I", "-S", "-c", "import os; os.system('id')", SITE_DIR, "prolog"]):
        assert server.hook_args(argv, py, SITE_DIR) is None, argv


def test_a_changed_module_is_seen(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("x = 1\n")
    st = os.stat(f)
    files = {str(f): (st.st_ino, st.st_mtime_ns, st.st_size)}
    assert server.changed(files) is None
    f.write_text("x = 22\n")
    assert server.changed(files) == str(f)
    f.unlink()
    assert server.changed(files) == str(f)


# ------------------------------------------------------------------ through the daemon

def test_a_job_through_the_daemon_prolog_monitor_epilog(client, tmp_path):
    """Prolog and epilog through the daemon: the node monitor (the daemon's child, the
    one process with NVML) samples the job from the prolog to the epilog, which writes
    the node summary from its final state; EpilogSlurmctld is answered at once."""
    site = make_site()
    running = Running(tmp_path, site)
    try:
        env = site.env(job_id="5101")
        cp = via(client, running.sock, hook("prolog"), env)
        assert cp.returncode == 0, cp.stderr
        sdir = site.state / "jobs" / "5101"
        prolog = json.loads((site.spool / "jobs" / "5101" / "prolog-gpu-node01.json").read_text())
        assert prolog["steps"]["sampler"] == {"monitor": "sampling", "resumed": False, "gpus": 1}
        st = server.ping(running.sock)
        mon = monitor.ask(site.state, {"op": "status"})
        assert mon["pid"] == st["monitor_pid"] and mon["jobs"] == ["5101"] and mon["nvml_inits"] == 1
        assert (sdir / "monitor.json").exists()
        time.sleep(1.0)                     # 0.2 s polls
        cp = via(client, running.sock, hook("epilog"), env)
        assert cp.returncode == 0, cp.stderr
        assert wait_for(lambda: running.children() == [], 10)     # the report, written after the answer
        node = json.loads((site.spool / "jobs" / "5101" / "node-gpu-node01.json").read_text())
        assert node["sampler_stop"] == "stopped" and node["samples"] >= 5 and node["gpu_available"]
        assert monitor.ask(site.state, {"op": "status"})["jobs"] == []
        assert running.children() == []
        # EpilogSlurmctld: answered by the daemon itself (no hook process on slurmctld's path),
        # the merge started detached writes the job summary
        record = ("JobId=5101 JobName=t UserId=nobody(65534) GroupId=nogroup(65534) JobState=COMPLETED "
                  "ExitCode=0:0 RunTime=00:01:00 NodeList=gpu-node01 NumNodes=1 Partition=gpu "
                  "OverSubscribe=NO Comment=(null)")
        cenv = dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", FAKE_SLURM="record", FAKE_SCONTROL_RECORD=record)
        cp = via(client, running.sock, hook("epilog-ctld"), cenv)
        assert (cp.returncode, cp.stdout, cp.stderr) == (0, "", "")
        summary = site.spool / "jobs" / "5101" / "summary.json"
        deadline = time.monotonic() + 30
        while not summary.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        got = json.loads(summary.read_text())
        assert (got["kind"], got["job"]["id"], got["nodes_missing"]) == ("job", "5101", [])
        # a bad job id goes to a hook process, which says why (in the log)
        cp = via(client, running.sock, hook("epilog-ctld"), dict(cenv, SLURM_JOB_ID="5101x"))
        assert cp.returncode == 0, cp.stderr
        st = server.ping(running.sock)
        assert (st["pid"], st["served"], st["version"]) == (running.proc.pid, 4, gsrun.__version__)
        cp = subprocess.run([sys.executable, "-P", "-c", LAUNCH, "daemon", "status", "--socket",
                             str(site.base / "none.sock")], capture_output=True, text=True, timeout=30, cwd="/")
        assert cp.returncode == 1 and cp.stderr.startswith("gsrun: daemon: not running: "), cp.stderr
        log = running.stop()
        assert "stopped (4 hooks served)" in log and "gsrun: monitor: stopped" in log, log
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
        shutil.rmtree(site.base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the client as another user")
def test_a_slurmuser_gets_the_merge_through_the_controller_door_and_nothing_else(client, tmp_path):
    """slurm.conf's SlurmUser (here nobody) runs EpilogSlurmctld: through ctld.sock the
    root daemon starts the merge, which writes the root-owned spool with the daemon's own
    config and spool (the client's GSRUN_*, SLURM_CONF and --spool-dir are dropped); that
    user gets nothing else there (no prolog, no step plan), and root's socket stays closed
    to it."""
    site = make_site()
    record = ("JobId=5111 JobName=t UserId=nobody(65534) GroupId=nogroup(65534) JobState=COMPLETED "
              "ExitCode=0:0 RunTime=00:01:00 NodeList=gpu-node01 NumNodes=1 Partition=gpu "
              "OverSubscribe=NO Comment=(null)")
    env = site.env(job_id="5111")
    own = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    run_dir = site.base / "run"
    run_dir.mkdir(mode=0o755)
    running = Running(tmp_path, site, run_dir=run_dir, extra_args=["--ctld-user", "nobody"],
                      extra_env=dict(own, FAKE_SLURM="record", FAKE_SCONTROL_RECORD=record))
    bindir = site.base / "bin"
    bindir.mkdir(mode=0o755)
    shutil.copy(client, bindir / "gsrun-hook")
    ctld_sock = str(run_dir / "ctld.sock")
    try:
        st = os.stat(ctld_sock)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 65534, 0o660)
        for phase in ("prolog", "epilog"):
            cp = via(client, running.sock, hook(phase), env)
            assert cp.returncode == 0, cp.stderr

        def as_slurmuser(sock, argv, env):
            return subprocess.run([str(bindir / "gsrun-hook"), sock, *argv], env=env, capture_output=True,
                                  text=True, timeout=60, cwd="/", user=65534, group=65534, extra_groups=[])

        forged = dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmctld", GSRUN_CONFIG="/nonexistent/gsrun.toml",
                      GSRUN_SPOOL_DIR="/nonexistent", SLURM_CONF="/nonexistent/slurm.conf")
        cp = as_slurmuser(ctld_sock, hook("epilog-ctld") + ["--spool-dir", "/nonexistent"], forged)
        assert (cp.returncode, cp.stderr) == (0, "")
        summary = site.spool / "jobs" / "5111" / "summary.json"
        deadline = time.monotonic() + 30
        while not summary.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        got = json.loads(summary.read_text())
        assert (got["kind"], got["job"]["id"], got["nodes_missing"]) == ("job", "5111", [])
        assert summary.stat().st_uid == 0
        cp = as_slurmuser(ctld_sock, hook("prolog"), dict(env, SLURM_JOB_ID="5112"))
        assert cp.returncode == 1 and "only EpilogSlurmctld is served on this socket" in cp.stderr, cp.stderr
        assert not (site.spool / "jobs" / "5112").exists()
        cp = as_slurmuser(running.sock, hook("epilog-ctld"), forged)
        assert cp.returncode == 1 and "node daemon not running" in cp.stderr, cp.stderr
        from gsrun.facts.hostfs import HostFS
        from gsrun.admin import doctor

        conf = site.base / "slurm.conf"
        conf.write_text("SlurmUser=nobody\nEpilogSlurmctld=/x\n")
        got = doctor.check_daemon(doctor.Context(HostFS(), state_dir=str(run_dir), slurm_conf=str(conf)))
        assert got.status != "fail", got
        log = running.stop()
        assert "EpilogSlurmctld of nobody (uid 65534)" in log and "refused on the controller's door" in log, log
        assert not os.path.exists(ctld_sock)
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
        shutil.rmtree(site.base, ignore_errors=True)


def test_ctld_env_keeps_slurmctlds_job_facts_and_nothing_else_of_the_request():
    own = {"PATH": "/usr/bin", "GSRUN_CONFIG": "/etc/gsrun/gsrun.toml", "SLURM_CONF": "/etc/slurm/slurm.conf",
           "SLURM_JOB_ID": "stale"}
    req = {"PATH": "/tmp/evil", "GSRUN_CONFIG": "/tmp/x.toml", "SLURM_CONF": "/tmp/slurm.conf",
           "SLURM_JOB_ID": "7", "SLURM_JOB_UID": "1000", "LD_PRELOAD": "/tmp/x.so"}
    assert server.ctld_env(req, own) == {"PATH": "/usr/bin", "GSRUN_CONFIG": "/etc/gsrun/gsrun.toml",
                                         "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_JOB_ID": "7",
                                         "SLURM_JOB_UID": "1000"}


def test_the_exit_status_and_stderr_are_the_hooks_own(client, tmp_path):
    """NVML/driver mismatch, as the node monitor found it: the prolog exits 1 (slurmd
    drains the node) with its reason, through the daemon."""
    site = make_site(nvml=MISMATCH)
    running = Running(tmp_path, site)
    try:
        env = site.env(job_id="5102", FAKE_NVSMI="mismatch")
        cp = via(client, running.sock, hook("prolog"), env)
        assert cp.returncode == 1
        assert "gsrun: prolog: NVML/driver mismatch: reboot required" in cp.stderr
        assert not samplers_of("5102", site.state)
    finally:
        running.proc.kill()
        running.proc.wait()
        shutil.rmtree(site.base, ignore_errors=True)


def test_without_a_daemon_the_hook_fails_with_why_and_never_runs_itself(client, tmp_path):
    marker = tmp_path / "ran"
    t0 = time.monotonic()
    cp = via(client, str(tmp_path / "none.sock"), [*hook("prolog")], {"X": "1"})
    waited_s = time.monotonic() - t0
    assert cp.returncode == 1 and cp.stdout == ""
    assert cp.stderr.splitlines() == [
        f"gsrun: prolog: node daemon not running: {tmp_path}/none.sock: No such file or directory",
        "hint: start it: systemctl start gsrun-daemon (journalctl -u gsrun-daemon says why it stopped); "
        "the node stays drained until it runs"]
    assert 4.5 < waited_s < 15          # it waited for a daemon that is (re)starting, boundedly
    cp = via(client, str(tmp_path / "none.sock"), ["/bin/sh", "-c", f"echo self > {marker}"], {})
    assert cp.returncode == 1 and "gsrun: hook: node daemon not running" in cp.stderr
    assert not marker.exists()


def test_a_command_the_daemon_does_not_serve_is_refused_and_the_daemon_goes_on(client, running, tmp_path):
    marker = tmp_path / "ran"
    cp = via(client, running.sock, ["/bin/sh", "-c", f"echo self > {marker}", "prolog"], {"X": "2"})
    assert cp.returncode == 1 and not marker.exists()
    assert cp.stderr.startswith("gsrun: prolog: node daemon refused the hook: not a hook of this installation"), \
        cp.stderr
    assert "hint: point slurm.conf's Prolog/Epilog at the lines `gsrun-node install` prints" in cp.stderr
    assert running.proc.poll() is None
    # a client of another user cannot even connect (socket 0600): it fails, it runs nothing
    if os.geteuid() == 0:
        cp = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", client,
                             running.sock, "/bin/sh", "-c", "id -u", "epilog"], capture_output=True, text=True,
                            timeout=30)
        assert (cp.returncode, cp.stdout) == (1, ""), cp.stderr
        assert f"gsrun: epilog: node daemon not running: {running.sock}: Permission denied" in cp.stderr
    assert "stopped (0 hooks served)" in running.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="the tuned prolog reads the job record as root does")
def test_a_client_killed_takes_its_hook_with_it_and_a_killed_hook_kills_its_client(client, running):
    """slurmd kills a hook past PrologEpilogTimeout: the daemon's child goes too. A
    hook that dies of a signal makes its client die of the same one (slurmd sees
    what it would have seen)."""
    site = make_site(command_s=20.0)
    try:
        # a tuned job asks slurmctld for its record; FAKE_SLURM unset: scontrol never answers
        env = site.env(job_id="5103", spank={"SPANK_GS_TUNE": "governor=performance"})
        p = subprocess.Popen([client, running.sock, *hook("prolog")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd="/")
        deadline = time.monotonic() + 10
        while not running.children() and time.monotonic() < deadline:
            time.sleep(0.02)
        kids = running.children()
        assert kids
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while running.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.children() == []

        p = subprocess.Popen([client, running.sock, *hook("prolog")], env=site.env(job_id="5104", spank={
            "SPANK_GS_TUNE": "governor=performance"}), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
        deadline = time.monotonic() + 10
        while not running.children() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(running.children()[0], signal.SIGKILL)
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        from helpers.node_site import kill_fakes

        kill_fakes(site)
        shutil.rmtree(site.base, ignore_errors=True)


def test_an_upgraded_module_makes_the_daemon_re_execute_and_the_hook_waits_for_it(client, tmp_path):
    """A gsrun module changed under a running daemon (an upgrade): the next hook is
    answered "try again" (never old code against a new layout), the daemon
    re-executes itself, and the client's retry runs the hook in the new image, once."""
    a = Running(tmp_path)
    try:
        import gsrun.daemon.server as mod

        st = os.stat(mod.__file__)
        os.utime(mod.__file__, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        try:
            site = make_site()
            try:
                cp = via(client, a.sock, hook("prolog"), site.env(job_id="5105", FAKE_SLURM="record"))
                from gsrun.admin.node_entry import hook_argv

                if hook_argv("prolog"):     # a regular install (an editable one cannot run the bootstrap)
                    assert cp.returncode == 0, cp.stderr
                text = a.log.read_text()
                assert "changed since the daemon started" in text and "re-executing" in text, text
                assert text.count("serving ") == 2, text        # the first image, then the new one
                assert a.proc.poll() is None        # same PID, new image
            finally:
                shutil.rmtree(site.base, ignore_errors=True)
        finally:
            os.utime(mod.__file__, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        a.proc.kill()
        a.proc.wait()


def test_the_preload_leaves_the_children_every_record_loading_plan_built():
    """A forked epilog would otherwise evaluate every record's type hints again (~4 ms on the dev VM)."""
    code = ("from gsrun.daemon.server import NodeDaemon\nfrom gsrun.base import record\n"
            "from gsrun.report.records import JobSummary, NodeSummary\n"
            "from gsrun.facts.sampler_state import SamplerState\n"
            "print(NodeDaemon('/nonexistent/d.sock').preload())\nbuilt = record._plan.cache_info().misses\n"
            "for cls in (JobSummary, NodeSummary, SamplerState):\n    record._plan(cls)\n"
            "print(record._plan.cache_info().misses - built, built)\n")
    cp = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert cp.returncode == 0, cp.stderr
    failed, (new, built) = cp.stdout.splitlines()[0], map(int, cp.stdout.split()[-2:])
    assert failed == "[]" and new == 0 and built >= 20, cp.stdout


def test_a_host_root_that_is_not_a_directory_stops_the_daemon_before_it_listens(tmp_path):
    """A mistyped ``--host-root`` (or GSRUN_HOST_ROOT) is refused at once, exit 2, no socket made:
    a daemon reading an empty tree would take every value of the node for unknown."""
    sock = tmp_path / "d.sock"
    for root in (tmp_path / "missing", tmp_path / "d.sock.file"):
        if root.name.endswith(".file"):
            root.write_text("")
        cp = subprocess.run([sys.executable, "-P", "-c", LAUNCH, "daemon", "run", "--socket", str(sock),
                             "--host-root", str(root)], capture_output=True, text=True, timeout=30, cwd="/")
        assert cp.returncode == 2, cp.stderr
        assert "Invalid value for '--host-root'" in cp.stderr and str(root) in cp.stderr
        assert not sock.exists()


def test_a_second_daemon_leaves_a_serving_ones_socket_alone_and_a_stopped_one_removes_its_own(running):
    """An admin trying `gsrun-node daemon run` while the unit's daemon serves: the second
    one refuses (renaming its socket over the path would leave the first serving nobody
    and the hooks failing once the second stops); the first goes on serving, and removes
    its socket when it stops (a stale one is replaced by the next daemon)."""
    import socket

    cp = subprocess.run([sys.executable, "-P", "-c", LAUNCH, "daemon", "run", "--socket", running.sock],
                        capture_output=True, text=True, timeout=30, cwd="/")
    assert cp.returncode == 2, cp.stderr
    assert f"gsrun: daemon: socket: {running.sock}: another daemon is serving it" in cp.stderr
    assert "hint: stop that one first" in cp.stderr
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(running.sock)             # still the first daemon's
    assert running.proc.poll() is None
    log = running.stop()
    assert "stopped" in log and "refused" not in log, log     # the second one's look is not a bad request
    assert not os.path.exists(running.sock)
    again = Running(running.log.parent)     # the directory is there, the socket is not: a fresh start
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(again.sock)
    finally:
        again.proc.kill()
        again.proc.wait()


def test_nothing_starts_without_the_clients_go(running, tmp_path):
    """The client gives up waiting for "ready" (and fails) -> the daemon, which then
    gets no "go", starts nothing: a hook never runs twice."""
    import socket

    site = make_site()
    try:
        req = server.encode_request(hook("prolog"), site.env(job_id="5106"), 0o022)
        for how in ("close", "late"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(running.sock)
            socket.send_fds(s, [req], [0, 1, 2])
            assert s.recv(1) == server.READY
            if how == "late":
                time.sleep(server.REQUEST_TIMEOUT_S + 0.5)
                try:
                    s.sendall(server.GO)
                except OSError:
                    pass
                assert s.recv(1) in (b"", server.REFUSED)     # not "S": nothing started
            s.close()
        time.sleep(0.3)
        assert running.children() == []
        assert "stopped (0 hooks served)" in running.stop()
    finally:
        shutil.rmtree(site.base, ignore_errors=True)


# ------------------------------------------------------------------ failures inside the daemon
# A daemon whose hook child is replaced (``server._child``: "S", then a line in a file, as a
# hook's one visible effect) and whose every command is served as a hook: what the daemon
# does around the fork, without a prolog's cost.
PATCHED = """
import os, sys, time
from gsrun.daemon import server
sock, marker, mode = sys.argv[1:4]
def child(args, env, umask, fds, conn, client_pid=None, handover=False):
    time.sleep(0.3)                 # the parent's answer, if any, reaches the client first
    conn.sendall(server.STARTED)
    if mode == "no-setsid":         # a client that leaves before the child is its own group
        time.sleep(1.5)
    with open(marker, "a") as f:
        f.write("daemon\\n")
    os._exit(0)
def probe(args, answer=None):      # the hook itself, in the daemon's real hook child
    with open("/proc/self/status") as f, open(marker, "w") as out:
        out.write("".join(l for l in f if l.startswith(("SigBlk", "SigIgn", "SigCgt"))))
    os._exit(0)
def broken(*args, **kwargs):       # the child's code fails before it runs anything
    raise TypeError("child() takes 5 positional arguments but 6 were given")
if mode == "merge":                 # every epilog-ctld starts a merge that takes 1 s and says when it ran
    def merge(argv, env, umask):
        open(marker, "a").write(f"+ {time.time()}\\n")
        time.sleep(1.0)
        open(marker, "a").write(f"- {time.time()}\\n")
        os._exit(0)
    server._merge_of = lambda args, env: (["python", "-m", "gsrun.epilog.ctld"], {})
    server._merge_child = merge
if mode == "probe":
    server.run_hook = probe
elif mode == "leaves":              # the hook leaves a process in its own group and says which
    import subprocess
    server.run_hook = lambda a, answer: (open(marker, "w").write(str(subprocess.Popen(["sleep", "60"]).pid)), 0)[1]
elif mode in ("early", "overdue"):  # the hook answers 5 (when it may), then goes on and says so
    server.REPORT_LIMIT_S = 1.0 if mode == "overdue" else 60.0
    server.run_hook = lambda a, answer: (answer and answer(5), time.sleep(1.0 if mode == "early" else 30),
                                         open(marker, "w").write("report"), 0)[-1]
elif mode == "status":              # the hook runs 0.5 s and ends with 3
    server.run_hook = lambda a, answer: (time.sleep(0.5), 3)[1]
elif mode == "broken":
    server._child = broken
else:
    server._child = child
server.hook_args = lambda argv, *a: ["epilog"]
if mode == "no-pidfd":
    def no_pidfd(pid, flags=0):
        raise OSError(24, "Too many open files")
    os.pidfd_open = no_pidfd
sys.exit(server.run(sock, monitor=False))
"""


def patched_daemon(tmp_path, mode: str):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    sock, marker, log = str(d / "server.sock"), tmp_path / "ran", tmp_path / "server.log"
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, "-P", "-c", PATCHED, sock, str(marker), mode], stdout=out,
                             stderr=subprocess.STDOUT, cwd="/")
    deadline = time.monotonic() + 30
    while not os.path.exists(sock) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert os.path.exists(sock), log.read_text()
    return p, sock, marker, log


def test_the_hooks_own_process_answers_its_status(client, tmp_path):
    """The hook's process sends X itself as it ends: its status reaches the client while
    the daemon cannot answer (stopped here) and before the daemon has reaped it."""
    import psutil

    p, sock, marker, log = patched_daemon(tmp_path, "status")
    c = subprocess.Popen([client, sock, "epilog"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(p.pid).children() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert psutil.Process(p.pid).children(), log.read_text()
        os.kill(p.pid, signal.SIGSTOP)
        assert c.wait(timeout=10) == 3, (c.stderr.read(), log.read_text())
    finally:
        os.kill(p.pid, signal.SIGCONT)
        c.kill()
        p.kill()
        p.wait()


def test_a_hook_that_answered_goes_on_after_its_client_left(client, tmp_path):
    """An epilog answers once the node is restored: the client exits with that status at
    once (its K), and the client's exit does not end the hook's report."""
    p, sock, marker, log = patched_daemon(tmp_path, "early")
    try:
        t0 = time.monotonic()
        cp = via(client, sock, ["/bin/true"], {}, timeout_s=30)
        assert cp.returncode == 5 and time.monotonic() - t0 < 0.9, (cp.stderr, log.read_text())
        assert not marker.exists()
        assert wait_for(lambda: marker.exists(), 10) and marker.read_text() == "report", log.read_text()
    finally:
        p.kill()
        p.wait()


def _raw_client(sock: str, go: bytes):
    """A client by hand: the request (``/bin/true``, fds 0-2), then ``go`` after R, then S."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    socket.send_fds(s, [server.encode_request(["/bin/true"], {}, 0o022)], [0, 1, 2])
    assert s.recv(1) == server.READY
    s.sendall(go)
    assert s.recv(1) == server.STARTED
    return s


def test_a_client_of_the_previous_release_gets_the_whole_hook_before_its_status(tmp_path):
    """A client that answers G (it sends no K after X): no early answer, so nothing of the
    hook is left to be killed when that client exits."""
    p, sock, marker, log = patched_daemon(tmp_path, "early")
    try:
        s = _raw_client(sock, server.GO)
        s.settimeout(10)
        assert s.recv(5) == server.EXITED + bytes(4)       # 0: the hook's own end, no early 5
        assert marker.read_text() == "report", log.read_text()
        s.close()
    finally:
        p.kill()
        p.wait()


def test_a_client_gone_after_the_answer_without_its_k_takes_the_hook_with_it(tmp_path):
    """X read but no K (slurmd killed the client then): the hook's group is killed, as for a
    client gone before X."""
    p, sock, marker, log = patched_daemon(tmp_path, "early")
    try:
        s = _raw_client(sock, server.GO_HANDOVER)
        s.settimeout(10)
        assert s.recv(5) == server.EXITED + (5 << 8).to_bytes(4, "big")
        s.close()
        time.sleep(2.0)
        assert not marker.exists(), log.read_text()
    finally:
        p.kill()
        p.wait()


def test_a_hook_alive_long_after_its_answer_is_killed(client, tmp_path):
    """After K the hook is the daemon's, for REPORT_LIMIT_S (1 s here): then its group is killed
    (a report stuck in a write no alarm interrupts), and the daemon says so."""
    p, sock, marker, log = patched_daemon(tmp_path, "overdue")
    try:
        cp = via(client, sock, ["/bin/true"], {}, timeout_s=30)
        assert cp.returncode == 5, (cp.stderr, log.read_text())
        assert wait_for(lambda: "after its answer: killed" in log.read_text(), 10), log.read_text()
        assert not marker.exists()
        assert wait_for(lambda: server.ping(sock)["running"] == 0, 10)
    finally:
        p.kill()
        p.wait()


def test_what_a_hook_leaves_in_its_group_ends_with_it(client, tmp_path):
    """As slurmd kills a hook's process group when the hook ends: a process the hook
    started in its group (not in a session of its own) does not outlive it."""
    import psutil

    p, sock, marker, log = patched_daemon(tmp_path, "leaves")
    try:
        cp = via(client, sock, ["/bin/true"], {}, timeout_s=30)
        assert cp.returncode == 0, (cp.stderr, log.read_text())
        left = int(marker.read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(left).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"the hook's process {left} outlived it")
    finally:
        p.kill()
        p.wait()


def test_a_hook_the_daemon_cannot_watch_still_runs_once_and_its_status_comes_back(client, tmp_path):
    """Out of descriptors after the fork (pidfd_open fails): the child runs the hook
    already, so the daemon must not answer anything before the child's "S"; it
    waits for the hook and sends its status."""
    p, sock, marker, log = patched_daemon(tmp_path, "no-pidfd")
    try:
        cp = via(client, sock, ["/bin/sh", "-c", f"echo self >> {marker}; exit 4"], {}, timeout_s=30)
        assert marker.read_text() == "daemon\n", (cp, log.read_text())
        assert cp.returncode == 0, cp.stderr
        assert "cannot be watched" in log.read_text()
    finally:
        p.kill()
        p.wait()


def test_a_client_gone_before_its_hook_has_its_own_group_takes_the_hook_with_it(tmp_path):
    """The client leaves between the child's "S" and its setsid(): no group of the
    child's PID yet, so the child itself is killed."""
    import socket

    p, sock, marker, log = patched_daemon(tmp_path, "no-setsid")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        socket.send_fds(s, [server.encode_request(["/bin/true"], {}, 0o022)], [0, 1, 2])
        assert s.recv(1) == server.READY
        s.sendall(server.GO)
        assert s.recv(1) == server.STARTED
        s.close()
        time.sleep(2.5)
        assert not marker.exists(), log.read_text()
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------------ the client against a stand-in daemon
# A one-connection daemon stand-in (run as ``user``): records the descriptors it was handed
# (whether each is a socket) and answers that the hook ran and exited 0.
STANDIN = """
import os, socket, stat, sys
sock, report = sys.argv[1:3]
s = socket.socket(socket.AF_UNIX)
s.bind(sock)
os.chmod(sock, 0o777)
s.listen(1)
s.settimeout(5)
try:
    c, _ = s.accept()
except TimeoutError:
    sys.exit(0)
c.settimeout(5)
_msg, fds, _f, _a = socket.recv_fds(c, 1 << 20, 3)
with open(report, "w") as f:
    f.write(" ".join("sock" if stat.S_ISSOCK(os.fstat(fd).st_mode) else "other" for fd in fds))
c.sendall(b"R")
c.recv(1)
c.sendall(b"SX" + bytes(4))
"""


def standin(tmp_path, uid: int | None = None):
    import pathlib
    import tempfile

    d = pathlib.Path(tempfile.mkdtemp(prefix="gsrun-standin-"))     # under /tmp: reachable by ``uid``
    (tmp_path / "standin").symlink_to(d)                            # removed with it below
    os.chmod(d, 0o755)
    report = d / "fds"
    argv = [sys.executable, "-I", "-c", STANDIN, str(d / "server.sock"), str(report)]
    if uid is not None:
        os.chown(d, uid, uid)
        argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", *argv]
    p = subprocess.Popen(argv, cwd="/")
    deadline = time.monotonic() + 10
    while not (d / "server.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (d / "server.sock").exists()
    return p, str(d / "server.sock"), report


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_closed_standard_descriptor_reaches_the_hook_as_dev_null_never_as_the_clients_socket(
        client, tmp_path, closed):
    """slurmd/slurmctld may start a hook with one of 0-2 closed: the client's socket
    would take that number and go to the hook as its stdin/stdout/stderr (the hook's
    output into the protocol). The client opens /dev/null there first: the daemon
    is handed three descriptors, none of them a socket."""
    p, sock, report = standin(tmp_path)
    try:
        cp = subprocess.run(["/bin/sh", "-c", f'exec {closed}>&-; exec "$@"', "sh", client, sock, "/bin/true"],
                            capture_output=True, text=True, timeout=30, cwd="/")
        assert cp.returncode == 0, cp.stderr
        assert report.read_text() == "other other other"
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a listener of another user")
def test_the_client_talks_only_to_a_daemon_of_its_own_user(client, tmp_path):
    """A socket at the daemon's path held by another user (a state directory open to
    it): the client neither hands it its environment and descriptors nor believes
    its "the hook exited 0"; it fails and says so."""
    p, sock, report = standin(tmp_path, uid=65534)
    try:
        cp = via(client, sock, ["/bin/sh", "-c", "echo self; exit 5", "epilog"], {}, timeout_s=30)
        assert (cp.returncode, cp.stdout) == (1, ""), cp.stderr
        assert f"gsrun: epilog: node daemon not running: {sock}: served by another user" in cp.stderr
        assert not report.exists() or report.read_text() == ""     # no descriptor handed over
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)


def _default_signals() -> None:
    """In a child before exec: every signal unblocked and at its default action."""
    import signal
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def test_the_hook_child_handles_signals_as_a_fresh_interpreter_does(client, tmp_path):
    """Blocked, ignored and caught signals of the hook in the daemon's child are those of
    the hook started on its own (python -I -S) with default dispositions: SIGINT raises
    KeyboardInterrupt there (the hook's finally blocks run), it does not kill the process
    outright. The reference starts from default dispositions, as slurmd's children do,
    whatever this test run inherited (``nohup`` ignores SIGHUP)."""
    p, sock, marker, log = patched_daemon(tmp_path, "probe")
    try:
        cp = via(client, sock, ["/bin/true"], {}, timeout_s=30)
        assert cp.returncode == 0, (cp.stderr, log.read_text())
        fresh = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; sys.stdout.write(''.join("
                                "l for l in open('/proc/self/status') if l.startswith(('SigBlk', 'SigIgn', 'SigCgt'))))"],
                               capture_output=True, text=True, check=True, cwd="/",
                               preexec_fn=_default_signals).stdout
        assert marker.read_text() == fresh
    finally:
        p.kill()
        p.wait()


def test_the_hook_child_joins_its_clients_cgroup_and_affinity(tmp_path):
    """The hook runs where slurmd's own hook process would (its cgroup v2 and CPU affinity):
    the job's sampler too, e.g. off the cores a site reserves for jobs."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    me = os.getpid()
    (proc / str(me)).mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / str(me) / "cgroup").write_text("0::/system.slice/slurmd.service\n")
    (proc / "self" / "cgroup").write_text("0::/system.slice/gsrun-server.service\n")
    (cg / "system.slice" / "slurmd.service").mkdir(parents=True)
    procs = cg / "system.slice" / "slurmd.service" / "cgroup.procs"
    procs.write_text("")
    # not a cgroup v2 hierarchy (v1 or hybrid): left alone
    assert server.join_client(me, str(proc), str(cg)) == [] and procs.read_text() == ""
    (cg / "cgroup.controllers").write_text("cpuset cpu memory pids\n")
    assert server.join_client(me, str(proc), str(cg)) == []
    assert procs.read_text() == "0"         # "0": the writing process, into slurmd's cgroup
    procs.write_text("")
    (proc / "self" / "cgroup").write_text("0::/system.slice/slurmd.service\n")     # there already
    assert server.join_client(me, str(proc), str(cg)) == [] and procs.read_text() == ""
    shutil.rmtree(procs.parent)            # gone (the slurmd restarted meanwhile)
    (proc / "self" / "cgroup").write_text("0::/\n")
    notes = server.join_client(me, str(proc), str(cg))       # cannot: said, not fatal
    assert len(notes) == 1 and notes[0].startswith(f"cgroup of the hook's client {me}:")
    assert server.join_client(2 ** 22 + 7, str(proc), str(cg))[-1].startswith("CPU affinity")


def test_a_child_whose_code_fails_never_runs_the_daemons_loop(client, tmp_path):
    """An exception in the forked child before the hook (a bug of ours) ends the child: it
    never returns into the daemon's loop (a second daemon, forever, on a copy of the
    listening socket). The client, which got no "S", fails and says so; nothing ran."""
    import psutil

    p, sock, marker, log = patched_daemon(tmp_path, "broken")
    try:
        cp = via(client, sock, ["/bin/sh", "-c", f"echo self >> {marker}"], {}, timeout_s=30)
        assert cp.returncode == 1 and not marker.exists(), (cp, log.read_text())
        assert "node daemon not running: it went away before the hook started" in cp.stderr
        deadline = time.monotonic() + 5
        while psutil.Process(p.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [c for c in psutil.Process(p.pid).children() if c.status() != psutil.STATUS_ZOMBIE] == []
        assert "request refused" not in log.read_text()
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------ the SPANK plugin's step plans (@bind)

def ask_plan(sock: str, stepd_env: dict[str, str], job_env: dict[str, str], cpus: str = "", mems: str = "",
             job_id: str = "4242", step_id: str = "0", mps: str = "-", bind: str = "-",
             plugstack_bind: str = "auto", ntasks: str = "1") -> str:
    """What the plugin does (spank_py/gsrun_spank.c, daemon_hello/daemon_plan): ``@bind`` with
    slurmstepd's own variables and fds 0-2, then ``@step`` with the job's environment -> the answer."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendmsg([server.encode_request([server.BIND_REQUEST], stepd_env, 0o022)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(__import__("array").array("i", [0, 1, 2]))))])
        s.sendall(server.encode_request(["@step", cpus, mems, job_id, step_id, mps, bind, plugstack_bind, ntasks],
                                        job_env, 0o022))
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


def test_a_step_plan_reads_the_config_beside_slurm_conf_as_slurmstepd_does(running, tmp_path):
    """slurmstepd's Python finds the site config as every gsrun command does (gsrun.request.config.
    config_path: $GSRUN_CONFIG, else gsrun.toml beside $SLURM_CONF): the daemon's plan for the step
    reads the same file -- here its spool_dir, where the prolog left the job's MIG devices."""
    from pathlib import Path

    host = Path(__file__).resolve().parents[1] / "data" / "hosts" / "h200-vm"
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=t\n")
    (etc / "gsrun.toml").write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n')
    job = tmp_path / "spool" / "jobs" / "4242"
    job.mkdir(parents=True)
    (job / "user-mig-n1.json").write_text(json.dumps({"devices": ["MIG-0123456789abcdef"]}))
    state = tmp_path / "state"
    state.mkdir()
    answer = ask_plan(running.sock, {"GSRUN_HOST_ROOT": str(host), "GSRUN_STATE_DIR": str(state),
                                     "SLURM_CONF": str(etc / "slurm.conf")},
                      {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"})
    lines = answer.splitlines()
    assert lines[0] == "GSA1" and lines[-1] == "end", answer
    assert "rank 0" in lines and "set CUDA_VISIBLE_DEVICES=MIG-0123456789abcdef" in lines, answer
    # the job id is slurmstepd's own: one the job environment names instead (a job can set its
    # environment) never reaches another job's MIG devices
    answer = ask_plan(running.sock, {"GSRUN_HOST_ROOT": str(host), "GSRUN_STATE_DIR": str(state),
                                     "SLURM_CONF": str(etc / "slurm.conf")},
                      {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"},
                      job_id="4343")
    assert answer.startswith("GSA1") and "MIG-0123456789abcdef" not in answer, answer
    # an answer for a request without the job id: an error (said by the plugin)
    assert ask_plan(running.sock, {}, {}, job_id="x").startswith("error "), answer


def test_the_daemon_plans_gs_mps_and_gs_bind_steps_as_slurmstepds_python_did(running, tmp_path):
    """--gs-mps and --gs-bind steps are planned by the daemon too (slurmstepd starts no
    Python): the MPS client environment for every task (a batch step's too, never the
    extern step's), --gs-bind none and plugstack bind=none keep Slurm's binding."""
    from pathlib import Path

    host = Path(__file__).resolve().parents[1] / "data" / "hosts" / "h200-vm"
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "gsrun.toml").write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nmps_dir = "{tmp_path}/mps"\n')
    stepd = {"GSRUN_HOST_ROOT": str(host), "GSRUN_CONFIG": str(etc / "gsrun.toml")}
    job = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_STEP_TASKS_PER_NODE": "2",
           "SLURM_STEP_GPUS": "0,1"}
    pipe = f"set CUDA_MPS_PIPE_DIRECTORY={tmp_path}/mps/4242/pipe"

    def plan(**kw) -> list[str]:
        answer = ask_plan(running.sock, stepd, job, **{"ntasks": "2", **kw})
        assert answer.startswith("GSA1\n") and answer.endswith("end\n"), answer
        return answer.splitlines()

    lines = plan(mps="=50")
    assert lines.count(pipe) == 3 and "rank 0" in lines and "rank 1" in lines and "rank *" in lines
    assert any(l.startswith("cpus ") for l in lines)
    lines = plan(mps="=", bind="=none")                         # --gs-mps --gs-bind none
    assert lines[:2] == ["GSA1", "rank *"] and pipe in lines and not any(l.startswith("cpus") for l in lines)
    lines = plan(plugstack_bind="none")                         # the admin turned binding off
    assert lines == ["GSA1", "end"]
    lines = plan(mps="=", step_id=str(0xFFFFFFFB))              # the batch step: MPS, no binding
    assert lines[:2] == ["GSA1", "rank *"] and pipe in lines
    assert plan(mps="=", step_id=str(0xFFFFFFFC)) == ["GSA1", "end"]      # the extern step: nothing
    vis = [l.split("=", 1)[1] for l in plan(bind="=isolate") if l.startswith("set CUDA_VISIBLE_DEVICES=")]
    assert len(vis) == 2 and all("," not in v for v in vis) and vis[0] != vis[1], vis    # each its own GPU
    vis = [l.split("=", 1)[1] for l in plan() if l.startswith("set CUDA_VISIBLE_DEVICES=")]
    assert len(vis) == 2 and all(v.count(",") == 1 for v in vis), vis                 # auto: both, own first
    assert ask_plan(running.sock, stepd, job, mps="50").startswith("error "), "an option field without ="


def test_a_hostile_step_environment_leaves_no_root_process_busy(running, tmp_path):
    """An ordinary srun can set any job variable: SLURM_LOCALID=60000 and beyond,
    SLURM_STEP_GPUS made of thousands of ranges, a huge task count. The plan has
    the ranks slurmstepd says the step has on the node (the job's SLURM_LOCALID and
    task counts are not read), is answered (or refused) within a second or two, and
    once the answer is back no process of the daemon's is left running: the plan's
    process is bounded by its own CPU and wall limits (server.BIND_CPU_S, server.BIND_PLAN_S)."""
    import psutil
    from pathlib import Path

    host = Path(__file__).resolve().parents[1] / "data" / "hosts" / "h200-vm"
    state = tmp_path / "state"
    state.mkdir()
    base = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1"}
    hostile = [
        {"SLURM_LOCALID": "60000", "SLURM_STEP_TASKS_PER_NODE": "60001"},
        {"SLURM_LOCALID": "999999999", "SLURM_STEP_TASKS_PER_NODE": "999999999"},
        {"SLURM_STEP_GPUS": ",".join(f"{i}-{i + 1}" for i in range(0, 40000, 3)),
         "SLURM_STEP_TASKS_PER_NODE": "8"},
        {"SLURM_STEP_TASKS_PER_NODE": "4294967295(x999999)", "SLURM_TASKS_PER_NODE": "9" * 60},
        {"SLURM_LOCALID": "4095", "SLURM_STEP_TASKS_PER_NODE": "4096", "SLURM_STEP_GPUS": "0"},
    ]
    before = {p.pid for p in psutil.process_iter()}
    for extra in hostile:
        t0 = time.monotonic()
        answer = ask_plan(running.sock, {"GSRUN_HOST_ROOT": str(host), "GSRUN_STATE_DIR": str(state)},
                          dict(base, **extra), cpus="0-3", mems="0")
        took_s = time.monotonic() - t0
        assert took_s < server.BIND_PLAN_S + 1, (extra, took_s)
        assert answer.startswith(("GSA1", "error ")), answer[:200]
        assert answer.count("\nrank ") <= 1, answer[:200]       # one task here: one rank at most
    assert "\nrank 0\n" in answer and "rank 1" not in answer, answer[:300]     # SLURM_LOCALID=4095: one rank
    time.sleep(0.2)
    busy = []
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        if p.pid in before or p.pid == os.getpid():
            continue
        try:
            if p.info["ppid"] in (running.proc.pid, 1) and "gsrun" in " ".join(p.info["cmdline"] or []):
                busy.append((p.pid, p.info["cmdline"][:3]))
        except psutil.NoSuchProcess:
            pass
    assert busy == []
    assert running.children() == []
    # every plan was reaped by the daemon: no zombie of a root plan is left
    assert [c.pid for c in psutil.Process(running.proc.pid).children() if c.status() == psutil.STATUS_ZOMBIE] == []
    assert running.proc.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_plan_waiting_for_its_step_does_not_hold_up_a_stop_or_a_reload(running, sig):
    """slurmstepd sends ``@bind`` at its start and ``@step`` later (a plan may wait
    BIND_WAIT_S for it): a stop or a reload (re-exec) kills such a plan at once
    (that step keeps Slurm's binding) instead of waiting for it with no socket."""
    import array
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(running.sock)
        s.sendmsg([server.encode_request([server.BIND_REQUEST], {}, 0o022)],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(array.array("i", [0, 1, 2]))))])
        deadline = time.monotonic() + 10
        while server.ping(running.sock)["running"] != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.ping(running.sock)["running"] == 1
        t0 = time.monotonic()
        running.proc.send_signal(sig)
        if sig == signal.SIGTERM:
            running.proc.wait(timeout=5)
        else:       # re-executed: serving again, the plan gone
            while time.monotonic() - t0 < 5:
                with suppress(Exception):       # no socket while it re-executes
                    if server.ping(running.sock)["running"] == 0:
                        break
                time.sleep(0.02)
            assert server.ping(running.sock)["running"] == 0 and running.proc.poll() is None
        assert time.monotonic() - t0 < 3, time.monotonic() - t0
        assert s.recv(100) == b""       # no plan: the plugin logs why and the step keeps Slurm's binding


def test_doctor_says_whether_the_daemon_answers_and_the_hooks_go_through_it(client, running, tmp_path):
    """`gsrun-node doctor` (check "daemon"): fail without an answer, warn while slurm.conf's
    Prolog=/Epilog= run gsrun without the client, ok once both do."""
    from gsrun.facts.hostfs import HostFS
    from gsrun.admin import doctor

    state = os.path.dirname(running.sock)
    conf = tmp_path / "slurm.conf"
    hooks = tmp_path / "prolog.d"
    hooks.mkdir()
    (hooks / "50-gsrun").write_text("#!/bin/sh\nexec /opt/gsrun/venv/bin/gsrun-node prolog\n")
    (tmp_path / "epilog").write_text(f"#!/bin/sh\nexec {client} {running.sock} /opt/gsrun/venv/bin/gsrun-node epilog\n")
    conf.write_text(f"Prolog={hooks}/*\nEpilog={tmp_path}/epilog\n")
    ctx = doctor.Context(HostFS(), state_dir=state, slurm_conf=str(conf))
    got = doctor.check_daemon(ctx)
    assert got.status == "warn" and got.data["hooks"] == {"prolog": "direct", "epilog": "daemon"}, got
    assert f"{conf}: Prolog= runs gsrun without the daemon's client" in got.detail
    (hooks / "50-gsrun").write_text(f"#!/bin/sh\nexec {client} {running.sock} /opt/gsrun/venv/bin/gsrun-node prolog\n")
    got = doctor.check_daemon(ctx)
    assert got.status == "ok" and got.data["pid"] == running.proc.pid, got
    assert got.detail.endswith("; Prolog= and Epilog= go through it")
    # SlurmUser not root: EpilogSlurmctld needs the controller's door (--ctld-user), not open here
    conf.write_text(f"Prolog={hooks}/*\nEpilog={tmp_path}/epilog\nSlurmUser=slurm\nEpilogSlurmctld=/x\n")
    got = doctor.check_daemon(ctx)
    assert got.status == "fail", got
    assert f"EpilogSlurmctld runs as SlurmUser=slurm and finds no daemon on {state}/ctld.sock" in got.detail
    assert "--ctld-user" in got.hint
    running.stop()
    got = doctor.check_daemon(ctx)
    assert got.status == "fail" and got.detail.startswith(f"not answering on {running.sock}: "), got
    assert "gsrun-daemon" in got.hint


def test_a_trickling_client_holds_the_loop_no_longer_than_one_request_deadline(running):
    """One deadline per request (server.REQUEST_TIMEOUT_S), not per read: a client that
    sends a byte every half second is dropped after the deadline, and a hook request
    behind it is served at once after that."""
    import socket

    site_req = server.encode_request(["@ping"], {}, 0o022)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(running.sock)
    t0 = time.monotonic()
    dropped_s = None
    for b in site_req[:12]:
        try:
            slow.sendall(bytes([b]))
        except OSError:
            dropped_s = time.monotonic() - t0
            break
        time.sleep(0.5)
        if slow.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) if _readable(slow) else False:
            dropped_s = time.monotonic() - t0
            break
    dropped_s = dropped_s if dropped_s is not None else time.monotonic() - t0
    slow.close()
    assert dropped_s < server.REQUEST_TIMEOUT_S + 1.5, dropped_s
    st = server.ping(running.sock)
    assert st["pid"] == running.proc.pid
    assert "request refused" in running.stop()      # the trickler, logged as a bad request


def _readable(s) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="the tuned prolog reads the job record as root does")
def test_a_daemon_killed_mid_job_loses_no_setting_and_no_figure(client, tmp_path):
    """SIGKILL the daemon while a tuned job's prolog runs, and again while the job runs:
    the prolog finishes on its own (its child is in its own session and holds the client's
    connection: the client gets the prolog's own status); the node monitor ends with its daemon; an epilog while
    no daemon runs fails without running anything (the node drains); the restarted
    daemon's monitor takes the job up from its state (the time without a monitor counted
    as gap, the samples before it kept), and the epilog through it restores every setting
    and writes the job's figures."""
    from helpers.node_site import TUNE, host_only, kill_fakes, snapshot
    from helpers.tuning_tree import diff

    site = make_site()
    a = b = None
    try:
        base = host_only(snapshot(site.host))
        env = site.env(job_id="5201", spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                       FAKE_SCONTROL_RECORD="JobId=5201 JobName=t UserId=nobody(65534) OverSubscribe=NO "
                                            "Comment=(null)")
        a = Running(tmp_path, site)
        mon_pid = server.ping(a.sock)["monitor_pid"]
        err_file = open(tmp_path / "prolog.err", "w+")     # the hook child keeps the client's stderr open
        p = subprocess.Popen([client, a.sock, *hook("prolog")], env=env, stdout=subprocess.DEVNULL,
                             stderr=err_file, text=True, cwd="/")
        deadline = time.monotonic() + 10
        while not a.children() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert a.children(), "the prolog never started"
        a.proc.kill()                       # mid-prolog
        a.proc.wait()
        deadline = time.monotonic() + 30
        while _alive(mon_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(mon_pid), "the monitor outlived its daemon"
        b = Running(tmp_path, site)         # systemd's Restart=always
        assert p.wait(timeout=60) == 0      # the prolog's own status, once it began sampling
        err = (tmp_path / "prolog.err").read_text()
        assert "went away without its exit status" not in err and "prolog: done in" in err, err
        sdir = site.state / "jobs" / "5201"
        deadline = time.monotonic() + 60    # the prolog's own process goes on to its end
        while not (sdir / "monitor.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (sdir / "monitor.json").exists(), ((tmp_path / "prolog.err").read_text()
                                                  + (tmp_path / "server.log").read_text())[-2000:]
        deadline = time.monotonic() + 30
        while len(diff(base, host_only(snapshot(site.host)))) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(diff(base, host_only(snapshot(site.host)))) >= 6      # governor x4, swappiness, thp...
        time.sleep(1.0)                     # the job runs, sampled every 0.2 s
        before = json.loads((sdir / "sampler.json").read_text())["samples"]
        assert before >= 3
        b.proc.kill()                       # mid-job
        b.proc.wait()
        time.sleep(1.0)                     # no monitor: a gap in the figures
        cp = via(client, b.sock, hook("epilog"), env)
        assert cp.returncode == 1 and "node daemon not running" in cp.stderr
        assert len(diff(base, host_only(snapshot(site.host)))) >= 6      # nothing ran
        b = Running(tmp_path, site)
        assert monitor.ask(site.state, {"op": "status"})["jobs"] == ["5201"]     # taken up
        time.sleep(0.6)
        cp = via(client, b.sock, hook("epilog"), env)
        assert cp.returncode == 0, cp.stderr
        assert diff(base, host_only(snapshot(site.host))) == []
        assert wait_for(lambda: not (site.state / "jobs" / "5201").exists(), 10)   # the report, after the answer
        node = json.loads((site.spool / "jobs" / "5201" / "node-gpu-node01.json").read_text())
        assert node["gpu_available"] and node["samples"] > before, node["samples"]
        assert node["gpus"][0]["util_gap_s"] >= 0.8, node["gpus"][0]["util_gap_s"]
    finally:
        for d in (a, b):
            if d is not None and d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        kill_fakes(site)
        shutil.rmtree(site.base, ignore_errors=True)


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except OSError:
        return False


# ------------------------------------------------------------------ the job's SPANK environment

def _recording_daemon(sock: str, got: dict):
    """A stand-in daemon in a thread: reads one hook request as the daemon does
    (server._read_request, its size limit included), records it, answers "the
    hook exited 0"."""
    import socket
    import threading

    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.listen(1)
    s.settimeout(30)

    def serve():
        try:
            c, _ = s.accept()
            try:
                argv, env, _um, fds = server._read_request(c, nfds=3)
                for fd in fds:
                    os.close(fd)
                got.update(argv=argv, env=env)
                c.sendall(server.READY)
                if c.recv(1) == server.GO_HANDOVER:
                    c.sendall(server.STARTED + server.EXITED + bytes(4))
            finally:
                c.close()
        except Exception as e:  # noqa: BLE001 - the test reads what happened
            got["error"] = repr(e)
        finally:
            s.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_a_jobs_oversized_spank_environment_neither_fails_the_hook_nor_reaches_it(client, tmp_path):
    """slurmd and slurmctld give the hooks the job's SPANK job-control environment
    (``SPANK_<NAME>``), which any user sets freely (a SPANK plugin of their own in
    a private SLURM_CONF, or any client of the submit RPC): over 1 MiB of it made
    the client fail ("environment over 1 MiB"), slurmd drained the node and held
    the job. The client hands the daemon only the SPANK_ variables the hooks read
    (gsrun.facts.jobenv.SPANK_KEYS), each bounded, and the hook runs."""
    from gsrun.facts.jobenv import SPANK_KEYS, is_spank_value

    sock = str(tmp_path / "d.sock")
    got: dict = {}
    t = _recording_daemon(sock, got)
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", "SPANK_GS_TUNE": "swappiness=10",
           "SPANK_GS_MIG": "x" * 120_000, "SPANK_OTHER_PLUGIN": "kept-out"}
    env.update({f"SPANK_BIG{i}": "A" * 100_000 for i in range(12)})       # 1.2 MB
    env.update({f"SPANK_GS_X{i}": "1" for i in range(5000)})                # many names gsrun never reads
    cp = via(client, sock, hook("epilog"), env, timeout_s=60)
    t.join(30)
    assert cp.returncode == 0, cp.stderr
    assert "error" not in got, got
    sent = got["env"]
    assert sent["SLURM_JOB_ID"] == "77" and sent["SPANK_GS_TUNE"] == "swappiness=10"
    assert {k for k in sent if k.startswith("SPANK_")} <= set(SPANK_KEYS)
    # an oversized value of one of them still reaches the hook as a value it refuses (bounded)
    assert 512 < len(sent["SPANK_GS_MIG"]) <= 4096 and not is_spank_value(sent["SPANK_GS_MIG"])


def test_the_clients_spank_names_are_the_ones_the_hooks_read():
    """client.c carries its own copy of gsrun.facts.jobenv.SPANK_KEYS."""
    import re

    from gsrun.facts.jobenv import SPANK_KEYS
    from gsrun.daemon.build import C_SOURCE

    text = C_SOURCE.read_text()
    block = re.search(r"gs_spank_keys\[\] = \{([^}]*)\}", text)
    assert block, "gs_spank_keys missing from client.c"
    assert tuple(re.findall(r'"([A-Z_]+)"', block.group(1))) == SPANK_KEYS


def test_job_ends_in_a_burst_run_a_bounded_number_of_merges_at_once_and_every_one_runs(client, tmp_path):
    """Every EpilogSlurmctld starts a merge (a forked child of the daemon) in the daemon's
    cgroup. 300 tiny array jobs of one user ended on the local cluster with 9-14 merges
    running at once (~250 MB); a burst on a large cluster started hundreds -- past the
    unit's MemoryMax, where the OOM killer ends merges (other users' reports) or the
    daemon itself. At most MAX_MERGES run at once; the others wait their turn."""
    p, sock, marker, log = patched_daemon(tmp_path, "merge")
    n = server.MAX_MERGES * 3
    try:
        procs = [subprocess.Popen([client, sock, *hook("epilog-ctld")], env={"SLURM_JOB_ID": str(100 + i)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/") for i in range(n)]
        for q in procs:
            assert q.wait(timeout=30) == 0, q.stderr.read()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not marker.exists() or marker.read_text().count("-") < n):
            time.sleep(0.2)
        events = sorted((float(t), +1 if k == "+" else -1) for k, t in
                        (ln.split() for ln in marker.read_text().splitlines()))
        assert sum(1 for _t, d in events if d > 0) == n, log.read_text()
        most = now = 0
        for _t, d in events:
            now += d
            most = max(most, now)
        assert most <= server.MAX_MERGES, most
    finally:
        p.kill()
        p.wait()
