"""Layout syntax (gsrun.request.mig_layout): pure."""

import pytest

from gsrun.base.errors import InputError
from gsrun.request.mig_layout import MAX_INSTANCES, format_layout, parse_layout


@pytest.mark.parametrize("text,want", [
    ("7g.141gb", [(1, "7g.141gb")]),
    ("3g.71gb+3g.71gb", [(2, "3g.71gb")]),
    ("7x1g.18gb", [(7, "1g.18gb")]),
    ("2x2g.35gb+1g.18gb", [(2, "2g.35gb"), (1, "1g.18gb")]),
    ("1g.18gb+me+3x1g.18gb", [(1, "1g.18gb+me"), (3, "1g.18gb")]),
    ("2x1g.18gb+me", [(2, "1g.18gb+me")]),
    ("  4G.71GB+3g.71gb \n", [(1, "4g.71gb"), (1, "3g.71gb")]),
    ("1g.24gb+gfx", [(1, "1g.24gb+gfx")]),
    ("8x1g.18gb", [(8, "1g.18gb")]),  # syntax fine; the planner refuses it for the GPU
])
def test_parse_valid(text, want):
    assert parse_layout(text) == want


@pytest.mark.parametrize("text,needle", [
    ("", "empty layout"),
    ("   ", "empty layout"),
    ("3g.71gb;rm -rf /", "outside [0-9a-z.+x]"),
    ("$(reboot)", "outside"),
    ("3g.71gb 3g.71gb", "outside"),
    ("3g.71gb\n+1g.18gb", "outside"),
    ("3g.71gb++1g.18gb", "empty term"),
    ("+3g.71gb", "empty term"),
    ("3g.71gb+", "empty term"),
    ("me+1g.18gb", "must follow a profile"),
    ("1g.18gb+me+me", "given twice"),
    ("0x1g.18gb", "at least 1"),
    ("3g71gb", "not a profile term"),
    ("3g.71", "not a profile term"),
    ("g.71gb", "not a profile term"),
    ("1g.18gb+xyz", "not a profile term"),
    ("999x1g.18gb", "not a profile term"),
    ("9x1g.18gb+9x1g.18gb", f"18 instances requested; gsrun accepts at most {MAX_INSTANCES}"),
    ("1g.18gb+" * 60 + "1g.18gb", "characters; at most"),
])
def test_parse_invalid(text, needle):
    with pytest.raises(InputError) as ei:
        parse_layout(text)
    assert needle in ei.value.detail
    assert ei.value.hint and "7x1g.18gb" in ei.value.hint
    assert str(ei.value).startswith("gsrun: mig: bad layout: ")


def test_parse_rejects_non_text():
    with pytest.raises(InputError):
        parse_layout(["3g.71gb"])


def test_format_roundtrip():
    for t in ["2x3g.71gb", "4g.71gb+2x1g.35gb", "1g.18gb+me+6x1g.18gb"]:
        assert format_layout(parse_layout(t)) == t


def test_config_validates_site_layouts_with_parse_layout():
    from gsrun.request.config import _layouts
    assert _layouts({"small": "7x1g.18gb", "halves": "3g.71gb+3g.71gb"}) is None
    msg = _layouts({"bad": "3g.71gb;x"})
    assert msg and "bad" in msg and "outside" in msg
