#!/usr/bin/env python3
"""The whole job lifecycle on a real GPU node, slurmd's part played by hand
(docs/history/benchmarks-log.md, "Real-node lifecycle").

Run as root on the H200 device machine, with gsrun installed (``gsrun-node``,
``gsrun-bind``, ``gseff`` on PATH):

    python3 tests/gpu/real_node.py [--seconds 40] [--uid 65534] [--out real_node.json]

Steps, each with the environment slurmd gives it (:mod:`slurm_env`, recorded
from Slurm 22.05, with this node's values: node ``h200``, ``SLURM_JOB_GPUS=0``):

0. the node daemon with its monitor (the one process that opens NVML; Prometheus
   on 127.0.0.1:9410, scraped during the task);
1. snapshot every ``/proc/sys/vm/*`` value and THP ``enabled``/``defrag``;
2. ``gsrun-node prolog`` with ``SPANK_GS_TUNE=swappiness=10,dirty_ratio=40,thp=never``,
   ``SPANK_GS_EXCLUSIVE=1``, ``SPANK_GS_MPS=`` (MPS, default share) and
   ``GSRUN_CONFIG`` pointing at a temporary config (state/spool/mps dirs under
   ``/tmp``, sampler every 1 s);
3. the task, as the job's user: ``gsrun-bind -- python3 train_job.py`` (a
   transformer in bf16, DataLoader with 4 workers) with
   ``CUDA_MPS_PIPE_DIRECTORY`` from the prolog's MPS record; meanwhile
   ``nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw`` every
   second, the vm/THP values, the MPS processes and the control log;
4. ``gsrun-node epilog`` (epilog env), ``gsrun-node epilog-ctld`` (its env; no
   ``scontrol`` here so the job record is absent), ``gseff --json`` as root and
   as the job's user;
5. checks: tuned values in force during the job and restored exactly after;
   MPS daemon ran as the user with the task as a client, and is gone after
   (no process, no directory, no journal); the task's CPU affinity is
   gsrun-bind's plan; the summary's utilization, memory high water, power and
   energy agree with nvidia-smi and the NVML energy counter read here.

Prints one JSON verdict (``ok``, ``checks``, figures) and exits 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

import slurm_env  # noqa: E402

JOB_ID = "990009"
NODE = "h200"
TUNE = "swappiness=10,dirty_ratio=40,thp=never"
EXPECT_TUNED = {"vm/swappiness": "10", "vm/dirty_ratio": "40", "thp/enabled": "never"}


def snapshot() -> dict[str, str]:
    """Every readable /proc/sys/vm value and THP enabled/defrag (selected word)."""
    out = {}
    for p in sorted(Path("/proc/sys/vm").iterdir()):
        try:
            if p.stat().st_mode & 0o444:
                out["vm/" + p.name] = p.read_text().strip()
        except OSError:
            continue
    for name in ("enabled", "defrag"):
        p = Path("/sys/kernel/mm/transparent_hugepage") / name
        try:
            text = p.read_text().strip()
            sel = [w[1:-1] for w in text.split() if w.startswith("[")]
            out["thp/" + name] = sel[0] if sel else text
        except OSError:
            pass
    return out


def mps_procs() -> dict[int, dict]:
    out = {}
    for p in psutil.process_iter(["name", "cmdline", "uids", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            words = [p.info["name"] or ""] + [os.path.basename(a) for a in (p.info["cmdline"] or [])[:1]]
            if any(w.startswith("nvidia-cuda-mps") for w in words):
                out[p.pid] = {"name": p.info["name"], "uid": p.info["uids"].real}
        except psutil.Error:
            continue
    return out


def energy_mj() -> int | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
    except Exception:  # noqa: BLE001
        return None


def smi_reading() -> dict | None:
    try:
        cp = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw",
                             "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                            timeout=10)
        u, m, p = [x.strip() for x in cp.stdout.strip().split(",")]
        return {"t": time.time(), "util_pct": float(u), "mem_used_mib": float(m), "power_w": float(p)}
    except Exception:  # noqa: BLE001
        return None


class Poller(threading.Thread):
    def __init__(self, interval_s: float = 1.0):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.readings: list[dict] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            r = smi_reading()
            if r:
                self.readings.append(r)
            self.stop.wait(self.interval_s)


METRICS_PORT = 9410


def scrape_gsrun(port: int) -> list[str]:
    """The ``gsrun_`` lines of one scrape of the node monitor's endpoint ([] when it does not answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return [ln for ln in r.read().decode().splitlines() if ln.startswith("gsrun_")][:200]
    except OSError as e:
        return [f"# scrape failed: {e}"]


def run_cmd(argv, env, timeout=120, user=None, keep_chars=4000) -> dict:
    t0 = time.perf_counter()
    kw = {}
    if user is not None:
        kw = {"user": user[0], "group": user[1], "extra_groups": []}
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd="/", **kw)
    return {"argv": argv[:3], "rc": cp.returncode, "wall_s": round(time.perf_counter() - t0, 3),
            "stdout": cp.stdout[-keep_chars:], "stderr": cp.stderr[-4000:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--uid", type=int, default=65534)
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--exclusive-only", action="store_true", help="keep the site default tuning.exclusive_only = true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"ok": False, "error": "run as root (slurmd's part)"}))
        return 2
    pw = pwd.getpwuid(args.uid)
    uid, gid, user = pw.pw_uid, pw.pw_gid, pw.pw_name
    tools = {n: shutil.which(n) or shutil.which(n, path=slurm_env.SAFE_PATH) for n in ("gsrun-node", "gsrun-bind", "gseff")}
    if not all(tools.values()):
        print(json.dumps({"ok": False, "error": f"gsrun not installed: {tools}"}))
        return 2
    base = Path(tempfile.mkdtemp(prefix="gsrun-real-", dir="/tmp"))
    os.chmod(base, 0o755)
    work = base / "job"
    work.mkdir()
    os.chown(work, uid, gid)
    train = base / "train_job.py"
    shutil.copy(HERE / "train_job.py", train)
    os.chmod(train, 0o644)
    cfg = base / "gsrun.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\nmps_dir = "{base}/mps"\n\n'
                   '[sampler]\ninterval_s = 1.0\nflush_s = 5.0\n'
                   # the working tree's prolog takes exclusivity only from the job record and
                   # asks scontrol only without SPANK: keep tuning testable either way
                   + ('' if args.exclusive_only else '\n[tuning]\nexclusive_only = false\n'))
    fakebin = slurm_env.write_fake_scontrol(base / "bin")
    extra = {"GSRUN_CONFIG": str(cfg), "PATH": f"{fakebin}:{slurm_env.SAFE_PATH}",
             "FAKE_COMMENT": "gsrun:tune=" + TUNE + ";mps=", "FAKE_USER": user, "FAKE_UID": str(uid)}
    spank = {"SPANK_GS_TUNE": TUNE, "SPANK_GS_EXCLUSIVE": "1", "SPANK_GS_MPS": ""}
    gpus, cpus = "0", os.cpu_count() or 1
    out: dict = {"job_id": JOB_ID, "node": NODE, "user": user, "uid": uid, "tune": TUNE, "checks": {}}
    checks = out["checks"]

    # the node daemon with its monitor (the one process that opens NVML), as a site's unit runs it
    (base / "state").mkdir(mode=0o755)
    dlog = open(base / "daemon.log", "wb")
    daemon = subprocess.Popen([tools["gsrun-node"], "daemon", "run", "--socket", str(base / "state" / "daemon.sock"),
                               "--state-dir", str(base / "state"), "--metrics-port", str(METRICS_PORT)],
                              env={**os.environ, **extra}, stdout=dlog, stderr=subprocess.STDOUT, cwd="/")
    deadline = time.time() + 60
    while not (base / "state" / "monitor.sock").exists() and time.time() < deadline:
        time.sleep(0.05)
    checks["monitor_listening"] = (base / "state" / "monitor.sock").exists()

    before = snapshot()
    mps_before = mps_procs()
    out["vm_before"] = {k: before.get(k) for k in ("vm/swappiness", "vm/dirty_ratio", "thp/enabled")}
    e0 = energy_mj()

    # 2. prolog
    penv = slurm_env.prolog_env(JOB_ID, uid, gid, user, NODE, gpus, cpus, str(work), spank, extra)
    t_prolog0 = time.time()
    pr = run_cmd([tools["gsrun-node"], "prolog"], penv, timeout=90)
    out["prolog"] = pr
    checks["prolog_rc0"] = pr["rc"] == 0
    rec_path = base / "spool" / "jobs" / JOB_ID / f"prolog-{NODE}.json"
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    out["prolog_record_steps"] = rec.get("steps")
    out["prolog_record_exclusive"] = rec.get("exclusive")
    out["config_text"] = cfg.read_text()
    mps_step = (rec.get("steps") or {}).get("mps") or {}
    mps_env = mps_step.get("env") or {}
    checks["prolog_started_mps"] = bool(mps_env.get("CUDA_MPS_PIPE_DIRECTORY"))
    checks["prolog_started_sampler"] = ((rec.get("steps") or {}).get("sampler") or {}).get("monitor") == "sampling"
    e_after_prolog = energy_mj()

    # 3. the task, as the user, through gsrun-bind
    tenv = slurm_env.task_env(JOB_ID, uid, user, NODE, gpus, cpus, str(work), extra=dict(mps_env))
    plan = run_cmd([tools["gsrun-bind"], "--plan", "--json"], tenv, timeout=60, user=(uid, gid))
    try:
        planned = json.loads(plan["stdout"])["ranks"][0]
    except Exception:  # noqa: BLE001
        planned = None
    out["plan_rank0"] = planned
    poller = Poller(1.0)
    poller.start()
    t_task0 = time.time()
    logf = open(work / "task.log", "wb")
    task = subprocess.Popen([tools["gsrun-bind"], "--", sys.executable, str(train), "--seconds",
                             str(args.seconds), "--out", str(work / "train.json")], env=tenv, cwd=str(work),
                            stdout=logf, stderr=subprocess.STDOUT, user=uid, group=gid, extra_groups=[])
    during, mps_during, control_log, gsrun_status = None, {}, [], None
    mid = time.time() + args.seconds / 2 + 5
    while task.poll() is None:
        if during is None and time.time() >= mid:
            during = snapshot()
            mps_during = mps_procs()
            st = run_cmd([tools["gsrun-node"], "status", "--json"], penv,
                         timeout=30)
            gsrun_status = st["stdout"][:3000]
            out["prometheus_during"] = scrape_gsrun(METRICS_PORT)
            mon = run_cmd([sys.executable, "-c", "import json, sys\nfrom gsrun.node import monitor\n"
                           "print(json.dumps(monitor.ask(sys.argv[1], {'op': 'status'})))", str(base / "state")],
                          {**os.environ, **extra}, timeout=30)
            out["monitor_status_during"] = mon["stdout"][:2000]
        time.sleep(0.5)
        if time.time() - t_task0 > args.seconds + 240:
            task.kill()
    t_task1 = time.time()
    logf.close()
    poller.stop.set()
    poller.join(5)
    out["task_rc"] = task.returncode
    out["task_wall_s"] = round(t_task1 - t_task0, 2)
    try:
        train_res = json.loads((work / "train.json").read_text())
    except Exception:  # noqa: BLE001
        train_res = {"ok": False, "log_tail": (work / "task.log").read_text(errors="replace")[-3000:]}
    out["train"] = train_res
    log_file = Path(mps_env.get("CUDA_MPS_LOG_DIRECTORY", "/nonexistent")) / "control.log"
    if log_file.exists():
        control_log = log_file.read_text(errors="replace").splitlines()
    out["mps_control_log"] = control_log[-40:]
    out["mps_during"] = {str(k): v for k, v in mps_during.items()}
    out["gsrun_status_during"] = gsrun_status
    e_before_epilog = energy_mj()

    # 4. epilog, epilog-ctld, gseff
    eenv = slurm_env.epilog_env(JOB_ID, uid, gid, user, NODE, gpus, cpus, str(work), spank, extra,
                                exit_code=0 if task.returncode == 0 else 1)
    ep = run_cmd([tools["gsrun-node"], "epilog"], eenv, timeout=120)
    out["epilog"] = ep
    e1 = energy_mj()
    el = int(time.time() - t_prolog0)
    cenv = slurm_env.ctld_env(JOB_ID, uid, user, NODE, extra={
        **extra, "FAKE_JOBSTATE": "COMPLETING", "FAKE_RUNTIME": f"{el // 3600:02d}:{el % 3600 // 60:02d}:{el % 60:02d}"})
    ct = run_cmd([tools["gsrun-node"], "epilog-ctld", "--wait-s", "5"], cenv, timeout=60)
    out["epilog_ctld"] = {k: ct[k] for k in ("rc", "wall_s", "stderr")}
    gs = run_cmd([tools["gseff"], "--json", JOB_ID], extra, timeout=60, keep_chars=10**8)
    gs_user = run_cmd([tools["gseff"], JOB_ID], {"HOME": str(work), **extra},
                      timeout=60, user=(uid, gid))
    out["gseff_user_text"] = gs_user["stdout"][-3000:] or gs_user["stderr"][-1000:]
    after = snapshot()
    time.sleep(0.5)
    mps_after = {k: v for k, v in mps_procs().items() if k not in mps_before}
    try:
        summary = json.loads(gs["stdout"])
    except Exception:  # noqa: BLE001
        summary = None
        out["gseff_error"] = {"rc": gs["rc"], "stderr": gs["stderr"][-2000:], "stdout_head": gs["stdout"][:500]}

    # 5. checks
    checks["train_ok"] = task.returncode == 0 and bool(train_res.get("ok"))
    checks["train_as_user"] = train_res.get("uid") == uid
    checks["tuned_during"] = during is not None and all(during.get(k) == v for k, v in EXPECT_TUNED.items())
    out["vm_during"] = {k: (during or {}).get(k) for k in EXPECT_TUNED}
    diff = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    out["vm_after"] = {k: after.get(k) for k in EXPECT_TUNED}
    out["vm_restore_diff"] = diff
    checks["restored_exactly"] = not diff
    checks["mps_daemon_as_user"] = any(v["uid"] == uid and "control" in (v["name"] or "")
                                       for v in mps_during.values())
    tpid = train_res.get("pid")
    checks["task_was_mps_client"] = any("NEW CLIENT" in ln for ln in control_log) and \
        (tpid is None or any(f"NEW CLIENT {tpid} " in ln for ln in control_log))
    checks["task_saw_job_mps_env"] = (train_res.get("env") or {}).get("CUDA_MPS_PIPE_DIRECTORY") == \
        mps_env.get("CUDA_MPS_PIPE_DIRECTORY")
    checks["mps_gone_process"] = not mps_after
    checks["mps_gone_dir"] = not (base / "mps" / JOB_ID).exists()
    checks["mps_gone_journal"] = not (base / "state" / f"mps-{JOB_ID}.json").exists()
    checks["epilog_rc0"] = ep["rc"] == 0
    checks["epilog_ctld_rc0"] = ct["rc"] == 0
    checks["gseff_json"] = gs["rc"] == 0 and summary is not None
    checks["gseff_as_user"] = gs_user["rc"] == 0
    if planned:
        planned_cpus = planned["cpus"]
        checks["bind_cpus_as_planned"] = train_res.get("affinity") == planned_cpus
        checks["bind_env"] = (train_res.get("env") or {}).get("GSRUN_BIND_CPUS") == \
            planned["env"].get("GSRUN_BIND_CPUS")
    else:
        checks["bind_cpus_as_planned"] = False
        out["plan_error"] = plan["stderr"][-1000:]
    sp = base / "spool" / "jobs" / JOB_ID
    try:
        us = (sp / "user-summary.json").stat()
        # root's, 0440, the job's group (gsrun.base.fsutil.write_user_copy): the user reads it, cannot replace it
        checks["user_summary_owner_mode"] = us.st_uid == 0 and us.st_gid == gid and (us.st_mode & 0o777) == 0o440
        ns = (sp / f"node-{NODE}.json").stat()
        checks["node_summary_root_0600"] = ns.st_uid == 0 and (ns.st_mode & 0o777) == 0o600
    except OSError as e:
        checks["user_summary_owner_mode"] = False
        out["spool_error"] = str(e)
    try:
        node_summary = json.loads((sp / f"node-{NODE}.json").read_text())
    except (OSError, ValueError):
        node_summary = {}
    checks["sampler_stopped"] = node_summary.get("sampler_stop") == "stopped"
    prom = out.get("prometheus_during") or []
    checks["prometheus_job_gpu_served"] = any(ln.startswith("gsrun_gpu_power_watts{") and f'job_id="{JOB_ID}"' in ln
                                              for ln in prom)
    try:
        checks["one_nvml_init"] = json.loads(out.get("monitor_status_during") or "{}").get("nvml_inits") == 1
    except ValueError:
        checks["one_nvml_init"] = False
    daemon.terminate()
    try:
        daemon.wait(30)
    except subprocess.TimeoutExpired:
        daemon.kill()
    dlog.close()
    out["daemon_log"] = (base / "daemon.log").read_text(errors="replace")[-3000:]

    # plausibility of the figures against nvidia-smi and the energy counter
    readings = [r for r in poller.readings if t_task0 <= r["t"] <= t_task1]
    fig: dict = {"smi_readings": len(readings)}
    if summary and summary.get("gpu", {}).get("devices"):
        g = summary["gpu"]["devices"][0]
        node_elapsed = summary["job"]["elapsed_s"] or summary["job"].get("sampled_s")   # no record here: the sampled span
        smi_util = statistics.mean(r["util_pct"] for r in readings) if readings else None
        # the sampler covers prolog->epilog; nvidia-smi covered the task only:
        # scale the task's mean to the sampler's window (idle outside the task)
        smi_util_window = smi_util * (t_task1 - t_task0) / node_elapsed if smi_util is not None else None
        smi_mem_max = max(r["mem_used_mib"] for r in readings) * 2**20 if readings else None
        smi_power = statistics.mean(r["power_w"] for r in readings) if readings else None
        own_energy_j = (e_before_epilog - e_after_prolog) / 1000 if None not in (e_before_epilog, e_after_prolog) else None
        own_energy_outer_j = (e1 - e0) / 1000 if None not in (e0, e1) else None
        fig.update({
            "summary_elapsed_s": node_elapsed, "task_wall_s": round(t_task1 - t_task0, 2),
            "summary_util_mean_pct": g["util_mean_pct"], "smi_util_mean_task_pct": smi_util and round(smi_util, 1),
            "smi_util_mean_scaled_to_window_pct": smi_util_window and round(smi_util_window, 1),
            "summary_sm_active_mean_pct": g["sm_active_mean_pct"],
            "summary_tensor_active_mean_pct": g["tensor_active_mean_pct"],
            "summary_mem_peak_bytes": g["mem_peak_bytes"], "smi_mem_used_max_bytes": smi_mem_max,
            "torch_max_reserved_bytes": train_res.get("max_memory_reserved_bytes"),
            "summary_power_mean_w": g["power_mean_w"], "summary_power_max_w": g["power_max_w"],
            "smi_power_mean_task_w": smi_power and round(smi_power, 1),
            "summary_energy_j": g["energy_j"], "nvml_energy_after_prolog_to_before_epilog_j": own_energy_j,
            "nvml_energy_before_prolog_to_after_epilog_j": own_energy_outer_j,
            "findings": [f["code"] for f in summary.get("findings", [])],
            "cpu": summary.get("cpu"), "memory": summary.get("memory"),
        })
        if smi_util_window is not None and g["util_mean_pct"] is not None:
            checks["util_matches_smi"] = abs(g["util_mean_pct"] - smi_util_window) <= 10.0
        if smi_mem_max and g["mem_peak_bytes"]:
            checks["mem_peak_matches_smi"] = 0.9 <= g["mem_peak_bytes"] / smi_mem_max <= 1.1
            checks["mem_peak_ge_torch_reserved"] = g["mem_peak_bytes"] >= (train_res.get("max_memory_reserved_bytes") or 0)
        if own_energy_j and own_energy_outer_j and g["energy_j"] is not None:
            # the sampler's window lies between the two windows read here
            checks["energy_within_nvml_windows"] = own_energy_j * 0.99 <= g["energy_j"] <= own_energy_outer_j * 1.01
        if smi_power and g["power_mean_w"]:
            # the summary's mean includes the idle seconds around the task
            checks["power_plausible"] = 0.5 * smi_power <= g["power_mean_w"] <= smi_power * 1.1
    else:
        checks["summary_has_gpu"] = False
    out["figures"] = fig
    out["smi_readings"] = [[round(r["t"] - t_task0, 1), r["util_pct"], r["mem_used_mib"], r["power_w"]]
                           for r in poller.readings]
    if summary:
        out["summary_gpu0"] = {k: v for k, v in (summary["gpu"]["devices"] or [{}])[0].items() if k != "timeline"}
        out["summary_findings"] = summary.get("findings")
    out["ok"] = all(checks.values())
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
