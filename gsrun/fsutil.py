"""Safe file effects for root code: atomic writes and owned directories.

Root writes into directories users can also reach (spool, MPS pipe dirs), so
every open refuses symlinks (``O_NOFOLLOW``) and every directory is checked
after creation (owner, mode, not a link).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from .errors import NodeError


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory,
    ``fsync`` it, ``rename`` over the target, ``fsync`` the directory.

    A crash leaves either the old file or the new one, never half of one.
    A symlink at ``path`` is replaced, never followed.
    """
    path = Path(path)
    d = path.parent
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=d)
    try:
        os.fchmod(fd, mode)
        if uid is not None or gid is not None:
            os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_json(path, obj, mode: int = 0o644, uid=None, gid=None) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", mode, uid, gid)


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


def ensure_dir(path: str | os.PathLike, mode: int, uid: int = 0, gid: int = 0) -> Path:
    """Create ``path`` (parents must exist) owned by ``uid:gid`` with ``mode``,
    or fix an existing one that we own.

    Raises:
        NodeError: ``path`` is a symlink or not a directory (something was
            planted there ahead of us), or it is owned by another user.
    """
    path = Path(path)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NodeError("fs", "refusing planted path", f"{path} is not a plain directory",
                        hint="remove it; gsrun creates its own directories")
    if os.geteuid() == 0:
        if st.st_uid not in (0, uid):
            raise NodeError("fs", "refusing foreign directory",
                            f"{path} is owned by uid {st.st_uid}, expected {uid}")
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)
    return path


def remove_tree(path: str | os.PathLike) -> None:
    """``rm -rf`` without following symlinks (a link inside is unlinked, its
    target is left alone)."""
    import shutil

    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        os.unlink(p)
        return
    shutil.rmtree(p, ignore_errors=True)
