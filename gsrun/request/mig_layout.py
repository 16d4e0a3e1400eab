"""MIG layout requests (``--mig`` / ``--gs-mig``): ``+``-separated terms
``[<n>x]<slices>g.<mem>gb[+me|+gfx]`` for one GPU::

    3g.71gb+3g.71gb          -> [(2, "3g.71gb")]
    1g.18gb+me+3x1g.18gb     -> [(1, "1g.18gb+me"), (3, "1g.18gb")]

Syntax only (bounded); :func:`gsrun.node.mig.plan_layout` decides what a GPU holds.
"""

from __future__ import annotations

import re

from gsrun.base.errors import InputError

MAX_LAYOUT_CHARS = 200
#: Most instances in one layout: GPUs allow 7, so ``8x1g.18gb`` reaches the planner, which says why
MAX_INSTANCES = 16
MAX_TERM_COUNT = 16

_ALLOWED = re.compile(r"^[0-9a-z.+x]+$")
_TERM = re.compile(r"^(?:(?P<n>[0-9]{1,2})x)?(?P<name>[1-9][0-9]?g\.[1-9][0-9]{0,3}gb)$")
#: compute slices of the profiles NVIDIA defines (``<slices>g``) on every MIG-capable GPU
SLICES = (1, 2, 3, 4, 7)
#: attribute suffixes NVIDIA appends to profile names (``1g.18gb+me``, ``1g.24gb+gfx``)
SUFFIXES = ("me", "gfx")

_HINT = ("write a layout like 7g.141gb, 3g.71gb+3g.71gb, 7x1g.18gb or 2x2g.35gb+1g.18gb; "
         "`gsrun-node mig plan --gpu 0 LAYOUT` lists this GPU's profiles")


def _bad(detail: str) -> InputError:
    return InputError("mig", "bad layout", detail, hint=_HINT)


def parse_layout(text: str) -> list[tuple[int, str]]:
    """A layout -> ``[(count, profile_name), ...]``, lower case, repeats merged.

    Raises:
        InputError: empty, a character outside ``[0-9a-z.+x]``, too long, a bad
            term, slices or suffix, a count of 0, more than :data:`MAX_INSTANCES`.
    """
    if not isinstance(text, str):
        raise _bad(f"expected text, got {type(text).__name__}")
    raw = text.strip().lower()
    if not raw:
        raise _bad("empty layout")
    if len(raw) > MAX_LAYOUT_CHARS:
        raise _bad(f"layout is {len(raw)} characters; at most {MAX_LAYOUT_CHARS}")
    if not _ALLOWED.match(raw):
        odd = sorted({c for c in raw if not re.match(r"[0-9a-z.+x]", c)})
        raise _bad(f"{text.strip()!r} has characters outside [0-9a-z.+x]: "
                   + " ".join(repr(c) for c in odd))
    tokens = raw.split("+")
    terms: list[list] = []  # [count, name]
    for tok in tokens:
        if tok == "":
            raise _bad(f"{raw!r}: empty term (a leading, trailing or doubled '+')")
        if tok in SUFFIXES:
            if not terms:
                raise _bad(f"{raw!r}: '+{tok}' must follow a profile name")
            if tok in terms[-1][1].split("+")[1:]:
                raise _bad(f"{raw!r}: '+{tok}' given twice for {terms[-1][1]}")
            terms[-1][1] += "+" + tok
            continue
        m = _TERM.match(tok)
        if not m:
            raise _bad(f"{tok!r} is not a profile term; expected [<n>x]<slices>g.<mem>gb "
                       f"with optional +{'/+'.join(SUFFIXES)}")
        n = int(m.group("n")) if m.group("n") is not None else 1
        slices = int(m.group("name").split("g.", 1)[0])
        if slices not in SLICES:
            raise _bad(f"{tok!r}: {slices} compute slices; MIG profiles have "
                       + ", ".join(map(str, SLICES[:-1])) + f" or {SLICES[-1]}")
        if n == 0:
            raise _bad(f"{tok!r}: a count must be at least 1")
        terms.append([n, m.group("name")])
    if len(terms) > MAX_TERM_COUNT:
        raise _bad(f"{len(terms)} terms; at most {MAX_TERM_COUNT}")
    merged: dict[str, int] = {}
    for n, name in terms:
        merged[name] = merged.get(name, 0) + n
    total = sum(merged.values())
    if total > MAX_INSTANCES:
        raise _bad(f"{total} instances requested; gsrun accepts at most {MAX_INSTANCES} per GPU "
                   "(GPUs themselves allow at most 7)")
    return [(n, name) for name, n in merged.items()]


def format_layout(items: list[tuple[int, str]]) -> str:
    """Inverse of :func:`parse_layout`: ``[(2, "3g.71gb")]`` -> ``"2x3g.71gb"``."""
    return "+".join(name if n == 1 else f"{n}x{name}" for n, name in items)
