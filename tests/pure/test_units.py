"""gsrun.report.units: one formatter per unit, and the same text as the
per-module formatters it replaced (render ``_b/_p/_dur/_energy``, mail
``_pct/_bytes/_duration/_energy/_hours``, gseff ``_gib``).

``tests/data/formatters/pre-units.json`` holds what those old functions
returned for a set of finite numbers (made at commit d8de2ac, before this
module existed); the report, the mail and ``gseff`` must print the same."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gsrun.report import units as U

PRE = json.loads((Path(__file__).resolve().parents[1] / "data" / "formatters" / "pre-units.json").read_text())
NEW = {
    "render._b": U.fmt_bytes,
    "render._p": lambda v: U.fmt_pct(v, 1),
    "render._dur": lambda v: U.fmt_duration_s(v, "clock"),
    "render._energy": lambda v: U.fmt_energy_j(v, "auto"),
    "mail._pct0": lambda v: U.fmt_pct(v, 0),
    "mail._pct1": lambda v: U.fmt_pct(v, 1),
    "mail._bytes": U.fmt_bytes,
    "mail._duration": lambda v: U.fmt_duration_s(v, "short"),
    "mail._energy": lambda v: U.fmt_energy_j(v, "kwh_j"),
    "mail._hours": U.fmt_hours_h,
    "mail._num": U.as_number,
    "gseff._gib": U.fmt_gib,
}


@pytest.mark.parametrize("old", sorted(PRE["out"]))
def test_same_text_as_the_formatter_it_replaced(old):
    got = [NEW[old](v) for v in PRE["values"]]
    assert got == PRE["out"][old]


@pytest.mark.parametrize("bad", [None, True, False, "12", [1], {}, math.nan, math.inf, -math.inf])
def test_not_a_finite_number_is_na(bad):
    assert U.as_number(bad) is None
    for fn in (U.fmt_bytes, U.fmt_gib, U.fmt_power_w, U.fmt_hours_h,
               lambda v: U.fmt_pct(v, 1), lambda v: U.fmt_duration_s(v, "clock"),
               lambda v: U.fmt_duration_s(v, "short"), lambda v: U.fmt_energy_j(v, "auto"),
               lambda v: U.fmt_energy_j(v, "kwh_j")):
        assert fn(bad) == U.NA
    assert U.fmt_pct(bad, 0, na="N/A (MIG)") == "N/A (MIG)"


def test_known_answers():
    assert U.fmt_duration_s(0, "clock") == "00:00:00" and U.fmt_duration_s(90061, "clock") == "1-01:01:01"
    assert U.fmt_duration_s(30, "short") == "30 s" and U.fmt_duration_s(2.5, "short") == "2.5 s"
    assert U.fmt_duration_s(1800, "short") == "00:30:00"
    assert U.fmt_energy_j(1800, "auto") == "1800 J" and U.fmt_energy_j(5 * 3600, "auto") == "5.0 Wh"
    assert U.fmt_energy_j(150 * 3600, "auto") == "150 Wh" and U.fmt_energy_j(2.5e6 * 3.6, "auto") == "2.50 kWh"
    assert U.fmt_energy_j(540000, "kwh_j") == "0.150 kWh (540000 J)"
    assert U.fmt_bytes(512) == "512 B" and U.fmt_bytes(1.5 * 2**30) == "1.5 GiB" and U.fmt_gib(2**33) == "8.00 GiB"
    assert U.fmt_pct(42, 1) == "42.0%" and U.fmt_pct(42.4, 0) == "42%"
    # a share above 0 never prints as 0% (the tiny-kernel job's SM activity 0.2 %)
    assert U.fmt_share_pct(0.2) == "0.2%" and U.fmt_share_pct(0.04) == "<0.1%" and U.fmt_share_pct(0.0) == "0%"
    assert U.fmt_share_pct(0.5) == "0.5%" and U.fmt_share_pct(0.6) == "1%" and U.fmt_share_pct(42.4) == "42%"
    assert U.fmt_share_pct(None) == "N/A" and U.fmt_share_pct(None, na="N/A (MIG)") == "N/A (MIG)"
    assert U.fmt_power_w(349.6) == "350 W" and U.fmt_hours_h(1.386) == "1.39"


def test_unknown_style_is_refused():
    with pytest.raises(ValueError):
        U.fmt_duration_s(100, "iso")
    with pytest.raises(ValueError):
        U.fmt_energy_j(100, "btu")
