"""Golden ``gsrun-node install`` output and the files it renders.

- ``install/print-single.txt``, ``install/print-prolog.d.txt``: the whole
  ``gsrun-node install --print --no-measure`` output (click, in-process) for
  the two slurm.conf layouts; the second also gives ``--hooks-dir``,
  ``--state-dir``, ``--spool-dir`` and ``--log-file``;
- ``install/gsrun.toml`` (the commented site config), ``gsrun-mail.service``,
  ``gsrun-mail.timer``, ``slurm.conf-single``, ``slurm.conf-prolog.d`` and
  ``plugstack.conf`` (:func:`gsrun.spank_py.build.render_plugstack`): each
  renderer alone, with fixed arguments;
- ``install/config-reference.md``: ``gsrun-node config reference``.

Inputs fixed by the test: the config path is ``<TMP>/etc/gsrun.toml`` (absent,
so the commented file is shown); ``SLURM_CONF`` is
``install/input-slurm.conf`` (a site prolog, ``PrologFlags=X11``,
``proctrack/cgroup``, a 30 s timeout); the Slurm version is
``23.11.4 from 'slurmctld -V'`` (``install.detect_slurm_version`` replaced:
this machine's Slurm, if any, does not count); the installation is
``<TMP>/venv/bin/python`` with a ``gsrun-node`` beside it
(``install.find_installation`` called with that python).

Normalised (placeholders): ``<TMP>`` the test's temporary directory,
``<REPO>`` this checkout. Regenerate with ``GSRUN_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import functools
import os

import pytest
from click.testing import CliRunner

from gsrun.spank_py.build import render_plugstack
from gsrun.admin import install
from gsrun.admin.node import cli
from helpers.golden import check_text
from helpers.paths import DATA, REPO

GOLDEN = DATA / "golden" / "install"
LAYOUTS = {
    "single": [],
    "prolog.d": ["--layout", "prolog.d", "--hooks-dir", "/opt/gsrun/libexec", "--state-dir", "/run/gsrun-golden",
                 "--spool-dir", "/var/spool/gsrun-golden", "--log-file", "/var/log/gsrun/hooks.log",
                 "--prolog-d", "/etc/slurm/prolog.d/", "--epilog-d", "/etc/slurm/epilog.d"],
}


@pytest.fixture
def fixed(tmp_path, monkeypatch):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "gsrun-node").write_text("#!/bin/sh\nexit 99\n")
    (venv / "gsrun-node").chmod(0o755)
    monkeypatch.setattr(install, "find_installation",
                        functools.partial(install.find_installation, python=str(venv / "python")))
    monkeypatch.setattr(install, "detect_slurm_version", lambda *a, **k: install.SlurmVersion("23.11.4", "slurmctld -V"))
    for k in [k for k in os.environ if k.startswith(("GSRUN_", "SLURM"))]:
        monkeypatch.delenv(k)

    def normalise(text: str) -> str:
        return text.replace(str(tmp_path), "<TMP>").replace(str(REPO), "<REPO>")
    return tmp_path, normalise


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_golden_install_print(layout, fixed):
    tmp_path, normalise = fixed
    args = ["install", "--print", "--no-measure", "--config", str(tmp_path / "etc" / "gsrun.toml"), *LAYOUTS[layout]]
    res = CliRunner().invoke(cli, args, standalone_mode=False,
                             env={"SLURM_CONF": str(GOLDEN / "input-slurm.conf")})
    assert res.exception is None, (res.output, res.exception)
    assert res.return_value == 0
    assert not (tmp_path / "etc").exists()            # --print changes nothing
    check_text(GOLDEN / f"print-{layout}.txt", normalise(res.stdout), f"gsrun-node install --print ({layout})")


HOOKS = {"prolog": "/opt/gsrun/libexec/gsrun-prolog", "epilog": "/opt/gsrun/libexec/gsrun-epilog",
         "epilog-ctld": "/opt/gsrun/libexec/gsrun-epilog-ctld"}


@pytest.mark.parametrize("layout", install.LAYOUTS)
def test_golden_slurm_conf_block(layout):
    flags, why = install.prolog_flags("X11", "proctrack/cgroup")
    text = install.render_slurm_lines("23.11.4", HOOKS, flags, why, 120, "120 s = the test's value", layout)
    check_text(GOLDEN / f"slurm.conf-{layout}", text, f"render_slurm_lines({layout})")


def test_golden_units_config_plugstack():
    units = install.render_units("/opt/gsrun/venv/bin/gsrun-node", "/etc/gsrun/site.toml")
    for name, text in units.items():
        check_text(GOLDEN / name, text, f"render_units: {name}")
    check_text(GOLDEN / "gsrun.toml", install.config_text(), "config_text() (the commented gsrun.toml)")
    block = render_plugstack("/usr/local/lib/gsrun/gsrun_spank.so", [("on_error", "ignore"), ("bind", "auto")],
                             "23.11.4", "3.11.7")
    check_text(GOLDEN / "plugstack.conf", block, "render_plugstack")


def test_golden_config_reference():
    res = CliRunner().invoke(cli, ["config", "reference"], standalone_mode=False)
    assert res.exception is None, res.output
    check_text(GOLDEN / "config-reference.md", res.stdout, "gsrun-node config reference")
