"""Site config validation: every key in SETTINGS rejects bad values with a
message that names the key; unknown sections/keys; partition tables; the
commented file and the generated reference (docs/CONFIG.md)."""

import json
import re
from pathlib import Path

import pytest

from gsrun.request import config
from gsrun.request.config import SETTINGS, ConfigError, parse_config
from gsrun.admin.install import render_config_reference

REPO = Path(__file__).resolve().parents[2]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def doc(key, value):
    sec, name = key.split(".", 1)
    return f"[{sec}]\n{name} = {toml_value(value)}\n"


def types_of(s):
    return s.type if isinstance(s.type, tuple) else (s.type,)


def wrong_type_value(s):
    """A value of a type the setting does not accept."""
    ts = types_of(s)
    for cand in ("not-a-number", 7, True, ["x"], {"A": "b"}, 2.5):
        if isinstance(cand, bool):
            if bool not in ts:
                return cand
            continue
        if not isinstance(cand, ts):
            return cand
    raise AssertionError(s.key)


def range_values(s):
    """Values just outside a numeric 'lo-hi' range from the table's own text."""
    m = re.fullmatch(r"(-?[0-9.]+)-([0-9.]+)", s.allowed)
    if not m:
        return []
    lo, hi = float(m.group(1)), float(m.group(2))
    if int in types_of(s) and float not in types_of(s):
        return [int(lo) - 1, int(hi) + 1]
    return [lo - 0.01 if lo > 0 else -1.0, hi * 2 + 1]


BAD_STRINGS = ["relative/path", "two\nlines", "bad value!", "0=16", "nope@", "x" * 300, "", "job,always",
               "governor=", "with space"]
BAD_DICTS = [{"bad name!": "x"}, {"lower": "x"}, {"ok": "9x9.bad"}]


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
def test_default_is_valid_and_round_trips(s):
    cfg = parse_config(doc(s.key, s.default))
    assert cfg[s.key] == s.default


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
def test_wrong_type_names_the_key(s):
    bad = wrong_type_value(s)
    with pytest.raises(ConfigError) as e:
        parse_config(doc(s.key, bad))
    msg = str(e.value)
    assert s.key in msg
    assert "allowed:" in msg


@pytest.mark.parametrize("s", [s for s in SETTINGS if range_values(s)], ids=lambda s: s.key)
def test_out_of_range_names_the_key_and_range(s):
    for bad in range_values(s):
        with pytest.raises(ConfigError) as e:
            parse_config(doc(s.key, bad))
        assert s.key in str(e.value)
        assert s.allowed in str(e.value)


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.check and str in types_of(s)], ids=lambda s: s.key)
def test_every_checked_string_rejects_something(s):
    rejected = []
    for bad in BAD_STRINGS:
        try:
            parse_config(doc(s.key, bad))
        except ConfigError as e:
            assert s.key in str(e)
            rejected.append(bad)
    assert rejected, f"{s.key}: no bad string was rejected"


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.check and dict in types_of(s)], ids=lambda s: s.key)
def test_every_checked_table_rejects_something(s):
    rejected = 0
    for bad in BAD_DICTS:
        try:
            parse_config(doc(s.key, bad))
        except ConfigError as e:
            assert s.key in str(e)
            rejected += 1
    assert rejected


def test_tuning_allowed_keys_rejects_unknown():
    with pytest.raises(ConfigError, match="tuning.allowed_keys"):
        parse_config('[tuning]\nallowed_keys = ["governor", "nohz_full"]\n')


def test_tune_keys_come_from_tuning_request():
    from gsrun.request import tune as tuning_request

    assert config.TUNE_KEYS is tuning_request.TUNE_KEYS


@pytest.mark.parametrize("value,ok", [
    ("", True), ("0=16G", True), ("0=16G,1=512M", True), ("10=1G", True),
    ("0=16G,", False), (",0=16G", False), ("0=16G1=16G", False), ("0=16", False), ("a=16G", False),
    ("0=16G,,1=2G", False), ("0=16T", False), ("0=16G\n", False),
])
def test_pinned_mem_limit_fullmatch(value, ok):
    text = doc("mps.pinned_mem_limit", value)
    if ok:
        assert parse_config(text)["mps.pinned_mem_limit"] == value
    else:
        with pytest.raises(ConfigError, match="mps.pinned_mem_limit"):
            parse_config(text)


def test_mail_default_domain():
    assert parse_config("")["mail.default_domain"] == ""
    assert parse_config('[mail]\ndefault_domain = "example.org"\n')["mail.default_domain"] == "example.org"
    with pytest.raises(ConfigError, match="mail.default_domain"):
        parse_config('[mail]\ndefault_domain = "exa mple.org"\n')


def test_bool_is_not_a_number_and_int_becomes_float():
    with pytest.raises(ConfigError, match="sampler.interval_s"):
        parse_config("[sampler]\ninterval_s = true\n")
    cfg = parse_config("[sampler]\ninterval_s = 2\n")
    assert cfg["sampler.interval_s"] == 2.0 and isinstance(cfg["sampler.interval_s"], float)


def test_unknown_section_and_key():
    with pytest.raises(ConfigError) as e:
        parse_config("[sampling]\ninterval_s = 1\n")
    assert "[sampling]" in str(e.value) and "sampler" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config("[sampler]\ninterval = 1\n")
    assert "sampler.interval" in str(e.value) and "interval_s" in str(e.value)
    with pytest.raises(ConfigError, match="TOML syntax"):
        parse_config("[sampler\n")
    with pytest.raises(ConfigError, match="bad section"):
        parse_config('sampler = 1\n')


def test_partition_tables():
    cfg = parse_config('[tuning]\ndefaults = "swappiness=30"\n'
                       '[partition.gpu.tuning]\ndefaults = "governor=performance,swappiness=10"\n'
                       '[partition.gpu.findings]\nidle_util_pct = 2\n')
    assert cfg.get("tuning.defaults") == "swappiness=30"
    assert cfg.get("tuning.defaults", "gpu") == "governor=performance,swappiness=10"
    assert cfg.get("findings.idle_util_pct", "gpu") == 2.0
    assert cfg.get("findings.idle_util_pct", "cpu") == 5.0
    # a key that is not per-partition
    with pytest.raises(ConfigError) as e:
        parse_config('[partition.gpu.sampler]\ninterval_s = 1\n')
    assert "partition.gpu.sampler.interval_s" in str(e.value) and "per-partition keys" in str(e.value)
    with pytest.raises(ConfigError, match="partition.gpu.tuning.nope"):
        parse_config('[partition.gpu.tuning]\nnope = 1\n')
    with pytest.raises(ConfigError, match="tuning.defaults"):
        parse_config('[partition.gpu.tuning]\ndefaults = "bogus=1"\n')
    with pytest.raises(ConfigError, match="bad partition name"):
        parse_config('[partition."g p u".tuning]\nenabled = true\n')
    with pytest.raises(ConfigError, match="must be a table"):
        parse_config('[partition.gpu]\ntuning = 1\n')
    with pytest.raises(ConfigError, match=r"\[partition\] must hold"):
        parse_config('partition = 1\n')


def test_commented_config_parses_and_uncommented_gives_defaults():
    text = config.render_commented_config()
    assert parse_config(text).effective() == parse_config("").effective()
    # uncomment every "# key = value" line: the defaults, written out, parse back to the defaults
    lines = []
    for line in text.split("# Per-partition overrides")[0].splitlines():
        m = re.match(r"^# ([a-z_]+) = (.*)$", line)
        lines.append(f"{m.group(1)} = {m.group(2)}" if m else line)
    cfg = parse_config("\n".join(lines))
    for s in SETTINGS:
        assert cfg[s.key] == s.default, s.key
        assert f"# {s.meaning}" in text


def test_reference_lists_every_key():
    ref = render_config_reference()
    for s in SETTINGS:
        sec, name = s.key.split(".", 1)
        assert f"## [{sec}]" in ref
        assert f"| `{name}` |" in ref, s.key
    assert "gsrun-node config reference > docs/CONFIG.md" in ref


def test_docs_config_md_is_generated():
    path = REPO / "docs" / "CONFIG.md"
    assert path.exists(), "docs/CONFIG.md missing: run gsrun-node config reference > docs/CONFIG.md"
    assert path.read_text() == render_config_reference(), (
        "docs/CONFIG.md is out of date with gsrun/config.py SETTINGS; regenerate it with:\n"
        "  gsrun-node config reference > docs/CONFIG.md")


# the patterns the string checks of gsrun.request.config stand for (no `re` on the hooks' path)
_PATTERNS = {
    "is_env_name": (r"^[A-Z_][A-Z0-9_]*\Z", re.match),
    "is_host_name": (r"^[A-Za-z0-9.-]{1,253}\Z", re.match),
    "is_email": (r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\Z", re.match),
}
_SAMPLES = ["", "A", "a", "_", "9", "NCCL_DEBUG", "nccl_debug", "A1", "1A", "A-B", "A B", "A\n", "\u00c9T\u00c9",
            "\uff21", "\u0664", "K\u212a", "localhost", "127.0.0.1", "a.b-c", "a_b", "-x", ".", "x" * 253,
            "x" * 254, "h\u00f6st", "host\n", "a@b", "@b", "a@", "a@@b", "a@b@c", "gsrun@localhost",
            "first.last+tag%x@example.org", "a b@c", "a@b c", "a@b_c", "\u00e9@b", "a@\u00e9", "A@B\n"]


@pytest.mark.parametrize("name", sorted(_PATTERNS))
def test_string_checks_equal_their_patterns(name):
    pat, how = _PATTERNS[name]
    check = getattr(config, name)
    for v in _SAMPLES:
        assert check(v) == bool(how(pat, v)), (name, v)


def test_command_name_check_equals_its_pattern():
    for v in _SAMPLES + ["sacctmgr", "x+y.z_1-2", "x" * 255, "x" * 256, "a/b"]:
        assert (config._bin(v) is None) == (v.startswith("/") and config._abs_path(v) is None
                                            or bool(re.fullmatch(r"[A-Za-z0-9_.+-]{1,255}", v))), v
