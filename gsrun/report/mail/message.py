"""The MIME message (pure): text + HTML with the timeline PNG inline, safe
header values, the bytes that go on the wire.
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import time
import unicodedata
from email import policy as email_policy
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from typing import Any

from gsrun.base.errors import InputError
from gsrun.base.record import or_none
from gsrun.report.records import JobSummary
from gsrun.report.mail.view import _BIDI, PHASE, clean_line, mail_view, render_html, render_text


MAX_PNG_BYTES = 5 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_WIDE_HEADERS = email_policy.default.clone(max_line_length=998)
_ADDR_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def set_text_header(msg: EmailMessage, name: str, text: Any, max_len: int = 250) -> str:
    """Set header ``name`` so readers show exactly ``clean_line(text)`` (returned): text with ``=?`` goes
    as our own encoded words, so a reader never decodes the user's."""
    value = clean_line(text, max_len)
    del msg[name]
    if "=?" in value:
        msg.set_raw(name, Header(value, "utf-8", header_name=name).encode(maxlinelen=76))
    else:
        msg[name] = value
    return value


def validate_addr(addr: str, what: str = "address") -> str:
    """The bare ``local@domain`` of ``a@b.example`` or ``Name <a@b.example>``.

    Raises:
        InputError: empty, control characters, an encoded word, several addresses, or not
            ``local@domain`` (Slurm's default MailUser is a bare user name: add the site domain).
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


def message_id(summary: JobSummary, domain: str) -> str:
    """``<gsrun.job-42.1a2b3c4d5e6f@domain>``, stable per summary; the hash tells wrapped ids apart."""
    job = summary.job
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", str(job.array or job.id or "unknown"))[:40]
    key = "|".join(str(or_none(x))
                   for x in (job.id, job.array, job.user, job.name, (job.nodes or [""])[0]))
    digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:12]
    return f"<gsrun.job-{safe}.{digest}@{domain}>"


def new_message(to_addr: str, from_addr: str, subject: str, msgid, date: float | None = None,
                to_what: str = "recipient address") -> EmailMessage:
    """A message with every gsrun mail's headers (``msgid(domain)``; RFC 3834 Auto-Submitted).

    Raises:
        InputError: as :func:`validate_addr`, for either address.
    """
    to_spec = validate_addr(to_addr, to_what)
    from_spec = validate_addr(from_addr, "sender address (mail.from_addr)")
    msg = EmailMessage(policy=email_policy.default)
    msg["From"] = f"gsrun <{from_spec}>"
    msg["To"] = to_spec
    set_text_header(msg, "Subject", subject, 250)
    msg["Date"] = email.utils.formatdate(date if date is not None else time.time(), localtime=True)
    msg["Message-ID"] = msgid(from_spec.rsplit("@", 1)[1])
    msg["Auto-Submitted"] = "auto-generated"
    return msg


def build_message(summary: JobSummary, report_text: str, png: bytes | None, to_addr: str, from_addr: str,
                  *, date: float | None = None, cfg=None) -> EmailMessage:
    """The efficiency mail of a job summary; 7-bit; a ``png`` that is not one or is over 5 MiB is left out::

        multipart/alternative
          text/plain; charset=utf-8 (quoted-printable)   templates/mail.txt.j2 + report_text
          multipart/related                               (text/html alone when png is None)
            text/html; charset=utf-8                      templates/mail.html.j2, <img src="cid:...">
            image/png (base64, inline, Content-ID)       ``png``

    Raises:
        InputError: as :func:`new_message`.
    """
    domain = validate_addr(from_addr, "sender address (mail.from_addr)").rsplit("@", 1)[1]
    jid = clean_line(summary.job.array or summary.job.id or "unknown", 40)
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", jid)[:40]
    cid = f"timeline.{safe}@{domain}"

    has_image = isinstance(png, (bytes, bytearray)) and png[:8] == PNG_MAGIC and len(png) <= MAX_PNG_BYTES
    size = None
    if has_image and len(png) >= 24 and png[12:16] == b"IHDR":
        w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        size = (w // 2, h // 2) if w > 900 else (w, h)     # the chart is drawn at 2x for high-DPI screens
    view = mail_view(summary, report_text, has_image, cid, image_dropped=png is not None, cfg=cfg,
                     image_size=size)

    msg = new_message(to_addr, from_addr, view["subject"], lambda d: message_id(summary, d), date,
                      "recipient address (MailUser)")
    set_text_header(msg, "X-Gsrun-Job", jid, 40)
    msg.set_content(render_text(view), subtype="plain", charset="utf-8", cte="quoted-printable")
    msg.add_alternative(render_html(view), subtype="html", charset="utf-8", cte="quoted-printable")
    if has_image:
        html_part = msg.get_payload()[1]
        html_part.add_related(bytes(png), maintype="image", subtype="png", cid=f"<{cid}>",
                              disposition="inline", filename="timeline.png")
    # unfolded ASCII headers (up to 998): Python's folder would move a Subject to a continuation line
    if all(str(v).isascii() for v in msg.values()):
        msg.policy = _WIDE_HEADERS
    return msg


class SpooledMessage(EmailMessage):
    """A spooled message; ``raw``: its exact bytes, what the transports send."""

    raw: bytes = b""


def wire_bytes(msg: EmailMessage) -> bytes:
    """The bytes to send (LF line ends)."""
    if isinstance(msg, SpooledMessage) and msg.raw:
        return msg.raw
    return msg.as_bytes()
