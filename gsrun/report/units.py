"""One formatter per unit for everything a person reads. Pure.

Each takes the unit its name says; anything not a finite number (None, NaN,
a bool, a string) prints as :data:`NA`, never 0.
"""

from __future__ import annotations

import math
import time as _time
from typing import Literal

NA = "N/A"
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
J_PER_WH = 3600.0
J_PER_KWH = 3.6e6


def as_number(v) -> float | None:
    """``v`` as a float when a finite int or float (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def fmt_pct(pct, digits: int, na: str = NA) -> str:
    """A 0..100 percentage with ``digits`` decimals: ``42.0%``, ``42%``."""
    f = as_number(pct)
    return na if f is None else f"{f:.{digits}f}%"


def fmt_share_pct(pct, na: str = NA) -> str:
    """A percentage as an integer, but a share above 0 never as ``0%``: ``0.2%`` or ``<0.1%``."""
    f = as_number(pct)
    if f is not None and f > 0 and f"{f:.0f}" == "0":
        return "<0.1%" if f < 0.05 else f"{f:.1f}%"
    return fmt_pct(pct, 0, na)


def fmt_bytes(n_bytes) -> str:
    """``512 B``, ``1.5 GiB``, up to TiB (``2048.0 TiB`` beyond)."""
    f = as_number(n_bytes)
    if f is None:
        return NA
    for unit in BINARY_UNITS:
        if abs(f) < 1024 or unit == BINARY_UNITS[-1]:
            return f"{f:.0f} B" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    raise AssertionError("unreachable")


def fmt_bytes_of(used_bytes, total_bytes) -> str:
    """``61.0 of 140.4 GiB``; ``512.0 MiB of 2.0 GiB`` for a part under 0.1 unit; no total: the part."""
    u, t = as_number(used_bytes), as_number(total_bytes)
    if t is None or t <= 0:
        return fmt_bytes(used_bytes)
    unit = 0
    while unit < len(BINARY_UNITS) - 1 and t >= 1024 ** (unit + 1):
        unit += 1
    div = 1024 ** unit
    if unit == 0:
        return f"{NA if u is None else f'{u:.0f}'} of {t:.0f} B"
    if u is None:
        return f"{NA} of {t / div:.1f} {BINARY_UNITS[unit]}"
    if u and u / div < 0.1:
        return f"{fmt_bytes(u)} of {t / div:.1f} {BINARY_UNITS[unit]}"
    return f"{u / div:.1f} of {t / div:.1f} {BINARY_UNITS[unit]}"


def fmt_time(epoch_s, with_date: bool = True) -> str:
    """Epoch seconds as local time: ``2025-10-09 10:00`` (``10:00`` without the date)."""
    f = as_number(epoch_s)
    if f is None or f <= 0:
        return NA
    return _time.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M", _time.localtime(f))


def fmt_gib(n_bytes) -> str:
    """``13.00 GiB`` (``gseff --sacct``'s columns)."""
    f = as_number(n_bytes)
    return NA if f is None else f"{f / 2**30:.2f} GiB"


def fmt_duration_s(seconds, style: Literal["clock", "short"]) -> str:
    """Seconds as ``[D-]HH:MM:SS`` (Slurm's form); ``short``: under a minute ``30 s`` / ``2.5 s``."""
    f = as_number(seconds)
    if f is None:
        return NA
    s = int(round(f))
    if style == "short" and s < 60:
        return f"{f:.1f} s" if f < 10 and f != int(f) else f"{s} s"
    if style not in ("clock", "short"):
        raise ValueError(f"duration style {style!r}")
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def fmt_energy_j(joules, style: Literal["auto", "kwh_j", "wh"]) -> str:
    """Joules as ``wh``: ``0.2 Wh``, ``2.5 Wh``, ``150 Wh``, ``1.02 kWh``; ``auto``: the same but
    ``540 J`` under 1 Wh; ``kwh_j``: ``0.150 kWh (540000 J)``."""
    f = as_number(joules)
    if f is None:
        return NA
    if style == "kwh_j":
        return f"{f / J_PER_KWH:.3f} kWh ({f:.0f} J)"
    if style not in ("auto", "wh"):
        raise ValueError(f"energy style {style!r}")
    wh = f / J_PER_WH
    if wh < 1 and style == "auto":
        return f"{f:.0f} J"
    if wh < 1000:
        return f"{wh:.0f} Wh" if wh >= 10 else f"{wh:.1f} Wh"
    return f"{wh / 1000:.2f} kWh"


def fmt_power_w(watts) -> str:
    """``350 W``."""
    f = as_number(watts)
    return NA if f is None else f"{f:.0f} W"


def fmt_hours_h(hours) -> str:
    """``1.39`` (the text around it names the unit)."""
    f = as_number(hours)
    return NA if f is None else f"{f:.2f}"


__all__ = ["NA", "as_number", "fmt_pct", "fmt_share_pct", "fmt_bytes", "fmt_bytes_of", "fmt_time", "fmt_gib", "fmt_duration_s",
           "fmt_energy_j", "fmt_power_w", "fmt_hours_h"]
