"""``--version`` on every console script: ``<prog> <version>`` from the
installed distribution's metadata, exit status 0."""

from __future__ import annotations

import importlib.metadata

import pytest
from click.testing import CliRunner

from gsrun.admin import node
from gsrun.wrapper import bind, cli, gseff, gsreport

COMMANDS = [(cli.cli, "gsrun"), (gseff.cli, "gseff"), (bind.main, "gsrun-bind"),
            (gsreport.cli, "gsrun-report"), (node.cli, "gsrun-node")]


@pytest.mark.parametrize("command, prog", COMMANDS, ids=[p for _, p in COMMANDS])
def test_version_prints_prog_and_the_distribution_version(command, prog):
    result = CliRunner().invoke(command, ["--version"], prog_name=prog)
    assert result.exit_code == 0, result.output
    assert result.output == f"{prog} {importlib.metadata.version('gsrun')}\n"


def test_gsrun_version_needs_no_other_option():
    """``gsrun --version`` alone: ``--gpus`` is required only for a submission."""
    result = CliRunner().invoke(cli.cli, ["--version", "--gpus", "2"], prog_name="gsrun")
    assert result.exit_code == 0
    assert result.output.startswith("gsrun ")
