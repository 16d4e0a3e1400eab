import pytest

from gsrun.request.config import parse_config
from gsrun.base.errors import ConfigError, InputError
from gsrun.request.tune import parse_tune_request


def test_parse_all_keys_in_order():
    text = ("governor=performance, swappiness=10,swap=off,dirty_ratio=40,dirty_background_ratio=5,"
            "thp=never,thp_defrag=defer+madvise,zone_reclaim_mode=0")
    got = parse_tune_request(text)
    assert got == {"governor": "performance", "swappiness": "10", "swap": "off", "dirty_ratio": "40",
                   "dirty_background_ratio": "5", "thp": "never", "thp_defrag": "defer+madvise",
                   "zone_reclaim_mode": "0"}
    assert list(got) == ["governor", "swappiness", "swap", "dirty_ratio", "dirty_background_ratio",
                         "thp", "thp_defrag", "zone_reclaim_mode"]


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_is_nothing(text):
    assert parse_tune_request(text) == {}


@pytest.mark.parametrize("text,token", [
    ("swappiness=201", "swappiness=201"),
    ("swappiness=-1", "swappiness=-1"),
    ("swappiness=010", "swappiness=010"),
    ("dirty_ratio=101", "dirty_ratio=101"),
    ("zone_reclaim_mode=8", "zone_reclaim_mode=8"),
    ("swap=on", "swap=on"),
    ("thp=sometimes", "thp=sometimes"),
    ("thp_defrag=defer madvise", "thp_defrag=defer madvise"),
    ("governor=Performance", "governor=Performance"),
    ("governor=perf;reboot", "governor=perf;reboot"),
    ("governor=$(id)", "governor=$(id)"),
    ("nice=5", "nice=5"),
    ("swappiness", "swappiness"),
    ("a=b=c", "a=b=c"),
    ("swappiness=10,,thp=never", ""),
    ("swappiness=10,", ""),
    ("swappiness=10,swappiness=20", "swappiness=20"),
    ("swappiness=1\n0", "swappiness=1\n0"),
])
def test_bad_token_is_named(text, token):
    with pytest.raises(InputError) as ei:
        parse_tune_request(text)
    assert f"token {token!r}" in ei.value.detail
    assert str(ei.value).startswith("gsrun: tune: bad tuning request: ")


def test_boundaries_accepted():
    assert parse_tune_request("swappiness=200,dirty_ratio=100,dirty_background_ratio=0") == {
        "swappiness": "200", "dirty_ratio": "100", "dirty_background_ratio": "0"}


def test_config_uses_parser_for_defaults():
    cfg = parse_config('[tuning]\ndefaults = "governor=performance,swappiness=10"\n')
    assert cfg["tuning.defaults"] == "governor=performance,swappiness=10"
    with pytest.raises(ConfigError) as ei:
        parse_config('[partition.gpu.tuning]\ndefaults = "swappiness=300"\n')
    assert "swappiness=300" in str(ei.value)
