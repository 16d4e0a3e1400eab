"""The one door to the host's ``/proc`` and ``/sys`` (and ``/dev``, ``/etc``).

Every reader and writer of host files takes a :class:`HostFS`. Its root is
``/`` on a real node, or a directory holding a recorded or fake tree
(``sys/``, ``proc/``, optionally ``nvml.json``), chosen with ``--host-root DIR``
or ``GSRUN_HOST_ROOT`` -- like node_exporter's ``--path.sysfs``. With a fake
root every read *and* write stays under it, so tuning can be tested for real
against a fake tree.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gsrun.base.errors import InputError

ENV_HOST_ROOT = "GSRUN_HOST_ROOT"
_MEMINFO_KB = re.compile(r"(?m)^(?:Node [0-9]+ )?(\S+):[ \t]+([0-9]+)[ \t]*kB")


def meminfo_kb(text: str) -> dict[str, int]:
    """``/proc/meminfo`` or a NUMA node's ``nodeN/meminfo`` text (``Node N``
    before each key) -> ``{"MemTotal": kB, "MemFree": kB, ...}``, the first
    of each key; counts without a unit (``HugePages_Total``) are left out. Pure."""
    out: dict[str, int] = {}
    for m in _MEMINFO_KB.finditer(text):
        out.setdefault(m[1], int(m[2]))
    return out


class HostFS:
    """Paths (``"sys/bus/pci/devices"``) resolved under :attr:`root`. Reads
    give None for an absent or unreadable file (absence is a fact); writes
    raise ``OSError`` for the caller to journal."""

    def __init__(self, root: str | os.PathLike = "/"):
        self._root = str(Path(root))
        if not os.path.isdir(self._root):
            raise InputError("hostfs", "host root is not a directory", str(root),
                             hint="--host-root DIR must hold sys/ and proc/")
        self._real = os.path.realpath(self._root) == "/"

    @classmethod
    def from_env(cls, host_root: str | None = None, environ=None) -> "HostFS":
        """``host_root`` if given, else ``$GSRUN_HOST_ROOT``, else ``/``."""
        environ = os.environ if environ is None else environ
        return cls(host_root or environ.get(ENV_HOST_ROOT) or "/")

    @property
    def root_dir(self) -> str:
        """The root as a string (no :mod:`pathlib`: the hooks' import budget)."""
        return self._root

    @property
    def root(self) -> Path:
        """The root as a :class:`~pathlib.Path`."""
        return Path(self._root)

    @property
    def is_real(self) -> bool:
        """True when this is the live host (root ``/``, resolved once when made)."""
        return self._real

    def _p(self, rel: str) -> str:
        """``rel`` under the root, as a string.

        Raises:
            InputError: ``rel`` has a ``..`` component (it would leave the root)."""
        rel = str(rel).lstrip("/")
        if ".." in rel.split("/"):
            raise InputError("hostfs", "path escapes host root", rel)
        return os.path.join(self._root, rel)

    def path(self, rel: str) -> Path:
        return Path(self._p(rel))

    def readlink(self, rel: str) -> str | None:
        """The target of the symlink ``rel`` as written (``os.readlink``),
        None when ``rel`` is not a symlink or cannot be read."""
        try:
            return os.readlink(self._p(rel))
        except (OSError, ValueError):
            return None

    def read(self, rel: str) -> str | None:
        """File text stripped of the trailing newline, or None if absent."""
        try:
            with open(self._p(rel), errors="replace") as f:
                return f.read().rstrip("\n")
        except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
            return None
        except OSError:
            return None

    def read_int(self, rel: str) -> int | None:
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text.strip().split()[0])
        except (ValueError, IndexError):
            return None

    def mem_total_bytes(self) -> int | None:
        """The node's memory: ``MemTotal`` of ``proc/meminfo`` (kB) in bytes,
        None when it cannot be read."""
        kb = meminfo_kb(self.read("proc/meminfo") or "").get("MemTotal")
        return None if kb is None else kb * 1024

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._p(rel))

    def listdir(self, rel: str) -> list[str]:
        """Sorted names in a directory; ``[]`` when it does not exist."""
        try:
            return sorted(os.listdir(self._p(rel)))
        except OSError:
            return []

    def write(self, rel: str, value: str) -> None:
        """Write a sysfs/procfs value the way ``echo value > file`` does.

        Raises:
            OSError: read-only file system, EINVAL from the kernel for a value
                it refuses, EACCES when not root.
        """
        p = self._p(rel)
        if self._real:
            with open(p, "w") as f:
                f.write(value)
        else:
            # fake tree: replace content exactly like the kernel shows it back
            if not os.path.exists(p):
                raise FileNotFoundError(p)
            with open(p, "w") as f:
                f.write(value if value.endswith("\n") else value + "\n")

    def nvml_json(self) -> Path | None:
        """``<root>/nvml.json`` (a recorded NVML answer set) under a fake root."""
        if self.is_real:
            return None
        p = os.path.join(self._root, "nvml.json")
        if not os.path.isfile(p):
            return None

        return Path(p)
