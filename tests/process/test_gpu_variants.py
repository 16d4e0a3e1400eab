"""Variants 3 and 4 of the recorded hosts, through the real ``gsrun-node prolog`` (whose
node monitor samples the job), ``gsrun-node epilog`` and ``gseff --json`` on
a fake host whose NVML recording is built for them:

- variant 3: ``nvmlDeviceGetTotalEnergyConsumption`` answers NOT_SUPPORTED
  (pre-Volta, some vGPU profiles), power answers 100 W. Before: the GPU had
  no energy and dropped out of the job's total. After: energy = the power
  samples integrated over the covered time, marked ``estimated`` in the node
  summary, the job summary, the JS1 blob, the report and the mail; noted
  once per job; the counter is not polled again;
- variant 4: only the v1 memory call (no ``reserved``): an idle GPU shows
  1 GiB "used" (the driver's reservation). Before: the job's high water was
  1 GiB on an idle GPU. After: the baseline the monitor read at the job's begin is subtracted (0), and
  the job's own processes' GPU memory (compute-process list over the job's
  PIDs; another user's process on the GPU is not counted) is reported beside.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from gsrun.report.mail import mail_view
from gsrun.report.records import JobSummary
from gsrun.report.render import render_text
from gsrun.report.summary import decode_js1, js1_blob
from helpers.node_site import kill_fakes, make_site, nvml_devices, run_node

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root; a process of the job's uid")
GIB = 1 << 30
USER = 65534


@pytest.fixture
def site():
    nv = nvml_devices(1)
    s = make_site(nvml=nv)
    s.procs = []
    yield s
    for p in s.procs:
        p.kill()
        p.wait(5)
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def _job_process(site, job="4242", uid=USER):
    code = "print('ready', flush=True)\nimport time\ntime.sleep(60)\n"
    env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "gpu-node01"} if job else {}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, user=uid, group=uid, extra_groups=[],
                         cwd="/", stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    site.procs.append(p)
    return p


@root_only
def test_energy_unsupported_estimated_and_v1_memory_baseline_and_job_processes(site):
    mine = _job_process(site)
    other = _job_process(site, job=None, uid=54321)
    data = json.loads((site.host / "nvml.json").read_text())
    dev = data["devices"][0]
    dev.pop("energy_mj", None)                      # absent key = NOT_SUPPORTED (code 3)
    dev["memory"] = {"ok": {"total": 150754820096, "used": GIB, "free": 149 * GIB}}   # v1: no "reserved"
    # listed for the first 4 s of the node monitor's NVML (it opens the recording once, at its start,
    # which the prolog's run makes), then gone: as the driver lists them after the job ends
    dev["compute_processes"] = {"script": [[0, {"ok": [{"pid": mine.pid, "used_bytes": 3 * GIB},
                                                       {"pid": other.pid, "used_bytes": 5 * GIB}]}],
                                           [4.0, {"ok": []}]]}
    (site.host / "nvml.json").write_text(json.dumps(data))
    env = site.env(gpus="0")
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    begun = json.loads((site.state / "jobs/4242/monitor.json").read_text())      # the monitor's, at begin
    assert begun["mem_baseline"] == {"0": GIB}
    time.sleep(4.5)                                  # polls every 0.2 s; the listing ends at 4 s
    for p in (mine, other):                          # the job ended; the other user's process too
        p.kill()
        p.wait(5)
    ep = run_node(["epilog"], dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmd"))
    assert ep.returncode == 0, ep.stderr
    node = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    (g,) = node["gpus"]
    # variant 3: estimated from 100 W over the covered time, never 0 or missing
    assert g["energy_estimated"] is True
    assert g["covered_s"] > 1.0
    assert g["energy_j"] == pytest.approx(100.0 * g["covered_s"], rel=0.2)
    notes = [n for n in node["notes"] if "energy counter" in n]
    assert notes == ["GPU 0: energy counter (nvmlDeviceGetTotalEnergyConsumption) Not Supported: "
                     "energy estimated from power samples"]                           # once per job
    # variant 4: idle GPU ~0 (v1 minus the prolog's baseline); the job's own processes beside it
    assert g["mem_peak_bytes"] == 0
    assert g["mem_baseline_bytes"] == GIB and "baseline" in g["mem_source"]
    assert g["mem_procs_peak_bytes"] == 3 * GIB                                        # not the other's 5 GiB
    # job summary (gseff --json merges the node summaries), JS1, report, mail
    res = subprocess.run([sys.executable, "-P", "-c", "from gsrun.wrapper.gseff import main; main()",
                          "4242", "--json", "--spool-dir", str(site.spool)], capture_output=True, text=True,
                         env=dict(os.environ, GSRUN_CONFIG=str(site.config)), timeout=60)
    assert res.returncode == 0, res.stderr
    summary = JobSummary.from_json(json.loads(res.stdout))
    assert summary.gpu.energy_estimated is True
    assert summary.gpu.energy_j == g["energy_j"] and summary.gpu.energy_kwh > 0
    assert decode_js1(js1_blob(summary))["gsrun"]["energy_estimated"] is True
    text = render_text(summary)
    assert "energy 0.1 Wh (estimated)" in text                   # the job's total
    notes = " ".join(ln.strip() for ln in text[text.index("gpu-node01 GPU 0"):].splitlines()[1:6])
    assert "energy estimated from power samples (energy counter:" in notes    # under GPU 0's block
    assert "the job's processes held at most 3.0 GiB" in notes
    view = mail_view(summary, text, False, "cid", "https://x.invalid")
    assert view["gpu_energy"].endswith("(estimated)") and view["devices"][0]["energy"].endswith("(estimated)")
    assert "job's processes 3.0 GiB" in view["devices"][0]["mem"]


def test_not_supported_is_polled_once_and_noted_once(tmp_path):
    """The counter that answered NOT_SUPPORTED is asked once per job, not per
    poll; the note is written once; a counter failing at first and then
    answering gives last - first valid reading (no estimate)."""
    from gsrun.facts.hostfs import HostFS
    from gsrun.facts.nvml import NA, FakeNvml, Seq
    from gsrun.node.sampler import Sampler, state_to_json
    from gsrun.report.summary import node_record

    nv = FakeNvml(nvml_devices(2))
    nv.set(1, "energy_mj", Seq([NA("Unknown Error", 999), NA("Unknown Error", 999),
                                {"ok": 1000}, {"ok": 3000}, {"ok": 5000}, {"ok": 7000}]))
    t = [1000.0]

    def clock():
        t[0] += 1.0
        return t[0]
    s = Sampler(HostFS(tmp_path), "4242", None, "n1", [0, 1], str(tmp_path / "sampler.json"), 1.0, 100.0,
                clock=clock, nvml=nv, usage=lambda: (1.0, 1, 1, "test"))
    for _ in range(6):
        s.sample_once()
    assert [c for c in nv.calls if c == (0, "energy_mj")] == [(0, "energy_mj")]     # asked once
    assert len([c for c in nv.calls if c == (1, "energy_mj")]) == 6                  # errors are retried
    assert "energy_mj" in s.state["gpus"][0]["not_polled"] and "energy_mj" not in s.state["gpus"][1]["not_polled"]
    assert [n for n in s.state["notes"] if "energy counter" in n] == [
        "GPU 0: energy counter (nvmlDeviceGetTotalEnergyConsumption) Not Supported: energy estimated from "
        "power samples"]
    summ = node_record(state_to_json(s.state), {"node": "n1", "job_id": "4242", "cpus_on_node": 1, "gpus": [0, 1]},
                        t[0]).to_json()
    g0, g1 = summ["gpus"]
    assert g0["energy_estimated"] is True and g0["energy_j"] == pytest.approx(100.0 * 5)   # 100 W x 5 s
    assert "energy_estimated" not in g1 and g1["energy_j"] == pytest.approx(6.0)           # (7000-1000) mJ
