"""Safe file effects for root code: atomic writes and owned directories.

Root writes into directories users can also reach (spool, MPS pipe dirs), so
every open refuses symlinks (``O_NOFOLLOW``) and every directory is checked
after creation (owner, mode, not a link).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import time
from contextlib import suppress
from pathlib import Path

from gsrun.base.errors import NodeError


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file, ``fsync``, ``rename``,
    ``fsync`` of the directory (``durable=False``: no fsyncs; a crash may lose
    the write). A crash, ``ENOSPC`` or signal leaves the old or the new file,
    never half, no temp file. Everything is relative to the directory opened
    ``O_NOFOLLOW``: a symlink at ``path`` is replaced, a directory swapped
    for a link is never written through.

    Raises:
        OSError: the directory is missing or is a symlink (``ELOOP``/``ENOTDIR``),
            disk full, read-only file system.
    """
    parent, base = _split(path)
    raw = data.encode() if isinstance(data, str) else data
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        tmp = None
        for _ in range(100):
            name = f".{base}.{os.getpid()}.{os.urandom(4).hex()}"
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=dfd)
                tmp = name
                break
            except FileExistsError:
                continue
        if tmp is None:
            raise FileExistsError(f"no temp name free in {parent}")
        try:
            os.fchmod(fd, mode)
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
            os.close(fd)
            fd = None
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            if fd is not None:
                os.close(fd)
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if durable:
            with suppress(OSError):
                os.fsync(dfd)
    finally:
        os.close(dfd)


def json_text(obj) -> str:
    """How gsrun writes a JSON file: compact, sorted keys, one trailing newline."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n"


def _split(path) -> tuple[str, str]:
    """``path`` -> (its directory, its name); ``"f"`` -> ``(".", "f")``."""
    p = os.fspath(path)
    p = p.rstrip("/") or p
    head, name = os.path.split(p)
    return head or ".", name


def atomic_write_json(path, obj, mode: int = 0o644, uid=None, gid=None, durable: bool = True) -> None:
    atomic_write(path, json_text(obj), mode, uid, gid, durable)


def flock_within(fd: int, timeout_s: float, poll_s: float = 0.005) -> bool:
    """Take an exclusive ``flock`` on ``fd``, polling (never blocking) for up
    to ``timeout_s``; False when another holder kept it that long.

    Raises:
        OSError: ``flock`` refused for another reason (``ENOLCK``: a file
            system without locks)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def read_bounded(path, max_bytes: int, owners=None, dir_fd: int | None = None) -> bytes | None:
    """The bytes of ``path`` when a regular file owned by one of ``owners``
    (default: this user), not group/other-writable, at most ``max_bytes``;
    else None. Opened once ``O_NOFOLLOW|O_NONBLOCK``, checked by ``fstat``,
    read at most ``max_bytes + 1``: the one reader of files root decides from."""
    allowed = (os.geteuid(),) if owners is None else tuple(owners)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in allowed or st.st_mode & 0o022 \
                or st.st_size > max_bytes:
            return None
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def read_own_file(path: str, max_bytes: int) -> bytes | None:
    """:func:`read_bounded` of a file owned by this process's user (its caches)."""
    return read_bounded(path, max_bytes)


#: Largest spool JSON file gsrun reads (a 64-GPU, 30-day job's summary is a few MiB)
MAX_SPOOL_JSON_BYTES = 64 << 20


def spool_owners() -> tuple[int, ...]:
    """Trusted spool file owners: root, plus this user when not root."""
    return (0,) if os.geteuid() == 0 else (0, os.geteuid())


def read_spool_json(path, max_bytes: int = MAX_SPOOL_JSON_BYTES) -> dict | None:
    """The JSON object in ``path`` read by :func:`read_bounded` from
    :func:`spool_owners`; None when absent, refused or not an object."""

    raw = read_bounded(path, max_bytes, spool_owners())
    if raw is None:
        return None
    try:
        d = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) else None


def read_json(path) -> dict | None:
    """JSON object from ``path`` (no symlink followed), or None if absent/corrupt."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read().decode())
    except (ValueError, OSError, UnicodeDecodeError):
        return None


#: The mode of a user's copy in the spool (``user-*.json``): root's, group-readable
USER_COPY_MODE = 0o440


def write_user_copy(path, data: str | bytes, gid: int | None, durable: bool = True) -> None:
    """Write a user's copy (``user-*.json``) with :func:`atomic_write`: root's,
    group ``gid``, :data:`USER_COPY_MODE`. The user can neither write, grow,
    replace nor ``chmod`` it, so root may read it back; no ACL (works on NFS).
    Not root (tests): the caller's own file.

    Raises:
        OSError: as :func:`atomic_write`."""
    root = os.geteuid() == 0
    atomic_write(path, data, USER_COPY_MODE, uid=0 if root else None,
                 gid=gid if root and gid is not None else None, durable=durable)


def ensure_dir(path: str | os.PathLike, mode: int, uid: int = 0, gid: int = 0,
               replace_planted: bool = False, log=None) -> Path:
    """Create ``path`` (parents must exist) as ``uid:gid`` ``mode``, or fix
    an existing one we own, through one ``O_NOFOLLOW|O_DIRECTORY`` descriptor.
    ``replace_planted``: something else found there is renamed to
    ``.planted-<name>-<unix time>`` (``log(msg)`` says so) and a fresh
    directory made.

    Raises:
        NodeError: ``path`` is a symlink or not a directory (something was
            planted there ahead of us), or it is owned by another user
            (without ``replace_planted``), or it cannot be created.
    """
    path = Path(path)
    for attempt in range(2):
        with suppress(FileExistsError):
            os.mkdir(path, mode)
        problem = None
        fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            problem = ("refusing planted path", f"{path} is not a plain directory")
        if fd is not None:
            st = os.fstat(fd)
            if os.geteuid() == 0 and st.st_uid not in (0, uid):
                problem = ("refusing foreign directory", f"{path} is owned by uid {st.st_uid}, expected {uid}")
        if problem is None:
            try:
                if os.geteuid() == 0:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            return path
        if fd is not None:
            os.close(fd)
        if not replace_planted or attempt:
            raise NodeError("fs", problem[0], problem[1], hint="remove it; gsrun creates its own directories")
        aside = path.with_name(f".planted-{path.name}-{int(time.time())}")
        try:
            os.rename(path, aside)
        except OSError as e:
            raise NodeError("fs", problem[0], f"{problem[1]}; cannot move it aside: {e.strerror}") from None
        if log is not None:
            log(f"{problem[0]}: {problem[1]}: moved aside to {aside}, made a fresh directory")
    raise AssertionError("unreachable")


def unlink_names(directory: str | os.PathLike, names) -> list[str]:
    """Unlink ``names`` (or the entries a predicate picks) relative to
    ``directory`` opened ``O_NOFOLLOW``; missing ones are no error. Returns
    the names removed.

    Raises:
        OSError: the directory is a symlink (``ELOOP``) or cannot be listed,
            an entry cannot be removed (permissions, read-only file system).
    """
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    gone = []
    try:
        wanted = [n for n in os.listdir(dfd) if names(n)] if callable(names) else list(names)
        for name in wanted:
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dfd)
                gone.append(name)
    finally:
        os.close(dfd)
    return gone


def remove_tree(path: str | os.PathLike) -> None:
    """``rm -rf`` without following symlinks."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        os.unlink(p)
        return
    shutil.rmtree(p, ignore_errors=True)


def publish_once(path: str | os.PathLike, data: bytes, mode: int = 0o600) -> bool:
    """Write ``path`` atomically unless it exists (``link`` of a staged file:
    exclusive on every node of a shared spool); True when this call did."""
    path = Path(path)
    stage = path.with_name(f".stage.{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    atomic_write(stage, data, mode)
    try:
        os.link(stage, path)
        return True
    except FileExistsError:
        return False
    finally:
        with suppress(FileNotFoundError):
            os.unlink(stage)
