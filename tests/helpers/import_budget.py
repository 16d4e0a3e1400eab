"""Import budgets that hold on every Python version.

A budget names modules a gsrun command must not load. The standard library
loads some of them itself, and differently from one version to the next
(3.13's ``pathlib`` loads ``contextlib`` through ``glob``; 3.14's ``typing``,
``inspect`` and ``dataclasses`` load ``ast`` through ``annotationlib``). What
the interpreter's own modules drag in is not gsrun's doing: the standard-library
modules the command loaded and its budget allows are imported again in a
fresh interpreter with the command's flags, and a forbidden module loaded
there too is not held against gsrun (:func:`over_budget`). Anything gsrun's
own code imports beyond that still counts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Mapping

# standard-library modules never imported by the probe (side effects, or the interpreter's own start-up)
_SKIP = frozenset({"__main__", "site", "sitecustomize", "usercustomize", "antigravity", "this", "idlelib",
                   "tkinter", "turtle", "turtledemo"})

_PROBE = r"""
import sys
for name in sys.argv[1:]:
    try:
        __import__(name)
    except Exception:
        pass
sys.stdout.write("\n".join(sorted(sys.modules)))
"""


def _forbidden(name: str, forbidden: Iterable[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def stdlib_modules(modules: Iterable[str]) -> list[str]:
    """The names in ``modules`` that belong to the running interpreter's standard library."""
    return sorted(m for m in modules
                  if m.split(".")[0] in sys.stdlib_module_names and m.split(".")[0] not in _SKIP)


def stdlib_drags(modules: Iterable[str], flags: Iterable[str] = ("-I", "-S"), env: Mapping[str, str] | None = None,
                 cwd: str = "/") -> frozenset[str]:
    """Every module loaded by a fresh interpreter (``sys.executable`` with
    ``flags``) that starts and imports ``modules``: what the running version's
    standard library loads for them by itself."""
    cp = subprocess.run([sys.executable, *flags, "-c", _PROBE, *modules], env=None if env is None else dict(env),
                        cwd=cwd, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"import probe failed: {cp.stderr[-2000:]}"
    return frozenset(cp.stdout.split())


def over_budget(loaded: Iterable[str], forbidden: Iterable[str], flags: Iterable[str] = ("-I", "-S"), *,
                excused: Iterable[str] = (), never_probe: Iterable[str] = (), env: Mapping[str, str] | None = None,
                cwd: str = "/") -> list[str]:
    """The ``forbidden`` modules in ``loaded`` that gsrun is to blame for.

    Not counted: those in ``excused`` (loaded before gsrun ran), and those
    the standard library loads by itself for the standard-library modules in
    ``loaded`` that the budget allows (:func:`stdlib_drags`, same ``flags``,
    ``env`` and ``cwd`` as the command). Modules in ``never_probe`` are not
    imported by the probe either: a deferred stand-in in ``loaded`` whose code
    never ran (:func:`gsrun.base.deferred.defer_import`), another budget's
    forbidden modules.
    """
    forbidden = tuple(forbidden)
    loaded = set(loaded)
    hits = {m for m in forbidden if m in loaded} - set(excused)
    if not hits:
        return []
    keep_out = (*forbidden, *never_probe)
    allowed = [m for m in stdlib_modules(loaded) if not _forbidden(m, keep_out)]
    return sorted(hits - stdlib_drags(allowed, flags, env, cwd))
