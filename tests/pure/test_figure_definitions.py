"""Each figure's definition is written once (gsrun.report.render.FIGURES),
printed by ``gseff --explain`` and quoted word for word in docs/USER.md."""

from __future__ import annotations

from click.testing import CliRunner

from gsrun.report.render import FIGURES, WRAP_COLS
from gsrun.wrapper import gseff
from helpers.paths import REPO


def test_user_md_quotes_every_definition():
    doc = (REPO / "docs" / "USER.md").read_text()
    for label, text in FIGURES:
        assert f"- **{label}**: {text}" in doc, label


def test_gseff_explain_needs_no_job_and_fits_the_report_width():
    res = CliRunner().invoke(gseff.cli, ["--explain"])
    assert res.exit_code == 0, res.output
    assert max(len(ln) for ln in res.output.splitlines()) <= WRAP_COLS
    flat = " ".join(res.output.split())
    for label, text in FIGURES:
        assert f"{label}: {' '.join(text.split())}" in flat
    assert "MEAN over the GPUs of each GPU's peak over its total" in flat     # the jobstats/reportseff difference
    res = CliRunner().invoke(gseff.cli, [])
    assert res.exit_code != 0 and "hint: gseff JOBID, or gseff --explain" in str(res.exception)
