"""The hooks' parsed-config cache (``load_config_or_defaults(cache_dir=...)``):
used only for the very file it was written for, re-checked value by value,
ignored when foreign, tampered or stale."""

from __future__ import annotations

import marshal
import os

import pytest

import gsrun.request.config as config
from gsrun.request.config import CACHE_NAME, load_config_or_defaults

TEXT = '[sampler]\ninterval_s = 3\n[partition.gpu.tuning]\ndefaults = "swappiness=10"\n'


@pytest.fixture
def site(tmp_path, monkeypatch):
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text(TEXT)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    return cfg, state


def _no_parse(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("parsed although the cache is valid")
    monkeypatch.setattr(config, "parse_config", refuse)


def test_cache_written_then_used_without_parsing(site, monkeypatch):
    cfg, state = site
    first = load_config_or_defaults(cache_dir=state)
    cache = state / CACHE_NAME
    assert cache.stat().st_mode & 0o777 == 0o600
    assert first["sampler.interval_s"] == 3.0 and first.get("tuning.defaults", "gpu") == "swappiness=10"
    _no_parse(monkeypatch)
    again = load_config_or_defaults(cache_dir=state)
    assert again.effective("gpu") == first.effective("gpu")
    assert again.effective(None) == first.effective(None)
    assert isinstance(again["sampler.interval_s"], float) and again.source == str(cfg)


def test_edited_file_is_parsed_again(site):
    cfg, state = site
    load_config_or_defaults(cache_dir=state)
    cfg.write_text(TEXT.replace("interval_s = 3", "interval_s = 7"))
    assert load_config_or_defaults(cache_dir=state)["sampler.interval_s"] == 7.0
    assert marshal.loads((state / CACHE_NAME).read_bytes())["values"]["sampler.interval_s"] == 7.0


def test_tampered_value_is_not_trusted(site):
    cfg, state = site
    load_config_or_defaults(cache_dir=state)
    cache = state / CACHE_NAME
    data = marshal.loads(cache.read_bytes())
    data["values"]["sampler.interval_s"] = -5          # outside the allowed range
    data["values"]["paths.state_dir"] = "relative/dir"  # not an absolute path
    cache.write_bytes(marshal.dumps(data))
    got = load_config_or_defaults(cache_dir=state)
    assert got["sampler.interval_s"] == 3.0 and got["paths.state_dir"].startswith("/")


def test_unknown_key_or_foreign_mode_ignored(site, monkeypatch):
    cfg, state = site
    load_config_or_defaults(cache_dir=state)
    cache = state / CACHE_NAME
    data = marshal.loads(cache.read_bytes())
    data["values"]["sampler.interval_s"] = 9.0          # in range: would be taken if the file were trusted
    cache.write_bytes(marshal.dumps(data))
    os.chmod(cache, 0o666)
    assert load_config_or_defaults(cache_dir=state, write_cache=False)["sampler.interval_s"] == 3.0
    os.chmod(cache, 0o600)
    assert load_config_or_defaults(cache_dir=state, write_cache=False)["sampler.interval_s"] == 9.0
    data["values"]["sampler.no_such_key"] = 1
    cache.write_bytes(marshal.dumps(data))
    assert load_config_or_defaults(cache_dir=state, write_cache=False)["sampler.interval_s"] == 3.0


def test_symlinked_cache_not_followed(site, tmp_path):
    cfg, state = site
    load_config_or_defaults(cache_dir=state)
    real = tmp_path / "elsewhere.marshal"
    os.replace(state / CACHE_NAME, real)
    data = marshal.loads(real.read_bytes())
    data["values"]["sampler.interval_s"] = 9.0
    real.write_bytes(marshal.dumps(data))
    os.symlink(real, state / CACHE_NAME)
    assert load_config_or_defaults(cache_dir=state, write_cache=False)["sampler.interval_s"] == 3.0


def test_fifo_at_the_cache_is_not_read(site):
    """A FIFO planted where the cache goes is refused without blocking (every hook reads it)."""
    cfg, state = site
    os.mkfifo(state / CACHE_NAME, 0o600)
    assert load_config_or_defaults(cache_dir=state, write_cache=False)["sampler.interval_s"] == 3.0


def test_broken_config_gives_defaults_and_no_cache(site):
    cfg, state = site
    cfg.write_text("[sampler]\ninterval_s = 'fast'\n")
    errors = []

    class Log:
        def error(self, m):
            errors.append(m)
    got = load_config_or_defaults(Log(), cache_dir=state)
    assert got.source == "<defaults>" and errors and "interval_s" in errors[0]
    assert not (state / CACHE_NAME).exists()


def test_missing_state_dir_means_no_cache(site, tmp_path):
    cfg, state = site
    got = load_config_or_defaults(cache_dir=tmp_path / "absent")
    assert got["sampler.interval_s"] == 3.0 and not (tmp_path / "absent").exists()
