"""While the job runs (gsrun.node.live, gsrun.report.live, gsrun.report.alerts): the bounded live node
file, gseff on a RUNNING job through the finished job's code, one alert mail per job through the mail
spool with the per-user hourly budget, gsrun --wait's alert line. No Slurm: a real Sampler on the H200
recording with a simulated clock, the spool in a temp dir."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from concurrent import futures
from types import SimpleNamespace

import pytest

from gsrun.base.paths import Paths
from gsrun.facts.live import read_live_docs
from gsrun.facts.nvml import FakeNvml
from gsrun.node.live import NOT_EXEMPT, LiveActions, job_fields_from_record
from gsrun.facts.sampler_state import GpuRef
from gsrun.node.sampler import new_state, state_to_json
from gsrun.report import alerts
from gsrun.request.config import parse_config
from gsrun.wrapper import gseff
from gsrun.wrapper.submit import JobState, follow_to_end
from helpers.line_log import LineLog
from helpers.sampler_sim import SimClock, h200_data, job_of, make_sampler, node_of, run_job

JOB = "4242"


def _spool(tmp_path, nodes=("n1",), user="alice"):
    spool = tmp_path / "spool"
    d = spool / "jobs" / JOB
    d.mkdir(parents=True)
    for n in nodes:
        rec = {"job": {"job_id": JOB, "node": n, "nodelist": list(nodes), "user": user, "uid": os.getuid(),
                       "gid": os.getgid(), "partition": "gpu", "cpus_on_node": 8, "gpus": list(range(8))},
               "prolog_time": 1_760_000_000.0}
        (d / f"prolog-{n}.json").write_text(json.dumps(rec))
    return spool


def _live(spool, node, clock, idle_cfg=None, kicks=None):
    return LiveActions(spool, JOB, node, os.getuid(), idle_cfg, live_flush_s=30.0, clock=clock,
                       kick=(lambda: kicks.append(node)) if kicks is not None else (lambda: None),
                       log=LineLog())


def test_live_file_bounded_and_gseff_running_figures_match_the_final_code(tmp_path):
    spool = _spool(tmp_path)
    clock = SimClock()
    fake = FakeNvml(h200_data(8))
    s = make_sampler(tmp_path, fake, list(range(8)), clock, interval_s=5.0, flush_s=5.0)
    s.live = _live(spool, "n1", clock)
    writes = []
    orig = s.live.write_live
    s.live.write_live = lambda st, js, now: (writes.append(now - clock.t0), orig(st, js, now))
    final = run_job(s, 25)            # t = 0 .. 120 s
    # written at the first flush, then no more often than every live.flush_s (30 s)
    assert writes == [0.0, 30.0, 60.0, 90.0, 120.0]
    path = spool / "jobs" / JOB / "user-live-n1.json"
    size = path.stat().st_size
    assert size < 8 * 1536, f"live file {size} bytes for 8 GPUs"            # aggregates only: < 1.5 KiB per GPU
    assert oct(path.stat().st_mode & 0o777) == "0o440"
    # bounded: a job 16x longer writes a live file of the same size (the timelines stay on the node)
    spool2 = _spool(tmp_path / "long")
    clock2 = SimClock()
    s2 = make_sampler(tmp_path / "long", FakeNvml(h200_data(8)), list(range(8)), clock2, interval_s=5.0, flush_s=5.0)
    s2.live = _live(spool2, "n1", clock2)
    long_final = run_job(s2, 400)
    size2 = (spool2 / "jobs" / JOB / "user-live-n1.json").stat().st_size
    assert size2 < 1.1 * size and len(json.dumps(long_final)) > 2 * len(json.dumps(final))
    # the last live write was after the last poll: its figures are the final code's figures
    s.live.write_live(s.state, state_to_json(s.state), clock())
    summary = gseff.load_summary(Paths("/nonexistent", str(spool), "/nonexistent"), JOB)
    # Slurm's elapsed time is squeue's while the job runs: the report so far says it was sampled 120 s
    assert summary.job.state == "RUNNING" and summary.job.elapsed_s is None
    assert summary.job.sampled_s == 120.0
    assert summary.live["nodes_live"] == ["n1"] and summary.live["alerts"] == []
    want = job_of([node_of(final, 120.0, cpus=8, gpus=list(range(8)))], 120.0)
    keys = ("util_mean_pct", "sm_active_mean_pct", "mem_peak_bytes", "energy_j", "power_mean_w", "covered_s")
    got_d = {(g.index, k): getattr(g, k) for g in summary.gpu.devices for k in keys}
    want_d = {(g.index, k): getattr(g, k) for g in want.gpu.devices for k in keys}
    assert got_d == want_d and len(summary.gpu.devices) == 8
    assert all(v is not None for (i, k), v in got_d.items() if k in ("util_mean_pct", "energy_j"))
    text = gseff.report_text(summary, None, now=clock() + 12)
    assert text.startswith("RUNNING: figures as of 12 s ago (live files of 1 node(s)")
    assert "gsrun report: job 4242 RUNNING after 00:02:00 (sampled) on n1\n" in text


def _finding(gpu, since, det, code="gpu_idle"):
    return {"code": code, "gpu": str(gpu), "since_s": since, "detected_s": det, "evidence": {"util_pct": 0.0}}


def _state(node, findings):
    st = state_to_json(new_state(JOB, node, [GpuRef(0, 0, "GPU-x", None, "NVIDIA H200", 150 << 30)], None, [],
                                 1_760_000_000.0, 5.0, 100))
    st.update(last_time=1_760_000_600.0, samples=1, waste_findings=findings)
    return st


def test_one_alert_per_job_across_nodes_and_mailed_once(tmp_path):
    spool = _spool(tmp_path, nodes=("n1", "n2"))
    clock = lambda: 1_760_000_700.0  # noqa: E731
    kicks = []
    cfg_idle = SimpleNamespace(alert_mail=True, cancel="off", cancel_after_min=None, mail_per_user_per_hour=3)
    a1, a2 = _live(spool, "n1", clock, cfg_idle, kicks), _live(spool, "n2", clock, cfg_idle, kicks)
    s1, s2 = _state("n1", [_finding(0, 0.0, 360.0)]), _state("n2", [_finding(1, 30.0, 390.0)])
    for a, s in ((a1, s1), (a2, s2)):
        a.after_flush(s, lambda s=s: dict(s))
    a1.after_flush(s1, lambda: dict(s1))           # nothing new: no second request
    assert sorted(p.name for p in (spool / "alerts" / "new").iterdir()) == [f"{JOB}.idle.json"]
    assert kicks == ["n1"]
    docs = read_live_docs(spool / "jobs" / JOB)
    line = docs["n1"]["alerts"][0]
    assert line.startswith("GPU 0 on n1 idle since ") and line.endswith("(6.0 min)")
    assert docs["n2"]["alerts"][0].startswith("GPU 1 on n2 idle")
    cfg = parse_config('[mail]\ndefault_domain = "example.org"\nfrom_addr = "gsrun@example.org"\n')
    out = alerts.process(spool, cfg, cfg_idle, now=1_760_000_710.0)
    assert out == {"queued": 1, "deferred": 0, "failed": 0}
    msgs = list((spool / "mail" / "new").iterdir())
    assert [m.name for m in msgs] == [f"{JOB}.idle.eml"]
    from email import policy as email_policy
    from email.parser import BytesParser

    msg = BytesParser(policy=email_policy.default).parsebytes(msgs[0].read_bytes())
    text = str(msg["To"]) and msg.as_string() + msg.get_content()
    assert "To: alice@example.org" in text and f"Subject: [gsrun] job {JOB} running: GPU 0 on n1 idle" in text
    assert f"scancel {JOB}" in text and "Report so far" in text
    # processed: a rerun queues nothing, and the job cannot be alerted again
    assert alerts.process(spool, cfg, cfg_idle, now=1_760_000_720.0) == {"queued": 0, "deferred": 0, "failed": 0}
    a3 = _live(spool, "n1", clock, cfg_idle, kicks)
    a3.after_flush(_state("n1", [_finding(2, 0.0, 400.0)]), lambda: {})
    assert not list((spool / "alerts" / "new").iterdir()) and kicks == ["n1"]


def test_per_user_hourly_budget_defers_never_drops(tmp_path):
    spool = tmp_path / "spool"
    (spool / "jobs").mkdir(parents=True)
    from gsrun.facts.live import queue_alert

    for j in ("11", "12", "13", "14"):
        assert queue_alert(spool, j, "idle", {"job_id": j, "kind": "idle", "user": "bob", "lines": [f"GPU 0 idle ({j})"]})
    cfg = parse_config('[mail]\ndefault_domain = "example.org"\n')
    idle = SimpleNamespace(mail_per_user_per_hour=3, cancel="off", cancel_after_min=None)
    t = time.mktime((2025, 10, 9, 10, 5, 0, 0, 0, -1))
    assert alerts.process(spool, cfg, idle, now=t) == {"queued": 3, "deferred": 1, "failed": 0}
    assert alerts.process(spool, cfg, idle, now=t + 600) == {"queued": 0, "deferred": 1, "failed": 0}
    assert alerts.process(spool, cfg, idle, now=t + 3600) == {"queued": 1, "deferred": 0, "failed": 0}
    assert sorted(p.name for p in (spool / "mail" / "new").iterdir()) == [f"{j}.idle.eml" for j in ("11", "12", "13", "14")]


def test_alert_without_address_is_recorded_failed(tmp_path):
    spool = tmp_path / "spool"
    (spool / "jobs").mkdir(parents=True)
    from gsrun.facts.live import queue_alert

    queue_alert(spool, "21", "idle", {"job_id": "21", "kind": "idle", "user": "carol", "lines": ["x"]})
    out = alerts.process(spool, parse_config(""), None, now=1_760_000_000.0)
    assert out == {"queued": 0, "deferred": 0, "failed": 1}
    assert (spool / "alerts" / "failed" / "21.idle.json").exists()
    assert "mail.default_domain" in (spool / "alerts" / "state" / "21.idle.json.failed").read_text()


def test_follow_prints_each_alert_line_once():
    states = iter([JobState("RUNNING", "00:00:05", 0, 0, None, "n1")] * 3
                  + [JobState("COMPLETED", "00:00:09", 0, 0, None, "n1")])
    lines = [[], ["GPU 0 on n1 idle since 10:00:00 (6.0 min)"],
             ["GPU 0 on n1 idle since 10:00:00 (6.0 min)", "GPU 1 on n1 idle since 10:00:30 (5.5 min)"]]
    calls = []

    def alerts_fn():
        calls.append(1)
        return lines[min(len(calls) - 1, 2)]
    t = [0.0]
    err = io.StringIO()
    rc = follow_to_end(JOB, out=io.StringIO(), err=err, poller=lambda j: next(states), clock=lambda: t[0],
                       sleep=lambda s: t.__setitem__(0, t[0] + 1.0), alerts=alerts_fn).rc
    assert rc == 0
    got = [ln for ln in err.getvalue().splitlines() if "ALERT:" in ln]
    assert got == [f"gsrun: job {JOB}: ALERT: GPU 0 on n1 idle since 10:00:00 (6.0 min)",
                   f"gsrun: job {JOB}: ALERT: GPU 1 on n1 idle since 10:00:30 (5.5 min)"]
    assert len(calls) == 4          # once per Slurm poll, never more


def test_watch_redraws_until_final_report(tmp_path):
    spool = _spool(tmp_path)
    clock = SimClock()
    s = make_sampler(tmp_path, FakeNvml(h200_data(1)), [0], clock, interval_s=5.0, flush_s=5.0)
    s.live = _live(spool, "n1", clock)
    final = run_job(s, 3)
    paths = Paths("/nonexistent", str(spool), "/nonexistent")
    summ = job_of([node_of(final, 10.0, gpus=[0])], 10.0, id=JOB)
    rounds = []

    def sleep(sec):
        rounds.append(sec)
        if len(rounds) == 2:     # the job ends: the controller's summary appears
            (spool / "jobs" / JOB / "user-summary.json").write_text(json.dumps(summ.to_json()))
    out = io.StringIO()
    cfg = parse_config("")
    assert gseff.watch_job(paths, JOB, cfg, out=out, sleep=sleep) == 0
    text = out.getvalue()
    assert rounds == [30.0, 30.0]
    assert text.count("RUNNING: figures as of") == 2
    assert text.rstrip().endswith(gseff.report_text(summ, cfg).rstrip())


@pytest.mark.parametrize("bad", ["../x", "n1/../../etc"])
def test_live_reader_skips_foreign_names(tmp_path, bad):
    d = tmp_path / "j"
    d.mkdir()
    (d / "user-live-n1.json").write_text(json.dumps({"kind": "live", "version": 1, "node": "n2", "state": {}}))
    assert read_live_docs(d) == {}


# ----------------------------------------------------------------------------- the opt-in cancel, real detector

def _cancel_run(tmp_path, table: dict, record: dict | None, nodes=("n1",), polls=20, other_live=None,
                record_at=None):
    """A job on a scripted GPU (busy 10 s, then idle) through the real Sampler + detector + LiveActions;
    returns (scancel calls, final state, spool). ``record_at``: the simulated second at which Slurm
    answers the job record (a busy controller); None: at once."""
    from gsrun.request.waste import IdleConfig
    from gsrun.node.sampler import Sampler
    from gsrun.facts.hostfs import HostFS
    from helpers.fake_nvml import work_then_idle

    spool = _spool(tmp_path, nodes=nodes)
    if other_live is not None:
        other_live(spool)
    clock = SimClock()
    fake = FakeNvml(work_then_idle(1, 10.0), clock=clock)
    root = tmp_path / "root"
    root.mkdir()
    idle = IdleConfig.from_table(table)
    s = Sampler(HostFS(str(root)), JOB, 1000, "n1", [0], str(tmp_path / "sampler.json"), 5.0, 5.0, 100,
                clock=clock, nvml=fake, usage=lambda: (None, None, None, "test"), idle=idle)
    calls, kicks = [], []
    if isinstance(record, dict):     # a job record as scontrol prints it -> read_cancel_fields' shape
        fields = {**job_fields_from_record(record), "unparsable": False}
    else:                            # None: Slurm not reachable; NOT_EXEMPT: squeue's answer did not parse
        fields = record
    answered = threading.Event()

    def job_record(j):     # (a loop that waits for it stops the clock: after 5 real s it answers)
        answered.wait(None if record_at is None else 0 if clock() - clock.t0 >= record_at else 5.0)
        return fields

    def answer():          # at record_at: the answer is in before the next poll
        answered.set()
        call = s.live._record_call
        futures.wait([call] if call else [], 5.0)

    answered.set() if record_at is None else clock.at(record_at, answer)
    s.live = LiveActions(spool, JOB, "n1", os.getuid(), idle, 30.0, clock=clock, job_record=job_record,
                         scancel=lambda j: (calls.append((j, clock() - clock.t0)), (True, "scancel accepted"))[1],
                         kick=lambda: kicks.append(1), log=LineLog())
    final = run_job(s, polls)
    return calls, final, spool


REC = {"Partition": "gpu", "QOS": "normal", "UserId": "alice(1000)", "Account": "lab", "BatchFlag": "1",
       "MailUser": "alice@example.org"}
ON = {"warn_after_min": 0.1, "cancel": "on", "cancel_after_min": 0.5, "cancel_grace_min": 0.25,
      "exempt_partitions": ["gpu-exempt"]}


def test_idle_job_cancelled_once_after_the_limit_with_reason(tmp_path):
    calls, final, spool = _cancel_run(tmp_path, ON, REC)
    # the poll at t = 10 s is the first idle one; it stands for (5 s, 10 s], so the GPU is idle
    # since 5 s; the limit is 30 s: the flush at t = 35 s warns, the one at 50 s (15 s grace) cancels, once
    assert calls == [(JOB, 50.0)]
    notes = [n for n in final["notes"] if "cancel" in n]
    warned = time.strftime("%H:%M:%S", time.localtime(1_760_000_035.0))
    assert notes == ["cancelled by gsrun (idle GPUs): all allocated GPUs idle since 5 s into the job, "
                     "for 0.8 min (limit 0.5 min, idle.cancel_after_min); warned 0.25 min before, at "
                     f"{warned} (idle.cancel_grace_min)"]
    # the warning came first, at the limit, with the time of the cancel
    assert [(a["action"], a["time"] - 1_760_000_000.0) for a in final["actions"]] == [
        ("alert_mailed", 15.0), ("cancel_warned", 35.0), ("cancel_requested", 50.0), ("cancel_done", 50.0)]
    assert final["actions"][1]["detail"] == (
        f"job {JOB} will be cancelled at {time.strftime('%H:%M', time.localtime(1_760_000_050.0))} (in 0.25 min) "
        "unless its GPUs work again: all allocated GPUs idle since 5 s into the job, for 0.5 min "
        "(limit 0.5 min, idle.cancel_after_min)")
    assert json.loads((spool / "jobs" / JOB / "idle-cancel.json").read_text())["reason"] == notes[0].split(": ", 1)[1]
    assert sorted(p.name for p in (spool / "alerts" / "new").iterdir()) == [
        f"{JOB}.cancel.json", f"{JOB}.idle.json", f"{JOB}.warning.json"]
    doc = read_live_docs(spool / "jobs" / JOB)["n1"]
    assert doc["cancel"]["action"] == "cancel" and doc["alerts"][-1].startswith(f"job {JOB} cancelled: ")
    assert doc["alerts"][0].startswith("GPU 0 on n1 idle since ")


def test_a_busy_controller_never_stalls_the_polls(tmp_path, monkeypatch):
    # the job record, asked at the flush of t = 35 s (due), answers at t = 47 s: the polls go on
    # meanwhile, the flush at 50 s takes the answer and warns, the cancel follows the grace after it
    from gsrun.node import live
    monkeypatch.setattr(live, "SLURM_WAIT_S", 0.05)
    calls, final, spool = _cancel_run(tmp_path, ON, REC, polls=30, record_at=47.0)
    assert [(a["action"], a["time"] - 1_760_000_000.0) for a in final["actions"]] == [
        ("alert_mailed", 15.0), ("cancel_warned", 50.0), ("cancel_requested", 65.0), ("cancel_done", 65.0)]
    assert calls == [(JOB, 65.0)] and final["samples"] > 20
    assert sorted(p.name for p in (spool / "alerts" / "new").iterdir()) == [
        f"{JOB}.cancel.json", f"{JOB}.idle.json", f"{JOB}.warning.json"]
    assert sorted(p.name for p in (spool / "alerts" / "new").iterdir()) == [
        f"{JOB}.cancel.json", f"{JOB}.idle.json", f"{JOB}.warning.json"]


def test_exempt_partition_and_report_mode_never_scancel(tmp_path):
    calls, final, _ = _cancel_run(tmp_path / "a", ON, dict(REC, Partition="gpu-exempt"))
    assert calls == [] and not [n for n in final["notes"] if "cancel" in n]
    calls, final, spool = _cancel_run(tmp_path / "b", dict(ON, cancel="report"), REC)
    assert calls == []
    assert [n for n in final["notes"] if "cancel" in n] == [
        f"idle cancel (report mode): would cancel job {JOB}: all allocated GPUs idle since 5 s into the job, "
        "for 0.5 min (limit 0.5 min, idle.cancel_after_min)"]
    assert not (spool / "jobs" / JOB / "idle-cancel.json").exists()


def test_interactive_job_gets_its_grace_and_unknown_record_never_cancels(tmp_path):
    calls, _, _ = _cancel_run(tmp_path / "a", dict(ON, interactive_grace_min=0.25), dict(REC, BatchFlag="0"))
    assert calls == [(JOB, 65.0)]           # idle since 5 s + 0.5 + 0.25 min, then 0.25 min grace
    calls, _, _ = _cancel_run(tmp_path / "b", ON, None)
    assert calls == []


def test_multi_node_cancel_waits_for_every_node(tmp_path):
    # n2 has no live file: its GPUs are unknown, never idle
    calls, _, _ = _cancel_run(tmp_path / "a", ON, REC, nodes=("n1", "n2"))
    assert calls == []

    def n2_idle(spool, since=1_760_000_020.0):
        doc = {"kind": "live", "version": 1, "node": "n2", "job_id": JOB, "written": 1_760_000_090.0,
               "state": {}, "all_idle_since": since}
        (spool / "jobs" / JOB / "user-live-n2.json").write_text(json.dumps(doc))
    # n2 idle since 20 s (later than n1's 5 s): due (warned) at 50 s, cancelled after the grace
    calls, _, _ = _cancel_run(tmp_path / "b", ON, REC, nodes=("n1", "n2"), other_live=n2_idle)
    assert calls == [(JOB, 65.0)]
    # only the first node of the job decides
    calls, _, _ = _cancel_run(tmp_path / "c", ON, REC, nodes=("n0", "n1"))
    assert calls == []


# --- what a user can write never steers root's cancel decision ------------------------------------------

def _n2_live(since, size_pad=0, mode=0o440, owner=None):
    def plant(spool):
        doc = {"kind": "live", "version": 1, "node": "n2", "job_id": JOB, "written": 1_760_000_090.0,
               "state": {}, "all_idle_since": since, "pad": "x" * size_pad}
        p = spool / "jobs" / JOB / "user-live-n2.json"
        p.write_text(json.dumps(doc))
        os.chmod(p, mode)
        if owner is not None:
            os.chown(p, owner, owner)
    return plant


def test_lead_node_decides_only_from_live_files_root_wrote(tmp_path):
    """Another node's live file that its user could rewrite (their own, or
    group/other-writable) or that is oversized is not read: that node's GPUs
    count as unknown, and a user cannot move ``all_idle_since`` to evade (or
    force) the cancel, nor make root read 300 MB."""
    # a sane root file: idle since 20 s -> warned at 50 s, cancelled at 65 s
    calls, _, _ = _cancel_run(tmp_path / "ok", ON, REC, nodes=("n1", "n2"), other_live=_n2_live(1_760_000_020.0))
    assert calls == [(JOB, 65.0)]
    # group-writable: the job's group could rewrite it -> not read -> unknown
    calls, _, _ = _cancel_run(tmp_path / "gw", ON, REC, nodes=("n1", "n2"),
                              other_live=_n2_live(1_760_000_020.0, mode=0o460))
    assert calls == []
    # oversized: refused after fstat, never read whole
    calls, _, _ = _cancel_run(tmp_path / "big", ON, REC, nodes=("n1", "n2"),
                              other_live=_n2_live(1_760_000_020.0, size_pad=2 << 20))
    assert calls == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_lead_node_ignores_a_live_file_its_user_owns(tmp_path):
    calls, _, _ = _cancel_run(tmp_path, ON, REC, nodes=("n1", "n2"),
                              other_live=_n2_live(1_760_000_020.0, owner=65534))
    assert calls == []


def test_unparsable_exemption_record_exempts_nothing(tmp_path):
    """A record a user broke (a newline or separator in a field) is no way
    out of the site's cancel: exemptions are allow-lists."""
    calls, final, _ = _cancel_run(tmp_path / "a", ON, dict(NOT_EXEMPT))
    assert calls == [(JOB, 50.0)]
    # the same job with a readable record in an exempt partition stays
    calls, _, _ = _cancel_run(tmp_path / "b", ON, dict(REC, Partition="gpu-exempt"))
    assert calls == []
