"""``gsrun`` refuses a bad ``--tune``, ``--mig``, ``--mps-share`` or
``--malloc`` at submit (with and without ``--dry-run``), with the parser the
node and the SPANK plugin use: ``gsrun: submit: OPTION: <detail>`` and a
``hint:`` naming what is allowed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gsrun.request.mig_layout import parse_layout
from gsrun.request.tune import GOVERNORS, parse_tune_request
from gsrun.spank_py.hooks import OptionError, check_mig, check_tune
from gsrun.wrapper import cli

BAD = [
    (["--tune", "governor=turbo"], "--tune", "governor must be one of performance|", "keys: governor, swappiness"),
    (["--tune", "nohz=1"], "--tune", "unknown key 'nohz'", "keys: governor"),
    (["--tune", "thp=sometimes"], "--tune", "thp must be one of always|madvise|never", "keys:"),
    (["--mig", "9g.1gb"], "--mig", "9 compute slices; MIG profiles have 1, 2, 3, 4 or 7", "site layouts: none"),
    (["--mig", "3g.71gb+"], "--mig", "empty term", "7x1g.18gb"),
    (["--mps-share", "101"], "--mps-share", "--mps='101'", "integer from 1 to 100"),
    (["--mps=abc"], "--mps-share", "--mps='abc'", "integer from 1 to 100"),
    (["--malloc", "mimalloc"], "--malloc", "'mimalloc'", "jemalloc, tcmalloc or none"),
]


@pytest.fixture(autouse=True)
def _site(tmp_path, monkeypatch):
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    monkeypatch.setenv("PATH", str(tmp_path))       # no sbatch: a refusal must come first


def _gsrun(*args: str):
    return CliRunner().invoke(cli.cli, ["--gpus", "4", "--gpus-per-node", "4", *args, "--", "/bin/true"],
                              prog_name="gsrun")


@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry-run"])
@pytest.mark.parametrize("args, option, detail, hint", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_value_refused_at_submit_with_allowed_values(args, option, detail, hint, dry_run):
    result = _gsrun(*(["--dry-run"] if dry_run else []), *args)
    assert result.exit_code != 0
    msg = str(result.exception)
    first, _, hint_line = msg.partition("\nhint: ")
    assert first.startswith(f"gsrun: submit: {option}: "), msg
    assert detail in first, msg
    assert hint in hint_line, msg


@pytest.mark.parametrize("args", [["--tune", "governor=performance,swappiness=10"], ["--mig", "7x1g.18gb"],
                                  ["--mps-share", "50"], ["--malloc", "none"]])
def test_good_values_pass_the_dry_run(args):
    result = _gsrun("--dry-run", "--exclusive", *args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "#SBATCH" in result.output


@pytest.mark.parametrize("governor", GOVERNORS)
def test_every_kernel_governor_is_accepted(governor):
    assert parse_tune_request(f"governor={governor}") == {"governor": governor}


def test_the_spank_plugin_refuses_the_same_values():
    """``--gs-tune``/``--gs-mig`` go through the same parsers as ``gsrun``."""
    with pytest.raises(OptionError, match="governor must be one of"):
        check_tune("governor=turbo")
    with pytest.raises(OptionError, match="9 compute slices"):
        check_mig("9g.1gb", {})
    for slices in (5, 6, 8):
        with pytest.raises(Exception, match="compute slices"):
            parse_layout(f"{slices}g.40gb")
