"""Immutable value types without :mod:`dataclasses`.

``import dataclasses`` costs ~7 ms (it imports ``inspect``, ``ast``, ``dis``,
``tokenize``) and each ``@dataclass`` another ~0.3 ms of code generation: on
the SPANK plugin's path in slurmstepd, which plans every bound step, that was
a third of the Python side. :class:`Frozen` gives what ``@dataclass(frozen=True)``
gave the types on that path (:mod:`gsrun.facts.topology`,
:mod:`gsrun.bind.plan`, :mod:`gsrun.facts.devices`, the config table):
positional and keyword construction with defaults, value equality and hash
over the compared fields, a ``Name(field=value, ...)`` repr, copy and pickle,
and assignment refused.

A subclass lists its fields in ``__slots__`` (in constructor order) and may set
``_defaults`` (field -> value, or :func:`factory` for a fresh mutable value
per instance) and ``_no_compare`` (fields left out of ``==`` and ``hash``)::

    class NumaNode(Frozen):
        __slots__ = ("id", "cpus", "mem_total_bytes", "distances")
        _defaults = {"mem_total_bytes": None, "distances": factory(dict)}
        _no_compare = frozenset({"distances"})
"""

from __future__ import annotations


class factory:  # noqa: N801 - used like dataclasses.field(default_factory=...)
    """A default made fresh for every instance (``factory(dict)``)."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class Frozen:
    """Base of immutable value types; see the module doc.

    Raises:
        TypeError: a missing, unknown or repeated field at construction.
        AttributeError: assignment to or deletion of a field.
    """

    __slots__ = ()
    _defaults: dict = {}
    _no_compare: frozenset = frozenset()

    def __init__(self, *args, **kwargs):
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} fields, {len(args)} given")
        for name, value in zip(names, args):
            object.__setattr__(self, name, value)
        for name in names[len(args):]:
            if name in kwargs:
                value = kwargs.pop(name)
            elif name in self._defaults:
                value = self._defaults[name]
                if isinstance(value, factory):
                    value = value.make()
            else:
                raise TypeError(f"{type(self).__name__}() missing field {name!r}")
            object.__setattr__(self, name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected or repeated fields {sorted(kwargs)}")

    def _key(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__ if n not in self._no_compare)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def __reduce__(self):   # copy and pickle: rebuild through __init__ (assignment is refused)
        return type(self), tuple(getattr(self, n) for n in self.__slots__)

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r} of {type(self).__name__}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r} of {type(self).__name__}")


class Slotted:
    """Base of the mutable counterparts (a step's outcome, a job's request, a
    tuning plan item): the subclass lists its fields in ``__slots__`` and
    writes its own ``__init__``; this gives the ``Name(field=value, ...)``
    repr and field-wise equality, and leaves them unhashable (they change)."""

    __slots__ = ()
    __hash__ = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)
