"""Golden renders of the efficiency mail (issue 22 item 7): the HTML part of
the 1-GPU and the 8-GPU job, with the real matplotlib timeline in place of
the ``cid:`` reference, screenshotted by headless Chromium at 1000 px and
400 px wide and compared with ``tests/data/screenshots/after/<job>.<width>.png``
within a tolerance (share of pixels differing by more than 48 in a channel:
:data:`MAX_DIFF`; fonts and matplotlib versions move a few pixels). The text
part's width is asserted (76 columns). ``GSRUN_REGEN_GOLDEN=1`` rewrites the
PNGs. Skipped, with the reason, when Chromium or Pillow is missing.
``tests/data/screenshots/before/`` holds the same renders of the mail before
issue 22 (not compared). Normalised: TZ=UTC (clock times in the mail)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from gsrun.report import mail
from gsrun.report.render import WRAP_COLS, render_png, render_text
from helpers.paths import DATA
from helpers.screenshot import chromium, diff_ratio, shoot

pytestmark = pytest.mark.process
GOLDEN = DATA / "screenshots" / "after"
MAX_DIFF = 0.02


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    import time
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _message(job: str):
    s = json.loads((DATA / "golden" / "summaries" / f"{job}.json").read_text())
    png = render_png(s)
    return s, png, mail.build_message(s, render_text(s), png, "alice@example.org", "gsrun@example.org", date=0)


@pytest.mark.parametrize("job", ["job-1gpu", "job-8gpu", "job-failed", "job-cancelled"])
def test_text_part_fits_76_columns_and_stands_alone(job):
    s, _png, msg = _message(job)
    text = msg.get_body(("plain",)).get_content()
    assert max(len(ln) for ln in text.splitlines()) <= WRAP_COLS
    assert f"job {s['job']['id']}" in text.lower() or f"Job {s['job']['id']}" in text


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("job", ["job-1gpu", "job-8gpu"])
@pytest.mark.parametrize("width", [1000, 400])
def test_mail_html_screenshot(job, width, tmp_path):
    pytest.importorskip("PIL", reason="Pillow missing (pip install -e '.[test]')")
    _s, png, msg = _message(job)
    html = msg.get_body(("html",)).get_content()
    assert 'name="viewport"' in html and "color-scheme" in html and "<style" not in html
    assert re.search(r'<img [^>]*width="720" height="\d+"', html)
    (tmp_path / "chart.png").write_bytes(png)
    page = tmp_path / "mail.html"
    page.write_text(re.sub(r'src="cid:[^"]+"', 'src="chart.png"', html))
    got = shoot(page, tmp_path / "shot.png", width)
    want = GOLDEN / f"{job}.{width}.png"
    if os.environ.get("GSRUN_REGEN_GOLDEN") == "1" or not want.exists():
        want.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, want)
    ratio = diff_ratio(got, want)
    assert ratio <= MAX_DIFF, (f"{job} at {width} px differs from {want} in {ratio:.1%} of the pixels; "
                               "after an intended change: GSRUN_REGEN_GOLDEN=1 and look at the PNGs")
