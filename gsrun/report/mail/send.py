"""Delivery of one message (effects): by SMTP (:func:`send_smtp`) or the
site's sendmail-compatible MailProg (:func:`send_mailprog`); :func:`deliver`
picks one. A failure is a :class:`MailError` that says whether retrying can help.
"""

from __future__ import annotations

import email.utils
import os
import smtplib
import socket
import ssl
import stat
import subprocess
from email.message import EmailMessage

from gsrun.base.errors import GsrunError
from gsrun.report.mail.message import validate_addr, wire_bytes
from gsrun.report.mail.view import PHASE, clean_line
from gsrun.request.config import SETTINGS


class MailError(GsrunError):
    """Delivery failed. ``permanent``: refused for good (5xx, unknown recipient); ``outage``: server
    unreachable, so this run tries no other message."""

    def __init__(self, what: str, detail: str, hint: str | None = None, *,
                 permanent: bool = False, outage: bool = False):
        super().__init__(PHASE, what, detail, hint)
        self.permanent = permanent
        self.outage = outage


def _cfg(cfg, key: str):
    try:
        return cfg[key]
    except KeyError:
        return {s.key: s.default for s in SETTINGS}[key]


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
    """Deliver by SMTP (``mail.smtp_*``, STARTTLS, AUTH), each socket call bounded by ``timeouts.command_s``.

    Raises:
        MailError: ``permanent`` for a 5xx refusal; ``outage`` when unreachable or timed out (down,
            firewalled, wrong host/port); else temporary (4xx, auth or TLS: likely the config).
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
    """Deliver through a sendmail-compatible ``mail.mailprog`` (``-i -f FROM -- TO...``, message on stdin).

    Raises:
        MailError: not executable, timed out, or a non-zero exit (permanent for 65 and 67).
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


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
