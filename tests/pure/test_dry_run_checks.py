"""The regex-free checks on ``gsrun``'s path answer as the allow-lists they
replaced."""

from __future__ import annotations

import re

import pytest

from gsrun.request.malloc import LIB_DIRS, check_lib_dirs
from gsrun.wrapper.render import _env_name
from gsrun.wrapper.spec import CONTROL_RE, has_control, sbatch_word

SAMPLES = ["", "a", "train.py", "llm-sft", "a b", "x\n", "\t", "a\x7f", "\x00", "é", "naïve\x01", "\u2028",
           "\x85", "\xa0", "ok_Name9", "9abc", "_x", "A" * 128, "A" * 129, "a-b", "a.b", "ab\ud800", "%j:@+=/,",
           "$(id)", "`id`", "'q'", '"d"', "#c", "/usr/lib", "/usr/../lib", "/usr/lib/x86_64-linux-gnu",
           "rel/dir", "/" + "d" * 254, "/" + "d" * 255, "/a b", "/a~"]


@pytest.mark.parametrize("text", SAMPLES)
def test_has_control_is_the_control_regex(text):
    assert has_control(text) == (re.search(CONTROL_RE, text) is not None)


@pytest.mark.parametrize("text", SAMPLES)
def test_plain_sbatch_word_as_before(text):
    plain = re.fullmatch(r"[A-Za-z0-9_.,:@%+=/-]+", text) is not None
    assert (sbatch_word(text) == text) == plain
    if not plain:
        assert sbatch_word(text) == '"' + re.sub(r'([\\"])', r"\\\1", text) + '"'


@pytest.mark.parametrize("text", SAMPLES)
def test_env_name_is_the_env_name_regex(text):
    assert _env_name(text) == (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", text) is not None)


@pytest.mark.parametrize("text", SAMPLES)
def test_lib_dir_is_the_lib_dir_regex(text):
    good = re.fullmatch(r"/[A-Za-z0-9_.+/-]{0,254}", text) is not None and "/../" not in text + "/"
    assert (check_lib_dirs([text]) is None) == good
    assert check_lib_dirs(LIB_DIRS) is None
