"""The real epilog on field cases 15, 16 (exit status), 17, 18 and 20, a
full spool, a read-only /sys, and who may read a job's summary.

Field cases are described in docs/field-cases.md; ``test_caseN_...`` names
the field case a test proves."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import psutil
import pytest

from gsrun.node import monitor, residual
from gsrun.facts.hostfs import HostFS
from helpers.node_site import TUNE, host_only, kill_fakes, leftover_fakes, make_site, nvml_devices, \
    run_node, samplers_of, snapshot, timed, wait_for
from helpers.sampler_sim import run_job
from helpers.tuning_tree import diff

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root; processes of other uids")
USER = 65534          # the job's user (nobody)
OTHER = 54321         # another user (no passwd entry)
BUS = ["0000:41:00.0", "0000:42:00.0", "0000:43:00.0", "0000:44:00.0"]
RECORD = "JobId={job} JobName=t UserId=nobody(65534) OverSubscribe=NO Comment=(null)"


def _lost_gpu1() -> dict:
    """Four GPUs; GPU 1 answers GPU_IS_LOST (15) from its second memory reading on."""
    nv = nvml_devices(4)
    nv["devices"][1]["memory"] = {"seq": [nv["devices"][1]["memory"], {"error": "GPU is lost", "code": 15}]}
    return nv


@pytest.fixture
def site(request):
    param = getattr(request, "param", {"nvml": nvml_devices(4)})
    s = make_site(**({"nvml": _lost_gpu1()} if param.get("nvml") == "lost" else param))
    s.spawned = []
    yield s
    for p in s.spawned:
        try:
            p.kill()
            p.wait(5)
        except OSError:
            pass
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def spawn(site, uid=USER, job="4242", ignore_term=False) -> subprocess.Popen:
    """A GPU-less stand-in for a leftover worker: runs as ``uid`` with
    ``SLURM_JOB_ID=job`` in its environment, reparented nowhere special."""
    code = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('ready', flush=True)\ntime.sleep(120)\n")
    env = {"SLURM_JOB_ID": job} if job else {}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, user=uid, group=uid, extra_groups=[], cwd="/",
                         stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    site.spawned.append(p)
    return p


def set_procs(site, per_gpu: dict[int, list], recheck: dict[int, list] | None = None) -> None:
    """Compute processes NVML reports per GPU index; ``recheck``: what the
    second listing (after the kill) reports."""
    data = json.loads((site.host / "nvml.json").read_text())
    for i, dev in enumerate(data["devices"]):
        first = [{"pid": p, "used_bytes": 100998 << 20} for p in per_gpu.get(i, [])]
        if recheck is None:
            dev["compute_processes"] = {"ok": first}
        else:
            again = [{"pid": p, "used_bytes": 100998 << 20} for p in recheck.get(i, [])]
            dev["compute_processes"] = {"seq": [{"ok": first}, {"ok": again}]}
    (site.host / "nvml.json").write_text(json.dumps(data))


def alive(p: subprocess.Popen) -> bool:
    try:
        return psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(p: subprocess.Popen, timeout_s: float = 5.0) -> bool:
    """Ended (the epilog's psutil may have reaped our child, so no exit code)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(p):
            return True
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------- field case 17: parsing (pure)

PMON_A = ("# gpu         pid  type    sm    mem    enc    dec    command\n"
          "# Idx           #   C/G     %      %      %      %    name\n"
          "    0          -     -      -      -      -      -    -\n"
          "    1          -     -      -      -      -      -    -\n")


@pytest.mark.parametrize("text", [PMON_A, "# gpu monitoring started\n" + PMON_A, "No running processes found\n",
                                  "Failed to initialize NVML: Driver/library version mismatch\n",
                                  "gpu_bus_id, pid, used_gpu_memory [MiB]\n", ""])
def test_case17_A_A2_pmon_and_noise_give_no_pids(text):
    procs, _ignored = residual.parse_compute_apps_csv(text)
    assert procs == []


def test_case17_B_csv_line():
    procs, ignored = residual.parse_compute_apps_csv("00000000:41:00.0, 2505781, 100998\n")
    assert ignored == 0
    assert procs == [residual.GpuProc("0000:41:00.0", 2505781, 100998 * 1024 * 1024)]
    facts = {2505781: residual.ProcFacts(2505781, True, uid=1000, ppid=1, env_job_id=None)}
    d = residual.select_targets(procs, {"0000:41:00.0"}, "4242", 1000, facts)
    assert [p.pid for p in d.targets] == [2505781]          # reparented to init, user1, job's GPU


@pytest.mark.parametrize("facts,bus,why", [
    (residual.ProcFacts(7, True, uid=1001, ppid=1), BUS[0], "uid 1001 is not the job's user"),
    (residual.ProcFacts(7, True, uid=1000, ppid=1, env_job_id="4243"), BUS[0], "belongs to job 4243 (SLURM_JOB_ID)"),
    (residual.ProcFacts(7, True, uid=1000, ppid=1, cgroup_job_id="4243"), BUS[0], "belongs to job 4243 (cgroup)"),
    (residual.ProcFacts(7, True, uid=1000, ppid=1), BUS[2], "not on this job's GPUs"),
    (residual.ProcFacts(7, False), BUS[0], "process gone"),
    (residual.ProcFacts(7, True), BUS[0], "owner unknown"),
])
def test_case17_never_targets_what_is_not_the_jobs(facts, bus, why):
    d = residual.select_targets([residual.GpuProc(bus, 7, 1)], {BUS[0], BUS[1]}, "4242", 1000, {7: facts})
    assert d.targets == [] and d.skipped[0]["why"] == why


def test_case17_pid1_and_protected_never_targeted():
    f = {1: residual.ProcFacts(1, True, uid=0), 99: residual.ProcFacts(99, True, uid=0)}
    d = residual.select_targets([residual.GpuProc(BUS[0], 1, 1), residual.GpuProc(BUS[0], 99, 1)], {BUS[0]},
                                "4242", 0, f, protect={99})
    assert d.targets == []


def test_proc_cgroup_job():
    assert residual.parse_proc_cgroup_job("0::/system.slice/slurmstepd.scope/job_4243/step_0/user/task_0\n") == "4243"
    assert residual.parse_proc_cgroup_job("4:cpuacct:/slurm/uid_1000/job_77/step_batch\n") == "77"
    assert residual.parse_proc_cgroup_job("0::/user.slice/user-1000.slice/session-3.scope\n") is None


# ---------------------------------------------------------------- field case 17: for real

@root_only
def test_case17_leftover_is_terminated_and_rechecked(site):
    w = spawn(site)
    set_procs(site, {0: [w.pid]}, recheck={})
    rep = residual.cleanup("4242", USER, [0, 1], HostFS(site.host), log=lambda m: None)
    assert rep["ok"] is True and rep["ended"] == {str(w.pid): "terminated"}
    assert gone(w)
    assert rep["source"].startswith("NVML")


@root_only
def test_case17_term_ignored_then_killed(site):
    w = spawn(site, ignore_term=True)
    set_procs(site, {1: [w.pid]}, recheck={})
    rep = residual.cleanup("4242", USER, [0, 1], HostFS(site.host), term_wait_s=0.5, log=lambda m: None)
    assert rep["ended"] == {str(w.pid): "killed"} and gone(w)


@root_only
def test_case17_other_job_other_gpu_other_user_untouched(site):
    mine = spawn(site)
    other_job = spawn(site, job="4243")             # same user, job 4243, seen on GPU 0 (no ConstrainDevices)
    other_gpu = spawn(site, job=None)               # same user, on GPU 2 (job 4243's)
    other_user = spawn(site, uid=OTHER, job=None)   # another user on the job's GPU
    set_procs(site, {0: [mine.pid, other_job.pid, other_user.pid], 2: [other_gpu.pid]},
              recheck={0: [other_job.pid, other_user.pid], 2: [other_gpu.pid]})
    rep = residual.cleanup("4242", USER, [0, 1], HostFS(site.host), log=lambda m: None)
    assert gone(mine) and rep["ended"] == {str(mine.pid): "terminated"}
    assert alive(other_job) and alive(other_gpu) and alive(other_user)
    assert rep["ok"] is False and rep["reason"].startswith(f"Residual GPU processes: pid {other_user.pid} on {BUS[0]}")
    assert [r["pid"] for r in rep["remaining"]] == [other_user.pid]      # job 4243's process is not "residual"


@root_only
def test_case17_B_via_nvidia_smi_csv_and_epilog_exit_status(site):
    """NVML cannot list processes: the CSV query of nvidia-smi is used;
    memory still held after the kill -> epilog exits 1 with the reason."""
    w = spawn(site)
    data = json.loads((site.host / "nvml.json").read_text())
    for d in data["devices"]:
        d["compute_processes"] = {"error": "Not Supported", "code": 3}
    (site.host / "nvml.json").write_text(json.dumps(data))
    env = site.env(gpus="0,1", FAKE_NVSMI="csv", FAKE_NVSMI_CSV=f"00000000:41:00.0, {w.pid}, 100998")
    cp = run_node(["epilog"], env)
    assert gone(w)
    assert cp.returncode == 1                       # the fake keeps listing it with 100998 MiB
    assert f"Residual GPU processes: pid {w.pid} on 0000:41:00.0 (100998 MiB)" in cp.stderr


@root_only
@pytest.mark.parametrize("mode", ["pmon", "pmon2"])
def test_case17_A_A2_through_the_epilog_nothing_killed(site, mode):
    w = spawn(site)
    data = json.loads((site.host / "nvml.json").read_text())
    for d in data["devices"]:
        d["compute_processes"] = {"error": "Not Supported", "code": 3}
    (site.host / "nvml.json").write_text(json.dumps(data))
    cp = run_node(["epilog"], site.env(gpus="0,1", FAKE_NVSMI=mode))
    assert cp.returncode == 0, cp.stderr
    assert alive(w) and "kill" not in cp.stderr.lower().replace("killed at", "")


# ---------------------------------------------------------------- field case 15 (epilog side)

MISMATCH = {"init": {"error": "Driver/library version mismatch", "code": 18}}


@root_only
@pytest.mark.parametrize("site", [{"nvml": MISMATCH}], indirect=True)
def test_case15_epilog_writes_summary_with_gpu_unavailable(site):
    env = site.env(gpus="0", FAKE_NVSMI="mismatch")
    assert run_node(["prolog"], env).returncode == 1
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert "GPU section unavailable: NVML init failed: LIB_RM_VERSION_MISMATCH" in cp.stderr   # not silent
    s = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert s["gpu_available"] is False
    assert s["gpu_reason"].startswith("NVML init failed: LIB_RM_VERSION_MISMATCH")
    assert s["job_id"] == "4242" and s["node"] == "gpu-node01"


@root_only
@pytest.mark.parametrize("site", [{"nvml": MISMATCH}], indirect=True)
def test_case15_sampler_runs_on_and_epilog_reports_it(site):
    """Mismatch after the prolog (driver upgraded mid-job): the sampler
    keeps CPU/memory figures; the summary says why GPU figures are missing."""
    env = site.env(gpus="0")
    (site.state / "jobs/4242").mkdir(parents=True)
    from gsrun.node.sampler import Sampler

    s = Sampler(HostFS(site.host), "4242", USER, "gpu-node01", [0], str(site.state / "jobs/4242/sampler.json"),
                0.01, 0.01, usage=lambda: (12.5, 1 << 30, 2 << 30, "test"))
    run_job(s, 3)
    cp = run_node(["epilog"], env)
    assert cp.returncode == 0
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["gpu_available"] is False and "LIB_RM_VERSION_MISMATCH" in summ["gpu_reason"]
    assert summ["cpu_time_s"] == 12.5 and summ["mem_peak_bytes"] == 2 << 30


# ---------------------------------------------------------------- field case 16: the node drained

@root_only
@pytest.mark.parametrize("site", [{"nvml": "lost"}], indirect=True)
def test_case16_a_gpu_the_monitor_found_lost_drains_the_node_before_the_next_job(site):
    """The node monitor found GPU 1 lost while the job ran: the epilog exits 1 (slurmd drains the
    node before it gets another job), with no Slurm command."""
    env = site.env(gpus="0,1")
    assert run_node(["prolog"], env).returncode == 0
    assert wait_for(lambda: monitor.ask(site.state, {"op": "lost", "job_id": "4242"})["lost"] == [1], 10)
    cp = run_node(["epilog"], env)
    assert cp.returncode == 1 and "GPU(s) lost during the job: [1]" in cp.stderr, cp.stderr
    assert not any("state=drain" in c for c in site.calls_made()), site.calls_made()
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert [g["lost_at_s"] is not None for g in summ["gpus"]] == [False, True]


@root_only
def test_case16_lost_gpu_drains_the_node(site):
    """The report finds the lost GPU after slurmd has its answer (the node is restored): the
    epilog drains the node through scontrol and keeps the job's state for an admin."""
    from gsrun.facts.nvml import NA, FakeNvml, Seq

    nv = FakeNvml(json.loads((site.host / "nvml.json").read_text()))
    nv.set(1, "memory", Seq([{"ok": {"total": 1, "used": 1, "free": 0}}, NA("GPU is lost", 15)]))
    (site.state / "jobs/4242").mkdir(parents=True)
    from gsrun.node.sampler import Sampler

    s = Sampler(HostFS(site.host), "4242", USER, "gpu-node01", [0, 1], str(site.state / "jobs/4242/sampler.json"),
                0.01, 0.01, nvml=nv, usage=lambda: (1.0, 1, 1, "test"))
    run_job(s, 4)
    cp = run_node(["epilog"], site.env(gpus="0,1", FAKE_SLURM="record"))
    assert cp.returncode == 0 and "draining gpu-node01: gsrun: GPU(s) lost during the job: [1]" in cp.stderr
    assert "scontrol update nodename=gpu-node01 state=drain reason=gsrun: GPU(s) lost during the job: [1]" \
        in site.calls_made(), site.calls_made()
    assert (site.state / "jobs/4242/sampler.json").exists()
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert [g["lost_at_s"] is not None for g in summ["gpus"]] == [False, True]


# ---------------------------------------------------------------- field case 18

def two_jobs_env(site, job, gpus, **kw):
    env = site.env(job_id=job, gpus=gpus, spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job=job), HOSTNAME="gpu-node01.cluster.example")
    env.update(kw)
    return env


def governor(site):
    return (site.host / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()


@root_only
def test_case18_first_epilog_keeps_node_settings_and_other_jobs_processes(site):
    base = host_only(snapshot(site.host))
    assert run_node(["prolog"], two_jobs_env(site, "4242", "0,1")).returncode == 0
    assert run_node(["prolog"], two_jobs_env(site, "4243", "2,3")).returncode == 0
    assert governor(site) == "performance"
    theirs_here = spawn(site, job="4243")          # 4243's worker seen on GPU 0
    theirs = spawn(site, job="4243")               # and on its own GPU 2
    set_procs(site, {0: [theirs_here.pid], 2: [theirs.pid]})
    site.calls.unlink()
    # slurmctld unreachable while the epilog runs: squeue/scontrol hang
    env = two_jobs_env(site, "4242", "0,1", FAKE_SLURM="hang")
    cp, took = timed(["epilog"], env)
    assert cp.returncode == 0, cp.stderr
    assert site.calls_made() == []                  # no scontrol/squeue/sacct on the epilog's path
    assert governor(site) == "performance"          # 4243 still runs: node-wide settings kept
    assert "jobs 4243 still on the node; node settings kept" in cp.stderr
    assert alive(theirs_here) and alive(theirs)
    assert samplers_of("4243", site.state) and not samplers_of("4242", site.state)
    set_procs(site, {})
    cp = run_node(["epilog"], two_jobs_env(site, "4243", "2,3", FAKE_SLURM="hang"))
    assert cp.returncode == 0
    assert diff(base, host_only(snapshot(site.host))) == []


@root_only
@pytest.mark.parametrize("round_", range(3))
def test_case18_concurrent_epilogs_exactly_one_restores(site, round_):
    base = host_only(snapshot(site.host))
    envs = [two_jobs_env(site, "4242", "0,1"), two_jobs_env(site, "4243", "2,3")]
    for e in envs:
        assert run_node(["prolog"], e).returncode == 0
    from helpers.node_site import LAUNCH

    ps = [subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "epilog"], env=e, stderr=subprocess.PIPE, text=True,
                           cwd="/") for e in envs]
    errs = [p.communicate(timeout=60)[1] for p in ps]
    assert [p.returncode for p in ps] == [0, 0], errs
    restored = [e for e in errs if "restored governor" in e]
    kept = [e for e in errs if "still on the node" in e]
    assert len(restored) == 1 and len(kept) == 1, errs
    assert diff(base, host_only(snapshot(site.host))) == []


# ---------------------------------------------------------------- field case 20 (epilog side)

@root_only
def test_case20_wedged_nvidia_smi_dcgmi_sacct_epilog_within_budget(site):
    base = host_only(snapshot(site.host))
    env = site.env(gpus="0,1", spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job="4242"))
    data = json.loads((site.host / "nvml.json").read_text())
    for d in data["devices"]:
        d["compute_processes"] = {"error": "Not Supported", "code": 3}     # forces the nvidia-smi path
    (site.host / "nvml.json").write_text(json.dumps(data))      # before the node monitor opens it
    assert run_node(["prolog"], env).returncode == 0
    site.calls.unlink()
    env.update(FAKE_NVSMI="hang", FAKE_SLURM="hang")
    cp, took = timed(["epilog"], env, timeout_s=300)     # the harness limit (PrologEpilogTimeout stand-in)
    assert took < 30, took
    assert cp.returncode == 0, cp.stderr
    assert "GPU process check incomplete: cannot list GPU processes: nvidia-smi timed out after 2 s" in cp.stderr
    assert [c.split()[0] for c in site.calls_made()] == ["nvidia-smi"]      # no scontrol/squeue/sacct
    assert leftover_fakes(site) == []                   # the hung nvidia-smi and its sleep were killed
    assert diff(base, host_only(snapshot(site.host))) == []


@root_only
def test_epilog_steps_have_their_own_deadlines(site):
    """One wedged step (budget 12 s, nvidia-smi timeout 30 s) cannot starve
    the tuning restore after it; the epilog exits 1 (drain) and says which step."""
    site.config.write_text(site.config.read_text().replace("epilog_budget_s = 90", "epilog_budget_s = 12")
                           .replace("command_s = 2.0", "command_s = 30"))
    base = host_only(snapshot(site.host))
    env = site.env(gpus="0", spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job="4242"))
    data = json.loads((site.host / "nvml.json").read_text())
    for d in data["devices"]:
        d["compute_processes"] = {"error": "Not Supported", "code": 3}
    (site.host / "nvml.json").write_text(json.dumps(data))      # before the node monitor opens it
    assert run_node(["prolog"], env).returncode == 0
    cp, took = timed(["epilog"], {**env, "FAKE_NVSMI": "hang"})
    assert took < 14, took
    assert cp.returncode == 1 and "residual step timed out" in cp.stderr
    assert diff(base, host_only(snapshot(site.host))) == []     # tuning still restored
    assert leftover_fakes(site) == []


# ---------------------------------------------------------------- disk full, read-only /sys

@root_only
def test_spool_full_epilog_restores_node_keeps_old_data(site):
    base = host_only(snapshot(site.host))
    env = site.env(gpus="0", spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job="4242"))
    site.spool.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(site.spool)], check=True)
    try:
        assert run_node(["prolog"], env).returncode == 0
        old = site.spool / "jobs/4242/node-gpu-node01.json"
        old.write_text('{"old": "summary from an earlier epilog run"}\n')
        with open(site.spool / "filler", "wb", buffering=0) as f:        # fill the spool to the last byte
            try:
                while True:
                    f.write(b"x" * 512)
            except OSError:
                pass
        time.sleep(0.5)
        cp, took = timed(["epilog"], env)
        assert cp.returncode == 0 and took < 20, cp.stderr
        assert "cannot write the node summary to the spool" in cp.stderr
        assert old.read_text() == '{"old": "summary from an earlier epilog run"}\n'   # atomic: old file kept
        assert [p.name for p in (site.spool / "jobs/4242").iterdir() if p.name.startswith(".")] == []
        pending = json.loads((site.state / "jobs/4242/node-gpu-node01.json.pending").read_text())
        assert pending["samples"] >= 1                      # the collected data is kept on the node
        assert diff(base, host_only(snapshot(site.host))) == []
    finally:
        subprocess.run(["umount", "-l", str(site.spool)], check=False)


@root_only
def test_read_only_sys_prolog_rolls_back_epilog_clean(site):
    base = host_only(snapshot(site.host))
    cpu = site.host / "sys/devices/system/cpu"
    subprocess.run(["mount", "--bind", str(cpu), str(cpu)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(cpu)], check=True)
        env = site.env(gpus="0", spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record",
                       FAKE_SCONTROL_RECORD=RECORD.format(job="4242"))
        cp = run_node(["prolog"], env)
        assert cp.returncode == 0, cp.stderr
        rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
        t = rec["steps"]["tuning"]
        assert "governor" in t["failed"] and "EROFS" in cp.stderr
        assert diff(base, host_only(snapshot(site.host))) == []      # rolled back
        e = run_node(["epilog"], env)
        assert e.returncode == 0, e.stderr
        assert diff(base, host_only(snapshot(site.host))) == []
    finally:
        subprocess.run(["umount", "-l", str(cpu)], check=False)


# ---------------------------------------------------------------- who may read what

def try_read(path, uid) -> str:
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with open(path, "rb") as f:
                f.read(1)
            os._exit(0)
        except PermissionError:
            os._exit(13)
        except BaseException:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return {0: "read", 13: "EACCES"}.get(os.waitstatus_to_exitcode(status), "other")


def try_as(uid, action) -> str:
    """``action()`` in a child with ``uid`` and gid ``uid`` -> "ok", "EACCES"/"EPERM" or "other"."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
            os._exit(0)
        except PermissionError as e:
            os._exit(1 if e.errno == 1 else 13)
        except BaseException:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return {0: "ok", 1: "EPERM", 13: "EACCES"}.get(os.waitstatus_to_exitcode(status), "other")


@root_only
def test_users_copy_cannot_be_written_grown_or_listed_by_users(site):
    """The user's copy is root's (group: the job's, 0440): its user reads it,
    cannot chmod, rewrite, grow or replace it; other users cannot list or
    enter the job's directory (file names tell what happened to a job)."""
    env = site.env(gpus="0")
    assert run_node(["prolog"], env).returncode == 0
    assert run_node(["epilog"], env).returncode == 0
    d = site.spool / "jobs/4242"
    user_copy = d / "user-node-gpu-node01.json"
    st = os.lstat(user_copy)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, USER, 0o440)
    dst = os.lstat(d)
    assert (dst.st_uid, dst.st_gid, stat.S_IMODE(dst.st_mode)) == (0, USER, 0o750)
    assert try_as(USER, lambda: os.chmod(user_copy, 0o640)) == "EPERM"
    assert try_as(USER, lambda: open(user_copy, "ab").write(b" " * (1 << 20))) == "EACCES"
    assert try_as(USER, lambda: os.rename(user_copy, d / "x")) == "EACCES"
    assert try_as(USER, lambda: os.listdir(d)) == "ok"
    assert try_as(OTHER, lambda: os.listdir(d)) == "EACCES"
    assert try_as(OTHER, lambda: open(user_copy, "rb").read(1)) == "EACCES"


@root_only
def test_summaries_readable_only_by_their_user(site):
    env = site.env(gpus="0")
    assert run_node(["prolog"], env).returncode == 0
    assert run_node(["epilog"], env).returncode == 0
    d = site.spool / "jobs/4242"
    for name, owner, mode in [("node-gpu-node01.json", 0, 0o600), ("prolog-gpu-node01.json", 0, 0o600),
                              ("user-node-gpu-node01.json", 0, 0o440)]:
        st = os.lstat(d / name)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner, mode), name
    assert stat.S_IMODE(os.lstat(site.spool / "jobs").st_mode) == 0o711      # no listing of other jobs
    assert try_read(d / "user-node-gpu-node01.json", USER) == "read"
    assert try_read(d / "node-gpu-node01.json", USER) == "EACCES"
    for name in ("user-node-gpu-node01.json", "node-gpu-node01.json", "prolog-gpu-node01.json"):
        assert try_read(d / name, OTHER) == "EACCES", name
    assert try_read(site.state / "jobs/4242/sampler.json", OTHER) == "EACCES"


# ---------------------------------------------------------------- the task's notes in the node summary

@pytest.mark.skipif(os.geteuid() != 0, reason="the notes file must belong to the job's user")
def test_task_notes_reach_the_node_settings_and_a_planted_link_does_not(site):
    """What local rank 0's gsrun-bind leaves in ``task-<node>/bind.json`` (the
    allocator verified in its maps, a hard RLIMIT_MEMLOCK of 64 KiB on a node
    with an mlx5 port) becomes the node summary's settings; a link planted
    there instead is never followed."""
    env = site.env()
    assert run_node(["prolog"], env).returncode == 0
    task = site.spool / "jobs/4242/task-gpu-node01"
    assert task.is_dir() and task.stat().st_uid == USER and stat.S_IMODE(task.stat().st_mode) == 0o700
    lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    notes = {"malloc": {"name": "jemalloc", "state": "verified", "path": lib,
                        "detail": "mapped in local rank 0's /proc/4711/maps"},
             "memlock": {"soft": 65536, "hard": 65536, "rdma": ["mlx5_0"],
                         "problem": "memlock: hard RLIMIT_MEMLOCK 65536 bytes (64 KiB), below unlimited: ..."}}
    (task / "bind.json").write_text(json.dumps(notes))
    os.chown(task / "bind.json", USER, USER)
    assert run_node(["epilog"], env).returncode == 0
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    by = {s["key"]: s for s in summ["settings"]}
    assert by["malloc"]["state"] == "applied" and by["malloc"]["reason"] == (
        f"LD_PRELOAD={lib} by gsrun-bind; verified: mapped in local rank 0's /proc/4711/maps")
    assert by["memlock"] == {"key": "memlock", "value": "65536", "state": "warning", "source": "node",
                             "reason": notes["memlock"]["problem"]}
    # the next run of the same id: a link to root's file in place of the notes is not read
    assert run_node(["prolog"], env).returncode == 0
    (site.base / "root-notes.json").write_text(json.dumps(notes))
    (task / "bind.json").symlink_to(site.base / "root-notes.json")
    assert run_node(["epilog"], env).returncode == 0
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert not any(s["key"] in ("malloc", "memlock") for s in summ["settings"] or [])
