"""Frozen dataclasses that are also a JSON contract. Pure.

A :class:`Record` subclass's field names are the JSON keys.
:meth:`Record.to_json` leaves out :data:`ABSENT` fields and writes ``extra``
keys back; :meth:`Record.from_json` is its tolerant inverse (a missing key
takes its default, unknown keys go to ``extra``; values are not converted,
only nested records, tuples and enums built). :func:`json_schema` gives a
draft 2020-12 schema from the type hints (``int``, ``float``, ``str``,
``bool``, ``None``, ``Any``, unions, ``tuple[X, ...]``, ``dict[str, X]``,
``Literal``, ``str`` enums, records) and each :func:`field`'s ``doc``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Mapping

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Absent:
    """The value of a field whose key is not in the JSON (see :data:`ABSENT`)."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_Absent, ())


ABSENT: Any = _Absent()
"""Field value meaning "this key is not written" (e.g. ``cpu_timeline`` of a
node summary made without sampler state). Falsy."""


def known(v: Any) -> bool:
    """``v`` is a value: neither None (unknown) nor :data:`ABSENT` (not in the file)."""
    return v is not None and v is not ABSENT


def or_none(v: Any) -> Any:
    """``v``, None for :data:`ABSENT` (a key not in the file reads as unknown)."""
    return None if v is ABSENT else v


def field(doc: str, default: Any = dataclasses.MISSING, *, factory=dataclasses.MISSING, optional_key: bool = False):
    """A record field with its doc (the schema's ``description``: shape, unit,
    source). ``optional_key``: default :data:`ABSENT`, not required by the
    schema; other fields are required even with a default (for older files)."""
    if optional_key:
        default = ABSENT
    md = {"doc": doc, "optional_key": optional_key}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


class Record:
    """Base of the JSON records (see the module doc). Subclasses are frozen
    dataclasses; one that keeps unknown keys declares ``extra: dict =
    extra_field()`` last."""

    def to_json(self) -> dict:
        """The record as plain JSON-able dicts/lists (the on-disk form)."""
        dd = self.__dict__
        out: dict = {}
        for name in _names(type(self)):
            v = dd[name]
            if v is ABSENT:
                continue
            out[name] = v if type(v) in _PLAIN else _dump(v)
        for k, v in (dd.get("extra") or {}).items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_json(cls, d: Mapping):
        """Build the record from its JSON form (see the module doc).

        Raises:
            ValueError: ``d`` is not an object, a required key is missing,
                or a nested value has the wrong shape (an enum value that is
                not a member, an object where an array belongs).
        """
        return _load_record(cls, d, cls.__name__)


def extra_field():
    """The ``extra`` field: unknown keys, written back; not compared, not in the schema."""
    return dataclasses.field(default_factory=dict, compare=False, repr=False,
                             metadata={"doc": "unknown keys, written back unchanged", "optional_key": True})


# ----------------------------------------------------------------------------- dump / load

_PLAIN = frozenset((str, int, float, bool, type(None)))   # JSON scalars: dumped and loaded as they are


@functools.cache
def _names(cls) -> tuple[str, ...]:
    """The field names :meth:`Record.to_json` writes, in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")


def _dump(v):
    t = type(v)
    if t in _PLAIN:
        return v
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, enum.Enum):
        return v.value
    if t is tuple or t is list or isinstance(v, (tuple, list)):
        return [x if type(x) in _PLAIN else _dump(x) for x in v]
    if isinstance(v, dict):
        return {k: x if type(x) in _PLAIN else _dump(x) for k, x in v.items()}
    return v


_hints = functools.cache(typing.get_type_hints)


def _is_record(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, Record)


@functools.cache
def _plan(cls) -> tuple:
    """How :func:`_load_record` reads ``cls``: per field (name, loader or
    None when the value is kept as it is, required), whether it keeps
    ``extra``, the known names, and name -> a function giving the default of
    each field whose default is written (not :data:`ABSENT`)."""
    hints = _hints(cls)
    fields, known, has_extra, defaults = [], set(), False, {}
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            has_extra = True
            continue
        known.add(f.name)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, _loader(hints[f.name]), required))
        if f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory
        elif not required and f.default is not ABSENT:
            defaults[f.name] = (lambda v: lambda: v)(f.default)
    return tuple(fields), has_extra, frozenset(known), defaults


def prepare_loaders(base: type | None = None) -> None:
    """Build the loading plan of every record class below ``base`` (default :class:`Record`) now: a daemon's
    forked children inherit them instead of each evaluating the type hints (~4 ms of an epilog, 2-core VM)."""
    for cls in (base or Record).__subclasses__():
        _plan(cls)
        prepare_loaders(cls)


_MISSING = object()


def _load_record(cls, d, where: str):
    if type(d) is not dict and not isinstance(d, collections.abc.Mapping):
        raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
    fields, has_extra, known, _defaults = _plan(cls)
    kw: dict = {}
    for name, load, required in fields:
        v = d.get(name, _MISSING)
        if v is not _MISSING:
            kw[name] = v if load is None else load(v, f"{where}.{name}")
        elif required:
            raise ValueError(f"{where}: missing key {name!r}")
    if has_extra:
        kw["extra"] = {k: v for k, v in d.items() if k not in known} if len(d) > len(kw) else {}
    return cls(**kw)


def _loader(tp):
    """A function ``(value, where) -> value`` reading type ``tp`` (built once
    per field), or None where the value is kept as it is."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return None
    if origin in (typing.Union, types.UnionType):
        allowed = typing.get_args(tp)
        none_ok = type(None) in allowed
        args = [a for a in allowed if a is not type(None)]
        tries = [(a, _loader(a)) for a in args if _structural(a)]
        if not tries:
            return None          # scalars only: kept as they are
        scalar_ok = any(not _structural(a) for a in args)

        def load_union(v, where):
            if v is None and none_ok:
                return None
            errors = []
            for _a, load in tries:
                try:
                    return load(v, where)
                except ValueError as e:
                    errors.append(str(e))
            if scalar_ok:
                return v      # a scalar alternative: kept as it is
            raise ValueError("; ".join(errors) or f"{where}: unexpected {v!r}")
        return load_union
    if _is_record(tp):
        return lambda v, where: _load_record(tp, v, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        def load_enum(v, where):
            try:
                return tp(v)
            except ValueError:
                raise ValueError(f"{where}: {v!r} is not one of {[m.value for m in tp]}") from None
        return load_enum
    if origin is tuple:
        args = typing.get_args(tp)
        item = _loader(args[0]) if args else None

        def load_tuple(v, where):
            if not isinstance(v, (list, tuple)):
                raise ValueError(f"{where}: expected an array, got {type(v).__name__}")
            if item is None:
                return tuple(v)
            return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))
        return load_tuple
    if origin in (dict, Mapping, typing.Mapping) or tp is dict:
        args = typing.get_args(tp)
        item = _loader(args[1]) if len(args) == 2 else None

        def load_dict(v, where):
            if type(v) is not dict and not isinstance(v, collections.abc.Mapping):
                raise ValueError(f"{where}: expected an object, got {type(v).__name__}")
            if item is None:
                return dict(v)
            return {k: item(x, f"{where}.{k}") for k, x in v.items()}
        return load_dict
    return None       # lists and scalars: kept as they are (checked by the schema, not here)


def _structural(tp) -> bool:
    origin = typing.get_origin(tp)
    return _is_record(tp) or origin in (tuple, dict, typing.Mapping) or \
        (isinstance(tp, type) and issubclass(tp, enum.Enum))


# ----------------------------------------------------------------------------- JSON Schema

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def json_schema(cls, schema_id: str, title: str | None = None) -> dict:
    """The JSON Schema (draft 2020-12) of record class ``cls``: every field
    a property (with its ``doc`` as description), fields without
    ``optional_key`` required, unknown keys allowed (newer writers).
    Nested records go to ``$defs``."""
    defs: dict = {}
    top = _record_schema(cls, defs)
    out = {"$schema": SCHEMA_DIALECT, "$id": schema_id, "title": title or cls.__name__}
    out.update(top)
    defs.pop(cls.__name__, None)
    if defs:
        out["$defs"] = dict(sorted(defs.items()))
    return out


def _doc(cls) -> str:
    return " ".join((cls.__doc__ or "").split())


def _record_schema(cls, defs: dict) -> dict:
    hints = _hints(cls)
    props, required = {}, []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        s = _type_schema(hints[f.name], defs)
        doc = f.metadata.get("doc")
        if doc:
            s = {"description": doc, **s}
        props[f.name] = s
        if not f.metadata.get("optional_key"):
            required.append(f.name)
    return {"description": _doc(cls), "type": "object", "properties": props, "required": required}


def _type_schema(tp, defs: dict) -> dict:
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin in (typing.Union, types.UnionType):
        parts = [_type_schema(a, defs) for a in typing.get_args(tp)]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            return {"type": [p["type"] for p in parts]}
        return {"anyOf": parts}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if _is_record(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}          # placeholder against recursion
            defs[tp.__name__] = _record_schema(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if origin is tuple or origin is list or tp is list:
        args = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(args[0], defs) if args else {}}
    if origin in (dict, typing.Mapping) or tp is dict:
        args = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(args[1], defs) if len(args) == 2 else {}}
    raise TypeError(f"no JSON Schema for {tp!r}")


__all__ = ["ABSENT", "Record", "extra_field", "field", "json_schema"]
