"""Golden files: a rendered artifact compared byte for byte with its stored copy.

Regenerate every golden file with ``GSRUN_REGEN_GOLDEN=1``::

    GSRUN_REGEN_GOLDEN=1 python -P -m pytest -p no:cacheprovider -q tests/pure tests/recorded tests/process -k golden

then review the diff with ``git diff tests/data/golden tests/data/hosts/*/golden``:
a golden file changes only when the rendered artifact was meant to change.
``tests/data/golden/README.md`` lists the golden files and their tests.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

REGEN = os.environ.get("GSRUN_REGEN_GOLDEN") == "1"


def check_text(path: Path, got: str, what: str) -> None:
    """Assert ``got`` equals the text in ``path`` (written instead under
    ``GSRUN_REGEN_GOLDEN=1``). The failure shows a unified diff and the way
    to regenerate."""
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.is_file(), f"missing golden file {path} for {what}; create it with GSRUN_REGEN_GOLDEN=1"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"{path} (golden)", f"{what} (now)", n=2))
        raise AssertionError(f"{what} differs from its golden file {path}:\n{diff[:6000]}\n"
                             "If the change is intended, regenerate with GSRUN_REGEN_GOLDEN=1 "
                             "and review `git diff tests/data/golden`.")


def check_json(path: Path, got, what: str) -> None:
    """:func:`check_text` for a JSON value (stored indented, keys sorted)."""
    check_text(path, json.dumps(got, indent=2, sort_keys=True, default=str) + "\n", what)
