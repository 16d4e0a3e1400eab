"""The MPS share a job asks for (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of its
MPS daemon), one rule for ``--mps[=PCT]``, ``--gs-mps`` (``SPANK_GS_MPS``),
``mps=PCT`` in the comment and a ``gres/mps`` job's own variable. Pure.
"""

from __future__ import annotations

from gsrun.base.errors import InputError
from gsrun.base.ids import is_digits

HINT = "use an integer from 1 to 100 (e.g. --gs-mps=50 or --mps=50), or the option alone for the site default"


def parse_mps_share(text: str, source: str = "--gs-mps", phase: str = "mps") -> int | None:
    """``text`` -> the percentage 1-100 (at most three ASCII digits), or None
    for a blank value (``--mps`` alone).

    Raises:
        InputError: ``gsrun: <phase>: bad active thread percentage:
            <source>=<repr>`` plus a hint, for anything else (``0``, ``101``,
            ``-5``, ``50%``, ``abc``, ``"４２"``, a non-str); likely a typo.
    """
    v = text.strip() if isinstance(text, str) else None
    if v == "":
        return None
    if v is None or not is_digits(v, 3) or not 1 <= int(v) <= 100:     # no `re` on the SPANK hooks' path
        raise InputError(phase, "bad active thread percentage", f"{source}={text!r}"[:120], hint=HINT)
    return int(v)
