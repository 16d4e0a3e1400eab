"""Alerts per condition (idle, stuck, never used) on simulated jobs made of the
GPU traces in tests/data/traces (the real H200 recordings and the synthetic
hang), driven through the detector and the sampler's live effects
(LiveActions) with the spool of a real job, then mailed by alerts.process."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from email import policy as email_policy
from email.parser import BytesParser

import pytest

from gsrun.node.live import LiveActions
from gsrun.report import alerts
from gsrun.request.config import parse_config
from gsrun.request.waste import GpuWatch, IdleConfig

from helpers.line_log import LineLog
from helpers.traces import TRACES, job_polls, load

pytestmark = pytest.mark.process

JOB = "4242"
T0 = 1_760_000_000.0
FLUSH_S = 5.0
# expect.json's replay config: thresholds scaled to the traces' length
CFG = dataclasses.replace(IdleConfig(), warn_after_min=0.75, stuck_after_min=0.5, alert_mail=True)
MAIL = parse_config('[mail]\ndefault_domain = "example.org"\nfrom_addr = "gsrun@example.org"\n')


def _spool(tmp_path, gpus):
    spool = tmp_path / "spool"
    d = spool / "jobs" / JOB
    d.mkdir(parents=True)
    rec = {"job": {"job_id": JOB, "node": "n1", "nodelist": ["n1"], "user": "alice", "uid": os.getuid(),
                   "gid": os.getgid(), "partition": "gpu", "cpus_on_node": 8, "gpus": list(range(gpus))},
           "prolog_time": T0}
    (d / "prolog-n1.json").write_text(json.dumps(rec))
    return spool


def run_job(tmp_path, gpus: dict, until_s: float, cfg=CFG, scancel=None):
    """The job's polls through one GpuWatch per GPU and LiveActions every FLUSH_S
    (``scancel``: the injected scancel; the job record is a plain batch job);
    returns (spool, state, kicks)."""
    spool = _spool(tmp_path, len(gpus))
    watches = {g: GpuWatch(g, cfg, None, 2 * max(t["interval_s"] for t, _ in segs)) for g, segs in gpus.items()}
    for g, segs in gpus.items():
        watches[g].power_limit_w = segs[0][0]["gpu"]["power_limit_w"]
    state = {"job_id": JOB, "node": "n1", "start_time": T0, "last_time": T0, "samples": 0, "gpus": [],
             "notes": [], "watch": list(watches.values()), "waste_findings": []}
    now = {"t": 0.0}
    kicks = []
    live = LiveActions(spool, JOB, "n1", os.getuid(), cfg, live_flush_s=30.0, clock=lambda: T0 + now["t"],
                       kick=lambda: kicks.append(now["t"]), log=LineLog(), scancel=scancel,
                       job_record=lambda j: {"partition": "gpu", "qos": "normal", "user": "alice", "account": "lab",
                                             "interactive": False, "mail_user": None, "unparsable": False})
    next_flush = 0.0
    for t, g, vals in job_polls(gpus):
        if t > until_s:
            break
        while t >= next_flush:
            now["t"] = next_flush
            live.after_flush(state, lambda: dict(state))
            next_flush += FLUSH_S
        state["waste_findings"] += watches[g].update(t, vals)
    now["t"] = next_flush
    live.after_flush(state, lambda: dict(state))
    return spool, state, kicks


def _requests(spool):
    return {p.name: json.loads(p.read_text()) for p in sorted((spool / "alerts" / "new").iterdir())}


def _mails(spool):
    return {p.name: BytesParser(policy=email_policy.default).parsebytes(p.read_bytes())
            for p in sorted((spool / "mail" / "new").iterdir())}


STUCK, IDLE, TRAIN = (TRACES / "stuck_collective_synthetic.json", TRACES / "idle_after_busy.json",
                      TRACES / "train.json")


def _need(*paths):
    for p in paths:
        if not p.exists():
            pytest.skip(f"trace {p.name} not recorded (tests/data/traces/README.md)")
    return [load(p) for p in paths]


def test_stuck_on_four_and_idle_on_four_gets_both_said(tmp_path):
    stuck, idle = _need(STUCK, IDLE)
    gpus = {str(i): [(stuck, 0.0)] for i in range(4)} | {str(i): [(idle, 0.0)] for i in range(4, 8)}
    spool, state, kicks = run_job(tmp_path, gpus, until_s=199.0)
    got = [(f["code"], f["gpu"], f["since_s"], f["detected_s"]) for f in state["waste_findings"]]
    assert got == [("gpu_stuck_collective", str(i), 120.0, 150.0) for i in range(4)] + \
        [("gpu_idle", str(i), 126.0, 171.0) for i in range(4, 8)]
    reqs = _requests(spool)
    assert sorted(reqs) == [f"{JOB}.idle.json", f"{JOB}.stuck.json"]      # one each, though flushed 40 times
    assert [ln.split(" since ")[0] for ln in reqs[f"{JOB}.stuck.json"]["lines"]] == \
        [f"GPU {i} on n1 looks stuck in a collective (busy at idle power)" for i in range(4)]
    assert [ln.split(" since ")[0] for ln in reqs[f"{JOB}.idle.json"]["lines"]] == \
        [f"GPU {i} on n1 idle" for i in range(4, 8)]
    assert kicks == [155.0, 175.0]          # the first flush after the detecting poll
    assert [(a["time"] - T0, a["action"], a["kind"]) for a in state["actions"]] == \
        [(155.0, "alert_mailed", "stuck"), (175.0, "alert_mailed", "idle")]
    assert state["actions"][1]["detail"].startswith("GPU 4 on n1 idle since ")
    assert alerts.process(spool, MAIL, CFG, now=T0 + 200) == {"queued": 2, "deferred": 0, "failed": 0}
    mails = _mails(spool)
    assert sorted(mails) == [f"{JOB}.idle.eml", f"{JOB}.stuck.eml"]
    assert str(mails[f"{JOB}.stuck.eml"]["Subject"]).startswith(
        f"[gsrun] job {JOB} running: GPU 0 on n1 looks stuck in a collective")
    assert str(mails[f"{JOB}.idle.eml"]["Subject"]).startswith(f"[gsrun] job {JOB} running: GPU 4 on n1 idle")


def test_idle_alert_says_the_memory_the_idle_gpus_hold(tmp_path):
    stuck, idle = _need(STUCK, IDLE)
    gpus = {str(i): [(stuck, 0.0)] for i in range(4)} | {str(i): [(idle, 0.0)] for i in range(4, 8)}
    spool, state, _ = run_job(tmp_path, gpus, until_s=199.0)
    # the recording: the idle process keeps its CUDA context, 1,422,721,024 B used (v2 used)
    assert [f["evidence"]["mem_used_bytes"] for f in state["waste_findings"]] == [64961380352] * 4 + [1422721024] * 4
    alerts.process(spool, MAIL, CFG, now=T0 + 200)
    mails = _mails(spool)
    idle_text = mails[f"{JOB}.idle.eml"].get_content()
    assert ("The idle GPUs still hold 5.3 GiB of GPU memory (GPU 4 on n1: 1.3 GiB, GPU 5 on n1: 1.3 GiB, "
            "GPU 6 on n1: 1.3 GiB, GPU 7 on n1: 1.3 GiB).") in " ".join(idle_text.split())
    assert "still hold" not in mails[f"{JOB}.stuck.eml"].get_content()     # stuck GPUs are not idle


def test_idle_alert_rearmed_only_after_the_gpu_worked_again(tmp_path):
    idle, train = _need(IDLE, TRAIN)
    # one GPU: busy then idle (recorded), trains again at 200 s (recorded), then busy and idle again
    spool, state, kicks = run_job(tmp_path, {"0": [(idle, 0.0), (train, 200.0), (idle, 260.0)]}, until_s=459.0)
    got = [(f["code"], f["since_s"], f["detected_s"]) for f in state["waste_findings"]]
    assert got == [("gpu_idle", 126.0, 171.0), ("gpu_idle", 386.0, 431.0)]
    assert sorted(_requests(spool)) == [f"{JOB}.idle-2.json", f"{JOB}.idle.json"]
    assert kicks == [175.0, 435.0]
    assert state["live_actions"]["fired"] == {"idle": True}
    assert alerts.process(spool, MAIL, CFG, now=T0 + 460) == {"queued": 2, "deferred": 0, "failed": 0}
    assert sorted(_mails(spool)) == [f"{JOB}.idle-2.eml", f"{JOB}.idle.eml"]


def test_still_idle_is_never_alerted_twice(tmp_path):
    idle, = _need(IDLE)
    spool, state, kicks = run_job(tmp_path, {"0": [(idle, 0.0)], "1": [(idle, 0.0)]}, until_s=199.0)
    assert len(state["waste_findings"]) == 2 and sorted(_requests(spool)) == [f"{JOB}.idle.json"]
    assert kicks == [175.0]


def test_actions_in_node_and_job_summary_and_gseff(tmp_path):
    """The real Sampler (the H200 recording, busy 10 s then idle), cancel on: the alert mail,
    the cancel request and its answer land in the state, the node and job summaries, and the
    report gseff prints (running: from the live file; ended: from the summaries)."""
    from gsrun.facts.hostfs import HostFS
    from gsrun.facts.live import read_live_docs
    from gsrun.facts.nvml import FakeNvml
    from gsrun.node.sampler import Sampler
    from gsrun.report.live import live_summary
    from gsrun.report.render import render_text
    from gsrun.wrapper import gseff
    from helpers.fake_nvml import work_then_idle
    from helpers.sampler_sim import SimClock, job_of, node_of, run_job as run_sampler

    spool = _spool(tmp_path, 1)
    clock = SimClock(T0)
    idle = IdleConfig.from_table({"warn_after_min": 0.1, "cancel": "on", "cancel_after_min": 0.5,
                                  "cancel_grace_min": 0.25})
    root = tmp_path / "root"
    root.mkdir()
    s = Sampler(HostFS(str(root)), JOB, 1000, "n1", [0], str(tmp_path / "sampler.json"), 5.0, 5.0, 100,
                clock=clock, nvml=FakeNvml(work_then_idle(1, 10.0), clock=clock),
                usage=lambda: (None, None, None, "test"), idle=idle)
    calls = []
    s.live = LiveActions(spool, JOB, "n1", os.getuid(), idle, 30.0, clock=clock,
                         job_record=lambda j: {"partition": "gpu", "qos": "normal", "user": "alice",
                                               "account": "lab", "interactive": False, "mail_user": None,
                                               "unparsable": False},
                         scancel=lambda j: (calls.append(j), (True, "scancel accepted"))[1], kick=lambda: None,
                         log=LineLog())
    final = run_sampler(s, 20)
    assert calls == [JOB]
    warned = ("all allocated GPUs idle since 5 s into the job, for 0.5 min (limit 0.5 min, "
              "idle.cancel_after_min)")
    reason = ("all allocated GPUs idle since 5 s into the job, for 0.8 min (limit 0.5 min, "
              "idle.cancel_after_min); warned 0.25 min before, at "
              + time.strftime("%H:%M:%S", time.localtime(T0 + 35)) + " (idle.cancel_grace_min)")
    warning = (f"job {JOB} will be cancelled at {time.strftime('%H:%M', time.localtime(T0 + 50))} (in 0.25 min) "
               f"unless its GPUs work again: {warned}")
    assert [(a["time"] - T0, a["action"], a["kind"], a["detail"]) for a in final["actions"]] == [
        (15.0, "alert_mailed", "idle", final["actions"][0]["detail"]),
        (35.0, "cancel_warned", None, warning),
        (50.0, "cancel_requested", None, f"scancel {JOB}: {reason}"),
        (50.0, "cancel_done", None, "scancel accepted")]
    assert final["actions"][0]["detail"].startswith("GPU 0 on n1 idle since ")
    # running: gseff reads the live file
    running = live_summary(JOB, read_live_docs(spool / "jobs" / JOB), None, None)
    assert [a.action for a in running.actions] == ["alert_mailed", "cancel_warned", "cancel_requested",
                                                   "cancel_done"]
    text = gseff.report_text(running, None, now=T0 + 40)
    block = text.split("Actions while the job ran\n", 1)[1].split("\n\n", 1)[0]
    items = [" ".join(x.split()) for x in block.split("  - ")[1:]]
    def stamp(t):       # fmt_time: the node's local clock
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(T0 + t))
    assert [x.split(" on n1: ", 1) for x in items] == [
        [stamp(15), "alert mailed (idle): GPU 0 on n1 idle since "
         + time.strftime("%H:%M:%S", time.localtime(T0 + 5)) + " (0.2 min)"],
        [stamp(35), f"idle-cancel warning: {warning}"],
        [stamp(50), f"idle cancel requested: scancel {JOB}: {reason}"],
        [stamp(50), "cancelled by gsrun: scancel accepted"]]
    # ended: node summary -> job summary -> the report
    node = node_of(final, 100.0)
    assert [a["action"] for a in node["actions"]] == ["alert_mailed", "cancel_warned", "cancel_requested",
                                                      "cancel_done"]
    job = job_of([node], 100.0)
    assert [a.to_json() for a in job.actions] == node["actions"]
    assert "cancelled by gsrun: scancel accepted" in render_text(job)


CANCEL = dataclasses.replace(CFG, cancel="on", cancel_after_min=1.0, cancel_grace_min=0.5)


def test_cancel_comes_only_after_the_warning_and_the_grace(tmp_path):
    idle, = _need(IDLE)
    calls = []
    # the recording: idle (context kept) since 126 s -> due at 186 s: warned at the flush at 190 s,
    # still idle at the end of the recording (199 s); the grace ends at 220 s
    spool, state, _ = run_job(tmp_path, {"0": [(idle, 0.0)]}, until_s=199.0,
                              cfg=dataclasses.replace(CANCEL, cancel_grace_min=0.1),
                              scancel=lambda j: (calls.append(j), (True, "scancel accepted"))[1])
    assert [(a["action"], a["time"] - T0) for a in state["actions"]] == [
        ("alert_mailed", 175.0), ("cancel_warned", 190.0), ("cancel_requested", 200.0), ("cancel_done", 200.0)]
    assert calls == [JOB]
    assert sorted(_requests(spool)) == [f"{JOB}.cancel.json", f"{JOB}.idle.json", f"{JOB}.warning.json"]
    assert alerts.process(spool, MAIL, CANCEL, now=T0 + 200) == {"queued": 3, "deferred": 0, "failed": 0}
    warn = _mails(spool)[f"{JOB}.warning.eml"]
    assert str(warn["Subject"]) == f"[gsrun] job {JOB} will be cancelled: GPUs idle"
    body = " ".join(warn.get_content().split())
    assert (f"job {JOB} will be cancelled at " in body and "(in 0.1 min) unless its GPUs work again: "
            "all allocated GPUs idle since 126 s into the job, for 1.1 min (limit 1 min, idle.cancel_after_min)"
            in body)


def test_gpu_working_again_in_the_grace_withdraws_the_warning(tmp_path):
    idle, train = _need(IDLE, TRAIN)
    calls = []
    # warned at 190 s; the recorded training starts at 200 s, before the grace (30 s) ends
    spool, state, _ = run_job(tmp_path, {"0": [(idle, 0.0), (train, 200.0)]}, until_s=254.0, cfg=CANCEL,
                              scancel=lambda j: (calls.append(j), (True, "scancel accepted"))[1])
    assert calls == []
    assert [(a["action"], a["time"] - T0) for a in state["actions"]] == [
        ("alert_mailed", 175.0), ("cancel_warned", 190.0)]
    assert state["live_actions"]["warned_at"] is None
    assert state["live_actions"]["alerts"][-1] == \
        f"job {JOB}: idle-cancel warning withdrawn (its GPUs are no longer all idle)"
