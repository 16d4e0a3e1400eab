"""The efficiency email: build the message, spool it, deliver it exactly once.

Four modules, in the project's facts / decisions / effects split:

- **What it says** (:mod:`~gsrun.report.mail.view`, pure): :func:`mail_wanted` (Slurm ``MailType`` + site
  ``mail.policy``), :func:`mail_kind` (report, cancelled before start,
  no run, requeued), :func:`mail_view` (every number the templates print,
  already formatted), :func:`subject_line`;
- **The message** (:mod:`~gsrun.report.mail.message`, pure):
  :func:`build_message` (a
  ``multipart/alternative`` text + HTML message, the timeline PNG inline in a
  ``multipart/related`` part referenced by ``cid:``).
- **Spool** (:mod:`~gsrun.report.mail.queue`, effects): :func:`enqueue` writes the message atomically
  (mode 0600) into ``<spool_dir>/mail/new/<jobid>.eml``, once per job id.
  :func:`flush` delivers queued messages through
- **the sender** (:mod:`~gsrun.report.mail.send`, effects: SMTP or the site's
  sendmail-compatible MailProg), with retry and capped exponential
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

from gsrun.base.fsutil import read_json   # the queue's state files; callers read them through here
from gsrun.report.mail.view import (_ANSI_RE, _BIDI, clean_block, clean_line, DEVICE_COLUMNS, _gpu_headline,
                                    LEVEL_COLOR, mail_kind, MAIL_TYPES, mail_view, mail_wanted, PHASE,
                                    render_html, render_text, SEVERITY_COLOR, subject_line)
from gsrun.report.mail.message import (_ADDR_RE, build_message, MAX_PNG_BYTES, message_id, PNG_MAGIC,
                                       set_text_header, SpooledMessage, _STRICT, validate_addr, _WIDE_HEADERS,
                                       wire_bytes)
from gsrun.report.mail.send import (_cfg, _crlf, deliver, _envelope, MailError, _MAILPROG_PERMANENT,
                                    _read_password, send_mailprog, send_smtp)
from gsrun.report.mail.queue import (BACKOFF_BASE_S, BACKOFF_CAP_S, backoff_s, enqueue, _find, flush, _Lock,
                                     _mail_dir, _move, prune, _qid, QID_RE, _queue_lock, queue_status,
                                     _read_msg, retry_failed, SUBDIRS)

__all__ = [
    "MailError", "build_message", "mail_wanted", "mail_kind", "mail_view", "subject_line", "message_id",
    "validate_addr", "clean_line", "clean_block", "set_text_header", "enqueue", "flush", "deliver", "send_smtp",
    "send_mailprog", "queue_status", "backoff_s", "prune", "retry_failed", "render_text", "render_html",
    "SpooledMessage", "wire_bytes",
]
