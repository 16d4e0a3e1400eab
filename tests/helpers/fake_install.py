"""A fake installation directory for ``gsrun`` tests that render (no tests here):
``gsrun``, ``gsrun-bind`` and ``python3`` that must never run (exit 99), an
``sinfo`` that prints a gres line, and an ``sbatch`` that refuses, so that
nothing is ever submitted from a test."""

from __future__ import annotations

from pathlib import Path

NEVER = "#!/bin/sh\nexit 99\n"
SBATCH_REFUSES = "#!/bin/sh\necho 'fake sbatch: nothing is submitted from tests' >&2; exit 1\n"


#: A conda executable whose ``shell.bash hook`` defines ``conda activate PREFIX`` as conda's own
#: does for what gsrun's job script uses: the prefix's ``bin`` first on PATH, CONDA_PREFIX, and
#: the prefix's ``etc/conda/activate.d/*.sh`` sourced.
FAKE_CONDA = r'''#!/bin/sh
[ "$1" = shell.bash ] && [ "$2" = hook ] || exit 2
cat <<'HOOK'
conda() {
  [ "$1" = activate ] || return 1
  export CONDA_PREFIX="$2" CONDA_SHLVL=1 PATH="$2/bin:$PATH"
  for f in "$2"/etc/conda/activate.d/*.sh; do [ -r "$f" ] && . "$f"; done
  return 0
}
HOOK
'''


def fake_bin(base: Path, sinfo: str) -> Path:
    """``<base>/bin`` with those executables; ``sinfo``: its script's body."""
    bindir = base / "bin"
    bindir.mkdir()
    for name, body in (("gsrun", NEVER), ("gsrun-bind", NEVER), ("python3", NEVER), ("sinfo", sinfo),
                       ("sbatch", SBATCH_REFUSES)):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    return bindir
