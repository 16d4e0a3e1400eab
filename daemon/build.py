"""Build ``gsrun-hook``, the node daemon's C client (``client.c``; the
daemon: :mod:`gsrun.daemon.server`).

``gsrun-node daemon build --out-dir DIR`` compiles it to ``DIR/gsrun-hook``
(the standard C library only: any ``cc``; hardened like the SPANK plugin).
A hook then runs::

    exec DIR/gsrun-hook /run/gsrun/daemon.sock <the hook's own command>

and fails (``gsrun: prolog: node daemon not running: ...``) when no daemon
serves the socket.
"""

from __future__ import annotations

import os
from pathlib import Path

from gsrun.spank_py.build import LINK_HARDENING, _run

C_SOURCE = Path(__file__).with_name("client.c")
CLIENT_NAME = "gsrun-hook"
CFLAGS = ["-O2", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2", "-fPIE", "-pie", "-Wall",
          "-Werror=implicit-function-declaration", "-Werror=format-security"]


def compile_command(out: str | os.PathLike, cc: str = "cc") -> list[str]:
    """The compiler argv. Pure."""
    return [cc, *CFLAGS, *LINK_HARDENING[:1], LINK_HARDENING[2], str(C_SOURCE), "-o", str(out)]


def build(out_dir: str | os.PathLike, cc: str | None = None) -> Path:
    """Compile ``out_dir/gsrun-hook`` (made under a temporary name, mode 0755,
    renamed into place) and return its path.

    Raises:
        NodeError: no compiler (install ``gcc``/``cc``), or it failed (its output
            is in the message).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{CLIENT_NAME}.build-{os.getpid()}"
    try:
        _run(compile_command(tmp, cc or os.environ.get("CC") or "cc"), f"compile {CLIENT_NAME}", phase="daemon build")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out / CLIENT_NAME)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out / CLIENT_NAME

