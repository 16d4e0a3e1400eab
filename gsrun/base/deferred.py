"""A module that a library imports but a short command may never use,
executed on first use instead of at ``import``.

``gsrun --dry-run`` runs at every submit; click imports :mod:`inspect` at
module level (with ``ast``, ``dis``, ``tokenize``, ``linecache`` and two
regexes: ~4 ms, a third of a second interpreter start) and calls it only to
clean help text (``inspect.cleandoc``) and to format help pages. With
:func:`defer_import` before ``import click``, ``import inspect`` binds a
placeholder module and the real module runs the first time any of its
attributes is read; the help text that gsrun passes in is already clean
(:class:`gsrun.wrapper.cli`'s options), so a dry run never reads one.

Why not :class:`importlib.util.LazyLoader`: on Python 3.11 the ``import``
statement itself reads the module's ``__spec__``, which a lazy module
answers by loading, so ``import inspect`` in click would load it at once.
The placeholder here holds the module's import attributes (``__spec__``,
``__file__``...) from the start, and loads through the same finder and
loader as a plain import would (``sys.meta_path``, ``exec_module``), into the
same module object: code that imported it early sees the real module.
"""

from __future__ import annotations

import _thread
import sys
import types

_LOCK = _thread.RLock()     # one module runs at a time, as under the import lock


class _Deferred(types.ModuleType):
    """A module not executed yet: the first attribute it lacks executes it."""

    def __getattr__(self, attr: str):
        with _LOCK:
            if type(self) is _Deferred:         # (another thread may have run it while this one waited)
                spec = self.__spec__
                self.__class__ = _Running       # its own code sees a module being imported
                try:
                    spec.loader.exec_module(self)
                except BaseException:
                    self.__class__ = types.ModuleType
                    if sys.modules.get(spec.name) is self:  # as a failed import: not left half-made
                        del sys.modules[spec.name]
                    raise
                self.__class__ = types.ModuleType
        return getattr(self, attr)


class _Running(_Deferred):
    """A deferred module whose code is running: another thread waits for it to
    finish (as it would for an import in progress); the thread running it gets
    ``AttributeError`` for what is not defined yet, as from a partly
    initialised module."""

    def __getattr__(self, attr: str):
        with _LOCK:
            if type(self) is _Running:          # this thread is running it (the lock is re-entrant)
                raise AttributeError(f"partially initialized module {self.__name__!r} has no attribute {attr!r}")
        return getattr(self, attr)


def defer_import(name: str) -> bool:
    """Make ``import name`` bind a placeholder that runs the module on first
    attribute access (see the module docstring).

    ``name``: a top-level module name, e.g. ``"inspect"``. Nothing changes
    (returns False) when the module is imported already, when it is a
    package, builtin, frozen or not found, or its loader cannot
    ``exec_module``: then a later ``import`` works as always. True: the
    placeholder is in :data:`sys.modules`.

    Errors: none of its own; an error in the module's code is raised at
    first use (and the placeholder leaves :data:`sys.modules`, as after a
    failed ``import``).
    """
    if "." in name or name in sys.modules:
        return False
    spec = None
    for finder in sys.meta_path:                   # the finders, in the order `import` asks them
        find = getattr(finder, "find_spec", None)
        spec = find(name, None) if find is not None else None
        if spec is not None:
            break
    if (spec is None or not spec.has_location or spec.submodule_search_locations is not None
            or not hasattr(spec.loader, "exec_module")):
        return False
    module = _Deferred(name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__package__ = spec.parent
    module.__file__ = spec.origin
    if spec.cached is not None:
        module.__cached__ = spec.cached
    sys.modules[name] = module
    return True
