"""The one journal of node changes: tuning, MPS and MIG write their prior
values here before they change anything, and restore from it.

A journal is one JSON object in one file, root ``0600``, replaced atomically
(:func:`gsrun.base.fsutil.atomic_write`), never written through a symlink.
The owner's fields are at the top level; the journal adds one key::

    "journal": {"format": 2, "kind": "tuning"|"tuning-job"|"mps"|"mig",
                "boot_id": "<uuid from /proc/sys/kernel/random/boot_id>"|null,
                "written_unix": <float, seconds>, "pid": <int, the writer>}

Each owner decides what a journal of an earlier boot
(:attr:`Loaded.earlier_boot`) means. Format 1 (no ``"journal"`` key) is still read.
"""

from __future__ import annotations

import os
import stat
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from gsrun.base.errors import NodeError
from gsrun.base.fsutil import atomic_write_json, flock_within, read_json
from gsrun.facts.hostfs import HostFS

FORMAT = 2
HEADER = "journal"
BOOT_ID = "proc/sys/kernel/random/boot_id"
LOCK_TIMEOUT_S = 30.0
MODE = 0o600


def boot_id(hostfs=None) -> str | None:
    """This boot's id under ``hostfs`` (None: the live host), or ``None`` when unreadable."""
    if hostfs is None:
        hostfs = HostFS("/")
    try:
        v = hostfs.read(BOOT_ID)
    except (OSError, NodeError):
        return None
    return v.strip() or None if v else None


@dataclass(frozen=True, slots=True)
class Loaded:
    """A journal as read: ``data`` (without the header), ``format``, the
    ``boot_id`` it was written in (None: unknown), ``earlier_boot``."""

    data: dict
    format: int
    boot_id: str | None
    earlier_boot: bool


class Journal:
    """One journal file of ``kind``; ``hostfs``: where the boot id is read
    (None: live host); ``uid``: the file's owner (None: the writer's);
    ``lock_path``: what :meth:`lock` flocks (default: the journal's directory).
    """

    def __init__(self, path, kind: str, hostfs=None, uid: int | None = None, lock_path=None):
        self.path = Path(path)
        self.kind = kind
        self.hostfs = hostfs
        self.uid = uid
        self.lock_path = Path(lock_path) if lock_path is not None else self.path.parent
        self._boot: str | None = None

    def boot_id(self) -> str | None:
        if self._boot is None:
            self._boot = boot_id(self.hostfs)
        return self._boot

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def load(self) -> Loaded | None:
        """The journal, or ``None`` when absent or not a JSON object (:meth:`exists`
        tells the two apart). No symlink is followed."""
        raw = read_json(self.path)
        if not isinstance(raw, dict):
            return None
        head = raw.pop(HEADER, None)
        if isinstance(head, dict):
            fmt, bid = int(head.get("format") or FORMAT), head.get("boot_id")
        else:                       # format 1: no header
            fmt, bid = 1, raw.get("boot_id")
        bid = bid if isinstance(bid, str) and bid else None
        now = self.boot_id()
        return Loaded(raw, fmt, bid, bool(bid and now and bid != now))

    def read(self) -> dict | None:
        """The owner's fields (:meth:`load` without the header), or ``None``."""
        got = self.load()
        return got.data if got else None

    def write(self, data: dict) -> None:
        """Replace the journal with ``data`` (a JSON object; its ``"journal"``
        key is the header, set here): atomic, fsync'd, mode 0600.

        Raises:
            OSError: directory missing or a symlink, disk full, read-only.
        """
        doc = {k: v for k, v in data.items() if k != HEADER}
        doc[HEADER] = {"format": FORMAT, "kind": self.kind, "boot_id": self.boot_id(),
                       "written_unix": round(time.time(), 3), "pid": os.getpid()}
        atomic_write_json(self.path, doc, mode=MODE, uid=self.uid)

    def remove(self, durable: bool = True) -> None:
        """Delete the journal (absent is fine), fsync'ing its directory
        (``durable=False``: not; a crash of the machine may bring it back,
        as a journal of an earlier boot)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return          # nothing removed: nothing to make durable
        if durable:
            with suppress(OSError):
                dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)

    def lock(self, timeout_s: float = LOCK_TIMEOUT_S) -> "_Flock":
        """Hold an exclusive ``flock`` on :attr:`lock_path` for the ``with`` block.

        Raises (on entering):
            NodeError: held by another process over ``timeout_s``, or the path
                is unusable (a symlink, missing).
        """
        return _Flock(self, timeout_s)


class _Flock:
    """:meth:`Journal.lock`'s context manager (a class: no ``contextlib`` on the hooks' path)."""

    __slots__ = ("journal", "timeout_s", "fd")

    def __init__(self, journal: Journal, timeout_s: float):
        self.journal, self.timeout_s, self.fd = journal, timeout_s, None

    def __enter__(self) -> None:
        j, timeout_s = self.journal, self.timeout_s
        is_dir = j.lock_path == j.path.parent
        flags = os.O_RDONLY | os.O_DIRECTORY if is_dir else os.O_RDWR | os.O_CREAT
        try:
            fd = os.open(j.lock_path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, MODE)
        except OSError as e:
            raise NodeError("journal", "cannot lock", f"{j.lock_path}: {e.strerror}") from None
        try:
            if not is_dir and not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NodeError("journal", "cannot lock", f"{j.lock_path} is not a plain file")
            if not flock_within(fd, timeout_s):
                raise NodeError("tune" if j.kind.startswith("tuning") else j.kind, "lock timeout",
                                f"{j.lock_path} held for more than {timeout_s:g} s")
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def __exit__(self, *exc) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # releases the flock
