"""Root's private Unix sockets: the node daemon's and its monitor's.

- :func:`peer` -- who is on the other end (``SO_PEERCRED``: the kernel's, at connect);
- :func:`check_dir` -- the socket's directory is this uid's and closed to others, so
  nobody else can replace the socket file;
- :func:`bind_private` -- listen on a path, mode 0600, made under a temporary name and
  renamed over the path, so a client never meets a half-made socket.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from contextlib import suppress

from gsrun.base.errors import NodeError


def peer(conn) -> tuple[int, int]:
    """``(pid, uid)`` of the process on the other end of ``conn``."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def check_dir(path: str, phase: str, missing_hint: str, open_hint: str) -> None:
    """Raise unless the directory of ``path`` is a directory of this uid that
    group and others cannot write.

    Raises:
        NodeError: ``<phase>: socket directory: ...`` with ``missing_hint``
            (it is missing) or ``open_hint`` (not a directory, another owner,
            writable by others).
    """
    d = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(d)
    except OSError as e:
        raise NodeError(phase, "socket directory", f"{d}: {e.strerror}", hint=missing_hint) from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise NodeError(phase, "socket directory", f"{d}: not a directory of uid {os.geteuid()} closed to others",
                        hint=open_hint)


def bind_private(path: str, backlog: int) -> tuple[socket.socket, tuple[int, int]]:
    """A non-blocking listening socket at ``path`` (mode 0600), made under
    ``<path>.<pid>.new`` and renamed over ``path``. -> the socket and the
    file's ``(st_dev, st_ino)`` (``fstat`` of the socket names the socket,
    not its file: the id to check before removing the path later).
    Raises OSError."""
    tmp = f"{path}.{os.getpid()}.new"
    with suppress(FileNotFoundError):
        os.unlink(tmp)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        s.bind(tmp)
    finally:
        os.umask(old_umask)
    os.chmod(tmp, 0o600)
    st = os.lstat(tmp)
    s.listen(backlog)
    os.rename(tmp, path)
    s.setblocking(False)
    return s, (st.st_dev, st.st_ino)
