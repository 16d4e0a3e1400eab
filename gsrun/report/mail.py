"""The efficiency email: build the message, spool it, deliver it exactly once.

Three layers, in the project's facts / decisions / effects split:

- **Decisions (pure):** :func:`mail_wanted` (Slurm ``MailType`` + site
  ``mail.policy``), :func:`mail_kind` (report, cancelled before start,
  no run, requeued), :func:`mail_view` (every number the templates print,
  already formatted), :func:`subject_line`, :func:`build_message` (a
  ``multipart/alternative`` text + HTML message, the timeline PNG inline in a
  ``multipart/related`` part referenced by ``cid:``).
- **Spool (effects):** :func:`enqueue` writes the message atomically
  (mode 0600) into ``<spool_dir>/mail/new/<jobid>.eml``, once per job id.
- **Sender (effects):** :func:`flush` delivers queued messages by SMTP or the
  site's sendmail-compatible MailProg, with retry and capped exponential
  backoff, moving each to ``mail/sent/`` (delivered) or ``mail/failed/``
  (permanent refusal, or ``mail.max_attempts`` used up).

Spool layout (all directories 0700, files 0600)::

    <spool_dir>/mail/new/<qid>.eml     queued (waiting, or deferred until next_try)
    <spool_dir>/mail/tmp/<qid>.eml     claimed by the running flush (being sent)
    <spool_dir>/mail/tmp/.stage.*      enqueue's staging files (never sent)
    <spool_dir>/mail/sent/<qid>.eml    delivered
    <spool_dir>/mail/failed/<qid>.eml  given up (see state/<qid>.json "last_error")
    <spool_dir>/mail/state/<qid>.json  {"attempts", "next_try", "last_error", ...}
    <spool_dir>/mail/.flush.lock       held by a flush for its whole run
    <spool_dir>/mail/.queue.lock       held for each (short) move between folders

Exactly once: a message moves only by ``rename`` (atomic), every move and
enqueue's "is it already anywhere?" check happen under ``.queue.lock`` (held
for microseconds, never while talking to a server), and flushes are
serialized by ``.flush.lock``; a second concurrent flush waits at most
``timeouts.command_s`` for the first and then returns ``busy``. The one
window left is a crash (power loss, SIGKILL) after the server accepted a
message and before its rename to ``sent/``: the next flush puts it back in
``new/`` and sends it again (at-least-once in that case only; the resend has
the same ``Message-ID``, so it is identifiable).
"""

from __future__ import annotations

import email.utils
import fcntl
import hashlib
import os
import re
import secrets
import smtplib
import socket
import ssl
import stat
import subprocess
import time
import unicodedata
from email import policy as email_policy
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any, Callable, Mapping

from gsrun.base.templating import render
from gsrun.base.errors import ConfigError, GsrunError, InputError, NodeError
from gsrun.base.fsutil import atomic_write, atomic_write_json, ensure_dir, flock_within, read_json
from gsrun.facts.slurm import ACTIVE_STATES as NOT_FINAL_STATES, FAILED_STATES as FAIL_STATES, state_word
from gsrun.report.records import is_mig as _is_mig
from gsrun.report.units import NA, as_number, fmt_bytes, fmt_bytes_of, fmt_duration_s, fmt_energy_j, fmt_hours_h, \
    fmt_share_pct, fmt_power_w, fmt_time

PHASE = "mail"
SUBDIRS = ("new", "tmp", "sent", "failed", "state")
BACKOFF_BASE_S = 60.0
BACKOFF_CAP_S = 3600.0
MAX_PNG_BYTES = 5 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_WIDE_HEADERS = email_policy.default.clone(max_line_length=998)

QID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_ADDR_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# bidi overrides/isolates: would let a job name reorder what the reader sees
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}

# Slurm MailType tokens (sbatch --mail-type); ALL = BEGIN,END,FAIL,INVALID_DEPEND,REQUEUE,STAGE_OUT
MAIL_TYPES = {"NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
              "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}
# colours (readable on white and on a dark background): severity of a finding, level of a verdict
SEVERITY_COLOR = {"crit": "#c62828", "error": "#c62828", "warn": "#d46b08", "info": "#5c6b7a"}
LEVEL_COLOR = {"good": "#2e7d32", "better": "#d46b08", "wasteful": "#c62828"}
# per-GPU columns of the HTML table, dropped when "none" / N/A for every GPU
DEVICE_COLUMNS = (("util", "Busy"), ("sm_active", "SM active"), ("mem", "Memory peak"), ("power", "Power"),
                  ("energy", "Energy"), ("throttle", "Slowed by"), ("xid", "Xid"))


class MailError(GsrunError):
    """Delivery of one message failed. ``permanent``: the server (5xx) or
    MailProg refused it for good (unknown recipient, bad data), retrying is
    useless. ``outage``: the server could not be reached at all (connection
    refused or timed out), so the other queued messages are not tried in the
    same run."""

    def __init__(self, what: str, detail: str, hint: str | None = None, *,
                 permanent: bool = False, outage: bool = False):
        super().__init__(PHASE, what, detail, hint)
        self.permanent = permanent
        self.outage = outage


# ----------------------------------------------------------------------------- text hygiene

def clean_line(value: Any, max_len: int = 200) -> str:
    """One line of display text from anything: ANSI escapes, control
    characters (NUL, ESC, DEL ...) and bidi overrides removed; line breaks
    (CR, LF, U+2028 ...) and tabs become one space; cut to ``max_len``
    characters. Safe for a header value."""
    s = _ANSI_RE.sub("", str(value))
    out = []
    for ch in s:
        if ch in "\t\r\n\u2028\u2029\x0b\x0c\x85":
            if out and out[-1] != " ":
                out.append(" ")
        elif ch in _BIDI or unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs"):
            continue
        else:
            out.append(ch)
    s = "".join(out).strip()
    return s if len(s) <= max_len else s[: max_len - 1] + "\u2026"


def set_text_header(msg: EmailMessage, name: str, text: Any, max_len: int = 250) -> str:
    """Set header ``name`` of ``msg`` to display text built from job data, so
    that a mail reader shows exactly :func:`clean_line` ``(text)``: the
    characters as typed, no control, CR/LF or bidi characters.

    RFC 2047 encoded words (``=?utf-8?q?=E2=80=AE...?=``, which a reader
    would decode into a right-to-left override or a line break) are never
    decoded for display: when the text holds an ``=?`` marker, the header is
    written as *our own* encoded words of the literal text (``=3D=3F``
    inside), folded to 76 columns, so a reader decodes exactly once and shows
    the marker as plain characters. (Assigning the text the usual way would
    let ``email.headerregistry`` decode the user's encoded words at once.)
    Returns the text set."""
    value = clean_line(text, max_len)
    del msg[name]
    if "=?" in value:
        msg.set_raw(name, Header(value, "utf-8", header_name=name).encode(maxlinelen=76))
    else:
        msg[name] = value
    return value


def clean_block(value: Any, max_len: int = 200_000) -> str:
    """Multi-line display text: like :func:`clean_line` per line, but keeps
    ``\\n`` (CRLF/CR normalised) and leading indentation."""
    s = _ANSI_RE.sub("", str(value)).replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for ch in s:
        if ch == "\n":
            out.append(ch)
        elif ch == "\t":
            out.append("    ")
        elif ch in _BIDI or unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs"):
            continue
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= max_len else s[:max_len] + "\n[... cut]"


def validate_addr(addr: str, what: str = "address") -> str:
    """Return the bare ``local@domain`` of ``addr`` or raise.

    Accepts ``a@b.example`` or ``Name <a@b.example>`` (the display name is
    dropped). Refuses control characters, several addresses, a missing
    domain (Slurm's default ``MailUser`` is the bare user name: append the
    site's mail domain before calling), and anything ``email.headerregistry``
    cannot parse.

    Raises:
        InputError: the address is empty, has CR/LF or other control
            characters, a list of addresses, or is not ``local@domain``.
    """
    if not isinstance(addr, str) or not addr.strip():
        raise InputError(PHASE, f"bad {what}", "empty", hint="the job has no MailUser, or mail.from_addr is empty")
    if any(unicodedata.category(c) == "Cc" or c in _BIDI for c in addr):
        raise InputError(PHASE, f"bad {what}", f"{addr!r} holds control characters")
    if "=?" in addr:   # an RFC 2047 encoded word: readers would decode it (into controls, bidi, CR/LF)
        raise InputError(PHASE, f"bad {what}", f"{addr!r} holds an encoded word (=?...?=)",
                         hint="give a plain local@domain address")
    if len(email.utils.getaddresses([addr])) != 1:
        raise InputError(PHASE, f"bad {what}", f"{addr!r} is not one address")
    _name, spec = email.utils.parseaddr(addr, **_STRICT)
    if not spec or not _ADDR_RE.fullmatch(spec) or ".." in spec or spec.startswith(".") or len(spec) > 254:
        hint = ("Slurm's MailUser defaults to the user name; add the site mail domain"
                if spec and "@" not in spec else None)
        raise InputError(PHASE, f"bad {what}", f"{addr!r} is not local@domain", hint=hint)
    try:
        Address(addr_spec=spec)
    except (ValueError, IndexError, TypeError) as e:
        raise InputError(PHASE, f"bad {what}", f"{addr!r}: {e}") from None
    return spec


try:  # Python >= 3.13 and the 3.11/3.12 security releases: refuse ambiguous address lists
    email.utils.parseaddr("a@b", strict=True)
    _STRICT = {"strict": True}
except TypeError:
    _STRICT = {}


def _qid(job_id: Any) -> str:
    s = str(job_id)
    if not QID_RE.fullmatch(s):
        raise InputError(PHASE, "bad job id", f"{s!r}", hint="expected e.g. 42 or 15053872_1491")
    return s


# ----------------------------------------------------------------------------- decisions

def mail_wanted(mail_type: str | None, policy: str, *, state: str | None = None,
                enabled: bool = True) -> bool:
    """Whether the job gets the efficiency mail.

    ``mail_type`` is Slurm's ``MailType`` from the job record
    (``scontrol show job``: ``END``, ``ALL``, ``END,FAIL``, ``NONE``,
    ``INVALID_DEPEND,BEGIN,END,FAIL,REQUEUE,STAGE_OUT``, ``(null)``...),
    ``policy`` the site's ``mail.policy``:

    - ``never``: no mail.
    - ``always``: every job (the caller still needs a MailUser).
    - ``job``: only when the user asked for end-of-job mail (``END`` or
      ``ALL``); ``FAIL`` alone gets the mail only when ``state`` is a failure
      (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...). BEGIN, REQUEUE,
      TIME_LIMIT_* and ARRAY_TASKS alone do not ask for a report.

    ``state`` (optional, Slurm job state): a job that is not finished
    (PENDING, REQUEUED, RUNNING ...) never gets the report now; it comes when
    the job really ends. ``enabled`` is ``mail.enabled``.

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
    if "END" in tokens or "ALL" in tokens:
        return True
    if "FAIL" in tokens and word in FAIL_STATES:
        return True
    return False


def mail_kind(summary: Mapping) -> str:
    """What kind of mail a job summary gets:

    - ``requeued``: state PENDING/REQUEUED/... (not final; the caller should
      not mail, see :func:`mail_wanted`; the text says a report follows).
    - ``cancelled_before_start``: CANCELLED with elapsed 0 (or none): no
      efficiency figures at all (field case 23, docs/field-cases.md).
    - ``no_run``: any other final state after 0 s (instant failure): the
      figures are not meaningful.
    - ``report``: the efficiency report.
    """
    job = summary.get("job") or {}
    word = state_word(str(job.get("state") or ""))
    elapsed = job.get("elapsed_s")
    zero = elapsed is None or as_number(elapsed) is None or float(elapsed) <= 0.0
    if word in NOT_FINAL_STATES:
        return "requeued"
    if word == "CANCELLED" and zero:
        return "cancelled_before_start"
    if zero:
        return "no_run"
    return "report"




def _gpu_headline(summary: Mapping) -> str | None:
    """``GPU busy 50% (good)`` / ``GPU busy N/A (MIG)`` / ``GPU data unavailable`` /
    None for a job without GPUs. Mean over the devices that have a figure;
    the judgement uses the default targets (the subject is the same for
    every site)."""
    gpu = summary.get("gpu") or {}
    job = summary.get("job") or {}
    devices = [d for d in (gpu.get("devices") or []) if isinstance(d, Mapping)]
    if gpu.get("available") is False:
        return "GPU data unavailable"
    if not devices:
        return "GPU data unavailable" if (as_number(job.get("gpus_alloc")) or 0) > 0 else None
    utils = [as_number(d.get("util_mean_pct")) for d in devices]
    vals = [u for u in utils if u is not None]
    if vals:
        from gsrun.report.findings import _t, _level, LEVEL_WORDS
        mean = sum(vals) / len(vals)
        word = LEVEL_WORDS[_level(mean, _t(None, "findings.low_util_note_pct", None),
                                  _t(None, "findings.low_util_warn_pct", None))]
        return f"GPU busy {fmt_share_pct(mean)} ({word})"
    if any(_is_mig(d) for d in devices):
        return "GPU busy N/A (MIG)"
    return "GPU busy N/A"


def subject_line(summary: Mapping) -> str:
    """``[gsrun] job 42 (train) COMPLETED: GPU busy 50% (good), CPU eff 42%``.

    Job id = the array form (``15053872_1491``) when present. Every piece
    goes through :func:`clean_line`, so the result holds no CR/LF or control
    characters whatever the job name is.
    """
    job = summary.get("job") or {}
    jid = clean_line(job.get("array") or job.get("id") or "?", 40)
    name = clean_line(job.get("name") or "", 60)
    state = clean_line(job.get("state") or "UNKNOWN", 40)
    head = f"[gsrun] job {jid}" + (f" ({name})" if name else "")
    kind = mail_kind(summary)
    if kind == "cancelled_before_start":
        return f"{head} {state.split(' ')[0]} before start"
    if kind == "requeued":
        return f"{head} {state}: report follows when the job ends"
    if kind == "no_run":
        return f"{head} {state} after 0 s: no efficiency figures"
    parts = []
    g = _gpu_headline(summary)
    if g:
        parts.append(g)
    parts.append(f"CPU eff {fmt_share_pct((summary.get('cpu') or {}).get('efficiency_pct'))}")
    return clean_line(f"{head} {state}: {', '.join(parts)}", 250)


def mail_view(summary: Mapping, report_text: str, has_image: bool, image_cid: str,
              image_dropped: bool = False, cfg=None, image_size: tuple[int, int] | None = None) -> dict:
    """Everything the templates print, formatted and cleaned (pure).

    Numbers come from the ``gsrun.summary/1`` job summary; ``None`` becomes
    ``N/A`` (MIG utilization: ``N/A (MIG)``, field case 12; unavailable GPU
    section: its reason, field case 15; both in docs/field-cases.md). Every
    key is always present, so the templates run under ``StrictUndefined``.

    Issue 22: ``verdict`` (rows of :func:`gsrun.report.findings.verdicts`
    with the value formatted and a colour per level), ``next_time`` /
    ``alert`` (:func:`gsrun.report.findings.headline`), findings with a
    colour per severity and the site's ``report.doc_url`` link (``cfg``),
    per-GPU columns that are not "none" everywhere (``columns``), clock
    times and queue wait. ``report_text`` is the text part itself (the
    report at 76 columns); the HTML part does not repeat it. ``image_size``:
    the chart's (width, height) as displayed, CSS px.
    """
    from gsrun.report.findings import headline, shown_findings, verdicts
    from gsrun.report.render import doc_link, settings_lines
    job = summary.get("job") or {}
    cpu = summary.get("cpu") or {}
    mem = summary.get("memory") or {}
    gpu = summary.get("gpu") or {}
    kind = mail_kind(summary)
    devices_in = [d for d in (gpu.get("devices") or []) if isinstance(d, Mapping)]

    devices = []
    events = []
    for d in devices_in:
        mig = _is_mig(d)
        util = as_number(d.get("util_mean_pct"))
        throttle = d.get("throttle_s") or {}
        cov = as_number(d.get("covered_s"))
        thr = ", ".join(f"{clean_line(k, 30).replace('hw_slowdown', 'hardware').replace('_', ' ')} "
                        + (fmt_share_pct(100 * v / cov) if cov else fmt_duration_s(v, "clock"))
                        for k, v in sorted(throttle.items())
                        if (as_number(v) or 0) > 0 and k != "sync_boost") if isinstance(throttle, Mapping) else ""
        xids = [x for x in (d.get("xid") or []) if as_number(x) is not None]
        lost = as_number(d.get("lost_at_s"))
        label = f"{clean_line(d.get('node') or '?', 64)} GPU {clean_line(d.get('index', '?'), 8)}"
        if xids:
            events.append(f"{label}: Xid {', '.join(str(int(x)) for x in xids)}")
        if lost is not None:
            events.append(f"{label}: lost {fmt_duration_s(lost, 'clock')} into the job "
                          "(figures cover the time before)")
        devices.append({
            "node": clean_line(d.get("node") or "?", 64),
            "index": clean_line(d.get("index", "?"), 8),
            "name": clean_line(d.get("name") or "?", 80),
            "mig": mig,
            "util": fmt_share_pct(util, na="N/A (MIG)" if mig else NA),
            "sm_active": fmt_share_pct(d.get("sm_active_mean_pct")),
            "tensor_active": fmt_share_pct(d.get("tensor_active_mean_pct")),
            "mem": fmt_bytes_of(d.get("mem_peak_bytes"), d.get("mem_total_bytes"))
                   + (f" (job's processes {fmt_bytes(d['mem_procs_peak_bytes'])})"
                      if d.get("mem_procs_peak_bytes") is not None else ""),
            "energy": fmt_energy_j(d.get("energy_j"), "wh") + (" (estimated)" if d.get("energy_estimated") else ""),
            "power": fmt_power_w(d.get("power_mean_w")),
            "throttle": thr or "none",
            "xid": ", ".join(str(int(x)) for x in xids) or "none",
            "lost": "" if lost is None else f"lost {fmt_duration_s(lost, 'clock')} into the job",
        })

    findings = []
    # field case 12 (docs/field-cases.md): no "did not use the GPU" when there is
    # no utilization figure to base it on (the same rule as the text report)
    for f in shown_findings(summary):
        sev = str(f.get("severity") or "info").lower()
        sev = {"alert": "crit"}.get(sev, sev)   # gsrun.report.findings' hardware events
        sev = sev if sev in ("info", "warn", "crit", "error") else "info"
        findings.append({"severity": sev, "color": SEVERITY_COLOR[sev],
                         "label": {"crit": "hardware", "error": "error", "warn": "fix", "info": "tip"}[sev],
                         "text": clean_line(f.get("text") or "", 500),
                         "link": clean_line(doc_link(cfg, clean_line(f.get("code") or "", 40)), 600)})
    rows, head = [], {"alert": "", "next": ""}
    if kind == "report":
        try:
            rows = verdicts(dict(summary), cfg, job.get("partition"))
            head = headline(dict(summary), rows)
        except (KeyError, TypeError, ValueError):   # a summary missing a section: no verdict, the rest stands
            rows = []
    verdict = [{"label": r["label"], "value": fmt_share_pct(r["pct"]), "word": r["word"],
                "color": LEVEL_COLOR.get(r["level"], "#666666"), "detail": clean_line(r["detail"], 200),
                "bar": None if r["bar_pct"] is None else int(round(r["bar_pct"]))} for r in rows]   # None: no bar (N/A is not 0)
    cols = [c for c in DEVICE_COLUMNS if any(d[c[0]] not in ("none", NA, "") for d in devices)]
    start, end, submit = (as_number(job.get(k)) for k in ("start_time", "end_time", "submit_time"))
    limit = as_number(job.get("time_limit_s"))

    req = as_number(mem.get("req_bytes"))
    mem_eff = as_number(mem.get("efficiency_pct"))
    cpu_eff = as_number(cpu.get("efficiency_pct"))
    gpu_avail = gpu.get("available") is not False
    gpus_alloc = as_number(job.get("gpus_alloc")) or 0
    return {
        "kind": kind,
        "subject": subject_line(summary),
        "job_id": clean_line(job.get("array") or job.get("id") or "?", 40),
        "job_raw_id": clean_line(job.get("id") or "?", 40),
        "name": clean_line(job.get("name") or "", 200),
        "user": clean_line(job.get("user") or "?", 64),
        "partition": clean_line(job.get("partition") or "?", 64),
        "state": clean_line(job.get("state") or "UNKNOWN", 64),
        "exit_code": clean_line("N/A" if job.get("exit_code") is None else job.get("exit_code"), 16),
        "nodes": clean_line(", ".join(str(n) for n in (job.get("nodes") or [])) or "none", 500),
        "elapsed": fmt_duration_s(job.get("elapsed_s"), "clock"),
        "cpus_alloc": clean_line("N/A" if job.get("cpus_alloc") is None else job.get("cpus_alloc"), 16),
        "gpus_alloc": clean_line("N/A" if job.get("gpus_alloc") is None else job.get("gpus_alloc"), 16),
        "cpu_time": fmt_duration_s(cpu.get("time_s"), "clock"),
        "cpu_eff": fmt_share_pct(cpu_eff),
        "cpu_source": clean_line(cpu.get("source") or "", 80),
        "mem_peak": fmt_bytes(mem.get("peak_bytes")),
        "mem_req": "not recorded" if req is None or req <= 0 else fmt_bytes(req),
        "mem_eff": fmt_share_pct(mem_eff),
        "gpu_section": bool(devices) or not gpu_avail or gpus_alloc > 0,
        "gpu_available": gpu_avail,
        "gpu_reason": clean_line(gpu.get("reason") or ("no GPU data recorded" if not devices else ""), 300),
        "gpu_any_mig": any(d["mig"] for d in devices),
        "gpu_headline": _gpu_headline(summary) or "",
        "devices": devices,
        "gpu_energy": fmt_energy_j(gpu.get("energy_j"), "wh") + (" (estimated)" if gpu.get("energy_estimated")
                                                                  else ""),
        "gpu_hours_alloc": fmt_hours_h(gpu.get("gpu_hours_alloc")),
        "gpu_hours_used": fmt_hours_h(gpu.get("gpu_hours_used")),
        "hardware_events": events,
        "verdict": verdict,
        "next_time": clean_line(head["next"], 300),
        "alert": clean_line(head["alert"], 300),
        "columns": [{"key": k, "title": t} for k, t in cols],
        "started": fmt_time(start),
        "ended": fmt_time(end),
        "queue_wait": fmt_duration_s(start - submit, "clock") if start and submit and start >= submit else "",
        "time_limit": "" if "time_limit_s" not in job else ("none" if not limit else fmt_duration_s(limit, "clock")),
        "image_width": (image_size or (720, 0))[0],
        "image_height": (image_size or (0, 0))[1],
        "findings": findings,
        "node_settings": [clean_line(ln, 2000) for ln in settings_lines(dict(summary))],
        "report_text": clean_block(report_text or ""),
        "has_image": bool(has_image),
        "image_cid": image_cid,
        "image_dropped": bool(image_dropped) and not has_image,
    }


# ----------------------------------------------------------------------------- templates

def render_text(view: Mapping) -> str:
    """The plain-text part (templates/mail.txt.j2)."""
    return render("mail.txt.j2", **view)


def render_html(view: Mapping) -> str:
    """The HTML part (templates/mail.html.j2, autoescaped)."""
    return render("mail.html.j2", **view)


# ----------------------------------------------------------------------------- message

def message_id(summary: Mapping, domain: str) -> str:
    """``<gsrun.job-42.1a2b3c4d5e6f@domain>``: the same job summary always
    gives the same id (a resend is recognisable); the hash of id, user, name
    and first node tells apart jobs once Slurm's job ids wrap around."""
    job = summary.get("job") or {}
    jid = str(job.get("array") or job.get("id") or "unknown")
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", jid)[:40]
    nodes = job.get("nodes") or [""]
    key = "|".join(str(x) for x in (job.get("id"), job.get("array"), job.get("user"), job.get("name"), nodes[0]))
    digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:12]
    return f"<gsrun.job-{safe}.{digest}@{domain}>"


def build_message(summary: dict, report_text: str, png: bytes | None, to_addr: str, from_addr: str,
                  *, date: float | None = None, cfg=None) -> EmailMessage:
    """The efficiency mail for one job summary (``gsrun.summary/1``).

    Structure::

        multipart/alternative
          text/plain; charset=utf-8 (quoted-printable)   templates/mail.txt.j2 + report_text
          multipart/related                               (text/html alone when png is None)
            text/html; charset=utf-8                      templates/mail.html.j2, <img src="cid:...">
            image/png (base64, inline, Content-ID)       ``png``

    Headers: From, To, Subject (:func:`subject_line`, set by :func:`set_text_header`:
    an encoded word in a job name is shown literally, never decoded), Date, Message-ID
    (:func:`message_id`, from the job id), ``Auto-Submitted: auto-generated``
    (RFC 3834: no vacation replies), ``X-Gsrun-Job``. Every header value is
    stripped of CR/LF and control characters; the whole message is 7-bit.

    ``png`` that is not a PNG (bad magic) or is over 5 MiB is left out and
    the text says "timeline unavailable" (a broken plot never stops the mail).
    ``date``: epoch seconds for the Date header (default now). ``cfg``: the
    site config (verdict targets, ``report.doc_url``; None: defaults). The
    picture is shown at half its pixel size when wider than 900 px (drawn
    at 2x), with explicit ``width`` / ``height``.

    Raises:
        InputError: ``to_addr`` or ``from_addr`` is not one valid
            ``local@domain`` address (see :func:`validate_addr`).
    """
    to_spec = validate_addr(to_addr, "recipient address (MailUser)")
    from_spec = validate_addr(from_addr, "sender address (mail.from_addr)")
    domain = from_spec.rsplit("@", 1)[1]
    job = summary.get("job") or {}
    jid = clean_line(job.get("array") or job.get("id") or "unknown", 40)
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", jid)[:40]
    cid = f"timeline.{safe}@{domain}"

    has_image = isinstance(png, (bytes, bytearray)) and png[:8] == PNG_MAGIC and len(png) <= MAX_PNG_BYTES
    size = None
    if has_image and len(png) >= 24 and png[12:16] == b"IHDR":
        w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        size = (w // 2, h // 2) if w > 900 else (w, h)     # the chart is drawn at 2x for high-DPI screens
    view = mail_view(summary, report_text, has_image, cid, image_dropped=png is not None, cfg=cfg,
                     image_size=size)

    msg = EmailMessage(policy=email_policy.default)
    msg["From"] = str(Address(username=from_spec.rsplit("@", 1)[0], domain=domain, display_name="gsrun"))
    msg["To"] = to_spec
    set_text_header(msg, "Subject", view["subject"], 250)   # encoded words in a job name stay literal
    msg["Date"] = email.utils.formatdate(date if date is not None else time.time(), localtime=True)
    msg["Message-ID"] = message_id(summary, domain)
    msg["Auto-Submitted"] = "auto-generated"
    set_text_header(msg, "X-Gsrun-Job", jid, 40)
    msg.set_content(render_text(view), subtype="plain", charset="utf-8", cte="quoted-printable")
    msg.add_alternative(render_html(view), subtype="html", charset="utf-8", cte="quoted-printable")
    if has_image:
        html_part = msg.get_payload()[1]
        html_part.add_related(bytes(png), maintype="image", subtype="png", cid=f"<{cid}>",
                              disposition="inline", filename="timeline.png")
    # Headers: do not fold ASCII values (lines up to RFC 5322's 998): Python's folder
    # otherwise moves a whole Subject to a continuation line, which readers then show with
    # a leading space. Bodies were encoded above with the default 76-column lines.
    if all(str(v).isascii() for v in msg.values()):
        msg.policy = _WIDE_HEADERS
    return msg


# ----------------------------------------------------------------------------- spool

def _mail_dir(spool_dir) -> Path:
    spool = Path(spool_dir)
    if not spool.is_dir():
        raise NodeError(PHASE, "spool directory missing", str(spool),
                        hint="gsrun-node install creates paths.spool_dir")
    uid, gid = os.geteuid(), os.getegid()
    base = ensure_dir(spool / "mail", 0o700, uid, gid)
    for sub in SUBDIRS:
        ensure_dir(base / sub, 0o700, uid, gid)
    return base


class _Lock:
    """``flock`` on a lock file (opened without following symlinks)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def acquire(self, timeout_s: float | None) -> bool:
        """Blocking when ``timeout_s`` is None, else poll until it runs out."""
        if timeout_s is None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return True
        return flock_within(self.fd, timeout_s, 0.05)

    def close(self) -> None:
        os.close(self.fd)  # releases the lock

    def __enter__(self):
        self.acquire(None)
        return self

    def __exit__(self, *exc):
        self.close()


def _queue_lock(base: Path) -> _Lock:
    return _Lock(base / ".queue.lock")


def _find(base: Path, qid: str) -> Path | None:
    for sub in ("new", "tmp", "sent", "failed"):
        p = base / sub / f"{qid}.eml"
        if os.path.lexists(p):
            return p
    return None


def enqueue(spool_dir, job_id, msg: EmailMessage) -> Path:
    """Queue ``msg`` for job ``job_id``: ``<spool_dir>/mail/new/<job_id>.eml``
    (mode 0600, written with :func:`gsrun.base.fsutil.atomic_write`).

    Idempotent per job id: when a message for this job is already queued,
    being sent, sent or failed, nothing is written and that file's path is
    returned (a rerun epilog does not mail twice). Never talks to a server;
    waits only for the queue lock, which is held for single renames.

    Raises:
        InputError: ``job_id`` is not a plain Slurm job id (``42``, ``15053872_1491``).
        NodeError: the spool directory is missing, or ``mail/`` there is a
            symlink or owned by someone else (planted).
    """
    qid = _qid(job_id)
    base = _mail_dir(spool_dir)
    existing = _find(base, qid)
    if existing is not None:
        return existing
    data = wire_bytes(msg)
    stage = base / "tmp" / f".stage.{qid}.{os.getpid()}.{secrets.token_hex(4)}"
    atomic_write(stage, data, mode=0o600)
    try:
        with _queue_lock(base):
            existing = _find(base, qid)
            if existing is not None:
                return existing
            target = base / "new" / f"{qid}.eml"
            os.rename(stage, target)
            return target
    finally:
        try:
            os.unlink(stage)
        except FileNotFoundError:
            pass


def queue_status(spool_dir) -> dict:
    """``{"new": [...], "tmp": [...], "sent": [...], "failed": [...]}``: job
    ids per folder, sorted (for ``gsrun-node mail status``)."""
    base = _mail_dir(spool_dir)
    return {sub: sorted(p.name[:-4] for p in (base / sub).iterdir()
                        if p.name.endswith(".eml") and not p.name.startswith("."))
            for sub in ("new", "tmp", "sent", "failed")}


def backoff_s(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed try: 60, 120, 240 ...
    capped at 3600 (so 48 attempts span about two days)."""
    return min(BACKOFF_BASE_S * (2 ** max(0, attempts - 1)), BACKOFF_CAP_S)


def _cfg(cfg, key: str):
    try:
        return cfg[key]
    except KeyError:
        from gsrun.request.config import SETTINGS
        for s in SETTINGS:
            if s.key == key:
                return s.default
        raise


def _read_password(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise MailError("cannot read mail.password_file", f"{path}: {e.strerror}",
                        hint="create it (mode 0600, owner root) or clear mail.username") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & stat.S_IROTH:
            raise MailError("refusing mail.password_file", f"{path} is world-readable",
                            hint=f"chmod 600 {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            pw = f.read(4096).decode("utf-8", "replace")
    finally:
        os.close(fd)
    return pw.rstrip("\r\n")


def _envelope(msg: EmailMessage) -> tuple[str, list[str]]:
    from_spec = validate_addr(str(msg["From"]), "From")
    tos = [validate_addr(a, "To") for _n, a in email.utils.getaddresses([str(msg["To"] or "")])
           if a] if msg["To"] else []
    if not tos:
        raise MailError("no recipient", "the queued message has no To:", permanent=True)
    return from_spec, tos


def send_smtp(msg: EmailMessage, cfg) -> None:
    """Deliver by SMTP: ``mail.smtp_host``:``mail.smtp_port``, every socket
    operation bounded by ``timeouts.command_s``; STARTTLS (certificate
    checked) when ``mail.starttls``; AUTH LOGIN/PLAIN when ``mail.username``
    with the password from ``mail.password_file``.

    Raises:
        MailError: ``permanent`` for a 5xx refusal of sender, recipients or
            data; ``outage`` when the server cannot be reached or times out
            (down, firewalled, wrong host/port); otherwise temporary (4xx,
            authentication or TLS failure: likely a config problem).
    """
    host, port = _cfg(cfg, "mail.smtp_host"), int(_cfg(cfg, "mail.smtp_port"))
    timeout_s = float(_cfg(cfg, "timeouts.command_s"))
    from_spec, tos = _envelope(msg)
    where = f"{host}:{port}"
    try:
        # local_hostname given: smtplib would otherwise call getfqdn(), an unbounded DNS lookup
        with smtplib.SMTP(host, port, timeout=timeout_s, local_hostname=socket.gethostname() or "localhost") as s:
            if _cfg(cfg, "mail.starttls"):
                s.starttls(context=ssl.create_default_context())
            user = _cfg(cfg, "mail.username")
            if user:
                s.login(user, _read_password(_cfg(cfg, "mail.password_file")))
            s.sendmail(from_spec, tos, _crlf(wire_bytes(msg)))
    except MailError:
        raise
    except smtplib.SMTPRecipientsRefused as e:
        codes = [c for c, _m in e.recipients.values()]
        detail = "; ".join(f"{r}: {c} {m.decode('utf-8', 'replace') if isinstance(m, bytes) else m}"
                           for r, (c, m) in e.recipients.items())
        raise MailError("recipient refused", f"{where}: {detail}",
                        permanent=all(500 <= c < 600 for c in codes)) from None
    except smtplib.SMTPAuthenticationError as e:
        raise MailError("SMTP authentication failed", f"{where}: {e.smtp_code}",
                        hint="check mail.username and mail.password_file") from None
    except smtplib.SMTPNotSupportedError as e:
        raise MailError("SMTP feature not supported", f"{where}: {e}",
                        hint="the server offers no STARTTLS/AUTH; check mail.starttls / mail.username") from None
    except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as e:
        text = e.smtp_error.decode("utf-8", "replace") if isinstance(e.smtp_error, bytes) else str(e.smtp_error)
        raise MailError("message refused", f"{where}: {e.smtp_code} {clean_line(text)}",
                        permanent=500 <= e.smtp_code < 600) from None
    except (smtplib.SMTPConnectError, smtplib.SMTPServerDisconnected, ConnectionError,
            TimeoutError, socket.gaierror) as e:
        raise MailError("SMTP server unreachable", f"{where}: {clean_line(e)}", outage=True,
                        hint="is the mail relay up? check mail.smtp_host / mail.smtp_port") from None
    except smtplib.SMTPResponseException as e:
        raise MailError("SMTP error", f"{where}: {e.smtp_code}", permanent=False) from None
    except ssl.SSLError as e:
        raise MailError("STARTTLS failed", f"{where}: {e}", hint="check the relay's certificate") from None
    except (smtplib.SMTPException, OSError) as e:
        raise MailError("SMTP failed", f"{where}: {e}", outage=isinstance(e, OSError)
                        and not isinstance(e, smtplib.SMTPException)) from None


# sysexits.h: EX_DATAERR 65, EX_NOUSER 67 are final; everything else (EX_TEMPFAIL 75 ...) is retried
_MAILPROG_PERMANENT = {65, 67}


def send_mailprog(msg: EmailMessage, cfg) -> None:
    """Deliver through the site's sendmail-compatible MailProg
    (``mail.mailprog``): ``[mailprog, "-i", "-f", FROM, "--", TO...]`` with
    the message on stdin, no shell, timeout ``timeouts.command_s``.

    (Slurm's own ``MailProg`` is often ``/bin/mail``-style, which takes a
    subject flag and would mangle a MIME message: point ``mail.mailprog`` at
    ``/usr/sbin/sendmail``.)

    Raises:
        MailError: not executable / timed out / non-zero exit (permanent for
            EX_DATAERR 65 and EX_NOUSER 67, temporary otherwise).
    """
    prog = _cfg(cfg, "mail.mailprog")
    timeout_s = float(_cfg(cfg, "timeouts.command_s"))
    from_spec, tos = _envelope(msg)
    argv = [prog, "-i", "-f", from_spec, "--", *tos]
    try:
        cp = subprocess.run(argv, input=wire_bytes(msg), capture_output=True,
                            timeout=timeout_s, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                            close_fds=True, cwd="/")
    except subprocess.TimeoutExpired:
        raise MailError("MailProg timed out", f"{prog} after {timeout_s:g} s",
                        hint="is the local MTA wedged?") from None
    except OSError as e:
        raise MailError("cannot run MailProg", f"{prog}: {e.strerror}",
                        hint="check mail.mailprog (e.g. /usr/sbin/sendmail)") from None
    if cp.returncode != 0:
        err = clean_line(cp.stderr.decode("utf-8", "replace"), 300)
        raise MailError("MailProg failed", f"{prog} exit {cp.returncode}: {err}",
                        permanent=cp.returncode in _MAILPROG_PERMANENT)


def deliver(msg: EmailMessage, cfg) -> None:
    """:func:`send_mailprog` when ``mail.mailprog`` is set, else :func:`send_smtp`."""
    if _cfg(cfg, "mail.mailprog"):
        send_mailprog(msg, cfg)
    else:
        send_smtp(msg, cfg)


class SpooledMessage(EmailMessage):
    """A message read back from the spool; ``raw`` holds its exact bytes,
    which is what the transports send (no re-serialisation, so what was
    queued is what arrives)."""

    raw: bytes = b""


def wire_bytes(msg: EmailMessage) -> bytes:
    """The bytes to send (LF line ends): the spooled bytes as they are, or
    ``msg`` serialised with its own policy."""
    if isinstance(msg, SpooledMessage) and msg.raw:
        return msg.raw
    return msg.as_bytes()


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def _read_msg(path: Path) -> SpooledMessage:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    msg = BytesParser(SpooledMessage, policy=email_policy.default).parsebytes(raw)
    msg.raw = raw
    return msg


def _move(base: Path, qid: str, src: str, dst: str) -> bool:
    """rename mail/<src>/<qid>.eml -> mail/<dst>/ under the queue lock;
    False when it is no longer in ``src`` (someone else moved it)."""
    with _queue_lock(base):
        try:
            os.rename(base / src / f"{qid}.eml", base / dst / f"{qid}.eml")
            return True
        except FileNotFoundError:
            return False


def flush(spool_dir, cfg, now: float | None = None,
          send: Callable[[EmailMessage, Any], None] | None = None) -> dict:
    """Deliver the queued messages that are due; ``gsrun-node mail flush``.

    ``cfg``: a :class:`gsrun.request.config.Config` (or a dict with the same keys;
    missing keys take the defaults). ``now``: epoch seconds used for the
    backoff schedule (default: the clock). ``send(msg, cfg)``: the transport,
    default :func:`deliver` (SMTP or MailProg); it raises :class:`MailError`
    (any other exception counts as a temporary failure).

    Per message: claimed by renaming ``new/`` -> ``tmp/``; on success moved to
    ``sent/``; on a temporary failure put back in ``new/`` with attempts+1 and
    ``next_try = now + backoff_s(attempts)``, or moved to ``failed/`` once
    ``mail.max_attempts`` tries are used; on a permanent refusal moved to
    ``failed/`` at once. When the server is unreachable (``outage``) the other
    due messages are not tried in this run (each would wait its own timeout)
    but their attempt counts rise too.

    Returns ``{"sent": n, "failed": n, "deferred": n, "busy": bool}``:
    ``deferred`` = still queued after this run (failed this time, or not due
    yet); ``busy`` = another flush held the spool for longer than
    ``timeouts.command_s`` and nothing was done.

    Raises:
        NodeError: the spool directory is missing or planted (see :func:`enqueue`).
    """
    base = _mail_dir(spool_dir)
    send = send or deliver
    timeout_s = float(_cfg(cfg, "timeouts.command_s"))
    max_attempts = int(_cfg(cfg, "mail.max_attempts"))
    result = {"sent": 0, "failed": 0, "deferred": 0, "busy": False}
    lock = _Lock(base / ".flush.lock")
    try:
        if not lock.acquire(timeout_s):
            result["busy"] = True
            return result
        # we hold the flush lock: anything claimed in tmp/ belongs to a flush that died
        for p in sorted((base / "tmp").iterdir()):
            if p.name.endswith(".eml") and not p.name.startswith("."):
                _move(base, p.name[:-4], "tmp", "new")
        outage: MailError | None = None
        for p in sorted((base / "new").iterdir()):
            if not p.name.endswith(".eml") or p.name.startswith("."):
                continue
            qid = p.name[:-4]
            t = time.time() if now is None else now
            state_path = base / "state" / f"{qid}.json"
            state = read_json(state_path) or {}
            attempts = int(state.get("attempts") or 0)
            if (as_number(state.get("next_try")) or 0) > t:
                result["deferred"] += 1
                continue
            if not _move(base, qid, "new", "tmp"):
                continue
            err: MailError | None = None
            if outage is not None:
                err = outage
            else:
                try:
                    send(_read_msg(base / "tmp" / f"{qid}.eml"), cfg)
                except MailError as e:
                    err = e
                except (ValueError, InputError) as e:  # unparsable / bad addresses in the queued file
                    err = MailError("bad queued message", f"{qid}: {e}", permanent=True)
                except Exception as e:  # noqa: BLE001 - a transport bug must not lose the message
                    err = MailError("send failed", f"{qid}: {type(e).__name__}: {e}")
            attempts += 1
            state.update({"job_id": qid, "attempts": attempts, "last_try": t})
            if err is None:
                state.update({"sent_at": t, "last_error": None, "next_try": None})
                atomic_write_json(state_path, state, mode=0o600)
                _move(base, qid, "tmp", "sent")
                result["sent"] += 1
                continue
            if err.outage:
                outage = err
            state["last_error"] = str(err).split("\n")[0]
            if err.permanent or attempts >= max_attempts:
                state.update({"failed_at": t, "next_try": None})
                atomic_write_json(state_path, state, mode=0o600)
                _move(base, qid, "tmp", "failed")
                result["failed"] += 1
            else:
                state["next_try"] = t + backoff_s(attempts)
                atomic_write_json(state_path, state, mode=0o600)
                _move(base, qid, "tmp", "new")
                result["deferred"] += 1
    finally:
        lock.close()
    return result


def retry_failed(spool_dir, job_id: str | None = None) -> list[str]:
    """Move ``failed/`` messages (one job, or all) back to ``new/`` with their
    attempt count reset, e.g. after the admin fixed the relay settings.
    Returns the job ids requeued. The flush lock is taken so no flush runs
    meanwhile (waits without limit: an admin command, not the epilog)."""
    base = _mail_dir(spool_dir)
    qids = [_qid(job_id)] if job_id is not None else queue_status(spool_dir)["failed"]
    done = []
    lock = _Lock(base / ".flush.lock")
    try:
        lock.acquire(None)
        for qid in qids:
            try:
                os.unlink(base / "state" / f"{qid}.json")
            except FileNotFoundError:
                pass
            if _move(base, qid, "failed", "new"):
                done.append(qid)
    finally:
        lock.close()
    return done


def prune(spool_dir, max_age_s: float = 30 * 86400, now: float | None = None) -> int:
    """Remove ``sent/`` and ``failed/`` messages (and their state) older than
    ``max_age_s``, and enqueue staging files older than a day. Returns the
    number of messages removed. A pruned job id can be queued again."""
    base = _mail_dir(spool_dir)
    t = time.time() if now is None else now
    removed = 0
    with _queue_lock(base):
        for sub in ("sent", "failed"):
            for p in (base / sub).iterdir():
                try:
                    if p.name.endswith(".eml") and t - os.lstat(p).st_mtime > max_age_s:
                        os.unlink(p)
                        removed += 1
                        try:
                            os.unlink(base / "state" / (p.name[:-4] + ".json"))
                        except FileNotFoundError:
                            pass
                except FileNotFoundError:
                    continue
        for p in (base / "tmp").iterdir():
            try:
                if p.name.startswith(".stage.") and t - os.lstat(p).st_mtime > 86400:
                    os.unlink(p)
            except FileNotFoundError:
                continue
    return removed


__all__ = [
    "MailError", "build_message", "mail_wanted", "mail_kind", "mail_view", "subject_line", "message_id",
    "validate_addr", "clean_line", "clean_block", "set_text_header", "enqueue", "flush", "deliver", "send_smtp",
    "send_mailprog", "queue_status", "backoff_s", "prune", "retry_failed", "render_text", "render_html",
    "SpooledMessage", "wire_bytes",
]
