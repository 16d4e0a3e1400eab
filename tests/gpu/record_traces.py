#!/usr/bin/env python3
"""Record GPU traces for the waste detector's tests on a real GPU node
(``tests/gpu/run --steps traces``; the format is tests/data/traces/README.md).

    python3 tests/gpu/record_traces.py --out DIR [--gpu 0] [--interval-s 1]
        [--train-s 45] [--busy-s 120] [--idle-s 70] [--never-s 48] [--tiny-s 35] [--only NAME,...]

For each workload, a child process (torch) runs on GPU ``--gpu`` (NVML index)
while this script polls that GPU every ``--interval-s`` with the sampler's own
reader (:func:`gsrun.node.sampler.read_gpu` through gsrun's RealNvml, keeping
the driver's sample-buffer position exactly as the sampler does, by folding
each poll with :func:`gsrun.node.sampler.update_gpu`) and writes, per poll,
what ``read_gpu`` returned, the time and the workload's PID (the job's PIDs):

* ``train``: bf16 8192x8192 matmuls plus an elementwise op, ``--train-s``;
* ``idle_after_busy``: the same load for ``--busy-s`` (the issue's 2 minutes),
  then ``--idle-s`` with its CUDA context held and no kernel;
* ``never_touched``: a process of the job that never touches the GPU, ``--never-s``;
* ``tiny_kernels``: a CUDA graph of 1000 64x64 bf16 matmuls replayed back to
  back, ``--tiny-s``.

Each workload prints its phase marks (epoch seconds) on stdout; they become
the trace's ``phases`` (seconds since the trace's first poll). Polling starts
2 s before the workload and ends 2 s after it exits. Each trace is written
(``DIR/traces/<name>.json``) as soon as it is done; a failing workload is
noted in ``DIR/traces/summary.json`` and the next one runs. Defaults: about
5.8 minutes in all (each workload's seconds + 4 s + torch start-up). Never changes a GPU setting.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

FORMAT = "gsrun.gpu-trace/1"

LOAD = r"""
import json, sys, time
mode, secs, idle_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
import os
def mark(name):
    with open(os.environ["GSRUN_TRACE_MARKS"], "a") as f:
        f.write(json.dumps({"phase": name, "t": time.time()}) + "\n")
if mode == "never":
    mark("run"); time.sleep(secs); mark("end"); sys.exit(0)
import torch
if mode in ("train", "busy_idle"):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    mark("busy")
    end = time.time() + secs
    while time.time() < end:
        for _ in range(8):
            c = torch.relu(a @ b)
        torch.cuda.synchronize()
    mark("idle" if mode == "busy_idle" else "end")
    if mode == "busy_idle":
        time.sleep(idle_s)      # the context (and the tensors) stay alive, no kernel runs
        mark("end")
else:   # tiny
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): c = a @ b
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(1000): c = a @ b
    torch.cuda.synchronize()
    mark("tiny")
    end = time.time() + secs
    while time.time() < end:
        for _ in range(20): g.replay()
        torch.cuda.synchronize()
    mark("end")
"""

WORKLOADS = {   # name -> (mode, seconds option)
    "train": ("train", "train_s"),
    "idle_after_busy": ("busy_idle", "busy_s"),
    "never_touched": ("never", "never_s"),
    "tiny_kernels": ("tiny", "tiny_s"),
}


def encode(v):
    """A reading as JSON: an NA as ``{"error", "code"}`` (FakeNvml's recording form)."""
    from gsrun.facts.nvml import is_na

    if is_na(v):
        return {"error": v.reason, "code": v.code}
    return v


def record(nv, ref, name: str, mode: str, secs: float, idle_s: float, interval_s: float, env: dict) -> dict:
    from gsrun.node.sampler import new_gpu_state, read_gpu, update_gpu

    import tempfile

    g = new_gpu_state(ref, 100)
    polls = []
    t0 = None
    proc = None
    pid = None
    started_wall = None
    pre_s, post_s = 2.0, 2.0
    tmp = Path(tempfile.mkdtemp(prefix="gsrun-trace-"))
    marks_path, err_path = tmp / "marks", tmp / "stderr"
    env = dict(env, GSRUN_TRACE_MARKS=str(marks_path))
    end_by = time.monotonic() + pre_s + secs + idle_s + 90.0     # hard stop: torch start-up + margin
    ended_at = None
    killed = False
    prev = None
    next_t = time.monotonic()
    with open(err_path, "w") as err_f:
        while True:
            if proc is None and t0 is not None and time.time() - t0 >= pre_s:
                proc = subprocess.Popen([sys.executable, "-c", LOAD, mode, str(secs), str(idle_s)],
                                        stdout=subprocess.DEVNULL, stderr=err_f, env=env)
                pid = proc.pid
                started_wall = time.time()
            wall = time.time()
            if t0 is None:
                t0 = wall
            t_s = round(wall - t0, 3)
            r = read_gpu(nv, ref, g["last_sample_us"], set(g.get("not_polled", ())))
            update_gpu(g, r, t_s, 0.0 if prev is None else t_s - prev, 0.0, {pid} if pid else set())
            prev = t_s
            polls.append({"t_s": t_s, "job_pids": [pid] if pid else [],
                          "r": {k: encode(v) for k, v in r.items()}})
            if proc is not None and ended_at is None and proc.poll() is not None:
                ended_at = time.monotonic()
            if ended_at is not None and time.monotonic() - ended_at >= post_s:
                break
            if time.monotonic() > end_by:
                if proc is not None:
                    proc.kill()
                killed = True
                break
            next_t += interval_s
            time.sleep(max(0.0, next_t - time.monotonic()))
    rc = proc.wait() if proc is not None else None
    err = err_path.read_text()[-2000:]
    phases_abs = []
    for line in (marks_path.read_text().splitlines() if marks_path.exists() else []):
        try:
            m = json.loads(line)
            phases_abs.append((str(m["phase"]), float(m["t"])))
        except (ValueError, KeyError, TypeError):
            pass
    for f in (marks_path, err_path):
        f.unlink(missing_ok=True)
    tmp.rmdir()
    marks = [(n, round(t - t0, 3)) for n, t in phases_abs]
    phases = []
    for i, (n, t) in enumerate(marks):
        if n == "end":
            continue
        end = marks[i + 1][1] if i + 1 < len(marks) else polls[-1]["t_s"]
        phases.append({"name": n, "start_s": t, "end_s": end})
    return {"format": FORMAT, "name": name, "synthetic": False,
            "source": f"recorded by tests/gpu/record_traces.py on {socket.gethostname()} "
                      f"{time.strftime('%Y-%m-%d', time.gmtime(t0))}",
            "interval_s": interval_s,
            "gpu": {"name": ref.name, "uuid": ref.uuid, "gpm": ref.gpm, "mig": ref.mig,
                    "power_limit_w": getattr(ref, "power_limit_w", None)},
            "phases": phases, "workload": {"mode": mode, "seconds": secs, "idle_s": idle_s, "pid": pid, "killed": killed,
                                           "process_started_s": None if started_wall is None else
                                           round(started_wall - t0, 3), "rc": rc, "stderr_tail": err},
            "polls": polls}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="record_traces")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use and record")
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--train-s", type=float, default=45.0)
    ap.add_argument("--busy-s", type=float, default=120.0)
    ap.add_argument("--idle-s", type=float, default=70.0)
    ap.add_argument("--never-s", type=float, default=48.0)
    ap.add_argument("--tiny-s", type=float, default=35.0)
    ap.add_argument("--only", default="", help="comma list of workload names")
    a = ap.parse_args(argv)
    from gsrun.facts.nvml import RealNvml
    from gsrun.node.sampler import resolve_gpus

    out = Path(a.out) / "traces"
    out.mkdir(parents=True, exist_ok=True)
    nv = RealNvml()
    minor = nv.get(a.gpu, "minor")
    refs, notes = resolve_gpus(nv, [int(minor)])
    ref = refs[0]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(ref.uuid or a.gpu))
    summary = {"gpu": ref.to_json(), "notes": notes, "driver": str(nv.driver_version()), "traces": {}}
    only = [x for x in a.only.split(",") if x]
    for name, (mode, opt) in WORKLOADS.items():
        if only and name not in only:
            continue
        secs = getattr(a, opt)
        t = time.time()
        try:
            tr = record(nv, ref, name, mode, secs, a.idle_s if mode == "busy_idle" else 0.0, a.interval_s, env)
            (out / f"{name}.json").write_text(json.dumps(tr, separators=(",", ":")) + "\n")
            summary["traces"][name] = {"polls": len(tr["polls"]), "phases": tr["phases"],
                                       "rc": tr["workload"]["rc"], "wall_s": round(time.time() - t, 1)}
        except Exception as e:  # noqa: BLE001 - one broken workload must not cost the others
            summary["traces"][name] = {"error": f"{type(e).__name__}: {e}", "wall_s": round(time.time() - t, 1)}
        print(json.dumps({name: summary["traces"][name]}), flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    nv.close()
    ok = all("error" not in v and v.get("rc") == 0 for v in summary["traces"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
