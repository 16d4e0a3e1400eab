"""Test setup: import the checkout's code (not an installed copy).

pyproject maps ``gsrun.prolog`` -> ``prolog/`` etc.; without an install we
reproduce that mapping here so ``import gsrun.prolog`` works from the tree.
"""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("prolog", "epilog", "wrapper", "spank_py", "templates")

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
for _name in [m for m in sys.modules if m == "gsrun" or m.startswith("gsrun.")]:
    del sys.modules[_name]
import gsrun  # noqa: E402

assert Path(gsrun.__file__).resolve().parent == REPO / "gsrun", gsrun.__file__
for _sub in SUBPACKAGES:
    _spec = importlib.util.spec_from_file_location(
        f"gsrun.{_sub}", REPO / _sub / "__init__.py", submodule_search_locations=[str(REPO / _sub)])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)
    setattr(gsrun, _sub, _mod)

DATA = REPO / "tests" / "data"
