"""Waste detection (gsrun.request.waste) on synthetic per-poll readings: the
classification of one poll, stretches and their times, the GPU never used,
gaps and unknown readings, the state round trip, the idle-cancel decision and
the [idle] config. Traces recorded on the real H200 drive the same detector in
tests/recorded/test_waste_traces.py."""

from __future__ import annotations

import json

import pytest

from gsrun.base.errors import ConfigError
from gsrun.request.config import idle_config, parse_config
from gsrun.request.waste import (IDLE, NEVER_USED, STUCK, GpuWatch, IdleConfig, all_idle_since, cancel_decision,
                                 classify)

pytestmark = pytest.mark.pure

CFG = IdleConfig(warn_after_min=2, stuck_after_min=3)
# per-poll figures in the shape of the real H200 (tests/data/hosts/h200-real/results):
# bare idle 83 W, a CUDA context and no work 128 W, training 300-450 W
BUSY = {"util_pct": 98.0, "sm_active_pct": 70.0, "tensor_active_pct": 65.0, "power_w": 420.0, "job_gpu_pids": [7]}
CTX_IDLE = {"util_pct": 0.0, "sm_active_pct": 0.0, "tensor_active_pct": 0.0, "power_w": 128.0, "job_gpu_pids": [7]}
UNTOUCHED = {"util_pct": 0.0, "sm_active_pct": 0.0, "tensor_active_pct": 0.0, "power_w": 83.0, "job_gpu_pids": []}
STUCK_R = {"util_pct": 100.0, "sm_active_pct": 0.2, "tensor_active_pct": 0.0, "power_w": 131.0, "job_gpu_pids": [7]}
TINY = {"util_pct": 98.0, "sm_active_pct": 3.7, "tensor_active_pct": 0.0, "power_w": 124.0, "job_gpu_pids": [7]}


def run(w, readings, t0=0.0, dt=5.0):
    out = []
    for k, r in enumerate(readings):
        for d in w.update(t0 + k * dt, r):
            out.append(d)
    return out


def test_classify_each_kind():
    assert classify(CTX_IDLE, 83.0, CFG) == "idle"
    assert classify(UNTOUCHED, 83.0, CFG) == "idle"
    assert classify(BUSY, 83.0, CFG) == "busy"
    assert classify(STUCK_R, 83.0, CFG) == "stuck"
    assert classify(TINY, 83.0, CFG) == "busy"         # SM 3.7 % > sm_idle_pct 1 %
    assert classify({}, 83.0, CFG) == "unknown"
    # util 0 but power far above the idle level (copies running): not idle
    assert classify(dict(CTX_IDLE, power_w=300.0), 83.0, CFG) == "busy"
    # no GPM: idle from utilization + power; never stuck (cannot tell from a light load)
    assert classify(dict(CTX_IDLE, sm_active_pct=None, tensor_active_pct=None), 83.0, CFG) == "idle"
    assert classify(dict(STUCK_R, sm_active_pct=None, tensor_active_pct=None), 83.0, CFG) == "busy"
    # power unknown: not stuck; idle on utilization + SM
    assert classify(dict(STUCK_R, power_w=None), 83.0, CFG) == "busy"
    assert classify(dict(CTX_IDLE, power_w=None), None, CFG) == "idle"
    # MIG: no utilization, no GPM: idle only when none of the job's processes is on it
    assert classify({"power_w": 90.0, "job_gpu_pids": []}, 83.0, CFG) == "idle"
    assert classify({"power_w": 90.0, "job_gpu_pids": [7]}, 83.0, CFG) == "unknown"
    # MPS: the GPU lists the MPS server, not the job's PIDs; busy by utilization stays busy
    assert classify(dict(BUSY, job_gpu_pids=[]), 83.0, CFG) == "busy"


def test_busy_then_idle_warns_once_with_times_and_evidence():
    w = GpuWatch("3", CFG)
    found = run(w, [BUSY] * 25 + [CTX_IDLE] * 40)     # polls every 5 s: busy t=0..120, idle from 125
    assert len(found) == 1
    d = found[0]
    assert d["code"] == IDLE and d["gpu"] == "3"
    assert d["since_s"] == 120.0                         # the window of the first idle reading starts at 120
    assert d["detected_s"] == 240.0                      # 2 min later
    ev = d["evidence"]
    assert ev["minutes"] == 2.0 and ev["polls"] == 24
    assert ev["power_idle_w"] == 128.0 and ev["power_idle_source"] == "min_seen"
    assert ev["util_max_pct"] == 0.0 and ev["job_processes"] == 1 and ev["ever_used"] is True
    assert ev["basis"] == ["utilization", "sm_activity", "power", "processes"]
    assert w.idle_since_s == 120.0 and w.ever_used
    assert [a["code"] for a in w.active] == [IDLE] and w.active[0]["until_s"] == 320.0
    # busy again: the detection is no longer active; a new idle stretch warns again
    more = run(w, [BUSY] * 2 + [CTX_IDLE] * 30, t0=325.0)
    assert w.idle_since_s is not None
    assert [(d["code"], d["since_s"], d["detected_s"]) for d in more] == [(IDLE, 330.0, 450.0)]


def test_never_used_instead_of_idle():
    w = GpuWatch("0", CFG, idle_power_w=83.0)
    found = run(w, [UNTOUCHED] * 30)
    assert [(d["code"], d["since_s"], d["detected_s"]) for d in found] == [(NEVER_USED, 0.0, 120.0)]
    assert found[0]["evidence"]["power_idle_source"] == "given"
    assert not w.ever_used and w.idle_since_s == 0.0


def test_context_without_kernels_is_idle_not_never_used():
    w = GpuWatch("0", CFG)
    assert [d["code"] for d in run(w, [CTX_IDLE] * 30)] == [IDLE]


def test_stuck_collective_after_its_window_and_not_idle():
    w = GpuWatch("1", CFG)
    found = run(w, [UNTOUCHED] * 2 + [BUSY] * 10 + [STUCK_R] * 60)
    assert [(d["code"], d["since_s"], d["detected_s"]) for d in found] == [(STUCK, 55.0, 235.0)]
    ev = found[0]["evidence"]
    assert ev["util_mean_pct"] == 100.0 and ev["sm_active_max_pct"] == 0.2 and ev["power_mean_w"] == 131.0
    assert w.idle_since_s is None


def test_tiny_kernels_are_not_stuck():
    w = GpuWatch("1", CFG)
    assert run(w, [UNTOUCHED] + [TINY] * 100) == []


def test_one_busy_poll_restarts_the_stretch():
    w = GpuWatch("0", CFG)
    found = run(w, [BUSY] + [CTX_IDLE] * 20 + [BUSY] + [CTX_IDLE] * 20)
    assert found == []                 # 100 s + 100 s idle, never 2 min in a row


def test_unknown_polls_are_gaps_not_zeros():
    w = GpuWatch("0", CFG, max_gap_s=16.0)
    # two unknown polls: 15 s between known polls, carried over (max_gap_s 16 s)
    seq = [BUSY] + ([CTX_IDLE] * 5 + [{}] * 2) * 6
    found = run(w, seq)
    assert [(d["code"], d["since_s"]) for d in found] == [(IDLE, 0.0)]
    # four unknown polls (25 s between known polls) end the stretch
    w = GpuWatch("0", CFG, max_gap_s=16.0)
    assert run(w, [BUSY] + ([CTX_IDLE] * 15 + [{}] * 4) * 3) == []
    # a sampler pause longer than max_gap_s: the new stretch starts after it
    w = GpuWatch("0", CFG, max_gap_s=16.0)
    run(w, [BUSY, CTX_IDLE, CTX_IDLE])
    w.update(100.0, CTX_IDLE)
    assert w.idle_since_s == 100.0


def test_a_stretch_after_a_pause_starts_one_window_back_without_gpm_and_at_the_pause_with_it():
    """GPM's figures are means over the whole time since the last poll; without GPM the utilization
    samples and the power reading cover at most one poll interval (window_s) of a 25 s pause."""
    no_gpm = {k: v for k, v in CTX_IDLE.items() if k not in ("sm_active_pct", "tensor_active_pct")}
    for reading, since in ((no_gpm, 95.0), (CTX_IDLE, 75.0)):
        w = GpuWatch("0", CFG, max_gap_s=30.0)
        w.window_s = 5.0
        run(w, [BUSY] * 16)                # t = 0 .. 75 s busy, then nothing read until 100 s
        w.update(100.0, reading)
        assert w.idle_since_s == since, reading
    w = GpuWatch("0", CFG, max_gap_s=30.0)  # no interval known (a bare watch): the previous poll
    run(w, [BUSY] * 16)
    w.update(100.0, no_gpm)
    assert w.idle_since_s == 75.0


def test_polls_a_little_late_keep_a_gpu_without_gpm_never_used():
    """Real polls come milliseconds after the interval: not a pause; the stretch still starts at the
    job's first poll, so an untouched GPU without GPM is "never used", not "idle"."""
    w = GpuWatch("0", IdleConfig(warn_after_min=2))
    w.window_s = 5.0
    found = run(w, [{"power_w": 83.0}] + [{"util_pct": 0.0, "power_w": 83.0}] * 40, dt=5.01)
    assert [(d["code"], d["since_s"]) for d in found] == [(NEVER_USED, 0.0)]


def test_round_trip_continues_the_stretch():
    a = GpuWatch("2", CFG)
    run(a, [BUSY] * 3 + [CTX_IDLE] * 10)
    d = json.loads(json.dumps(a.to_json()))
    b = GpuWatch.from_json(d, CFG)
    assert b.to_json() == a.to_json()
    rest = [CTX_IDLE] * 20
    ra = run(a, rest, t0=65.0)
    rb = run(b, rest, t0=65.0)
    assert ra == rb and [x["detected_s"] for x in ra] == [130.0]
    # unknown keys are ignored; a newer version is refused
    assert GpuWatch.from_json(dict(d, future_key=1), CFG).idle_since_s == 10.0
    with pytest.raises(ValueError, match="newer"):
        GpuWatch.from_json(dict(d, v=99), CFG)
    with pytest.raises(ValueError):
        GpuWatch.from_json({"nope": 1}, CFG)


def test_all_idle_since_is_the_latest():
    a, b = GpuWatch("0", CFG), GpuWatch("1", CFG)
    run(a, [BUSY] + [CTX_IDLE] * 10)
    run(b, [BUSY] * 4 + [CTX_IDLE] * 7)
    assert (a.idle_since_s, b.idle_since_s) == (0.0, 15.0)
    assert all_idle_since([a, b]) == 15.0
    b.update(55.0, BUSY)
    assert all_idle_since([a, b]) is None
    assert all_idle_since([]) is None


ON = IdleConfig(cancel_after_min=120, cancel="on", exempt_partitions=("debug",), exempt_qos=("long",),
                exempt_users=("alice",), exempt_accounts=("physics",), interactive_grace_min=30)
JOB = {"partition": "gpu", "qos": "normal", "user": "bob", "account": "chem", "interactive": False}


def test_cancel_after_the_limit_with_figures():
    assert cancel_decision(ON, JOB, 600.0, 600.0 + 119 * 60)[0] == "none"
    act, why = cancel_decision(ON, JOB, 600.0, 600.0 + 125 * 60)
    assert act == "cancel"
    assert why == ("all allocated GPUs idle since 600 s into the job, for 125 min (limit 120 min, "
                   "idle.cancel_after_min)")
    assert cancel_decision(ON, JOB, None, 1e6) == ("none", "not all of the job's GPUs are idle")


def test_cancel_off_by_default_and_report_mode():
    assert IdleConfig().cancel == "off" and IdleConfig().cancel_after_min is None
    assert cancel_decision(IdleConfig(), JOB, 0.0, 1e7)[0] == "none"
    assert cancel_decision(IdleConfig(cancel="on"), JOB, 0.0, 1e7)[0] == "none"     # no cancel_after_min
    rep = IdleConfig(cancel_after_min=60, cancel="report")
    act, why = cancel_decision(rep, JOB, 0.0, 3600.0)
    assert act == "report" and "for 60 min (limit 60 min" in why


@pytest.mark.parametrize("key,value,word", [("partition", "debug", "partition debug"), ("qos", "long", "QOS long"),
                                            ("user", "alice", "user alice"), ("account", "physics", "account physics")])
def test_exemptions(key, value, word):
    act, why = cancel_decision(ON, dict(JOB, **{key: value}), 0.0, 1e7)
    assert act == "none" and why.startswith(f"{word} is exempt")


def test_interactive_grace():
    job = dict(JOB, interactive=True)
    assert cancel_decision(ON, job, 0.0, 149 * 60.0)[0] == "none"
    act, why = cancel_decision(ON, job, 0.0, 150 * 60.0)
    assert act == "cancel" and "limit 150 min (120 + 30 min grace for an interactive job)" in why


def test_config_table_parses_and_defaults():
    cfg = idle_config(parse_config('[idle]\ncancel_after_min = 90\ncancel = "report"\nwarn_after_min = 30\n'
                                   'exempt_partitions = ["debug", "interactive"]\nexempt_users = ["alice"]\n'))
    assert cfg.cancel_after_min == 90.0 and cfg.cancel == "report" and cfg.warn_after_min == 30.0
    assert cfg.exempt_partitions == ("debug", "interactive") and cfg.exempt_users == ("alice",)
    assert idle_config(parse_config("")) == IdleConfig()
    assert idle_config(parse_config("[idle]\ncancel_after_min = 0\n")).cancel_after_min is None


@pytest.mark.parametrize("text,key", [
    ('cancel = "yes"', "idle.cancel"),
    ("warn_after_min = 0", "idle.warn_after_min"),
    ("sm_idle_pct = 101", "idle.sm_idle_pct"),
    ('exempt_partitions = ["bad name!"]', "idle.exempt_partitions"),
    ('exempt_users = ["x y"]', "idle.exempt_users"),
    ("exempt_qos = \"long\"", "idle.exempt_qos"),
    ("alert_mail = 1", "idle.alert_mail"),
    ("warn_after = 5", "idle.warn_after"),
])
def test_config_errors_name_the_key(text, key):
    with pytest.raises(ConfigError) as e:
        parse_config(f"[idle]\n{text}\n")
    assert key in str(e.value)


def test_from_table_errors():
    with pytest.raises(ConfigError, match="idle.nope"):
        IdleConfig.from_table({"nope": 1})
    with pytest.raises(ConfigError, match="idle.cancel"):
        IdleConfig.from_table({"cancel": "maybe"})
    assert IdleConfig.from_table({"warn_after_min": 5}).warn_after_min == 5.0


def test_classify_without_utilization_uses_sm_activity():
    r = {"util_pct": None, "sm_active_pct": 0.0, "tensor_active_pct": 0.0, "power_w": 128.0, "job_gpu_pids": [7]}
    assert classify(r, 83.0, CFG) == "idle"
    assert classify(dict(r, sm_active_pct=40.0), 83.0, CFG) == "busy"
    assert classify(dict(r, power_w=400.0), 83.0, CFG) == "busy"


def test_codes_are_finding_codes():
    from gsrun.report.records import FindingCode

    assert {IDLE, STUCK, NEVER_USED} <= {c.value for c in FindingCode}


def test_alert_plan_one_per_condition_rearmed_when_cleared():
    from gsrun.request.waste import alert_plan
    assert alert_plan({}, {"idle", "stuck"}) == (["idle", "stuck"], [])
    assert alert_plan({"idle": True, "stuck": True}, {"idle", "stuck"}) == ([], [])      # still true: silent
    assert alert_plan({"idle": True, "stuck": True}, {"stuck"}) == ([], ["idle"])        # idle cleared: re-armed
    assert alert_plan({"idle": False, "stuck": True}, {"idle", "stuck"}) == (["idle"], [])
    assert alert_plan({}, {"busy"}) == ([], [])


def test_held_memory_counts_idle_and_never_used_only():
    from gsrun.report.alerts import held_line, held_memory
    fs = [{"code": "gpu_idle", "gpu": "0", "node": "n1", "evidence": {"mem_used_bytes": 1422721024}},
          {"code": "gpu_never_used", "gpu": "1", "node": "n1", "evidence": {"mem_used_bytes": 0}},
          {"code": "gpu_stuck_collective", "gpu": "2", "evidence": {"mem_used_bytes": 64961380352}},
          {"code": "gpu_idle", "gpu": "3", "evidence": {"mem_used_bytes": None}}]
    assert held_memory(fs) == (1422721024, [("GPU 0 on n1", 1422721024), ("GPU 1 on n1", 0)])
    assert held_line(fs) == "The idle GPUs still hold 1.3 GiB of GPU memory (GPU 0 on n1: 1.3 GiB, GPU 1 on n1: 0 B)."
    assert held_line(fs[2:]) == ""


def test_cancel_step_warns_then_waits_the_grace():
    from gsrun.request.waste import cancel_step
    assert cancel_step("cancel", None, 1000.0, 15.0) == "warn"
    assert cancel_step("cancel", 1000.0, 1000.0 + 899.0, 15.0) == "wait"
    assert cancel_step("cancel", 1000.0, 1000.0 + 900.0, 15.0) == "cancel"
    assert cancel_step("cancel", 1000.0, 1005.0, 0.0) == "cancel"       # no grace: still one flush after the warning
    assert cancel_step("none", 1000.0, 2000.0, 15.0) == "none"           # not due: the warning is withdrawn
    assert cancel_step("report", None, 2000.0, 15.0) == "report"


def test_cancel_grace_min_is_a_setting():
    from gsrun.request.waste import IdleConfig
    assert IdleConfig().cancel_grace_min == 15.0
    assert IdleConfig.from_table({"cancel_grace_min": 5}).cancel_grace_min == 5.0
    with pytest.raises(Exception, match="idle.cancel_grace_min"):
        IdleConfig.from_table({"cancel_grace_min": -1})
