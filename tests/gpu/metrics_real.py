#!/usr/bin/env python3
"""The per-job Prometheus textfile on the real H200: a busy
phase then an idle phase under gsrun's own sampler with the textfile export
on, the ``.prom`` file it wrote at the end of each phase kept for review.

    python3 tests/gpu/metrics_real.py [--busy-s 25] [--idle-s 25] [--out DIR]

The sampler is :class:`gsrun.node.sampler.Sampler` on the real NVML, GPU 0,
polled every second and flushed every 2 s (each flush writes
``gsrun_job_<job>.prom`` through
:class:`gsrun.node.metrics_textfile.TextfileExporter`), its job's processes
found as on a node without a job cgroup (``SLURM_JOB_ID`` in their
environment). The load is 8192x8192 bf16 matmuls back to back in a child
process carrying that ``SLURM_JOB_ID``; the idle phase has no process of the
job on the GPU. At the end the epilog's removal
(:func:`gsrun.node.metrics_textfile.remove_job_file`) runs.

Writes ``DIR/metrics-busy.prom``, ``DIR/metrics-idle.prom`` (the files as
node_exporter would read them) and ``DIR/metrics_real.json`` (figures and
checks: busy utilization >= 0.8 and idle flag 0; idle utilization <= 0.05 and
idle flag 1; energy counter rising; file mode 0644; nothing left after the
removal). Exits 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = "990021"
LOAD = r"""
import sys, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
c = a @ b
torch.cuda.synchronize()
print("ready", flush=True)
import select
while not select.select([sys.stdin], [], [], 0)[0]:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def series(path: Path) -> dict:
    """``{family: value}`` of GPU 0 in a .prom file (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if s.labels.get("gpu") == "0":
                out[s.name] = s.value
    return out


def run_phase(s, seconds: float, interval_s: float, flush_s: float) -> None:
    t0 = time.time()
    last_flush = None
    n = 0
    polled = False
    while time.time() - t0 < seconds:
        time.sleep(max(0.0, t0 + n * interval_s - time.time()))
        s.sample_once()
        polled = True
        n += 1
        if last_flush is None or time.time() - last_flush >= flush_s:
            s.flush()
            s.after_flush()
            last_flush = time.time()
            polled = False
    if polled:      # as the sampler does: a flush window always holds a poll (an empty window has no means)
        s.flush()
        s.after_flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy-s", type=float, default=25.0)
    ap.add_argument("--idle-s", type=float, default=25.0)
    ap.add_argument("--out", default="gpu-results")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    from gsrun.facts.hostfs import HostFS
    from gsrun.node.metrics_textfile import FILE_MODE, TextfileExporter, file_name, remove_job_file, user_label
    from gsrun.node.sampler import Sampler
    from gsrun.node.live import LiveActions
    from gsrun.facts.live import read_live_docs
    from gsrun.report.live import live_summary, live_text
    from gsrun.report.render import render_text
    from gsrun.request.waste import IdleConfig

    tmp = Path(tempfile.mkdtemp(prefix="gsrun-metrics-real-"))
    tdir = tmp / "textfile"
    tdir.mkdir()
    prom = tdir / file_name(JOB)
    res: dict = {"job": JOB, "checks": {}}
    env = {**os.environ, "SLURM_JOB_ID": JOB, "CUDA_VISIBLE_DEVICES": "0", "NCCL_NVLS_ENABLE": "0"}
    load = None
    try:
        s = Sampler(HostFS.from_env(None), JOB, os.getuid(), "h200", [0], str(tmp / "sampler.json"), 1.0, 2.0, 1000,
                    idle=IdleConfig(warn_after_min=0.25))
        s.export = TextfileExporter(str(tdir), JOB, user_label(os.getuid()))
        # the live report as gseff shows a running job: the sampler's live file (every flush here),
        # idle alert after 15 s of idle (no mail: nothing configured; the alert line is what is checked)
        spool = tmp / "spool"
        (spool / "jobs" / JOB).mkdir(parents=True)
        s.live = LiveActions(spool, JOB, "h200", os.getuid(), s.idle_cfg, live_flush_s=0.0, kick=lambda: None)

        def live_report(tag: str) -> dict:
            docs = read_live_docs(spool / "jobs" / JOB)
            summ = live_summary(JOB, docs)
            text = live_text(summ, time.time()) + "\n" + render_text(summ, color=False)
            (out / f"live-{tag}.txt").write_text(text)
            devs, live = summ.gpu.devices, summ.live
            return {"state": summ.job.state, "util_pct": devs[0].util_mean_pct if devs else None,
                    "alerts": live["alerts"], "findings": [f.get("code") for f in live["findings"]],
                    "bytes": sum(len(json.dumps(d)) for d in docs.values())}
        s.sample_once()                      # the prolog's first poll: before the job's process starts
        load = subprocess.Popen([sys.executable, "-c", LOAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)
        res["load_ready"] = load.stdout.readline().strip()
        run_phase(s, a.busy_s, 1.0, 2.0)
        shutil.copy(prom, out / "metrics-busy.prom")
        res["live_busy"] = live_report("busy")
        res["mode_octal"] = oct(stat.S_IMODE(os.stat(prom).st_mode))
        load.stdin.write("stop\n")
        load.stdin.flush()
        load.wait(30)
        run_phase(s, a.idle_s, 1.0, 2.0)
        shutil.copy(prom, out / "metrics-idle.prom")
        res["live_idle"] = live_report("idle")
        s.nv.close()
        res["removed"] = remove_job_file(str(tdir), JOB)
        res["left"] = sorted(os.listdir(tdir))
        busy, idle = series(out / "metrics-busy.prom"), series(out / "metrics-idle.prom")
        res["busy"], res["idle"] = busy, idle
        res["watch"] = s.state["watch"][0].to_json() if s.state.get("watch") else None
        c = res["checks"]
        c["busy_util_ge_0.8"] = busy.get("gsrun_gpu_utilization_ratio", -1) >= 0.8
        c["busy_not_idle"] = busy.get("gsrun_gpu_idle") == 0.0
        c["busy_power_gt_200w"] = busy.get("gsrun_gpu_power_watts", 0) > 200
        c["busy_memory_gt_256mib"] = busy.get("gsrun_gpu_memory_used_bytes", 0) > 256 << 20
        c["idle_util_le_0.05"] = 0 <= idle.get("gsrun_gpu_utilization_ratio", -1) <= 0.05
        c["idle_flag_1"] = idle.get("gsrun_gpu_idle") == 1.0
        c["energy_rises"] = idle.get("gsrun_gpu_energy_joules_total", 0) > \
            busy.get("gsrun_gpu_energy_joules_total", float("inf")) > 0
        c["mode_default"] = res["mode_octal"] == oct(FILE_MODE)     # metrics.textfile_mode's default, 0640
        c["removed_nothing_left"] = res["removed"] == [file_name(JOB)] and res["left"] == []
        lb, li = res["live_busy"], res["live_idle"]
        c["live_running_busy"] = lb["state"] == "RUNNING" and (lb["util_pct"] or 0) >= 80 and not lb["alerts"]
        c["live_idle_alert"] = li["state"] == "RUNNING" and any(" idle since " in a for a in li["alerts"]) \
            and "gpu_idle" in li["findings"]
        c["live_file_small"] = lb["bytes"] < 12 * 1024 and li["bytes"] < 12 * 1024
    except Exception as e:  # noqa: BLE001 - one JSON verdict whatever happens
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    res["ok"] = "error" not in res and bool(res["checks"]) and all(res["checks"].values())
    res["checks"] = res.pop("checks")       # last, with ok: in the tail tests/gpu/run prints
    text = json.dumps(res, indent=1, default=str)
    (out / "metrics_real.json").write_text(text + "\n")
    print(text)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
