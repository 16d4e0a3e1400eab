#!/usr/bin/env python3
"""The node daemon killed with SIGKILL mid-job on a real GPU node, and started again.

Run as root on the H200 device machine, with gsrun installed (``gsrun-node`` on PATH):

    python3 tests/gpu/restart_real.py [--seconds 30] [--out restart_real.json]

1. ``gsrun-node daemon run`` (its node monitor opens the real NVML), then ``gsrun-node
   prolog`` for a job on GPU 0 with ``SPANK_GS_TUNE=swappiness=10,dirty_ratio=40,thp=never``
   and ``SPANK_GS_EXCLUSIVE=1`` (settings changed on this node, journaled);
2. the job's task: a bf16 matmul loop on GPU 0 for ``--seconds``, as ``nobody``;
3. a third of the way in: SIGKILL the daemon; its monitor ends with it (``PR_SET_PDEATHSIG``),
   the task runs on with nothing sampling it for 3 s;
4. the daemon started again: its monitor takes the job up from its state (``monitor.json``,
   ``sampler.json``) with one ``nvmlInit``;
5. the task ends; ``gsrun-node epilog``: the monitor's final sample, the node summary,
   the restore.

Checks: every ``/proc/sys/vm`` and THP value is back byte for byte; the summary has the
samples of before the kill and after the restart (more than before), the 3 s without a
monitor as gap time (never as 0 % utilization), a busy GPU (utilization mean above 50 %),
and ``sampler_stop == "stopped"``; the restarted monitor counted one ``nvmlInit``; no
process of the daemon is left. Prints one JSON verdict and exits 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import slurm_env  # noqa: E402
from real_node import snapshot  # noqa: E402

JOB_ID = "990011"
NODE = "h200"
TUNE = "swappiness=10,dirty_ratio=40,thp=never"
TASK = ("import sys, time, torch\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "end = time.time() + float(sys.argv[1])\n"
        "while time.time() < end:\n"
        "    for _ in range(20):\n"
        "        a = (a @ a).clamp_(-1, 1)\n"
        "    torch.cuda.synchronize()\n")


def monitor_status(state) -> dict:
    from gsrun.node import monitor

    return monitor.ask(state, {"op": "status"}, timeout_s=10, wait_s=30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"ok": False, "error": "run as root (slurmd's part)"}))
        return 2
    node = shutil.which("gsrun-node") or shutil.which("gsrun-node", path=slurm_env.SAFE_PATH)
    base = Path(tempfile.mkdtemp(prefix="gsrun-restart-", dir="/tmp"))
    os.chmod(base, 0o755)
    cfg = base / "gsrun.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\nmps_dir = "{base}/mps"\n'
                   '\n[sampler]\ninterval_s = 1.0\nflush_s = 2.0\n\n[tuning]\nexclusive_only = false\n')
    fakebin = slurm_env.write_fake_scontrol(base / "bin")
    extra = {"GSRUN_CONFIG": str(cfg), "PATH": f"{fakebin}:{slurm_env.SAFE_PATH}",
             "FAKE_COMMENT": "gsrun:tune=" + TUNE}
    spank = {"SPANK_GS_TUNE": TUNE, "SPANK_GS_EXCLUSIVE": "1"}
    cpus = os.cpu_count() or 1
    state = base / "state"
    out: dict = {"job_id": JOB_ID, "checks": {}}
    checks = out["checks"]
    before = snapshot()
    d1 = slurm_env.start_node_daemon(node, state, extra, log_path=base / "daemon.log")
    mon1 = monitor_status(state)
    pe = slurm_env.prolog_env(JOB_ID, 65534, 65534, "nobody", NODE, "0", cpus, "/tmp", spank, extra)
    pr = subprocess.run([node, "prolog"], env=pe, capture_output=True, text=True, timeout=90, cwd="/")
    checks["prolog_rc0"] = pr.returncode == 0
    tuned = snapshot()
    checks["tuned_during_job"] = tuned.get("vm/swappiness") == "10" and tuned.get("thp/enabled") == "never"
    tenv = slurm_env.task_env(JOB_ID, 65534, "nobody", NODE, "0", cpus, "/tmp")
    task = subprocess.Popen([sys.executable, "-c", TASK, str(args.seconds)], env=tenv, cwd="/tmp",
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, user=65534, group=65534, extra_groups=[])
    time.sleep(args.seconds / 3)
    samples_before = json.loads((state / "jobs" / JOB_ID / "sampler.json").read_text())["samples"]
    mon_pid = mon1.get("pid")
    d1.kill()
    d1.wait()
    t_kill = time.time()
    deadline = time.time() + 10
    while psutil_running(mon_pid) and time.time() < deadline:
        time.sleep(0.05)
    checks["monitor_ended_with_its_daemon"] = not psutil_running(mon_pid)
    time.sleep(max(0.0, 3.0 - (time.time() - t_kill)))
    d2 = slurm_env.start_node_daemon(node, state, extra, log_path=base / "daemon.log")
    mon2 = monitor_status(state)
    out["monitor_after_restart"] = mon2
    checks["job_taken_up"] = mon2.get("jobs") == [JOB_ID]
    checks["one_nvml_init_per_start"] = mon2.get("nvml_inits") == 1 and mon1.get("nvml_inits") == 1
    _, err = task.communicate(timeout=args.seconds + 120)
    out["task_rc"] = task.returncode
    out["task_stderr"] = err.decode(errors="replace")[-1500:]
    ee = slurm_env.epilog_env(JOB_ID, 65534, 65534, "nobody", NODE, "0", cpus, "/tmp", spank, extra)
    ep = subprocess.run([node, "epilog"], env=ee, capture_output=True, text=True, timeout=120, cwd="/")
    checks["epilog_rc0"] = ep.returncode == 0
    out["epilog_stderr"] = ep.stderr[-2000:]
    after = snapshot()
    checks["settings_restored"] = after == before
    out["restore_diff"] = {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                           if before.get(k) != after.get(k)}
    try:
        summ = json.loads((base / "spool" / "jobs" / JOB_ID / f"node-{NODE}.json").read_text())
        g = summ["gpus"][0]
        out["figures"] = {"samples_before_kill": samples_before, "samples": summ["samples"],
                          "gap_s": summ.get("gap_s"), "util_gap_s": g.get("util_gap_s"),
                          "util_mean_pct": g.get("util_mean_pct"), "sampler_stop": summ.get("sampler_stop"),
                          "energy_j": g.get("energy_j")}
        checks["figures_kept"] = summ["samples"] > samples_before and summ.get("sampler_stop") == "stopped"
        checks["gap_counted"] = (g.get("util_gap_s") or 0) >= 2.0
        checks["busy_gpu_seen"] = (g.get("util_mean_pct") or 0) > 50
    except (OSError, ValueError, KeyError, IndexError) as e:
        out["summary_error"] = str(e)
        checks["figures_kept"] = False
    d2.terminate()
    d2.wait(30)
    checks["task_rc0"] = task.returncode == 0
    out["daemon_log"] = (base / "daemon.log").read_text(errors="replace")[-2500:]
    out["ok"] = all(checks.values())
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if out["ok"] else 1


def psutil_running(pid) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
