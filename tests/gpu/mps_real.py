#!/usr/bin/env python3
"""Real-GPU check of gsrun.node.mps (the per-job MPS daemon started and
stopped for real, with real CUDA clients), for the H200 device machine.

Run as root from the repository root:

    python3 tests/gpu/mps_real.py [--uid 65534] [--gpu 0] [--clients 4] [--run-s 3]

What it does (the prolog/epilog path, for real):
  1. picks the GPU's UUID (``nvidia-smi --query-gpu=uuid``, read-only) and a
     user: ``--uid``, default nobody (65534) when root; a preflight
     ``import torch; torch.cuda.is_available()`` as that user decides, and
     falls back to the current uid if it fails (reported as ``uid_fallback``);
  2. ``gsrun.node.mps.start`` for job 990005 in a private ``<tmp>/mps`` (never
     touches compute mode: no ``set_compute_mode``);
  3. runs ``--clients`` concurrent CUDA processes (torch bf16 matmul loops) as
     that user with only ``gsrun.node.mps.task_env`` added (no
     ``CUDA_VISIBLE_DEVICES``: clients see the daemon's devices);
  4. asks the daemon ``get_server_list`` while they run and reads
     ``control.log``: expects ONE server and the clients' PIDs as NEW CLIENT;
  5. ``gsrun.node.mps.stop``; checks no MPS process (other than ones that existed
     before) and no directory / journal is left.

Prints one JSON object (``ok``, ``checks``, ``control_log``, ``start``,
``stop``) and exits 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import psutil  # noqa: E402

from gsrun.node import mps  # noqa: E402

JOB_ID = "990005"
CLIENT = r"""
import json, os, sys, time
import torch
run_s = float(sys.argv[1])
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
n = 0
end = time.perf_counter() + run_s
while time.perf_counter() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
    n += 50
print(json.dumps({"pid": os.getpid(), "iters": n, "sum_finite": bool(torch.isfinite(c).all().item())}),
      flush=True)
"""


def mps_processes() -> dict[int, str]:
    out = {}
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            words = [p.info["name"] or ""] + [os.path.basename(a) for a in (p.info["cmdline"] or [])[:2]]
            if any(w.startswith("nvidia-cuda-mps") for w in words):
                out[p.pid] = " ".join(p.info["cmdline"] or [p.info["name"]])
        except psutil.Error:
            pass
    return out


def gpu_uuid(index: str) -> str:
    r = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", index],
                       capture_output=True, text=True, timeout=30)
    u = r.stdout.strip()
    return u if r.returncode == 0 and u.startswith("GPU-") else index


def as_user(uid: int, gid: int) -> dict:
    if os.geteuid() == 0 and uid != os.geteuid():
        return {"user": uid, "group": gid, "extra_groups": []}
    return {}


def client_env(base: Path, uid: int, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CUDA_MPS_") and k != "CUDA_VISIBLE_DEVICES"}
    home = base / "home"
    env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
                "TRITON_CACHE_DIR": str(home / ".triton"), "NCCL_NVLS_ENABLE": "0"})
    env.update(extra)
    return env


def preflight(uid: int, gid: int, env: dict) -> tuple[bool, str]:
    try:
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           env=env, capture_output=True, text=True, timeout=120, cwd="/",
                           **as_user(uid, gid))
    except subprocess.TimeoutExpired:
        return False, "timeout"
    return r.returncode == 0 and r.stdout.strip().endswith("True"), (r.stderr or r.stdout)[-300:]


def control(pipe_dir: str, cmd: str, uid: int, gid: int) -> str:
    r = subprocess.run(["nvidia-cuda-mps-control"], input=cmd + "\n", capture_output=True, text=True,
                       timeout=20, env={"PATH": mps.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
                       cwd="/", **as_user(uid, gid))
    return r.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uid", type=int, default=None)
    ap.add_argument("--gpu", default="0", help="NVML index of the GPU to give the job")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--run-s", type=float, default=3.0)
    ap.add_argument("--timeout-s", type=float, default=30.0)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))  # so finally: still stops the daemon

    result: dict = {"ok": False, "checks": {}}
    checks = result["checks"]
    before = mps_processes()
    result["mps_processes_before"] = before
    base = Path(tempfile.mkdtemp(prefix="gsrun-mps-real-", dir="/tmp"))
    os.chmod(base, 0o755)
    mps_dir, state_dir = str(base / "mps"), str(base / "state")
    uid = args.uid if args.uid is not None else (65534 if os.geteuid() == 0 else os.getuid())
    gid = uid if uid != 0 else 0
    (base / "home").mkdir()
    os.chown(base / "home", uid, gid)
    pre_ok, pre_msg = preflight(uid, gid, client_env(base, uid, {}))
    if not pre_ok and uid != os.getuid():
        result["uid_fallback"] = {"from": uid, "why": pre_msg}
        uid, gid = os.getuid(), os.getgid()
        os.chown(base / "home", uid, gid)
    result["uid"] = uid
    uuid = gpu_uuid(args.gpu)
    result["gpus"] = [uuid]
    started = None
    clients = []
    try:
        t0 = time.monotonic()
        started = mps.start(JOB_ID, uid, gid, [uuid], mps_dir, state_dir, None, None,
                            "nvidia-cuda-mps-control", args.timeout_s, log=lambda m: print(m, file=sys.stderr))
        result["start"] = started
        result["start_s"] = round(time.monotonic() - t0, 3)
        daemon = psutil.Process(started["pids"][0])
        checks["daemon_uid"] = daemon.uids().real == uid
        st = {d: os.stat(d) for d in (started["job_dir"], started["pipe_dir"], started["log_dir"])}
        checks["dirs_owned_0700"] = all(s.st_uid == uid and (s.st_mode & 0o777) == 0o700 for s in st.values())
        checks["mps_dir_0711"] = (os.stat(mps_dir).st_mode & 0o777) == 0o711
        checks["pid_file"] = os.path.exists(os.path.join(started["pipe_dir"], mps.PID_FILE))

        env = client_env(base, uid, mps.task_env(JOB_ID, mps_dir))
        for _ in range(args.clients):
            clients.append(subprocess.Popen([sys.executable, "-c", CLIENT, str(args.run_s)], env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, cwd="/",
                                            **as_user(uid, gid)))
        deadline = time.monotonic() + 180
        for c in clients:
            line = ""
            while time.monotonic() < deadline and c.poll() is None:
                line = c.stdout.readline()
                if line.strip() == "ready" or not line:
                    break
            if line.strip() != "ready":
                raise RuntimeError(f"client {c.pid} not ready: {c.stderr.read()[-500:]}")
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        time.sleep(min(1.0, args.run_s / 2))
        servers_during = control(started["pipe_dir"], "get_server_list", uid, gid)
        result["get_server_list"] = servers_during
        outs = []
        for c in clients:
            out, err = c.communicate(timeout=120)
            outs.append(json.loads(out.strip().splitlines()[-1]) if c.returncode == 0 else
                        {"pid": c.pid, "rc": c.returncode, "err": err[-500:]})
        result["clients"] = outs
        checks["clients_ok"] = all(o.get("iters", 0) > 0 and o.get("sum_finite") for o in outs)
        clog = Path(started["log_dir"], "control.log").read_text(errors="replace")
        slog_path = Path(started["log_dir"], "server.log")
        slog = slog_path.read_text(errors="replace") if slog_path.exists() else ""
        servers = set(re.findall(r"NEW SERVER (\d+)", clog))
        client_pids = set(int(x) for x in re.findall(r"NEW CLIENT (\d+)", clog))
        result["control_log"] = clog.splitlines()[:80]
        result["server_log_tail"] = slog.splitlines()[-20:]
        result["log_servers"] = sorted(servers)
        result["log_clients"] = sorted(client_pids)
        checks["one_server"] = len(servers) == 1 and servers_during.split() == sorted(servers)
        checks["four_clients"] = ({c.pid for c in clients} <= client_pids
                                  and len(client_pids) == args.clients)
    except Exception as e:  # report, then still stop below
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
                c.wait(timeout=30)
        t0 = time.monotonic()
        res = mps.stop(JOB_ID, mps_dir, state_dir, "nvidia-cuda-mps-control", args.timeout_s,
                       log=lambda m: print(m, file=sys.stderr))
        result["stop"] = res
        result["stop_s"] = round(time.monotonic() - t0, 3)
        time.sleep(0.5)
        after = mps_processes()
        result["mps_processes_after"] = after
        checks["stop_clean"] = res["status"] == "stopped" and res["leftover"] == []
        checks["quit_ok"] = res["quit"] == "ok"
        checks["no_new_mps_process"] = set(after) <= set(before)
        checks["no_job_dir"] = not os.path.lexists(os.path.join(mps_dir, JOB_ID))
        checks["no_journal"] = not os.path.lexists(os.path.join(state_dir, f"mps-{JOB_ID}.json"))
        shutil.rmtree(base, ignore_errors=True)
    result["ok"] = "error" not in result and all(checks.values())
    print(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
