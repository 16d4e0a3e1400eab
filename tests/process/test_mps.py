"""gsrun.node.mps: per-job MPS daemon lifecycle with the fake control binary
(tests/data/fake-bin/nvidia-cuda-mps-control), the permission model checked
for real (owner/mode by stat, access by a child that setuid's to another
uid), and field cases 17-19 of docs/field-cases.md (targeted kill, two jobs
side by side, compute mode restored).

Needs root (the daemon runs as another uid); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gsrun.node import mps
from gsrun.base.errors import InputError, NodeError

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "data" / "fake-bin" / "nvidia-cuda-mps-control"
USER = 65534      # nobody (has a passwd entry)
OTHER = 54321     # a uid with no passwd entry (exercises that path too)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the daemon as another uid")


# ---------------------------------------------------------------- pure parts

@pytest.mark.parametrize("environ,opt,want", [
    ({}, None, None),
    ({}, "", None),
    ({}, "50", 50),
    ({}, "100", 100),
    ({}, "1", 1),
    ({"SPANK_GS_MPS": "30"}, None, 30),
    ({"SPANK_GS_MPS": ""}, None, None),
    ({"SPANK_GS_MPS": "30"}, "60", 60),                  # the explicit option wins over SPANK's copy
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, None, 25),   # Slurm gres/mps alone
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, "60", 25),   # Slurm's share caps the option
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80"}, "60", 60),
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80"}, "", 80),
])
def test_requested_pct(environ, opt, want):
    assert mps.requested_pct(environ, opt) == want


@pytest.mark.parametrize("environ,opt", [
    ({}, "0"), ({}, "101"), ({}, "-5"), ({}, "abc"), ({}, "50%"), ({}, "5 0"), ({}, "$(id)"),
    ({"SPANK_GS_MPS": "200"}, None), ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "0"}, None),
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "x"}, "50"),
])
def test_requested_pct_rejects(environ, opt):
    with pytest.raises(InputError) as e:
        mps.requested_pct(environ, opt)
    assert str(e.value).startswith("gsrun: mps: bad active thread percentage:")
    assert "hint:" in str(e.value)


def test_task_env_and_job_id_validation():
    assert mps.task_env("4242", "/run/gsrun/mps") == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gsrun/mps/4242/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/gsrun/mps/4242/log"}
    for bad in ("", "../4242", "4242/..", "42 42", "4242;id", "$(id)", "4242\n", "a" * 5, "1" * 21):
        with pytest.raises(InputError):
            mps.task_env(bad, "/run/gsrun/mps")


def test_daemon_env_is_an_allow_list():
    caller = {"PATH": "/root/evil:/usr/bin", "LD_PRELOAD": "/tmp/x.so", "SLURM_JOB_ID": "4242",
              "LANG": "en_US.UTF-8", "TZ": "$(id)", "PYTHONPATH": "/tmp", "SECRET": "s"}
    env = mps.daemon_env({"HOME": "/home/u1", "USER": "u1", "LOGNAME": "u1"}, ["GPU-aaaa-bbbb-cccc", "3"],
                         "/run/gsrun/mps/4242/pipe", "/run/gsrun/mps/4242/log", 40, "0=16G", caller)
    assert env == {
        "PATH": mps.SAFE_PATH, "HOME": "/home/u1", "USER": "u1", "LOGNAME": "u1", "LANG": "en_US.UTF-8",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-aaaa-bbbb-cccc,3",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gsrun/mps/4242/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/gsrun/mps/4242/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G"}
    env2 = mps.daemon_env({"HOME": "/"}, ["0"], "/p", "/l", None, None, {})
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env2
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env2


@pytest.mark.parametrize("kw", [
    {"gpus": []}, {"gpus": ["0;id"]}, {"gpus": ["../0"]}, {"gpus": [0]},
    {"active_thread_pct": 0}, {"active_thread_pct": 101}, {"active_thread_pct": True},
    {"pinned_mem_limit": "16G; id"}, {"pinned_mem_limit": "0=16T"}, {"timeout_s": 0},
    {"job_id": "../etc"},
])
def test_start_rejects_bad_input_before_touching_anything(tmp_path, kw):
    args = dict(job_id="4242", uid=USER, gid=USER, gpus=["0"], mps_dir=str(tmp_path / "mps"),
                state_dir=str(tmp_path / "state"), active_thread_pct=None, pinned_mem_limit=None,
                control_bin=str(FAKE), timeout_s=5)
    args.update(kw)
    with pytest.raises(InputError):
        mps.start(**args, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- fixtures for the real lifecycle

class Site:
    """A throwaway node layout under /tmp (every ancestor traversable, as the
    daemon runs as another uid) with per-test copies of the fake binary."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="gsrun-mps-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        self.mps_dir = str(self.base / "run" / "mps")
        self.state_dir = str(self.base / "state")
        self.logs: list[str] = []
        self._bins = 0

    def bin(self, **knobs) -> str:
        """A copy of the fake control binary with its behaviour knobs."""
        self._bins += 1
        d = self.base / f"bin{self._bins}"
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
        dst = d / "nvidia-cuda-mps-control"
        shutil.copy(FAKE, dst)
        os.chmod(dst, 0o755)
        (d / "fake-mps.json").write_text(json.dumps(knobs))
        os.chmod(d / "fake-mps.json", 0o644)
        return str(dst)

    def start(self, job_id="4242", uid=USER, gpus=("0", "1"), bin=None, timeout_s=5.0, **kw):
        return mps.start(job_id, uid, uid, list(gpus), self.mps_dir, self.state_dir,
                         kw.pop("active_thread_pct", None), kw.pop("pinned_mem_limit", None),
                         bin or self.bin(), timeout_s, log=self.logs.append, **kw)

    def stop(self, job_id="4242", bin=None, timeout_s=5.0, **kw):
        return mps.stop(job_id, self.mps_dir, self.state_dir, bin or str(FAKE), timeout_s,
                        log=self.logs.append, **kw)

    def procs_under_base(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                v = p.environ().get("CUDA_MPS_PIPE_DIRECTORY", "")
                if v.startswith(str(self.base)) and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def cleanup(self):
        for p in self.procs_under_base():
            try:
                p.kill()
            except psutil.Error:
                pass
        for d in Path(self.mps_dir).glob("*"):     # a job directory a failed test left mounted
            if os.path.ismount(d):
                subprocess.run(["umount", "-l", str(d)], check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def site():
    s = Site()
    yield s
    s.cleanup()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def owner_mode(path) -> tuple[int, int, int]:
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode), path
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def spawn_lookalike(uid: int, pipe_dir: str) -> subprocess.Popen:
    """A process that looks like an MPS server (argv[0] nvidia-cuda-mps-server)
    with the given pipe dir in its environ, running as uid."""
    return subprocess.Popen(["nvidia-cuda-mps-server", "-c", "import time; time.sleep(120)"],
                            executable="/usr/bin/python3", env={"CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
                            user=uid, group=uid, extra_groups=[], cwd="/")


# ---------------------------------------------------------------- lifecycle

@root_only
def test_lifecycle_start_stop(site):
    r = site.start(active_thread_pct=40, pinned_mem_limit="0=16G,1=8G")
    job_dir = Path(site.mps_dir) / "4242"
    assert r["pipe_dir"] == str(job_dir / "pipe") and r["log_dir"] == str(job_dir / "log")
    assert r["env"] == mps.task_env("4242", site.mps_dir)
    assert len(r["pids"]) == 1
    p = psutil.Process(r["pids"][0])
    assert p.uids().real == USER and p.uids().effective == USER
    assert p.gids().real == USER
    assert p.name() == "nvidia-cuda-mps"          # comm, as on the H200 probe
    env = json.loads((job_dir / "log" / "fake-env.json").read_text())
    assert env == {"PATH": mps.SAFE_PATH, "HOME": "/nonexistent", "USER": "nobody", "LOGNAME": "nobody",
                   **({"LANG": os.environ["LANG"]} if "LANG" in os.environ else {}),
                   **({"LC_ALL": os.environ["LC_ALL"]} if "LC_ALL" in os.environ else {}),
                   **({"TZ": os.environ["TZ"]} if "TZ" in os.environ else {}),
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1",
                   "CUDA_MPS_PIPE_DIRECTORY": r["pipe_dir"], "CUDA_MPS_LOG_DIRECTORY": r["log_dir"],
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G,1=8G"}
    ctl = (job_dir / "log" / "control.log").read_text()
    assert f"] Starting control daemon using socket {job_dir}/pipe/control\n" in ctl
    assert f"Control {r['pids'][0]:5d}]" in ctl
    assert stat.S_ISSOCK(os.lstat(job_dir / "pipe" / "control").st_mode)
    # journal: root 0600, the pid with its creation time
    jpath = Path(site.state_dir) / "mps-4242.json"
    st = os.lstat(jpath)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    j = json.loads(jpath.read_text())
    assert j["pids"] == [{"pid": p.pid, "create_time": p.create_time()}]
    assert (j["uid"], j["gid"], j["gpus"], j["state"]) == (USER, USER, ["0", "1"], "running")

    res = site.stop()
    assert res["status"] == "stopped" and res["quit"] == "ok"
    assert res["ended"] == [p.pid] and res["killed"] == [] and res["leftover"] == []
    assert not alive(p.pid)
    assert not os.path.lexists(job_dir) and not jpath.exists()
    assert owner_mode(site.mps_dir) == (0, 0, 0o711)  # the parent stays for other jobs
    assert site.procs_under_base() == []
    # a second epilog run (or gsrun-node restore) finds nothing
    again = site.stop()
    assert again["status"] == "nothing"


@root_only
def test_servers_are_ended_with_the_daemon(site):
    b = site.bin(server=True)
    r = site.start(bin=b)
    found = mps.find_job_processes(r["pipe_dir"], USER)
    assert len(found) == 2 and r["pids"][0] in [p.pid for p in found]
    server = [p for p in found if p.pid != r["pids"][0]][0]
    assert server.uids().real == USER and server.ppid() == r["pids"][0]
    res = site.stop(bin=b)
    assert res["status"] == "stopped" and res["quit"] == "ok"
    assert sorted(res["ended"]) == sorted(p.pid for p in found)
    assert not alive(server.pid) and site.procs_under_base() == []


@root_only
def test_permission_model(site):
    r = site.start()
    job_dir = Path(site.mps_dir) / "4242"
    assert owner_mode(site.mps_dir) == (0, 0, 0o711)
    for d in (job_dir, job_dir / "pipe", job_dir / "log"):
        assert owner_mode(d) == (USER, USER, 0o700), d
    # every ancestor traversable by others (field case 19)
    for d in Path(site.mps_dir).parents:
        assert os.stat(d).st_mode & stat.S_IXOTH, d

    def probe(uid: int) -> dict:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(rfd)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                out = {"mps_x": os.access(site.mps_dir, os.X_OK),
                       "mps_r": os.access(site.mps_dir, os.R_OK),
                       "job_x": os.access(job_dir, os.X_OK),
                       "pipe_x": os.access(r["pipe_dir"], os.X_OK),
                       "log_r": os.access(os.path.join(r["log_dir"], "control.log"), os.R_OK)}
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(os.path.join(r["pipe_dir"], "control"))
                    out["connect"] = "ok"
                except OSError as e:
                    out["connect"] = type(e).__name__
                try:
                    os.listdir(site.mps_dir)
                    out["list_mps"] = "ok"
                except OSError as e:
                    out["list_mps"] = type(e).__name__
                os.write(wfd, json.dumps(out).encode())
            finally:
                os._exit(0)
        os.close(wfd)
        data = b""
        while chunk := os.read(rfd, 4096):
            data += chunk
        os.close(rfd)
        os.waitpid(pid, 0)
        return json.loads(data)

    other = probe(OTHER)
    assert other == {"mps_x": True, "mps_r": False, "job_x": False, "pipe_x": False, "log_r": False,
                     "connect": "PermissionError", "list_mps": "PermissionError"}
    owner = probe(USER)
    assert owner == {"mps_x": True, "mps_r": False, "job_x": True, "pipe_x": True, "log_r": True,
                     "connect": "ok", "list_mps": "PermissionError"}
    assert site.stop()["status"] == "stopped"


@root_only
def test_existing_open_mps_dir_is_tightened(site):
    os.makedirs(site.mps_dir)
    os.chmod(site.mps_dir, 0o1777)
    site.start()
    assert owner_mode(site.mps_dir) == (0, 0, 0o711)
    site.stop()


@root_only
def test_planted_symlink_is_refused_and_not_written_through(site):
    os.makedirs(site.mps_dir, mode=0o711)
    target = site.base / "victim"
    target.mkdir(mode=0o755)
    os.symlink(target, Path(site.mps_dir) / "4242")
    with pytest.raises(NodeError) as e:
        site.start()
    assert "refusing planted path" in str(e.value)
    assert list(target.iterdir()) == []
    assert owner_mode(target) == (0, 0, 0o755)                  # not chowned through the link
    assert os.path.islink(Path(site.mps_dir) / "4242")           # left for the admin to see
    assert not (Path(site.state_dir) / "mps-4242.json").exists()
    assert site.procs_under_base() == []


@root_only
def test_foreign_job_dir_is_refused(site):
    """A directory another user made at <mps_dir>/<nextjob> must not win."""
    os.makedirs(site.mps_dir, mode=0o711)
    pre = Path(site.mps_dir) / "4242"
    pre.mkdir()
    os.chmod(pre, 0o777)
    os.chown(pre, OTHER, OTHER)
    with pytest.raises(NodeError) as e:
        site.start()
    assert "refusing foreign directory" in str(e.value)
    assert owner_mode(pre) == (OTHER, OTHER, 0o777) and list(pre.iterdir()) == []
    assert site.procs_under_base() == []


@root_only
def test_ancestor_not_traversable_is_refused(site):
    closed = site.base / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(NodeError) as e:
        mps.start("4242", USER, USER, ["0"], str(closed / "mps"), site.state_dir, None, None,
                  site.bin(), 5, log=site.logs.append)
    assert "not traversable" in str(e.value) and str(closed) in str(e.value)
    assert site.procs_under_base() == []


@root_only
def test_quit_hangs_bounded_wait_then_targeted_kill(site):
    hang = site.bin(quit="hang", term="ignore", server=True)
    r = site.start(bin=hang)
    mine = mps.find_job_processes(r["pipe_dir"], USER)
    assert len(mine) == 2
    # bystanders: another job of the same user, and look-alikes that must survive
    other_job = site.start(job_id="4243", gpus=["2", "3"])
    same_uid_other_pipe = spawn_lookalike(USER, other_job["pipe_dir"])
    other_uid_our_pipe = spawn_lookalike(OTHER, r["pipe_dir"])
    plain_sleep = subprocess.Popen(["sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": r["pipe_dir"]},
                                   user=USER, group=USER, extra_groups=[])
    try:
        t0 = time.monotonic()
        res = site.stop(bin=hang, timeout_s=1.0)
        took = time.monotonic() - t0
        assert res["quit"] == "timeout"
        assert sorted(res["killed"]) == sorted(p.pid for p in mine)
        assert set(res["terminated"]) == {p.pid for p in mine}  # TERM first, ignored, then KILL
        assert res["leftover"] == [] and res["status"] == "stopped"
        assert 1.0 + mps._TERM_WAIT_S <= took < 1.0 + mps._TERM_WAIT_S + mps._KILL_WAIT_S + 2
        assert all(not alive(p.pid) for p in mine)
        assert not os.path.lexists(Path(site.mps_dir) / "4242")
        # untouched: other job's daemon, look-alikes by name or env alone, wrong uid
        assert alive(other_job["pids"][0])
        assert same_uid_other_pipe.poll() is None
        assert other_uid_our_pipe.poll() is None
        assert plain_sleep.poll() is None
        assert os.path.isdir(other_job["pipe_dir"])
    finally:
        for pr in (same_uid_other_pipe, other_uid_our_pipe, plain_sleep):
            pr.kill()
            pr.wait()
    assert site.stop(job_id="4243")["status"] == "stopped"


@root_only
def test_daemon_already_dead_orphan_server_is_ended(site):
    b = site.bin(server=True, orphan_server=True)
    r = site.start(bin=b)
    procs = mps.find_job_processes(r["pipe_dir"], USER)
    server = [p for p in procs if p.pid != r["pids"][0]][0]
    os.kill(r["pids"][0], signal.SIGKILL)               # the daemon died mid-job
    deadline = time.time() + 5
    while alive(r["pids"][0]) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(r["pids"][0]) and alive(server.pid)
    res = site.stop(bin=b, timeout_s=1.0)
    # quit finds no daemon behind the socket; the server is found by environ + uid
    assert res["quit"].startswith("rc 1: Cannot find MPS control daemon process")
    assert server.pid in res["terminated"] and res["killed"] == []
    assert res["status"] == "stopped" and not alive(server.pid)
    assert not os.path.lexists(Path(site.mps_dir) / "4242")
    assert site.procs_under_base() == []


@root_only
def test_daemon_already_dead_nothing_left(site):
    r = site.start()
    os.kill(r["pids"][0], signal.SIGKILL)
    t0 = time.monotonic()
    res = site.stop(timeout_s=5.0)
    assert time.monotonic() - t0 < 3.0      # no process to wait for
    assert res["status"] == "stopped" and res["killed"] == [] and res["leftover"] == []
    assert not os.path.lexists(Path(site.mps_dir) / "4242")


@root_only
def test_node_rebooted_between_prolog_and_epilog(site):
    site.start()
    # reboot: /run is tmpfs, so journal and directories are gone, processes too
    site.cleanup()
    site.__init__()
    res = site.stop()
    assert res["status"] == "nothing" and res["quit"] == "skipped"
    assert res["errors"] == [] and res["killed"] == []
    assert any("nothing to do" in m and "rebooted" in m for m in site.logs)


@root_only
def test_journal_lost_but_daemon_running_is_still_stopped(site):
    r = site.start()
    os.unlink(Path(site.state_dir) / "mps-4242.json")
    res = site.stop()
    assert res["status"] == "stopped" and res["quit"] == "ok"
    assert res["ended"] == r["pids"]
    assert not os.path.lexists(Path(site.mps_dir) / "4242")


@root_only
def test_two_jobs_side_by_side(site):
    """Field case 18/19: same user on disjoint GPUs, plus another user; stopping
    one leaves the others' daemons and directories alone."""
    a = site.start(job_id="4242", gpus=["0", "1"])
    b = site.start(job_id="4243", gpus=["2", "3"])
    c = site.start(job_id="4244", uid=OTHER, gpus=["GPU-00000000-1111-2222-3333-444444444444"])
    envs = {j: json.loads((Path(site.mps_dir) / j / "log" / "fake-env.json").read_text())
            for j in ("4242", "4243", "4244")}
    assert envs["4242"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert envs["4243"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert envs["4244"]["CUDA_VISIBLE_DEVICES"] == "GPU-00000000-1111-2222-3333-444444444444"
    assert envs["4244"]["HOME"] == "/" and "USER" not in envs["4244"]  # uid without passwd entry
    assert psutil.Process(c["pids"][0]).uids().real == OTHER
    assert owner_mode(Path(site.mps_dir) / "4244") == (OTHER, OTHER, 0o700)

    res = site.stop(job_id="4242")
    assert res["status"] == "stopped" and res["ended"] == a["pids"]
    assert not alive(a["pids"][0])
    assert alive(b["pids"][0]) and alive(c["pids"][0])
    assert os.path.isdir(b["pipe_dir"]) and os.path.isdir(c["pipe_dir"])
    assert (Path(site.state_dir) / "mps-4243.json").exists()
    # the survivors still answer
    out = subprocess.run([str(FAKE)], input=b"get_server_list\n", capture_output=True, timeout=10,
                         env={"CUDA_MPS_PIPE_DIRECTORY": b["pipe_dir"]}, user=USER, group=USER,
                         extra_groups=[])
    assert out.returncode == 0, out.stderr
    assert site.stop(job_id="4243")["ended"] == b["pids"]
    assert alive(c["pids"][0])
    assert site.stop(job_id="4244")["ended"] == c["pids"]
    assert site.procs_under_base() == []


@root_only
def test_compute_mode_set_and_restored(site):
    modes = {"0": 0, "1": 2}
    calls = []

    def setter(gpu, mode):
        calls.append((gpu, mode))
        prior, modes[gpu] = modes[gpu], mode
        return prior

    r = site.start(set_compute_mode=setter)
    assert modes == {"0": 3, "1": 3}
    assert r["compute_mode_prior"] == {"0": 0, "1": 2}
    j = json.loads((Path(site.state_dir) / "mps-4242.json").read_text())
    assert j["compute_mode"] == {"0": 0, "1": 2}

    failing = {"1"}

    def restore(gpu, mode):
        if gpu in failing:
            raise RuntimeError("NVML_ERROR_NO_PERMISSION")
        setter(gpu, mode)

    res = site.stop(restore_compute_mode=restore)
    assert res["status"] == "incomplete" and res["journal_kept"] is True
    assert res["compute_mode_restored"] == {"0": 0}
    assert modes == {"0": 0, "1": 3}
    assert any("GPU 1 not restored to 2" in e for e in res["errors"])
    assert res["leftover"] == [] and res["dir_removed"] is True      # the rest still done
    j = json.loads((Path(site.state_dir) / "mps-4242.json").read_text())
    assert j["compute_mode"] == {"1": 2} and j["state"] == "incomplete"

    failing.clear()
    res2 = site.stop(restore_compute_mode=restore)          # gsrun-node restore / a retry
    assert res2["status"] == "stopped" and res2["compute_mode_restored"] == {"1": 2}
    assert modes == {"0": 0, "1": 2}
    assert not (Path(site.state_dir) / "mps-4242.json").exists()


@root_only
def test_compute_mode_without_restore_function_keeps_journal(site):
    modes = {"0": 0}

    def setter(gpu, mode):
        prior, modes[gpu] = modes[gpu], mode
        return prior

    site.start(gpus=["0"], set_compute_mode=setter)
    res = site.stop()
    assert res["status"] == "incomplete" and res["journal_kept"]
    assert modes == {"0": 3}
    assert site.procs_under_base() == []


@root_only
def test_failed_start_is_undone(site):
    modes = {"0": 0, "1": 0}

    def setter(gpu, mode):
        prior, modes[gpu] = modes[gpu], mode
        return prior

    with pytest.raises(NodeError) as e:
        site.start(bin=site.bin(fail_start=True), set_compute_mode=setter)
    assert "exited 1: fake: MPS control daemon failed to start" in str(e.value)
    assert modes == {"0": 0, "1": 0}
    assert not os.path.lexists(Path(site.mps_dir) / "4242")
    assert not (Path(site.state_dir) / "mps-4242.json").exists()


@root_only
def test_daemon_too_slow_times_out_and_is_cleaned(site):
    b = site.bin(start_delay_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(NodeError) as e:
        site.start(bin=b, timeout_s=0.7)
    assert "did not come up" in str(e.value)
    assert time.monotonic() - t0 < 0.7 + 5 + mps._TERM_WAIT_S + mps._KILL_WAIT_S
    time.sleep(0.2)
    assert site.procs_under_base() == []
    assert not os.path.lexists(Path(site.mps_dir) / "4242")


@root_only
def test_slow_daemon_within_timeout_and_no_pid_file(site):
    r = site.start(bin=site.bin(start_delay_s=0.5, no_pid_file=True))
    p = psutil.Process(r["pids"][0])
    assert p.uids().real == USER
    assert p.environ()["CUDA_MPS_PIPE_DIRECTORY"] == r["pipe_dir"]
    assert site.stop()["ended"] == r["pids"]


@root_only
def test_recycled_pid_in_journal_is_not_killed(site):
    site.start()
    bystander = subprocess.Popen(["sleep", "60"], user=USER, group=USER, extra_groups=[])
    try:
        jpath = Path(site.state_dir) / "mps-4242.json"
        j = json.loads(jpath.read_text())
        j["pids"].append({"pid": bystander.pid, "create_time": 1.0})   # same PID, other process
        jpath.write_text(json.dumps(j))
        res = site.stop()
        assert res["status"] == "stopped" and bystander.pid not in res["killed"] + res["terminated"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@root_only
def test_requeued_job_restarts_cleanly(site):
    first = site.start()
    second = site.start()
    assert first["pids"] != second["pids"]
    assert not alive(first["pids"][0]) and alive(second["pids"][0])
    assert any("stale MPS state" in m for m in site.logs)
    assert site.stop()["ended"] == second["pids"]


@root_only
def test_the_jobs_writable_directory_is_a_capped_filesystem_of_its_own(site):
    """The job's user owns the MPS pipe and log directories (its control daemon
    writes there). On the node's /run (mps_dir's default) they were as large as
    /run: a job filled root's runtime filesystem -- gsrun's state directory, the
    node daemon's socket, systemd's files -- and other jobs' prologs failed there
    (slurmd drains the node). The job directory is a tmpfs of its own, capped in
    bytes and inodes; the epilog unmounts and removes it."""
    r = site.start()
    job_dir = Path(site.mps_dir) / "4242"
    assert os.path.ismount(job_dir)
    assert owner_mode(job_dir) == (USER, USER, 0o700)
    fill = ("import os, sys\n"
            "d = sys.argv[1]\n"
            "try:\n"
            "    with open(os.path.join(d, 'fill'), 'wb') as f:\n"
            "        for _ in range(256):\n"
            "            f.write(bytes(1 << 20))\n"
            "            f.flush()\n"
            "    print('wrote 256 MiB')\n"
            "except OSError as e:\n"
            "    print('bytes', e.errno)\n"
            "os.unlink(os.path.join(d, 'fill'))\n"
            "try:\n"
            "    for i in range(100000):\n"
            "        open(os.path.join(d, f'n{i}'), 'w').close()\n"
            "    print('made 100000 files')\n"
            "except OSError as e:\n"
            "    print('inodes', e.errno)\n")
    cp = subprocess.run(["/usr/bin/python3", "-I", "-c", fill, r["log_dir"]], user=USER, group=USER,
                        extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/")
    import errno

    assert cp.stdout.split("\n")[:2] == [f"bytes {errno.ENOSPC}", f"inodes {errno.ENOSPC}"], cp
    assert shutil.disk_usage(job_dir).total <= mps.JOB_DIR_BYTES
    res = site.stop()
    assert res["status"] == "stopped" and res["dir_removed"], res
    assert not os.path.lexists(job_dir) and not os.path.ismount(job_dir)
