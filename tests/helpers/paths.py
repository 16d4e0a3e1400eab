"""Where test inputs live.

- ``DATA``: recordings the project made itself (``tests/data``; each folder's
  README names its source).
- ``SHARED``: public data kept beside the checkout (``../shared``: real hwloc
  topologies, the field cases behind docs/field-cases.md). Read by a path
  relative to the project root, never
  copied into the project; tests that need it skip with a reason when absent.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared"
