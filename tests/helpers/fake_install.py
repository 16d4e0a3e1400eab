"""A fake installation directory for ``gsrun`` tests that render (no tests here):
``gsrun``, ``gsrun-bind`` and ``python3`` that must never run (exit 99), an
``sinfo`` that prints a gres line, and an ``sbatch`` that refuses, so that
nothing is ever submitted from a test."""

from __future__ import annotations

from pathlib import Path

NEVER = "#!/bin/sh\nexit 99\n"
SBATCH_REFUSES = "#!/bin/sh\necho 'fake sbatch: nothing is submitted from tests' >&2; exit 1\n"


def fake_bin(base: Path, sinfo: str) -> Path:
    """``<base>/bin`` with those executables; ``sinfo``: its script's body."""
    bindir = base / "bin"
    bindir.mkdir()
    for name, body in (("gsrun", NEVER), ("gsrun-bind", NEVER), ("python3", NEVER), ("sinfo", sinfo),
                       ("sbatch", SBATCH_REFUSES)):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    return bindir
