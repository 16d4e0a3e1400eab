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
from pathlib import Path

from gsrun.base.errors import NodeError


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None, durable: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory,
    ``fsync`` it, ``rename`` over the target, ``fsync`` the directory.
    ``durable=False`` leaves out both ``fsync`` calls: readers still see the
    old file or the new one, never half of one, but a crash may lose the
    last write (for a file rewritten every few seconds that nobody needs
    after a crash: the Prometheus textfile).

    A crash, a full disk (``ENOSPC``) or a signal leaves either the old file or
    the new one, never half of one, and no temp file. A symlink at ``path`` is
    replaced, never followed; the directory itself is opened with
    ``O_NOFOLLOW`` and every operation is relative to that descriptor, so a
    directory swapped for a symlink (``<spool>/jobs/<id> -> /etc``) is never
    written through.

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
            while view:                     # os.write, no file object: this runs at every sampler flush
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
            os.close(fd)
            fd = None
            os.replace(tmp, base, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            if fd is not None:
                os.close(fd)
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        if durable:
            try:
                os.fsync(dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)


def json_text(obj) -> str:
    """How gsrun writes a JSON file: compact, sorted keys, one trailing newline."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n"


def _split(path) -> tuple[str, str]:
    """``path`` -> (its directory, its name), as ``Path(path).parent`` and
    ``.name`` give them (``"f"`` -> ``(".", "f")``), without :mod:`pathlib`."""
    p = os.fspath(path)
    p = p.rstrip("/") or p
    head, name = os.path.split(p)
    return head or ".", name


def atomic_write_json(path, obj, mode: int = 0o644, uid=None, gid=None, durable: bool = True) -> None:
    """:func:`json_text` of ``obj`` written by :func:`atomic_write` (``durable``: see there)."""
    atomic_write(path, json_text(obj), mode, uid, gid, durable)


def flock_within(fd: int, timeout_s: float, poll_s: float = 0.005) -> bool:
    """Take an exclusive ``flock`` on ``fd``, trying every ``poll_s`` seconds
    for up to ``timeout_s`` (``LOCK_NB``: never a blocking call). True when
    held (released when ``fd`` is closed), False when another holder kept it
    that long.

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
    """The bytes of ``path`` when it is a regular file owned by one of
    ``owners`` (uids; default: this process's user), not writable by group or
    others, at most ``max_bytes`` long; else None (absent, a link -- never
    followed --, a FIFO -- never blocked on --, another owner, too big,
    unreadable). Opened once with ``O_NOFOLLOW`` and checked with ``fstat`` on
    that descriptor (no check-then-read race); reads stop after
    ``max_bytes + 1`` bytes, so a file grown after the ``fstat`` is refused
    too. ``dir_fd``: ``path`` relative to that directory. The one reader of
    files root decides from: what another user could have written is never
    read."""
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
    """:func:`read_bounded` of a file owned by this process's user: for the
    caches gsrun keeps for itself (the parsed config, slurmctld's config)."""
    return read_bounded(path, max_bytes)


#: Largest spool JSON file gsrun reads (summaries, node and live files); a
#: 64-GPU, 30-day job's summary is a few MiB.
MAX_SPOOL_JSON_BYTES = 64 << 20


def spool_owners() -> tuple[int, ...]:
    """The owners a spool file may have for this process to trust it: root
    (every spool file is root's), plus this process's user when it is not
    root (its own test spool, or a file only it could have hurt)."""
    return (0,) if os.geteuid() == 0 else (0, os.geteuid())


def read_spool_json(path, max_bytes: int = MAX_SPOOL_JSON_BYTES) -> dict | None:
    """The JSON object in the spool file ``path`` read by :func:`read_bounded`
    (owner root -- or this user when not root --, not group- or
    other-writable, at most ``max_bytes``), None when absent, refused or not
    a JSON object."""

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


#: The mode of a user's copy in the spool (``user-*.json``): root's file,
#: readable by the job's group, writable by nobody but root.
USER_COPY_MODE = 0o440


def write_user_copy(path, data: str | bytes, gid: int | None, durable: bool = True) -> None:
    """Write a user's copy of a spool file (``user-summary.json``,
    ``user-node-<node>.json``, ``user-live-<node>.json``,
    ``user-mig-<node>.json``) with :func:`atomic_write`: owned by root, group
    ``gid`` (the job's group), mode :data:`USER_COPY_MODE`. The user reads it
    through the group and can neither write, grow, replace (the job
    directory is root's) nor ``chmod`` it, so root may read it back with
    :func:`read_spool_json`. Plain owner and group bits, no ACL: the same on
    local disks and NFS. Not root (tests): the caller's own file, group unchanged.

    Raises:
        OSError: as :func:`atomic_write`."""
    root = os.geteuid() == 0
    atomic_write(path, data, USER_COPY_MODE, uid=0 if root else None,
                 gid=gid if root and gid is not None else None, durable=durable)


def ensure_dir(path: str | os.PathLike, mode: int, uid: int = 0, gid: int = 0,
               replace_planted: bool = False, log=None) -> Path:
    """Create ``path`` (parents must exist) owned by ``uid:gid`` with ``mode``,
    or fix an existing one that we own.

    The directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` and checked and
    changed through that descriptor (``fstat``/``fchown``/``fchmod``), so a
    symlink swapped in after the check is never followed.

    ``replace_planted``: a symlink, a non-directory or a directory owned by
    another user found at ``path`` is moved aside (renamed, not followed, to
    ``.planted-<name>-<unix time>`` in the same parent, for the admin to look
    at) and a fresh directory is made; ``log(msg)`` says so.

    Raises:
        NodeError: ``path`` is a symlink or not a directory (something was
            planted there ahead of us), or it is owned by another user
            (without ``replace_planted``), or it cannot be created.
    """
    path = Path(path)
    for attempt in range(2):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
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
    """Unlink the entries of ``directory`` named by ``names`` (an iterable of
    names, or a predicate ``name -> bool`` over the directory's listing),
    relative to the directory opened with ``O_NOFOLLOW``: a symlinked
    directory is never entered, a link among the names is removed, never
    followed. A missing directory or name is no error. Returns the names
    removed, in the order tried.

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
            try:
                os.unlink(name, dir_fd=dfd)
                gone.append(name)
            except FileNotFoundError:
                pass
    finally:
        os.close(dfd)
    return gone


def remove_tree(path: str | os.PathLike) -> None:
    """``rm -rf`` without following symlinks (a link inside is unlinked, its
    target is left alone)."""
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
    """Write ``path`` atomically unless it exists: a staged file is hard-linked
    to the name (``link`` fails when the name exists, on every node of a
    shared spool). Returns True when this call published it."""
    path = Path(path)
    stage = path.with_name(f".stage.{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    atomic_write(stage, data, mode)
    try:
        os.link(stage, path)
        return True
    except FileExistsError:
        return False
    finally:
        try:
            os.unlink(stage)
        except FileNotFoundError:
            pass
