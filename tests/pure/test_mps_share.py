"""gsrun.request.mps_share: one rule for --mps, --gs-mps, SPANK_GS_MPS, the
job comment and Slurm's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE."""

import sys

import pytest

from gsrun.base.errors import InputError
from gsrun.node import mps
from gsrun.request.mps_share import parse_mps_share
from gsrun.spank_py import hooks

GOOD = [("", None), ("  ", None), ("1", 1), ("50", 50), ("100", 100), ("050", 50), (" 7 ", 7), ("007", 7)]
BAD = ["0", "00", "101", "0100", "-5", "+5", "5 0", "50%", "abc", "$(id)", "４２", "²", "50\n1", "1e2", "0x10",
       "on", "yes", "true", "5.0"]


@pytest.mark.parametrize("text,want", GOOD)
def test_parse(text, want):
    assert parse_mps_share(text) == want


@pytest.mark.parametrize("text", BAD + [None, 50])
def test_refused(text):
    with pytest.raises(InputError) as ei:
        parse_mps_share(text, "--mps", phase="submit")
    head, _, hint = str(ei.value).partition("\nhint: ")
    assert head.startswith("gsrun: submit: bad active thread percentage: --mps=")
    assert "\n" not in head and "1 to 100" in hint


@pytest.mark.parametrize("text", [t for t, _ in GOOD] + BAD)
def test_every_entry_point_agrees(text, monkeypatch):
    """hooks (with and without gsrun importable) and the prolog side
    accept and refuse the same values, with the same number."""
    try:
        want = parse_mps_share(text)
    except InputError:
        want = "refused"

    def hook(value):
        try:
            out = hooks.check_mps(value)
        except hooks.OptionError:
            return "refused"
        return None if out == "" else int(out)

    def node(value):
        try:
            return mps.requested_pct({"SPANK_GS_MPS": value}, None)
        except InputError:
            return "refused"

    assert hook(text) == want
    assert node(text) == want
    monkeypatch.setitem(sys.modules, "gsrun.request.mps_share", None)   # import raises ImportError
    assert hook(text) == want


def _gsrun_dry_run(mps_arg, tmp_path, monkeypatch, capsys):
    from gsrun.wrapper.cli import cli
    monkeypatch.setenv("GSRUN_CONFIG", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    script = tmp_path / "job.sh"
    script.write_text("true\n")
    script.chmod(0o755)                          # gsrun refuses a script it cannot run
    rc = cli.main(["--gpus", "1", "--gpus-per-node", "1", mps_arg, "--dry-run", str(script)],
                  prog_name="gsrun", standalone_mode=False)
    return rc, capsys.readouterr().out


def test_gsrun_mps_flag_uses_the_same_rule(tmp_path, monkeypatch, capsys):
    rc, out = _gsrun_dry_run("--mps=050", tmp_path, monkeypatch, capsys)
    assert rc == 0 and "mps=50" in out and "mps=050" not in out       # normalized like --gs-mps
    for bad in ("--mps=４２", "--mps=0100", "--mps=yes"):
        with pytest.raises(InputError, match="gsrun: submit: --mps-share: --mps="):
            _gsrun_dry_run(bad, tmp_path, monkeypatch, capsys)


def test_an_srun_inside_a_job_given_gs_mps_without_a_value_is_not_refused():
    """sbatch --gs-mps (no percentage) reaches every srun of the job as "(null)" (Slurm
    forwards the NULL optarg so): that is the option given without a value, never a bad one."""
    from gsrun.spank_py.hooks import validate_options

    assert validate_options({"gs-mps": "(null)"}) == validate_options({"gs-mps": ""})
    assert validate_options({"gs-mps": "(null)"})[1] == []
    exports, errors = validate_options({"gs-tune": "(null)"})          # a required value: still refused
    assert exports == {} and len(errors) == 1
