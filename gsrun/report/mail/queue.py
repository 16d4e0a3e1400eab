"""The mail spool queue (effects); layout and the exactly-once argument:
:mod:`gsrun.report.mail`.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import time
from contextlib import suppress
from email import policy as email_policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any, Callable

from gsrun.base.errors import InputError, NodeError
from gsrun.base.fsutil import atomic_write, atomic_write_json, ensure_dir, flock_within, read_json
from gsrun.report.units import as_number
from gsrun.report.mail.message import SpooledMessage, wire_bytes
from gsrun.report.mail.send import MailError, _cfg, deliver
from gsrun.report.mail.view import PHASE


SUBDIRS = ("new", "tmp", "sent", "failed", "state")
BACKOFF_BASE_S = 60.0
BACKOFF_CAP_S = 3600.0
QID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


def _qid(job_id: Any) -> str:
    s = str(job_id)
    if not QID_RE.fullmatch(s):
        raise InputError(PHASE, "bad job id", f"{s!r}", hint="expected e.g. 42 or 15053872_1491")
    return s


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
    """Queue ``msg`` as ``mail/new/<job_id>.eml`` (0600), once per id: an id already anywhere in the
    spool writes nothing and returns that file's path.

    Raises:
        InputError: ``job_id`` is not a queue id (``42``, ``15053872_1491``).
        NodeError: the spool is missing, or ``mail/`` is a symlink or not ours (planted).
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
        stage.unlink(missing_ok=True)


def queue_status(spool_dir) -> dict:
    """Folder -> sorted queue ids (``gsrun-node mail status``)."""
    base = _mail_dir(spool_dir)
    return {sub: sorted(_qids(base / sub)) for sub in ("new", "tmp", "sent", "failed")}


def _qids(folder: Path) -> list[str]:
    """The queue ids of ``folder``'s messages, in file name order (staging files left out)."""
    return [p.name[:-4] for p in sorted(folder.iterdir()) if p.name.endswith(".eml") and not p.name.startswith(".")]


def backoff_s(attempts: int) -> float:
    """Seconds after the ``attempts``-th failure: 60, 120, 240 ... up to 3600."""
    return min(BACKOFF_BASE_S * (2 ** max(0, attempts - 1)), BACKOFF_CAP_S)


def _read_msg(path: Path) -> SpooledMessage:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    msg = BytesParser(SpooledMessage, policy=email_policy.default).parsebytes(raw)
    msg.raw = raw
    return msg


def _move(base: Path, qid: str, src: str, dst: str) -> bool:
    """Rename ``<src>/<qid>.eml`` to ``<dst>/`` under the queue lock; False if no longer in ``src``."""
    with _queue_lock(base):
        try:
            os.rename(base / src / f"{qid}.eml", base / dst / f"{qid}.eml")
            return True
        except FileNotFoundError:
            return False


def flush(spool_dir, cfg, now: float | None = None,
          send: Callable[[EmailMessage, Any], None] | None = None) -> dict:
    """Deliver the due messages (``gsrun-node mail flush``) through ``send(msg, cfg)`` (default
    :func:`deliver`). Each is claimed into ``tmp/``, then moved to ``sent/``, back to ``new/`` with a
    backoff, or to ``failed/`` (permanent or ``mail.max_attempts``); after an ``outage`` the rest count
    an attempt untried. -> ``{"sent", "failed", "deferred" (still queued), "busy" (another flush held
    the lock past timeouts.command_s)}``.

    Raises:
        NodeError: the spool is missing or planted.
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
        # under the flush lock, anything in tmp/ is a dead flush's
        for qid in _qids(base / "tmp"):
            _move(base, qid, "tmp", "new")
        outage: MailError | None = None
        for qid in _qids(base / "new"):
            t = time.time() if now is None else now
            state_path = base / "state" / f"{qid}.json"
            state = read_json(state_path) or {}
            attempts = int(state.get("attempts") or 0)
            if (as_number(state.get("next_try")) or 0) > t:
                result["deferred"] += 1
                continue
            if not _move(base, qid, "new", "tmp"):
                continue
            err: MailError | None = outage
            if err is None:
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
                dst, count = "sent", "sent"
            else:
                outage = err if err.outage else outage
                state["last_error"] = str(err).split("\n")[0]
                if err.permanent or attempts >= max_attempts:
                    state.update({"failed_at": t, "next_try": None})
                    dst, count = "failed", "failed"
                else:
                    state["next_try"] = t + backoff_s(attempts)
                    dst, count = "new", "deferred"
            atomic_write_json(state_path, state, mode=0o600)
            _move(base, qid, "tmp", dst)
            result[count] += 1
    finally:
        lock.close()
    return result


def retry_failed(spool_dir, job_id: str | None = None) -> list[str]:
    """Requeue ``failed/`` messages (one, or all) with no attempts; -> their ids. Waits for the flush lock."""
    base = _mail_dir(spool_dir)
    qids = [_qid(job_id)] if job_id is not None else queue_status(spool_dir)["failed"]
    done = []
    lock = _Lock(base / ".flush.lock")
    try:
        lock.acquire(None)
        for qid in qids:
            (base / "state" / f"{qid}.json").unlink(missing_ok=True)
            if _move(base, qid, "failed", "new"):
                done.append(qid)
    finally:
        lock.close()
    return done


def prune(spool_dir, max_age_s: float = 30 * 86400, now: float | None = None) -> int:
    """Remove ``sent/`` and ``failed/`` messages older than ``max_age_s`` (their ids can queue again) and
    staging files older than a day. -> messages removed."""
    base = _mail_dir(spool_dir)
    t = time.time() if now is None else now
    removed = 0
    with _queue_lock(base):
        for sub in ("sent", "failed"):
            for p in (base / sub).iterdir():
                with suppress(FileNotFoundError):
                    if p.name.endswith(".eml") and t - os.lstat(p).st_mtime > max_age_s:
                        os.unlink(p)
                        removed += 1
                        (base / "state" / (p.name[:-4] + ".json")).unlink(missing_ok=True)
        for p in (base / "tmp").iterdir():
            with suppress(FileNotFoundError):
                if p.name.startswith(".stage.") and t - os.lstat(p).st_mtime > 86400:
                    os.unlink(p)
    return removed
