"""gsrun.base.deferred: ``import`` binds a placeholder, the module runs on first
attribute access, once, into the same object; and gsrun's click options give
click's help text without running ``inspect`` (issue 24, item 6)."""

from __future__ import annotations

import importlib
import sys
import time

import click
import pytest

from gsrun.base.deferred import _Deferred, defer_import


@pytest.fixture
def modules_dir(tmp_path, monkeypatch):
    """A directory on sys.path whose modules count their runs in ``RUNS`` of
    a module the test keeps (``sys.modules`` restored afterwards)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(sys.modules)
    runs = []
    sys.modules["_deferred_test_runs"] = type(sys)("_deferred_test_runs")
    sys.modules["_deferred_test_runs"].RUNS = runs
    yield tmp_path, runs
    for name in set(sys.modules) - set(saved):
        del sys.modules[name]


def _module(d, name: str, body: str) -> None:
    (d / f"{name}.py").write_text(f"import _deferred_test_runs\n_deferred_test_runs.RUNS.append({name!r})\n{body}")


def test_import_binds_a_placeholder_that_runs_once_on_first_use(modules_dir):
    d, runs = modules_dir
    _module(d, "dmod_a", "VALUE = 42\ndef double(x):\n    return 2 * x\n")
    assert defer_import("dmod_a") is True
    import dmod_a

    assert runs == [] and isinstance(dmod_a, _Deferred)
    assert dmod_a.__name__ == "dmod_a" and dmod_a.__file__ == str(d / "dmod_a.py")   # without running it
    assert dmod_a.double(4) == 8                                    # first use runs it
    assert runs == ["dmod_a"] and type(dmod_a) is type(sys)
    from dmod_a import VALUE

    assert VALUE == 42 and sys.modules["dmod_a"] is dmod_a and runs == ["dmod_a"]
    with pytest.raises(AttributeError):
        dmod_a.missing


def test_a_module_that_fails_raises_at_first_use_and_is_not_left_half_made(modules_dir):
    d, runs = modules_dir
    _module(d, "dmod_bad", "X = 1\nraise RuntimeError('broken module')\n")
    assert defer_import("dmod_bad") is True
    import dmod_bad

    with pytest.raises(RuntimeError, match="broken module"):
        dmod_bad.X
    assert "dmod_bad" not in sys.modules
    with pytest.raises(RuntimeError, match="broken module"):   # a new import tries again, as usual
        importlib.import_module("dmod_bad")
    assert runs == ["dmod_bad", "dmod_bad"]


def test_nothing_changes_for_imported_missing_package_or_builtin_modules(modules_dir):
    d, runs = modules_dir
    _module(d, "dmod_b", "")
    importlib.import_module("dmod_b")

    assert defer_import("dmod_b") is False and runs == ["dmod_b"]
    (d / "dpkg").mkdir()
    (d / "dpkg" / "__init__.py").write_text("")
    assert defer_import("dpkg") is False and "dpkg" not in sys.modules
    assert defer_import("dmod_not_there") is False and "dmod_not_there" not in sys.modules
    assert defer_import("dpkg.sub") is False
    assert defer_import("sys") is False                             # already imported (builtin)


@pytest.mark.parametrize("help_text", ["Total GPUs (one task per GPU).", "", None, "  two\n    lines\n  here\n",
                                       "a\ttab", " leading space", "trailing space ", "one line\n"])
@pytest.mark.parametrize("deprecated", [False, True])
def test_gsrun_options_help_is_what_click_makes(help_text, deprecated):
    """gsrun.wrapper.cli._Option sets a plain one-line help text itself (click
    would run inspect.cleandoc on it); every text ends as click's own option
    would have it."""
    from gsrun.wrapper.cli import _Option

    try:
        theirs = click.Option(["--x"], help=help_text, deprecated=deprecated)
    except TypeError:
        pytest.skip("this click has no deprecated options (before 8.2)")
    ours = _Option(["--x"], help=help_text, deprecated=deprecated)
    assert ours.help == theirs.help


def test_every_gsrun_option_takes_the_plain_path():
    """gsrun's own help texts are all plain (so a dry run needs no inspect)
    and the help page lists them as click would."""
    from gsrun.wrapper.cli import _Option, cli

    opts = [p for p in cli.params if isinstance(p, click.Option)]
    assert len(opts) >= 30 and all(type(p) is _Option for p in opts)
    for p in opts:
        assert p.help and p.help == p.help.strip() and "\n" not in p.help and "\t" not in p.help, p.opts


def test_a_second_thread_waits_for_the_module_to_finish(modules_dir):
    """Two threads read an attribute of a deferred module at once: the module
    runs once and both get the value (the second waits, as for an import in
    progress), never an AttributeError from a half-run module."""
    import threading

    d, runs = modules_dir
    _module(d, "slow_deferred", "import time\ntime.sleep(0.3)\nvalue = 42\n")
    assert defer_import("slow_deferred")
    import slow_deferred

    got = []

    def read():
        try:
            got.append(slow_deferred.value)
        except Exception as e:  # noqa: BLE001 - the failure is what the test looks for
            got.append(e)

    threads = [threading.Thread(target=read) for _ in range(2)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join()
    assert got == [42, 42] and runs == ["slow_deferred"]
