"""Helpers for the prolog/epilog fault and hostile-input tests (no tests here).

- :func:`make_host`: a fake host root (the H200 VM recording + synthetic
  cpufreq + swap, from test_tuning_support) with an ``nvml.json``;
- :func:`site`: config file, state/spool/mps dirs under one temp dir;
- :func:`run_node`: ``gsrun-node ARGS`` from the checkout in a child
  process (the hooks run as slurmd runs them: a fresh process, an env dict),
  with the fake tools of tests/data/fake-bin first on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.tuning_tree import make_tree, snapshot  # noqa: F401 (re-exported)

REPO = Path(__file__).resolve().parents[2]
FAKE_BIN = REPO / "tests" / "data" / "fake-bin"
H200_NVML = REPO / "tests" / "data" / "hosts" / "h200-vm" / "nvml.json"
TUNE = "governor=performance,swappiness=10,thp=never,dirty_ratio=40"

# gsrun-node (its console-script entry point) of the installed package (tests/run installs this checkout; conftest checks they match)
LAUNCH = "import sys\nfrom gsrun.admin.node_entry import main\nmain(sys.argv[1:])\n"


def nvml_devices(n: int = 4, bus_fmt: str = "0000:{:02x}:00.0", first_bus: int = 0x41) -> dict:
    """A synthetic NVML recording with ``n`` GPUs (minor i, bus 41+i)."""
    devs = []
    for i in range(n):
        bus = bus_fmt.format(first_bus + i)
        devs.append({
            "name": {"ok": "NVIDIA H200"}, "uuid": {"ok": f"GPU-{i:08x}-0000-0000-0000-000000000000"},
            "minor": {"ok": i}, "pci": {"ok": {"busId": "0000" + bus}},
            "memory": {"ok": {"total": 150754820096, "used": 1 << 30, "free": 149 << 30}},
            "power_mw": {"ok": 100000}, "compute_processes": {"ok": []},
            "utilization": {"ok": {"gpu": 50, "memory": 10}},
        })
    return {"driver": {"ok": "580.00"}, "count": n, "devices": devs}


def make_host(root: Path, nvml: dict | None | str = "h200") -> Path:
    make_tree(root)
    if nvml == "h200":
        shutil.copy(H200_NVML, root / "nvml.json")
    elif isinstance(nvml, dict):
        (root / "nvml.json").write_text(json.dumps(nvml))
    return root


@dataclass
class Site:
    base: Path
    host: Path
    state: Path
    spool: Path
    mps: Path
    config: Path
    calls: Path

    def env(self, job_id: str = "4242", uid: int = 65534, gpus: str | None = "0", spank: dict | None = None,
            **extra) -> dict:
        """The environment slurmd gives Prolog/Epilog (recorded shape,
        shared/data/slurm-22.05/prolog_slurmd.env) plus test plumbing."""
        env = {"PATH": f"{FAKE_BIN}:/usr/bin:/bin", "SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(uid),
               "SLURM_JOB_GID": str(uid), "SLURM_JOB_USER": "nobody", "SLURMD_NODENAME": "gpu-node01",
               "HOSTNAME": "gpu-node01.cluster.example", "SLURM_JOB_PARTITION": "gpu",
               "SLURM_JOB_NODELIST": "gpu-node01", "SLURM_JOB_CPUS_PER_NODE": "4",
               "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "GSRUN_CONFIG": str(self.config),
               "GSRUN_HOST_ROOT": str(self.host), "GSRUN_STATE_DIR": str(self.state),
               "GSRUN_SPOOL_DIR": str(self.spool), "FAKE_CALL_LOG": str(self.calls),
               "PYTHONDONTWRITEBYTECODE": "1"}
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
        for k, v in (spank or {}).items():
            env[k] = v
        env.update(extra)
        return env

    def calls_made(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def make_site(nvml="h200", config_extra: str = "", budget_prolog_s: float = 60, budget_epilog_s: float = 90,
              command_s: float = 2.0) -> Site:
    base = Path(tempfile.mkdtemp(prefix="gsrun-fault-", dir="/tmp"))
    os.chmod(base, 0o755)
    host = make_host(base / "host", nvml)
    cfg = base / "gsrun.toml"
    cfg.write_text(f"""
[paths]
state_dir = "{base}/state"
spool_dir = "{base}/spool"
mps_dir = "{base}/run/mps"
[sampler]
interval_s = 0.2
flush_s = 0.2
[metrics]
http_port = 0
[timeouts]
command_s = {command_s}
prolog_budget_s = {budget_prolog_s}
epilog_budget_s = {budget_epilog_s}
{config_extra}
""")
    return Site(base, host, base / "state", base / "spool", base / "run" / "mps", cfg, base / "calls.log")


_DAEMONS: dict[str, subprocess.Popen] = {}


def node_daemon(env: dict) -> subprocess.Popen:
    """The node daemon (and so the node monitor) of the site whose
    ``GSRUN_STATE_DIR`` and ``GSRUN_HOST_ROOT`` are in ``env``, started on
    first use and kept for the session (:func:`stop_daemons`): the hooks
    reach the monitor through ``<state dir>/monitor.sock``."""
    state = env["GSRUN_STATE_DIR"]
    p = _DAEMONS.get(state)
    if p is not None and p.poll() is None:
        return p
    os.makedirs(state, mode=0o755, exist_ok=True)
    sock = os.path.join(state, "monitor.sock")
    denv = {k: v for k, v in env.items() if not k.startswith("SLURM")}
    log = open(os.path.join(os.path.dirname(state), "daemon.log"), "ab")
    p = subprocess.Popen([sys.executable, "-P", "-c", LAUNCH, "daemon", "run", "--socket",
                          os.path.join(state, "daemon.sock"), "--state-dir", state,
                          "--host-root", env["GSRUN_HOST_ROOT"], "--metrics-port", "0"], env=denv, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, cwd="/", start_new_session=True)
    log.close()
    deadline = time.monotonic() + 20
    while not os.path.exists(sock) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    _DAEMONS[state] = p
    return p


def monitor_pid(state_dir) -> int | None:
    """The PID of the node monitor of ``state_dir`` (its ``status`` answer), None when none answers."""
    from gsrun.base.errors import GsrunError
    from gsrun.node import monitor

    try:
        return monitor.ask(state_dir, {"op": "status"}, timeout_s=5, wait_s=0).get("pid")
    except GsrunError:
        return None


def stop_daemon(state_dir, kill: bool = False) -> None:
    """Stop the node daemon of the site whose state dir is ``state_dir`` (its
    monitor flushes every job and ends with it; ``kill``: SIGKILL, a crash,
    the monitor gets SIGTERM from the kernel): the next hook starts another,
    whose monitor takes the jobs with a ``monitor.json`` up again."""
    p = _DAEMONS.pop(str(state_dir), None)
    if p is None or p.poll() is not None:
        return
    (p.kill if kill else p.terminate)()
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 15        # the monitor (a child, PR_SET_PDEATHSIG) ends with it
    while monitor_pid(state_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        os.unlink(os.path.join(str(state_dir), "monitor.sock"))     # the next daemon's start is awaited
    except OSError:
        pass


def daemon_pids(state_dir) -> set[int]:
    """The node daemon of ``state_dir`` and its monitor (empty when not running)."""
    p = _DAEMONS.get(str(state_dir))
    if p is None or p.poll() is not None:
        return set()
    out = {p.pid}
    mon = monitor_pid(state_dir)
    if mon is not None:
        out.add(mon)
    return out


def stop_daemons() -> None:
    for p in _DAEMONS.values():
        if p.poll() is None:
            p.terminate()
    for p in _DAEMONS.values():
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    _DAEMONS.clear()


def run_node(args: list[str], env: dict, timeout_s: float = 120, cwd: str = "/") -> subprocess.CompletedProcess:
    """``gsrun-node ARGS`` as slurmd runs a hook: ``cwd`` is the hook's working
    directory (slurmctld's may be world-writable: tests/process/test_root_cwd_imports.py).
    A prolog or epilog of a site finds the site's node daemon running (:func:`node_daemon`)."""
    if args and args[0] in ("prolog", "epilog") and "GSRUN_STATE_DIR" in env and "GSRUN_HOST_ROOT" in env:
        node_daemon(env)
    return subprocess.run([sys.executable, "-P", "-c", LAUNCH, *args], env=env, capture_output=True, text=True,
                          errors="replace", timeout=timeout_s, cwd=cwd)


def wait_for(pred, timeout_s: float) -> bool:
    """``pred()`` true within ``timeout_s`` (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def timed(args, env, timeout_s=120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    cp = run_node(args, env, timeout_s)
    return cp, time.monotonic() - t0


def sampled_jobs(state_dir) -> list[str]:
    """The jobs the node monitor of ``state_dir`` samples now ([] when none runs)."""
    from gsrun.base.errors import GsrunError
    from gsrun.node import monitor

    try:
        return list(monitor.ask(state_dir, {"op": "status"}, timeout_s=5, wait_s=0).get("jobs") or [])
    except GsrunError:
        return []


def samplers_of(job_id: str, state_dir) -> list[str]:
    """``[job_id]`` when the node monitor of ``state_dir`` samples the job, else []."""
    return [job_id] if job_id in sampled_jobs(state_dir) else []


def procs_with_arg(marker: str) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if any(marker in a for a in (p.info["cmdline"] or [])) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


def host_only(snap: dict) -> dict:
    """The node's own files (sys/, proc/) of a snapshot of the host root."""
    return {k: v for k, v in snap.items() if k.startswith(("sys", "proc"))}


def kill_fakes(site) -> None:
    """Stop the site's node daemon (:func:`stop_daemon`), then end the fake
    tools' leftovers of this site (a hung fake whose parent was killed at a
    timeout leaves its ``sleep`` behind): PIDs whose environment has this
    site's FAKE_CALL_LOG. For a test's teardown."""
    import psutil

    stop_daemon(site.state)
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("FAKE_CALL_LOG") == str(site.calls):
                p.kill()
        except psutil.Error:
            pass


def leftover_fakes(site) -> list[str]:
    import psutil

    out = []
    mine = daemon_pids(site.state)      # the site's node daemon and monitor run for the session
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.environ().get("FAKE_CALL_LOG") == str(site.calls) and p.info["status"] != psutil.STATUS_ZOMBIE \
                    and p.info["pid"] not in mine:
                out.append(" ".join(p.info["cmdline"] or []))
        except psutil.Error:
            pass
    return out
