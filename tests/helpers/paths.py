"""Where test inputs live.

- ``DATA``: recordings the project made itself (``tests/data``; each folder's
  README names its source).
- ``SHARED``: public data kept beside the checkout (``../shared``: real hwloc
  topologies, the field cases behind docs/field-cases.md). Read by a path
  relative to the project root, never
  copied into the project; tests that need it skip with a reason when absent.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared"


def is_bytecode(path: Path) -> bool:
    """A ``__pycache__`` folder or a compiled file (``*.pyc``) or one inside such a
    folder: what Python leaves beside a module it loads unless
    ``PYTHONDONTWRITEBYTECODE`` is set, never part of the data."""
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def data_entries(folder: Path) -> list[Path]:
    """``folder``'s entries, sorted, without bytecode (:func:`is_bytecode`)."""
    return sorted(p for p in folder.iterdir() if not is_bytecode(p))


def load_data_module(path: Path, name: str) -> ModuleType:
    """A script kept with the data (``make.py`` beside the files it made) as a
    module, without writing its bytecode into the data folder."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    keep, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = keep
    return mod
