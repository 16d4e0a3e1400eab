"""What the efficiency mail says (pure): whether a job gets one, which kind,
its subject and every value the templates print, formatted and cleaned.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Mapping

from gsrun.base.templating import render
from gsrun.base.errors import ConfigError
from gsrun.base.record import ABSENT, known
from gsrun.facts.slurm import ACTIVE_STATES as NOT_FINAL_STATES, FAILED_STATES as FAIL_STATES, state_word
from gsrun.report.records import CpuFigures, GpuFigures, JobSummary, MemoryFigures, is_mig as _is_mig
from gsrun.report.units import NA, as_number, fmt_bytes, fmt_bytes_of, fmt_duration_s, fmt_energy_j, fmt_hours_h, \
    fmt_share_pct, fmt_power_w, fmt_time
from gsrun.report.findings import _t, _level, LEVEL_WORDS
from gsrun.report.findings import fmt_run_time, gpus_asked, headline, run_time_s, shown_findings, verdicts
from gsrun.report.render import doc_link, settings_lines


PHASE = "mail"
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# bidi overrides/isolates: would let a job name reorder what the reader sees
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}
# colours (readable on white and on a dark background): severity of a finding, level of a verdict
SEVERITY_COLOR = {"crit": "#c62828", "error": "#c62828", "warn": "#d46b08", "info": "#5c6b7a"}
LEVEL_COLOR = {"good": "#2e7d32", "better": "#d46b08", "wasteful": "#c62828"}
# per-GPU columns of the HTML table, dropped when "none" / N/A for every GPU
DEVICE_COLUMNS = (("util", "Busy"), ("sm_active", "SM active"), ("mem", "Memory peak"), ("power", "Power"),
                  ("energy", "Energy"), ("throttle", "Slowed by"), ("xid", "Xid"))


def _shown(ch: str) -> bool:
    return ch not in _BIDI and unicodedata.category(ch) not in ("Cc", "Zl", "Zp", "Cs")


def clean_line(value: Any, max_len: int = 200) -> str:
    """One line safe for a header: ANSI escapes, controls and bidi overrides removed, line breaks and
    tabs one space, cut to ``max_len``."""
    out = []
    for ch in _ANSI_RE.sub("", str(value)):
        if ch in "\t\r\n\u2028\u2029\x0b\x0c\x85":
            if out and out[-1] != " ":
                out.append(" ")
        elif _shown(ch):
            out.append(ch)
    s = "".join(out).strip()
    return s if len(s) <= max_len else s[: max_len - 1] + "\u2026"


def clean_block(value: Any, max_len: int = 200_000) -> str:
    """:func:`clean_line` per line, keeping line ends and indentation."""
    s = _ANSI_RE.sub("", str(value)).replace("\r\n", "\n").replace("\r", "\n")
    s = "".join(ch if ch == "\n" or _shown(ch) else "    " if ch == "\t" else "" for ch in s)
    return s if len(s) <= max_len else s[:max_len] + "\n[... cut]"


def mail_wanted(mail_type: str | None, policy: str, *, state: str | None = None,
                enabled: bool = True) -> bool:
    """Whether the job gets the mail: never before a final ``state``; ``policy`` (``mail.policy``)
    ``always``, ``never``, or ``job``: Slurm's ``MailType`` has END or ALL, or FAIL and a failed state.

    Raises:
        ConfigError: ``policy`` is not job, always or never.
    """
    if policy not in ("job", "always", "never"):
        raise ConfigError("config", "bad value for mail.policy", repr(policy), hint="allowed: job|always|never")
    word = state_word(state)
    if not enabled or policy == "never" or word in NOT_FINAL_STATES:
        return False
    if policy == "always":
        return True
    tokens = {t.strip().upper() for t in re.split(r"[,\s]+", mail_type or "") if t.strip()}
    if "NONE" in tokens and len(tokens) == 1:
        return False
    return "END" in tokens or "ALL" in tokens or "FAIL" in tokens and word in FAIL_STATES


def mail_kind(summary: JobSummary) -> str:
    """``requeued`` (not final), ``cancelled_before_start`` (field case 23), ``no_run`` (ended after
    0 s) or ``report``."""
    word = state_word(str(summary.job.state or ""))
    elapsed = run_time_s(summary.job)
    zero = elapsed is None or elapsed <= 0.0
    if word in NOT_FINAL_STATES:
        return "requeued"
    if word == "CANCELLED" and zero:
        return "cancelled_before_start"
    if zero:
        return "no_run"
    return "report"


def _gpu_headline(summary: JobSummary) -> str | None:
    """``GPU busy 50% (good)``, ``GPU busy N/A (MIG)``, ``GPU data unavailable``, None without GPUs."""
    gpu = summary.gpu or GpuFigures()
    devices = gpu.devices or ()
    if not devices and not gpus_asked(summary.job, gpu):
        return None
    if gpu.available is False or not devices:
        return "GPU data unavailable"
    vals = [u for u in (as_number(d.util_mean_pct) for d in devices) if u is not None]
    if vals:
        mean = sum(vals) / len(vals)
        word = LEVEL_WORDS[_level(mean, _t(None, "findings.low_util_note_pct", None),
                                  _t(None, "findings.low_util_warn_pct", None))]
        return f"GPU busy {fmt_share_pct(mean)} ({word})"
    if any(_is_mig(d) for d in devices):
        return "GPU busy N/A (MIG)"
    return "GPU busy N/A"


def subject_line(summary: JobSummary) -> str:
    """``[gsrun] job 42 (train) COMPLETED: GPU busy 50% (good), CPU eff 42%``, cleaned."""
    job = summary.job
    jid = clean_line(job.array or job.id or "?", 40)
    name = clean_line(job.name or "", 60)
    state = clean_line(job.state or "UNKNOWN", 40)
    head = f"[gsrun] job {jid}" + (f" ({name})" if name else "")
    kind = mail_kind(summary)
    if kind == "cancelled_before_start":
        return f"{head} {state.split(' ')[0]} before start"
    if kind == "requeued":
        return f"{head} {state}: report follows when the job ends"
    if kind == "no_run":
        return f"{head} {state} after 0 s: no efficiency figures"
    g = _gpu_headline(summary)
    cpu = f"CPU eff {fmt_share_pct((summary.cpu or CpuFigures()).efficiency_pct)}"
    return clean_line(f"{head} {state}: " + (f"{g}, {cpu}" if g else cpu), 250)


def mail_view(summary: JobSummary, report_text: str, has_image: bool, image_cid: str,
              image_dropped: bool = False, cfg=None, image_size: tuple[int, int] | None = None) -> dict:
    """Everything the templates print, every key present (``StrictUndefined``); None prints ``N/A``.
    ``image_size``: the chart's displayed (width, height), CSS px; a section left out reads as empty."""
    job = summary.job
    cpu, mem, gpu = summary.cpu or CpuFigures(), summary.memory or MemoryFigures(), summary.gpu or GpuFigures()
    kind = mail_kind(summary)

    devices, events = [], []
    for d in gpu.devices or ():
        mig = _is_mig(d)
        util = as_number(d.util_mean_pct)
        cov = as_number(d.covered_s)
        thr = ", ".join(f"{clean_line(k, 30).replace('hw_slowdown', 'hardware').replace('_', ' ')} "
                        + (fmt_share_pct(100 * v / cov) if cov else fmt_duration_s(v, "clock"))
                        for k, v in sorted((d.throttle_s or {}).items())
                        if (as_number(v) or 0) > 0 and k != "sync_boost")
        xids = [x for x in d.xid or () if as_number(x) is not None]
        lost = as_number(d.lost_at_s)
        node, index = clean_line(d.node or "?", 64), clean_line(d.index, 8)
        label = f"{node} GPU {index}"
        if xids:
            events.append(f"{label}: Xid {', '.join(str(int(x)) for x in xids)}")
        if lost is not None:
            events.append(f"{label}: lost {fmt_duration_s(lost, 'clock')} into the job "
                          "(figures cover the time before)")
        devices.append({
            "node": node,
            "index": index,
            "name": clean_line(d.name or "?", 80),
            "mig": mig,
            "util": fmt_share_pct(util, na="N/A (MIG)" if mig else NA),
            "sm_active": fmt_share_pct(d.sm_active_mean_pct),
            "tensor_active": fmt_share_pct(d.tensor_active_mean_pct),
            "mem": fmt_bytes_of(d.mem_peak_bytes, d.mem_total_bytes)
                   + (f" (job's processes {fmt_bytes(d.mem_procs_peak_bytes)})"
                      if known(d.mem_procs_peak_bytes) else ""),
            "energy": fmt_energy_j(d.energy_j, "wh") + (" (estimated)" if d.energy_estimated else ""),
            "power": fmt_power_w(d.power_mean_w),
            "throttle": thr or "none",
            "xid": ", ".join(str(int(x)) for x in xids) or "none",
            "lost": "" if lost is None else f"lost {fmt_duration_s(lost, 'clock')} into the job",
        })

    findings = []
    for f in shown_findings(summary):
        sev = str(f.severity or "info").lower()
        sev = {"alert": "crit"}.get(sev, sev)   # gsrun.report.findings' hardware events
        sev = sev if sev in ("info", "warn", "crit", "error") else "info"
        findings.append({"severity": sev, "color": SEVERITY_COLOR[sev],
                         "label": {"crit": "hardware", "error": "error", "warn": "fix",
                                   "info": "tip" if f.action else "note"}[sev],
                         "text": clean_line(f.text or "", 500),
                         "link": clean_line(doc_link(cfg, clean_line(f.code or "", 40)), 600)})
    rows, head = [], {"alert": "", "next": ""}
    if kind == "report":
        try:
            rows = verdicts(summary, cfg, job.partition)
            head = headline(summary, rows)
        except (AttributeError, KeyError, TypeError, ValueError):   # a summary missing a section: no verdict
            rows = []
    verdict = [{"label": r["label"], "value": fmt_share_pct(r["pct"]), "word": r["word"],
                "color": LEVEL_COLOR.get(r["level"], "#666666"), "detail": clean_line(r["detail"], 200),
                "bar": None if r["bar_pct"] is None else int(round(r["bar_pct"]))} for r in rows]   # None: no bar (N/A is not 0)
    cols = [c for c in DEVICE_COLUMNS if any(d[c[0]] not in ("none", NA, "") for d in devices)]
    start, end, submit = as_number(job.start_time), as_number(job.end_time), as_number(job.submit_time)
    limit, req = as_number(job.time_limit_s), as_number(mem.req_bytes)
    return {
        "kind": kind,
        "subject": subject_line(summary),
        "job_id": clean_line(job.array or job.id or "?", 40),
        "job_raw_id": clean_line(job.id or "?", 40),
        "name": clean_line(job.name or "", 200),
        "user": clean_line(job.user or "?", 64),
        "partition": clean_line(job.partition or "?", 64),
        "state": clean_line(job.state or "UNKNOWN", 64),
        "exit_code": clean_line(job.exit_code if known(job.exit_code) else NA, 16),
        "cpus_alloc": clean_line(job.cpus_alloc if known(job.cpus_alloc) else NA, 16),
        "gpus_alloc": clean_line(job.gpus_alloc if known(job.gpus_alloc) else NA, 16),
        "nodes": clean_line(", ".join(str(n) for n in job.nodes or ()) or "none", 500),
        "elapsed": fmt_run_time(job),
        "cpu_time": fmt_duration_s(cpu.time_s, "clock"),
        "cpu_eff": fmt_share_pct(cpu.efficiency_pct),
        "cpu_source": clean_line(cpu.source or "", 80),
        "mem_peak": fmt_bytes(mem.peak_bytes),
        "mem_req": "" if req is None or req <= 0 else fmt_bytes(req),
        "mem_eff": fmt_share_pct(mem.efficiency_pct),
        "gpu_section": bool(devices) or gpus_asked(job, gpu) > 0,
        "gpu_available": gpu.available is not False,
        "gpu_reason": clean_line(gpu.reason or ("no GPU data recorded" if not devices else ""), 300),
        "gpu_any_mig": any(d["mig"] for d in devices),
        "gpu_headline": _gpu_headline(summary) or "",
        "devices": devices,
        "gpu_energy": fmt_energy_j(gpu.energy_j, "wh") + (" (estimated)" if gpu.energy_estimated else ""),
        "gpu_hours_alloc": fmt_hours_h(gpu.gpu_hours_alloc),
        "gpu_hours_used": fmt_hours_h(gpu.gpu_hours_used),
        "hardware_events": events,
        "verdict": verdict,
        "next_time": clean_line(head["next"], 300),
        "alert": clean_line(head["alert"], 300),
        "columns": [{"key": k, "title": t} for k, t in cols],
        "started": fmt_time(start),
        "ended": fmt_time(end),
        "queue_wait": fmt_duration_s(start - submit, "clock") if start and submit and start >= submit else "",
        "time_limit": "" if job.time_limit_s is ABSENT else ("none" if not limit else fmt_duration_s(limit, "clock")),
        "image_width": (image_size or (720, 0))[0],
        "image_height": (image_size or (0, 0))[1],
        "findings": findings,
        "node_settings": [clean_line(ln, 2000) for ln in settings_lines(summary)],
        "report_text": clean_block(report_text or ""),
        "has_image": bool(has_image),
        "image_cid": image_cid,
        "image_dropped": bool(image_dropped) and not has_image,
    }


def render_text(view: Mapping) -> str:
    return render("mail.txt.j2", **view)


def render_html(view: Mapping) -> str:
    return render("mail.html.j2", **view)
