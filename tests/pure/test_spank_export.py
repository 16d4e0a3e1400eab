"""The SPANK hooks' value checks that avoid `re` (the --gs-* path
imports no regex engine) accept exactly what the regexes they replace accept."""

import re

import pytest

from gsrun.request.mps_share import parse_mps_share
from gsrun.spank_py import hooks

EXPORT_RE = re.compile(r"[A-Za-z0-9_.,=+:-]{0,512}")   # what gsrun.facts.jobenv accepts
PCT_RE = re.compile(r"[0-9]{1,3}")


@pytest.mark.parametrize("text", ["", "50", "swappiness=10,thp=never", "7x1g.18gb", "a:b+c-d", "x" * 512,
                                  "x" * 513, "a b", "a\n", "é", "４２", "a;b", "$(id)", "a/b", "ABC_def.1"])
def test_export_value_matches_the_regex(text):
    assert hooks.is_export_value(text) == bool(EXPORT_RE.fullmatch(text))


@pytest.mark.parametrize("text", ["1", "50", "050", "100", "0", "101", "0100", "1000", "-5", "50%", "abc",
                                  "４２", "5\n", " 7 ", "1e2", "+5"])
def test_mps_share_matches_the_regex_rule(text):
    v = text.strip()
    ok = bool(PCT_RE.fullmatch(v)) and 1 <= int(v) <= 100
    if ok:
        assert parse_mps_share(text) == int(v)
    else:
        with pytest.raises(Exception, match="bad active thread percentage"):
            parse_mps_share(text)
