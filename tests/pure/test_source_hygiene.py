"""Every source file byte-compiles with warnings as errors: an invalid escape
such as ``"\\Z"`` in a docstring is a SyntaxWarning on Python 3.12+ (a
DeprecationWarning on 3.11) and will be an error in a later Python."""

from __future__ import annotations

import warnings

import pytest

from helpers.paths import REPO

FOLDERS = ("gsrun", "prolog", "epilog", "wrapper", "spank_py", "templates", "tests", "examples")
SOURCES = sorted(f for d in FOLDERS for f in (REPO / d).rglob("*.py") if "__pycache__" not in f.parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_compiles_without_warnings(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
