"""The efficiency email: ``view`` decides what it says, ``message`` builds
it, ``queue`` spools it, ``send`` delivers it (SMTP or MailProg) exactly once.

Spool layout (all directories 0700, files 0600)::

    <spool_dir>/mail/new/<qid>.eml     queued (waiting, or deferred until next_try)
    <spool_dir>/mail/tmp/<qid>.eml     claimed by the running flush (being sent)
    <spool_dir>/mail/tmp/.stage.*      enqueue's staging files (never sent)
    <spool_dir>/mail/sent/<qid>.eml    delivered
    <spool_dir>/mail/failed/<qid>.eml  given up (see state/<qid>.json "last_error")
    <spool_dir>/mail/state/<qid>.json  {"attempts", "next_try", "last_error", ...}
    <spool_dir>/mail/.flush.lock       held by a flush for its whole run
    <spool_dir>/mail/.queue.lock       held for each (short) move between folders

Exactly once: messages move only by ``rename``, under ``.queue.lock`` (never
held while talking to a server); only a crash between the server's accept and
the rename to ``sent/`` sends one again, with the same ``Message-ID``.
"""

from __future__ import annotations

from gsrun.base.fsutil import read_json   # the queue's state files; callers read them through here
from gsrun.report.mail.view import (clean_block, clean_line, mail_kind, mail_view, mail_wanted, render_html,
                                    render_text, subject_line)
from gsrun.report.mail.message import (build_message, message_id, new_message, set_text_header, SpooledMessage,
                                       validate_addr, wire_bytes)
from gsrun.report.mail.send import deliver, MailError, send_mailprog, send_smtp
from gsrun.report.mail.queue import backoff_s, enqueue, flush, _move, prune, queue_status, retry_failed

__all__ = [
    "MailError", "build_message", "mail_wanted", "mail_kind", "mail_view", "subject_line", "message_id",
    "validate_addr", "clean_line", "clean_block", "set_text_header", "enqueue", "flush", "deliver", "send_smtp",
    "send_mailprog", "queue_status", "backoff_s", "prune", "retry_failed", "render_text", "render_html",
    "SpooledMessage", "wire_bytes", "new_message", "read_json", "_move",
]
