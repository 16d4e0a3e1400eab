"""spank_py/build.py install side: the plugstack block and the copied .so
(pure + tmp files; no compiler needed)."""

import stat

import pytest

from gsrun.base.errors import ConfigError, InputError
from gsrun.spank_py import build as b


@pytest.fixture
def so(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    p = d / "gsrun_spank.so"
    p.write_bytes(b"\x7fELF fake gsrun_spank built-for slurm=0x180b01 python=3.13.5 libpython=x")
    (d / b.PY_PART_NAME).write_bytes(b"\x7fELF fake python half")
    return p


def test_install_writes_block_and_keeps_other_plugins(tmp_path, so):
    ps = tmp_path / "plugstack.conf"
    ps.write_text("optional /usr/lib/slurm/other.so a=1\n")
    dest = tmp_path / "lib"
    target = b.install(so, dest, ps, {"pythonpath": ["/opt/gsrun/venv/lib/python3.13/site-packages", "/x"],
                                      "on_error": "ignore", "bind": "none"})
    assert target == dest / "gsrun_spank.so" and target.read_bytes() == so.read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    half = dest / b.PY_PART_NAME          # the plugin loads its Python half from its own folder
    assert half.read_bytes() == b"\x7fELF fake python half" and stat.S_IMODE(half.stat().st_mode) == 0o755
    text = ps.read_text()
    assert text.startswith("optional /usr/lib/slurm/other.so a=1\n")
    lines = [l for l in text.splitlines() if l.startswith("required")]
    assert lines == [f"required {target} pythonpath=/opt/gsrun/venv/lib/python3.13/site-packages "
                     "pythonpath=/x on_error=ignore bind=none"]
    assert "Built for Slurm 24.11.1 with Python 3.13.5" in text   # read back from the .so


def test_reinstall_replaces_block(tmp_path, so):
    ps = tmp_path / "plugstack.conf"
    b.install(so, tmp_path / "lib", ps, {"pythonpath": "/a"})
    ps.write_text(ps.read_text() + "optional /other.so\n")
    b.install(so, tmp_path / "lib", ps, {"pythonpath": "/b"})
    text = ps.read_text()
    assert text.count(b.BEGIN_MARKER) == 1 and "pythonpath=/b" in text and "pythonpath=/a" not in text
    assert "optional /other.so" in text


def test_install_without_the_python_half_installs_nothing(tmp_path, so):
    (so.parent / b.PY_PART_NAME).unlink()
    with pytest.raises(b.NodeError, match="the plugin's Python half"):
        b.install(so, tmp_path / "lib", tmp_path / "plugstack.conf")
    assert not (tmp_path / "lib" / "gsrun_spank.so").exists() and not (tmp_path / "plugstack.conf").exists()


@pytest.mark.parametrize("args,needle", [
    ({"colour": "blue"}, "unknown keys ['colour']"),
    ({"pythonpath": "relative"}, "absolute path"),
    ({"pythonpath": "/with space"}, "absolute path"),
    ({"pythonpath": "/a\nrequired /evil.so"}, "absolute path"),
    ({"on_error": "maybe"}, "fail, ignore"),
    ({"bind": "spread"}, "auto, none"),
])
def test_bad_install_args_refused_before_writing(tmp_path, so, args, needle):
    ps = tmp_path / "plugstack.conf"
    with pytest.raises(InputError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        b.install(so, tmp_path / "lib", ps, args)
    assert not ps.exists() and not (tmp_path / "lib").exists()


def test_half_block_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no end marker"):
        b.merge_plugstack(b.BEGIN_MARKER + "\nrequired /x.so\n", "new\n")


def test_render_is_strict_about_path():
    with pytest.raises(InputError):
        b.render_plugstack("relative.so", [])
    text = b.render_plugstack("/usr/lib/gsrun/gsrun_spank.so", [("bind", "auto")], "22.05.8", "3.11.2")
    assert "\nrequired /usr/lib/gsrun/gsrun_spank.so bind=auto\n" in text
    assert text.endswith(b.END_MARKER + "\n")
