"""Golden report text and ``gseff`` output (text and ``--json``).

Inputs: the job summaries stored in ``tests/data/golden/summaries/``
(made once by ``summaries/make.py`` from simulated sampler runs on the H200
recording; stored so these goldens do not move when the simulator does).

- ``report/<job>.txt``: :func:`gsrun.report.render.render_text` (plain) and
  ``report/<job>.color.txt`` (ANSI colour, as a terminal shows it);
- ``gseff/<job>.txt`` and ``gseff/<job>.json``: the ``gseff JOBID`` command
  (click, ``--spool-dir`` holding ``jobs/<id>/summary.json``; ``NO_COLOR``,
  ``GSRUN_CONFIG`` an empty file so this host's config does not count).

Nothing is normalised: none of these outputs holds a path, a time or a
host name of this machine. Regenerate with ``GSRUN_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gsrun.report.records import JobSummary
from gsrun.report.render import render_text
from gsrun.wrapper.gseff import cli as gseff_cli
from helpers.golden import check_text
from helpers.paths import DATA

GOLDEN = DATA / "golden"
SUMMARIES = GOLDEN / "summaries"
JOBS = ("job-1gpu", "job-8gpu", "job-failed", "job-cancelled", "job-tuned")


def summary_json(job: str) -> dict:
    return json.loads((SUMMARIES / f"{job}.json").read_text())


def summary(job: str) -> JobSummary:
    return JobSummary.from_json(summary_json(job))


@pytest.mark.parametrize("job", JOBS)
def test_golden_report_text(job):
    s = summary(job)
    check_text(GOLDEN / "report" / f"{job}.txt", render_text(s), f"render_text({job})")
    check_text(GOLDEN / "report" / f"{job}.color.txt", render_text(s, color=True), f"render_text({job}, color)")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("job", JOBS)
def test_golden_gseff(job, as_json, tmp_path, monkeypatch):
    s = summary_json(job)
    jid = s["job"]["id"]
    d = tmp_path / "spool" / "jobs" / jid
    d.mkdir(parents=True)
    shutil.copy(SUMMARIES / f"{job}.json", d / "summary.json")
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    for k in ("GSRUN_SPOOL_DIR", "GSRUN_STATE_DIR"):
        monkeypatch.delenv(k, raising=False)
    res = CliRunner().invoke(gseff_cli, [jid, "--spool-dir", str(tmp_path / "spool"), *(["--json"] if as_json else [])],
                             env={"NO_COLOR": "1", "GSRUN_CONFIG": str(cfg)})
    assert res.exit_code == 0, (res.output, res.exception)
    ext = "json" if as_json else "txt"
    check_text(GOLDEN / "gseff" / f"{job}.{ext}", res.stdout, f"gseff {jid}{' --json' if as_json else ''} ({job})")
    if as_json:
        assert json.loads(res.stdout) == s
