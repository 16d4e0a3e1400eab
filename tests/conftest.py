"""Test tiers, one per folder (each gets its pytest marker):

=============  ============================================================  ==========
folder         what runs                                                     marker
=============  ============================================================  ==========
pure/          decisions and parsers on values made in the test              pure
recorded/      readers and decisions on recorded host trees (tests/data)     recorded
process/       real child processes: hooks, CLIs, sampler, mail, SPANK build  process
slurm/         jobs on the local cluster from tests/cluster/up               slurm
gpu/           a real NVIDIA GPU node: ``tests/gpu/run`` (not pytest)        -
bench/         benchmarks, ratios against a baseline (not pytest)            -
=============  ============================================================  ==========

``tests/run`` runs every tier this machine can (``tests/run -m pure`` picks
one). The code under test is the *installed* ``gsrun`` (``tests/run``
installs this checkout; for a quick loop ``pip install -e .[test]``); this
file stops the run when that install is not this checkout's code, so a stale
copy is never tested by mistake. Helpers live in ``tests/helpers``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIERS = ("pure", "recorded", "process", "slurm")
# import package -> folder of the checkout (pyproject's package-dir)
PACKAGE_DIRS = {"gsrun": "gsrun", "gsrun.prolog": "prolog", "gsrun.epilog": "epilog",
                "gsrun.wrapper": "wrapper", "gsrun.daemon": "daemon", "gsrun.spank_py": "spank_py", "gsrun.templates": "templates"}


def _stale_install() -> str | None:
    """Why the importable gsrun is not this checkout's code, or None."""
    import importlib

    for pkg, folder in PACKAGE_DIRS.items():
        try:
            mod = importlib.import_module(pkg)
        except ImportError as e:
            return f"cannot import {pkg}: {e}"
        installed = Path(mod.__file__).resolve().parent
        src = REPO / folder
        for f in src.rglob("*"):
            if f.suffix not in (".py", ".j2", ".c", ".h", ".map"):
                continue
            if "__pycache__" in f.parts:
                continue
            other = installed / f.relative_to(src)
            if not other.is_file() or other.read_bytes() != f.read_bytes():
                return f"{other} is not {f}"
    return None


def pytest_configure(config):
    for t in TIERS:
        config.addinivalue_line("markers", f"{t}: test tier tests/{t}/ (see tests/conftest.py)")
    why = _stale_install()
    if why:
        pytest.exit(f"gsrun: tests: the installed gsrun is not this checkout: {why}\n"
                    "hint: run tests/run (installs the checkout), or `pip install -e .[test]` "
                    "in the venv you test with", returncode=4)


# Site settings a developer's shell (or tests/run, after tests/cluster/up) may carry:
# gsrun finds its config beside $SLURM_CONF, so the tiers that do not test the
# cluster run without them, whatever the shell they start from.
SITE_ENV = ("SLURM_CONF", "GSRUN_CONFIG", "GSRUN_SPOOL_DIR", "GSRUN_STATE_DIR", "GSRUN_HOST_ROOT",
            "GSRUN_TOPOLOGY_XML", "GSRUN_PYTHON")


@pytest.fixture(autouse=True)
def _hermetic_site_env(request, monkeypatch):
    tier = Path(str(request.node.fspath)).resolve().relative_to(REPO / "tests").parts[0]
    if tier != "slurm":
        for name in SITE_ENV:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def utc_tz():
    """``TZ=UTC`` for a whole module (its module fixtures included): sacct prints local
    times and the golden tables print them back, stored as UTC."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TZ", "UTC")
        time.tzset()
        yield
    time.tzset()


def pytest_collection_modifyitems(config, items):
    have_cluster = bool(os.environ.get("GSRUN_TEST_CLUSTER"))
    skip = pytest.mark.skip(reason="needs the local Slurm cluster: run tests/run (sets GSRUN_TEST_CLUSTER)")
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(REPO / "tests")
        tier = rel.parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "slurm" and not have_cluster:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """Stop the node daemons the process tests started for their sites (tests/helpers/node_site.py)."""
    try:
        from helpers.node_site import stop_daemons
    except ImportError:
        return
    stop_daemons()
