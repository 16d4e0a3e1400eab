"""The cluster report's mails (per-user digests, the admins' tables) through
gsrun's mail spool, so an SMTP outage only delays them. One mail per user
and window (queue id ``digest.<user>.<start>-<end>``); never a job twice
(``<spool>/report/digests.json`` keeps each user's last covered End);
``cluster_report.digest_min_interval_h`` and ``digests_per_run`` limit them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from gsrun.base.errors import InputError
from gsrun.base.fsutil import atomic_write_json, ensure_dir, read_json
from gsrun.report.fleet import UserDigest
from gsrun.report.fleet_render import Scope, digest_text
from gsrun.report.mail import enqueue, flush, new_message

STATE_NAME = "digests.json"


@dataclass(frozen=True)
class Outgoing:
    """A mail to send; ``user`` None for the admins' tables."""

    qid: str
    to_addr: str
    subject: str
    body: str
    user: str | None = None


def _user_ok(user: str) -> bool:
    return 0 < len(user) <= 32 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in user) \
        and user[0].isalnum()


def state_path(spool_dir) -> Path:
    return Path(spool_dir) / "report" / STATE_NAME


def read_state(spool_dir) -> dict[str, dict]:
    """user -> ``{"last_end_s", "sent_at"}``."""
    got = read_json(state_path(spool_dir))
    return {k: v for k, v in got.items() if isinstance(v, dict)} if isinstance(got, dict) else {}


def digest_after(state: dict[str, dict]) -> dict[str, float]:
    return {u: float(v.get("last_end_s") or 0) for u, v in state.items()}


def plan_digests(digests: list[UserDigest], scope: Scope, cfg, state: dict[str, dict],
                 now: float) -> tuple[list[Outgoing], list[str]]:
    """The digests to send, and why each other user is skipped."""
    domain = str(cfg["mail.default_domain"])
    min_gap_s = float(cfg["cluster_report.digest_min_interval_h"]) * 3600.0
    cap = int(cfg["cluster_report.digests_per_run"])
    out, skipped = [], []
    for d in digests:
        if not _user_ok(d.user):
            skipped.append(f"{d.user[:40]!r}: user name not usable in a mail address")
            continue
        last = float((state.get(d.user) or {}).get("sent_at") or 0)
        if now - last < min_gap_s:
            skipped.append(f"{d.user}: had a digest {fmt_ago(now - last)} ago "
                           f"(cluster_report.digest_min_interval_h)")
            continue
        if not domain:
            skipped.append(f"{d.user}: no mail.default_domain to make an address")
            continue
        if len(out) >= cap:
            skipped.append(f"{d.user}: cluster_report.digests_per_run ({cap}) reached")
            continue
        out.append(Outgoing(f"digest.{d.user}.{int(scope.start_s)}-{int(scope.end_s)}", f"{d.user}@{domain}",
                            f"[gsrun] your GPU jobs: {d.findings()} findings, {d.gpu_h:.1f} GPU-hours",
                            digest_text(d, scope, str(cfg["report.doc_url"])), d.user))
    return out, skipped


def fmt_ago(s: float) -> str:
    return f"{s / 3600:.0f} h"


def admin_mail(to_addr: str, text: str, scope: Scope) -> Outgoing:
    return Outgoing(f"report.{int(scope.start_s)}-{int(scope.end_s)}", to_addr,
                    "[gsrun] cluster GPU report", text)


def build(o: Outgoing, from_addr: str, now: float) -> EmailMessage:
    """Raises:
        InputError: a bad recipient or sender address."""
    msg = new_message(o.to_addr, from_addr, o.subject, lambda d: f"<gsrun.{o.qid}@{d}>", now)
    msg.set_content(o.body, subtype="plain", charset="utf-8", cte="quoted-printable")
    return msg


def send(outgoing: list[Outgoing], cfg, spool_dir, now: float | None = None, deliver=None) -> dict:
    """Queue every mail, record the digests, flush once. -> :func:`~gsrun.report.mail.flush`'s counts
    and ``queued``.

    Raises:
        InputError: a bad address (nothing of that mail is queued).
        NodeError: the spool is missing or planted."""
    now = time.time() if now is None else now
    from_addr = str(cfg["mail.from_addr"])
    msgs = [(o, build(o, from_addr, now)) for o in outgoing]
    for o, msg in msgs:
        enqueue(spool_dir, o.qid, msg)
    users = [o for o in outgoing if o.user]
    if users:
        state = read_state(spool_dir)
        for o in users:
            end_s = float(o.qid.rsplit("-", 1)[1])
            prev = state.get(o.user) or {}
            state[o.user] = {"last_end_s": max(end_s, float(prev.get("last_end_s") or 0)), "sent_at": now}
        ensure_dir(Path(spool_dir) / "report", 0o700, os.geteuid(), os.getegid())
        atomic_write_json(state_path(spool_dir), state, mode=0o600)
    res = flush(spool_dir, cfg, now=now, send=deliver)
    res["queued"] = len(msgs)
    return res


def dry_run_text(outgoing: list[Outgoing], skipped: list[str]) -> str:
    """What :func:`send` would queue, and whom it skips."""
    out = []
    for o in outgoing:
        out += [f"--- would send {o.qid} to {o.to_addr}", f"Subject: {o.subject}", "", o.body.rstrip("\n"), ""]
    out += [f"--- skipped {s}" for s in skipped]
    return "\n".join(out) + ("\n" if out else "")


__all__ = ["Outgoing", "plan_digests", "admin_mail", "build", "send", "dry_run_text", "read_state",
           "digest_after", "InputError"]
