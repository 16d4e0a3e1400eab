"""One formatter per unit, for everything a person reads: the text report
(:mod:`gsrun.report.render`, ``gseff``), the mail (:mod:`gsrun.report.mail`)
and ``gseff --sacct``. Pure.

Every function takes the number in the unit its name says and returns
text; a value that is not a finite number (``None``, NaN, a bool, a string)
prints as :data:`NA`, never as 0. Where callers print a quantity
differently, a ``digits`` / ``style`` argument says which form.
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
    """``v`` as a float when it is a finite int or float (not a bool), else
    None ("not available": summaries are untrusted JSON)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def fmt_pct(pct, digits: int, na: str = NA) -> str:
    """A percentage (0..100 scale, not a fraction) with ``digits`` decimals:
    ``42.0%`` (report: 1 digit) or ``42%`` (mail, subject: 0 digits).
    ``na``: what a missing value prints as."""
    f = as_number(pct)
    return na if f is None else f"{f:.{digits}f}%"


def fmt_share_pct(pct, na: str = NA) -> str:
    """A percentage as an integer (the verdict, the per-GPU
    figures, the findings), except a share above 0 that would print as
    ``0%``: one decimal (``0.2%``, ``0.5%``) or ``<0.1%``, so a small
    share is never shown as none. ``na`` as in :func:`fmt_pct`."""
    f = as_number(pct)
    if f is not None and f > 0 and f"{f:.0f}" == "0":
        return "<0.1%" if f < 0.05 else f"{f:.1f}%"
    return fmt_pct(pct, 0, na)


def fmt_bytes(n_bytes) -> str:
    """Bytes in binary units, one decimal: ``512 B``, ``1.5 GiB``, up to TiB
    (``2048.0 TiB`` beyond). The same in the report and the mail."""
    f = as_number(n_bytes)
    if f is None:
        return NA
    for unit in BINARY_UNITS:
        if abs(f) < 1024 or unit == BINARY_UNITS[-1]:
            return f"{f:.0f} B" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    raise AssertionError("unreachable")


def fmt_bytes_of(used_bytes, total_bytes) -> str:
    """A part of a total in the total's binary unit, one decimal:
    ``61.0 of 140.4 GiB``, ``512.0 MiB of 2.0 GiB`` when the part is under a
    tenth of a unit of the total; the part alone when there is no total."""
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
    """An epoch time as this host's local clock time: ``2025-10-09 10:00``
    (``10:00`` without the date). Slurm's StartTime / EndTime / SubmitTime
    are in the controller's local time too."""
    f = as_number(epoch_s)
    if f is None or f <= 0:
        return NA
    return _time.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M", _time.localtime(f))


def fmt_gib(n_bytes) -> str:
    """Bytes always in GiB with two decimals (``13.00 GiB``): the
    ``gseff --sacct`` table, where the column compares like with like."""
    f = as_number(n_bytes)
    return NA if f is None else f"{f / 2**30:.2f} GiB"


def fmt_duration_s(seconds, style: Literal["clock", "short"]) -> str:
    """A duration in seconds, rounded to whole seconds.

    - ``clock`` (report, ``gseff``): always ``[D-]HH:MM:SS`` (``00:00:30``,
      ``1-01:01:01``), as Slurm prints elapsed time.
    - ``short`` (mail): under a minute as seconds (``30 s``; one decimal
      below 10 s when not whole: ``2.5 s``), else ``[D-]HH:MM:SS``.
    """
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
    """Energy given in joules.

    - ``auto`` (report GPU table): whichever reads best of ``540 J``,
      ``2.5 Wh`` (below 10 Wh), ``150 Wh``, ``1.02 kWh``.
    - ``kwh_j`` (old mail): ``0.150 kWh (540000 J)``.
    - ``wh`` (report, mail, ``gseff``): ``0.2 Wh``, ``2.5 Wh`` (below 10 Wh),
      ``150 Wh``, ``1.02 kWh`` (from 1000 Wh).
    """
    f = as_number(joules)
    if f is None:
        return NA
    if style == "kwh_j":
        return f"{f / J_PER_KWH:.3f} kWh ({f:.0f} J)"
    if style == "wh":
        wh = f / J_PER_WH
        if wh >= 1000:
            return f"{wh / 1000:.2f} kWh"
        return f"{wh:.0f} Wh" if wh >= 10 else f"{wh:.1f} Wh"
    if style != "auto":
        raise ValueError(f"energy style {style!r}")
    wh = f / J_PER_WH
    if wh < 1:
        return f"{f:.0f} J"
    if wh < 1000:
        return f"{wh:.0f} Wh" if wh >= 10 else f"{wh:.1f} Wh"
    return f"{wh / 1000:.2f} kWh"


def fmt_power_w(watts) -> str:
    """Power in whole watts: ``350 W`` (mean power: energy over the sampled
    span, else the mean of ``nvmlDeviceGetPowerUsage``)."""
    f = as_number(watts)
    return NA if f is None else f"{f:.0f} W"


def fmt_hours_h(hours) -> str:
    """Hours (GPU-hours) with two decimals and no unit word: ``1.39`` (the
    text around it says "GPU-hours")."""
    f = as_number(hours)
    return NA if f is None else f"{f:.2f}"


__all__ = ["NA", "as_number", "fmt_pct", "fmt_share_pct", "fmt_bytes", "fmt_bytes_of", "fmt_time", "fmt_gib", "fmt_duration_s",
           "fmt_energy_j", "fmt_power_w", "fmt_hours_h"]
