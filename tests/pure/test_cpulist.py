"""parse_cpulist bounds: a range is checked before it is expanded, so a
hostile list (``--allowed-cpus``, a planted cpuset file) costs nothing.
Before the check, ``0-100000000`` took 35 s and 8.6 GiB before it was refused;
``0-4294967295`` would have needed hundreds of GiB."""

from __future__ import annotations

import time

import pytest

from gsrun.base.cpulist import MAX_LIST_IDS, parse_cpulist
from gsrun.base.errors import InputError


@pytest.mark.parametrize("text", ["0-4294967295", "0-100000000", "65536", "0-65536:2", "9" * 5000, "0-" + "9" * 5000])
def test_ids_beyond_the_bound_are_refused_before_expanding(text):
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="CPU id out of range"):
        parse_cpulist(text)
    assert time.perf_counter() - t0 < 0.05


def test_many_overlapping_full_ranges_are_refused_fast():
    t0 = time.perf_counter()
    with pytest.raises(InputError) as ei:
        parse_cpulist(",".join(["0-65535"] * 5000))
    assert time.perf_counter() - t0 < 0.5
    assert str(ei.value).startswith("gsrun: cpulist: list too long:") and "\nhint: " in str(ei.value)
    assert f"over {MAX_LIST_IDS}" in str(ei.value)


def test_largest_lists_still_parse():
    assert parse_cpulist("0-65535") == list(range(65536))
    assert parse_cpulist("0-65535,0-65535,0-65535,0-65535") == list(range(65536))
    assert parse_cpulist("0-15:2,1") == [0, 1, 2, 4, 6, 8, 10, 12, 14]
