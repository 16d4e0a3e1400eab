"""The regex-free checks on ``gsrun``'s path answer as the allow-lists they
replaced, and :func:`gsrun.base.exe.which` finds what
:func:`shutil.which` finds."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from gsrun.base.exe import which
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


def test_which_finds_what_shutil_finds(tmp_path, monkeypatch):
    a, b, d = tmp_path / "a", tmp_path / "b", tmp_path / "d"
    for p in (a, b, d / "tool"):
        p.mkdir(parents=True)
    (a / "tool").write_text("#!/bin/sh\n")           # not executable
    (b / "tool").write_text("#!/bin/sh\n")
    (b / "tool").chmod(0o755)
    (b / "other").write_text("")
    (b / "other").chmod(0o755)
    monkeypatch.chdir(b)
    paths = [f"{a}:{b}", f"{d}:{b}", f"{a}", "", ":", f"{b}:{b}", f"{a}::{b}", "/nonexistent"]
    for name in ("tool", "other", "missing", str(b / "tool"), str(a / "tool"), "./tool", "sh"):
        for path in paths:
            assert which(name, path) == shutil.which(name, path=path), (name, path)
    monkeypatch.setenv("PATH", f"{a}:{b}")
    assert which("tool") == shutil.which("tool") == os.path.join(b, "tool")
    monkeypatch.delenv("PATH")
    assert which("sh") == shutil.which("sh")
