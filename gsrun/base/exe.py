"""Finding an executable on ``PATH`` without importing :mod:`shutil`.

:func:`which` is :func:`shutil.which` for POSIX (same lookup, same result)
for the paths every ``gsrun`` takes: ``import shutil`` also imports ``bz2``,
``lzma`` and ``fnmatch`` (~1.5 ms), a tenth of what ``gsrun --dry-run`` spends
beyond the interpreter and click. Code that copies or
moves files uses :mod:`shutil` itself.
"""

from __future__ import annotations

import os


def which(name: str, path: str | None = None) -> str | None:
    """The first ``PATH`` entry holding an executable file ``name``
    (``os.path.join(dir, name)``, as found: not made absolute, links kept),
    else None. A ``name`` with a directory part is checked as given.

    ``path``: the search path (``"dir1:dir2"``), default ``$PATH`` (unset:
    ``os.confstr("CS_PATH")``, else :data:`os.defpath`); an empty string
    finds nothing, an empty entry is the working directory. As
    :func:`shutil.which` with the default mode (``os.F_OK | os.X_OK``) on POSIX.
    """
    if os.path.dirname(name):
        return name if _executable(name) else None
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):
                path = os.defpath
    if not path:
        return None
    seen = set()
    for d in path.split(os.pathsep):
        if d not in seen:
            seen.add(d)
            candidate = os.path.join(d, name)
            if _executable(candidate):
                return candidate
    return None


def _executable(fn: str) -> bool:
    return os.path.exists(fn) and os.access(fn, os.F_OK | os.X_OK) and not os.path.isdir(fn)
