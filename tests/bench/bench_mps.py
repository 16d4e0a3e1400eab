#!/usr/bin/env python3
"""MPS throughput benchmark: gsrun's per-job MPS daemon vs no MPS vs a
hand-started daemon (docs/history/benchmarks-log.md, "MPS aggregate throughput"), for the H200
device machine.

Run from the repository root (as root or any user that can run CUDA):

    python3 tests/bench/bench_mps.py [--ns 2,4,8] [--size 256] [--duration-s 8] [--rounds 1]

N concurrent processes each loop ``size x size`` bf16 matmuls (torch) for
``duration_s`` after a common start signal; the aggregate throughput is the
sum of each process's matmuls per second. Three modes in the same run:

* ``none``:  no MPS (the processes time-slice the GPU). Their
  ``CUDA_MPS_PIPE_DIRECTORY`` points at an empty private directory, so no
  daemon (not even one at the default /tmp/nvidia-mps) is used.
* ``gsrun``: the daemon started by ``gsrun.node.mps.start`` (job 990006, private
  ``<tmp>/mps``), clients get ``gsrun.node.mps.task_env``.
* ``hand``:  ``nvidia-cuda-mps-control -d`` started by hand with its own
  private pipe/log directories and the same ``CUDA_VISIBLE_DEVICES``.
* ``hand-gsenv``: started by hand, but with gsrun's daemon environment,
  umask and session (tells the environment's cost from gsrun's code).
* ``gsrun-prestart``: gsrun's daemon, then ``start_server -uid`` before the
  clients start (the MPS server already up when the first client connects).

Modes run one after the other in each round (order reversed in odd rounds to
cancel drift); every daemon is asked to ``quit`` in a ``finally`` (and the
hand one is then killed by its pid-file PID if it stays). Compute mode is
never touched; ``NCCL_NVLS_ENABLE=0`` is kept in the workers' environment.

Prints one JSON object: per mode and N the median aggregate matmuls/s, the
ratios gsrun/none, hand/none, gsrun/hand, and whether the targets set for
gsrun's MPS daemon are met (gsrun/none >= 2 at N = 8; gsrun within 5 % of
hand at every N).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import psutil  # noqa: E402

from gsrun.node import mps  # noqa: E402

JOB_ID = "990006"
WORKER = r"""
import json, sys, time
import torch
size, dur = int(sys.argv[1]), float(sys.argv[2])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
for _ in range(200):
    c = a @ b
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
n = 0
t0 = time.perf_counter()
end = t0 + dur
while True:
    for _ in range(100):
        c = a @ b
    torch.cuda.synchronize()
    n += 100
    now = time.perf_counter()
    if now >= end:
        break
print(json.dumps({"iters": n, "elapsed_s": now - t0}), flush=True)
"""


def mps_pids() -> set[int]:
    out = set()
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            words = [p.info["name"] or ""] + [os.path.basename(a) for a in (p.info["cmdline"] or [])[:2]]
            if any(w.startswith("nvidia-cuda-mps") for w in words):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def gpu_query(index: str, field: str) -> str:
    r = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", index],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip() if r.returncode == 0 else f"error: {r.stderr.strip()[:200]}"


def run_workers(n: int, size: int, duration_s: float, env: dict) -> dict:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(size), str(duration_s)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd="/") for _ in range(n)]
    try:
        for p in procs:
            line = p.stdout.readline()
            while line and line.strip() != "ready":
                line = p.stdout.readline()
            if line.strip() != "ready":
                err = p.stderr.read()    # the error's first lines and its end (a CUDA error is often first)
                raise RuntimeError(f"worker {p.pid} failed: {err if len(err) <= 1600 else err[:800] + ' ... ' + err[-800:]}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        per = []
        for p in procs:
            out, err = p.communicate(timeout=duration_s + 120)
            if p.returncode != 0:
                raise RuntimeError(f"worker {p.pid} rc {p.returncode}: {err[-800:]}")
            per.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    rates = [w["iters"] / w["elapsed_s"] for w in per]
    return {"aggregate_per_s": sum(rates), "per_process_per_s": [round(r, 1) for r in rates]}


@contextmanager
def no_mps(base: Path, uuid: str):
    empty = base / "none-pipe"
    empty.mkdir(exist_ok=True)
    yield {"CUDA_MPS_PIPE_DIRECTORY": str(empty), "CUDA_VISIBLE_DEVICES": uuid}


@contextmanager
def gsrun_mps(base: Path, uuid: str, log: list):
    mps_dir, state_dir = str(base / "mps"), str(base / "state")
    try:
        mps.start(JOB_ID, os.getuid(), os.getgid(), [uuid], mps_dir, state_dir, None, None,
                      "nvidia-cuda-mps-control", 30.0, log=log.append)
        yield dict(mps.task_env(JOB_ID, mps_dir))
    finally:
        res = mps.stop(JOB_ID, mps_dir, state_dir, "nvidia-cuda-mps-control", 30.0, log=log.append)
        log.append(f"gsrun stop: {res['status']} quit={res['quit']} leftover={res['leftover']}")
        if res["leftover"]:
            raise RuntimeError(f"gsrun MPS daemon left processes: {res['leftover']}")


def start_server(pipe_dir: str, log: list) -> None:
    """``start_server -uid <uid>`` to a running control daemon: the MPS server
    is then up before the first client connects (what a prolog could do)."""
    r = subprocess.run(["nvidia-cuda-mps-control"], input=f"start_server -uid {os.getuid()}\n".encode(),
                       env={"PATH": mps.SAFE_PATH, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir},
                       timeout=30, capture_output=True)
    log.append(f"start_server rc {r.returncode}: {r.stdout.decode(errors='replace').strip()[:200]}")


@contextmanager
def gsrun_prestart_mps(base: Path, uuid: str, log: list):
    with gsrun_mps(base, uuid, log) as extra:
        start_server(extra["CUDA_MPS_PIPE_DIRECTORY"], log)
        yield extra


@contextmanager
def hand_mps(base: Path, uuid: str, log: list, gsrun_env: bool = False):
    """A daemon started by hand; ``gsrun_env`` starts it the way gsrun does
    (gsrun's daemon environment, umask 077, new session) to tell a cost of
    that environment from one of gsrun's code."""
    name = "hand-gsenv" if gsrun_env else "hand"
    pipe, logd = base / name / "pipe", base / name / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logd.mkdir(parents=True, exist_ok=True)
    if gsrun_env:
        env = mps.daemon_env({"HOME": os.environ.get("HOME", "/")}, [uuid], str(pipe), str(logd),
                             None, None, os.environ)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, timeout=30, check=True, cwd="/",
                       umask=0o077, start_new_session=True, close_fds=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        env = {"PATH": mps.SAFE_PATH, "HOME": os.environ.get("HOME", "/"),
               "CUDA_VISIBLE_DEVICES": uuid,
               "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logd)}
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, timeout=30, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (pipe / "control").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logd)}
    finally:
        pid = None
        try:
            pid = int((pipe / mps.PID_FILE).read_text().strip())
        except (OSError, ValueError):
            pass
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, timeout=30,
                           capture_output=True)
        except subprocess.TimeoutExpired:
            log.append("hand quit timed out")
        if pid:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.1)
            else:
                log.append(f"hand daemon {pid} still there after quit: KILL")
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="2,4,8")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--gpu", default="0")
    ap.add_argument("--modes", default="none,gsrun,hand")
    args = ap.parse_args()
    def _term(*_a):
        raise RuntimeError("SIGTERM: stopped early; figures below are partial")

    signal.signal(signal.SIGTERM, _term)  # caught below: daemons quit, partial figures printed
    ns = [int(x) for x in args.ns.split(",")]
    modes = args.modes.split(",")
    log: list[str] = []
    before = mps_pids()
    if before:
        print(json.dumps({"error": f"MPS processes already running: {sorted(before)}; not benchmarking"}))
        return 2
    uuid = gpu_query(args.gpu, "uuid")
    if not uuid.startswith("GPU-"):
        uuid = args.gpu
    out = {"size": args.size, "duration_s": args.duration_s, "rounds": args.rounds, "ns": ns,
           "gpu": uuid, "compute_mode_before": gpu_query(args.gpu, "compute_mode"), "runs": []}
    base = Path(tempfile.mkdtemp(prefix="gsrun-bench-mps-", dir="/tmp"))
    os.chmod(base, 0o755)
    wenv_base = {k: v for k, v in os.environ.items()
                 if not k.startswith("CUDA_MPS_") and k != "CUDA_VISIBLE_DEVICES"}
    wenv_base["NCCL_NVLS_ENABLE"] = "0"
    # the clients see the one GPU the daemon serves, as a job's tasks do (Slurm sets it for them);
    # without it a client on a multi-GPU host also sees GPUs no daemon serves and fails to start CUDA
    wenv_base["CUDA_VISIBLE_DEVICES"] = uuid
    samples: dict[str, dict[int, list[float]]] = {m: {n: [] for n in ns} for m in modes}
    try:
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else modes[::-1]
            for mode in order:
                ctx = {"none": lambda: no_mps(base, uuid), "gsrun": lambda: gsrun_mps(base, uuid, log),
                       "gsrun-prestart": lambda: gsrun_prestart_mps(base, uuid, log),
                       "hand": lambda: hand_mps(base, uuid, log),
                       "hand-gsenv": lambda: hand_mps(base, uuid, log, gsrun_env=True)}[mode]()
                with ctx as extra:
                    for n in ns:
                        r = run_workers(n, args.size, args.duration_s, {**wenv_base, **extra})
                        samples[mode][n].append(r["aggregate_per_s"])
                        out["runs"].append({"round": rnd, "mode": mode, "n": n, **r})
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        time.sleep(0.5)
        out["mps_processes_after"] = sorted(mps_pids())
        out["compute_mode_after"] = gpu_query(args.gpu, "compute_mode")
        out["log"] = log
        shutil.rmtree(base, ignore_errors=True)
    med = {m: {n: statistics.median(v) for n, v in d.items() if v} for m, d in samples.items()}
    out["aggregate_matmul_per_s"] = {m: {str(n): round(v, 1) for n, v in d.items()} for m, d in med.items()}

    def ratio(a, b):
        return {str(n): round(med[a][n] / med[b][n], 3) for n in ns
                if n in med.get(a, {}) and n in med.get(b, {}) and med[b][n] > 0}

    out["ratios"] = {"gsrun_vs_none": ratio("gsrun", "none"), "hand_vs_none": ratio("hand", "none"),
                     "gsrun_vs_hand": ratio("gsrun", "hand"),
                     "hand_gsenv_vs_hand": ratio("hand-gsenv", "hand"),
                     "gsrun_prestart_vs_hand": ratio("gsrun-prestart", "hand")}
    g8 = out["ratios"]["gsrun_vs_none"].get("8")
    gh = out["ratios"]["gsrun_vs_hand"]
    out["aims"] = {"gsrun_vs_none_n8_ge_2": None if g8 is None else g8 >= 2.0,
                   "gsrun_within_5pct_of_hand": None if not gh else all(abs(v - 1) <= 0.05 for v in gh.values())}
    print(json.dumps(out, indent=1))
    return 0 if "error" not in out and not out["mps_processes_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
