"""Alert requests (``<spool>/alerts/new/<job>.<kind>[-<n>].json``, from
:func:`gsrun.facts.live.queue_alert`) -> mails in the report mail's spool,
run first by ``gsrun-node mail flush``. One mail per condition and job until
it clears; at most ``idle.mail_per_user_per_hour`` per user per clock hour
(``alerts/state/<user>.<YYYYmmddHH>.json``; over budget waits), never
holding back a ``cancel`` or its ``warning``. No address: ``failed/``.
"""

from __future__ import annotations

import os
import time
from email.message import EmailMessage
from pathlib import Path

from gsrun.base.fsutil import atomic_write_json, read_json
from gsrun.base.ids import is_job_id, is_user_name
from gsrun.base.templating import render
from gsrun.facts.live import alerts_dir, read_live_docs, split_alert_key
from gsrun.report import mail
from gsrun.report.live import live_summary
from gsrun.report.render import render_text
from gsrun.report.units import fmt_bytes

MAX_REQUESTS_PER_RUN = 200


def recipient(req: dict, job: dict | None, default_domain: str) -> str | None:
    """The job's MailUser, else the user name; a bare name gets ``@default_domain`` (none: None). Pure."""
    who = (job or {}).get("mail_user") or req.get("mail_user") or (job or {}).get("user") or req.get("user")
    if not isinstance(who, str) or not who:
        return None
    if "@" in who:
        return who
    if not default_domain or not is_user_name(who):
        return None
    return f"{who}@{default_domain}"


def hour_key(now: float) -> str:
    return time.strftime("%Y%m%d%H", time.localtime(now))


def held_memory(findings) -> tuple[int, list[tuple[str, int]]] | None:
    """``(total_bytes, [(gpu label, bytes)])`` the idle / never-used GPUs still hold (evidence
    ``mem_used_bytes``: nvmlDeviceGetMemoryInfo at the last poll); None if unread. Pure."""
    per = []
    for f in findings or ():
        if not isinstance(f, dict) or f.get("code") not in ("gpu_idle", "gpu_never_used"):
            continue
        m = (f.get("evidence") or {}).get("mem_used_bytes")
        if isinstance(m, int) and not isinstance(m, bool) and m >= 0:
            per.append((f"GPU {f.get('gpu')}" + (f" on {f['node']}" if f.get("node") else ""), m))
    return (sum(m for _, m in per), per) if per else None


def held_line(findings) -> str:
    """``The idle GPUs still hold 5.3 GiB of GPU memory (GPU 4: 1.3 GiB, ...)``, or "". Pure."""
    held = held_memory(findings)
    if held is None:
        return ""
    total, per = held
    parts = ", ".join(f"{g}: {fmt_bytes(m)}" for g, m in per[:8]) + (", ..." if len(per) > 8 else "")
    return f"The idle GPUs still hold {fmt_bytes(total)} of GPU memory ({parts})."


def build_alert(req: dict, to_addr: str, from_addr: str, report_text: str | None, cancel_after_min,
                date: float | None = None, key: str | None = None) -> EmailMessage:
    """The alert or cancel notice mail (``templates/alert.txt.j2``); ``key``: ``kind[-<n>]`` for the
    Message-ID. Raises :class:`~gsrun.base.errors.InputError` on a bad address."""
    job_id = mail.clean_line(req["job_id"], 40)
    kind = req["kind"]
    lines = [mail.clean_line(x, 300) for x in req.get("lines") or ()][:16]
    after = f"{cancel_after_min:g} min" if isinstance(cancel_after_min, (int, float)) else ""
    held = mail.clean_line(held_line(req.get("findings")), 400)
    body = render("alert.txt.j2", kind=kind, job_id=job_id, lines=lines, held=held,
                  reason=mail.clean_line(req.get("reason") or "", 400), cancel_after=after,
                  report=mail.clean_block(report_text) if report_text else "")
    subject = f"[gsrun] job {job_id} cancelled: GPUs idle" if kind == "cancel" else \
        f"[gsrun] job {job_id} will be cancelled: GPUs idle" if kind == "warning" else \
        f"[gsrun] job {job_id} running: {lines[0] if lines else 'GPU time unused'}"
    msg = mail.new_message(to_addr, from_addr, subject,
                           lambda d: f"<gsrun.job-{job_id}.{mail.clean_line(key or kind, 40)}@{d}>", date)
    mail.set_text_header(msg, "X-Gsrun-Job", job_id, 40)
    mail.set_text_header(msg, "X-Gsrun-Alert", kind, 20)
    msg.set_content(body, subtype="plain", charset="utf-8", cte="quoted-printable")
    return msg


def process(spool_dir, cfg, idle_cfg=None, now: float | None = None, job_record=None, log=None) -> dict:
    """Queue ``alerts/new/``'s requests as mails. ``job_record(job_id)``: the job's ``mail_user`` and
    ``user`` (None: the request's). -> ``{"queued", "deferred", "failed"}``."""
    now = time.time() if now is None else now
    base = alerts_dir(spool_dir)
    per_hour = getattr(idle_cfg, "mail_per_user_per_hour", 3)
    cancel_after = getattr(idle_cfg, "cancel_after_min", None) if getattr(idle_cfg, "cancel", "off") == "on" else None
    out = {"queued": 0, "deferred": 0, "failed": 0}
    names = sorted(p.name for p in (base / "new").iterdir() if p.name.endswith(".json")
                   and not p.name.startswith("."))[:MAX_REQUESTS_PER_RUN]
    for name in names:
        p = base / "new" / name
        req = read_json(p)
        parts = name[:-len(".json")].rsplit(".", 1)
        key = split_alert_key(parts[1]) if len(parts) == 2 else None
        if not req or key is None or not is_job_id(parts[0], array=True) \
                or req.get("job_id") != parts[0] or req.get("kind") != key[0]:
            _finish(base, name, "failed", {"error": "malformed request"})
            out["failed"] += 1
            continue
        job_id, kind = parts[0], key[0]
        job = _quiet(job_record, job_id) if job_record is not None else None    # None: the request's user
        to_addr = recipient(req, job, str(cfg["mail.default_domain"] or ""))
        if to_addr is None:
            _finish(base, name, "failed", {"error": "no address: no MailUser with a domain and "
                                                    "mail.default_domain is empty"})
            if log:
                log.warn(f"alert for job {job_id} not mailed: no address (set mail.default_domain)")
            out["failed"] += 1
            continue
        user_key = to_addr.lower()
        count_path = base / "state" / f"{_safe(user_key)}.{hour_key(now)}.json"
        count = (read_json(count_path) or {}).get("sent", 0)
        if kind not in ("cancel", "warning") and count >= per_hour:
            out["deferred"] += 1
            continue
        report = _quiet(_report_text, spool_dir, job_id, cfg)      # an alert without it is still one
        try:
            msg = build_alert(req, to_addr, cfg["mail.from_addr"], report, cancel_after, date=now, key=parts[1])
            mail.enqueue(spool_dir, f"{job_id}.{parts[1]}", msg)
        except Exception as e:  # noqa: BLE001 - bad address etc.: recorded, not retried for ever
            _finish(base, name, "failed", {"error": str(e)[:300]})
            out["failed"] += 1
            continue
        atomic_write_json(count_path, {"sent": count + 1}, mode=0o600)
        _finish(base, name, "done", {"to": to_addr, "time": round(now, 3)})
        out["queued"] += 1
    return out


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an optional part: the alert goes without it
        return None


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "@._-" else "_" for c in text)[:120]


def _finish(base: Path, name: str, sub: str, info: dict) -> None:
    try:
        os.rename(base / "new" / name, base / sub / name)
    except OSError:
        return
    atomic_write_json(base / "state" / f"{name}.{sub}", info, mode=0o600)


def _report_text(spool_dir, job_id: str, cfg) -> str | None:
    live = read_live_docs(Path(spool_dir) / "jobs" / job_id)
    s = live_summary(job_id, live, None, cfg)
    return render_text(s, color=False, cfg=cfg) if s else None


__all__ = ["process", "build_alert", "recipient", "held_memory", "held_line"]
