"""Golden layouts of the efficiency mail: the HTML part of the 1-GPU and the
8-GPU job, with the real matplotlib timeline in place of the ``cid:``
reference, laid out by headless Chromium at 1000 px and 400 px wide and
compared box by box with ``tests/data/screenshots/after/<job>.<width>.layout.json``
(:func:`helpers.screenshot.layout_differences`: positions and widths within a
few px, heights within two lines of text, no sideways scrolling). Pixels are
not compared: another font or Chromium version wraps text elsewhere and moves
every pixel below. The text part's width is asserted (76 columns).
``GSRUN_REGEN_GOLDEN=1`` rewrites the layouts and the screenshots beside them
(``<job>.<width>.png``, for a person to look at). Skipped, with the reason,
when Chromium is missing. Normalised: TZ=UTC (clock times in the mail)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from gsrun.report import mail
from gsrun.report.records import JobSummary
from gsrun.report.render import WRAP_COLS, render_png, render_text
from helpers.paths import DATA
from helpers.screenshot import chromium, layout, layout_differences, shoot

pytestmark = [pytest.mark.process, pytest.mark.usefixtures("utc_tz")]   # the goldens print UTC
GOLDEN = DATA / "screenshots" / "after"


def _message(job: str):
    s = JobSummary.from_json(json.loads((DATA / "golden" / "summaries" / f"{job}.json").read_text()))
    png = render_png(s)
    return s, png, mail.build_message(s, render_text(s), png, "alice@example.org", "gsrun@example.org", date=0)


@pytest.mark.parametrize("job", ["job-1gpu", "job-8gpu", "job-failed", "job-cancelled"])
def test_text_part_fits_76_columns_and_stands_alone(job):
    s, _png, msg = _message(job)
    text = msg.get_body(("plain",)).get_content()
    assert max(len(ln) for ln in text.splitlines()) <= WRAP_COLS
    assert f"job {s.job.id}" in text.lower() or f"Job {s.job.id}" in text


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("job", ["job-1gpu", "job-8gpu"])
@pytest.mark.parametrize("width", [1000, 400])
def test_mail_html_layout(job, width, tmp_path):
    _s, png, msg = _message(job)
    html = msg.get_body(("html",)).get_content()
    assert 'name="viewport"' in html and "color-scheme" in html and "<style" not in html
    assert re.search(r'<img [^>]*width="720" height="\d+"', html)
    (tmp_path / "chart.png").write_bytes(png)
    page = tmp_path / "mail.html"
    page.write_text(re.sub(r'src="cid:[^"]+"', 'src="chart.png"', html))
    got = layout(page, width)
    want_path = GOLDEN / f"{job}.{width}.layout.json"
    if os.environ.get("GSRUN_REGEN_GOLDEN") == "1" or not want_path.exists():
        pytest.importorskip("PIL", reason="Pillow missing (pip install -e '.[test]')")
        want_path.parent.mkdir(parents=True, exist_ok=True)
        want_path.write_text(json.dumps(got, indent=None, separators=(",", ":")) + "\n")
        shutil.copyfile(shoot(page, tmp_path / "shot.png", width), GOLDEN / f"{job}.{width}.png")  # for a person
    want = json.loads(want_path.read_text())
    # the chart is never wider than the window, the text never makes the page scroll sideways
    imgs = [b for b in got["boxes"] if b[0] == "img"]
    assert imgs and all(b[1] >= 0 and b[1] + b[2] <= width for b in imgs), imgs
    problems = layout_differences(got, want, width)
    assert not problems, (f"{job} at {width} px: the layout differs from {want_path} "
                          f"(after an intended change: GSRUN_REGEN_GOLDEN=1 and look at the PNGs beside it):\n"
                          + "\n".join(problems))


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install -y chromium)")
def test_the_layout_comparison_sees_a_real_change(tmp_path):
    """The tolerances pass other fonts, not a changed layout: the mail without its
    740 px column, or with a picture that makes a 400 px window scroll sideways."""
    _s, png, msg = _message("job-1gpu")
    html = re.sub(r'src="cid:[^"]+"', 'src="chart.png"', msg.get_body(("html",)).get_content())
    (tmp_path / "chart.png").write_bytes(png)
    want = json.loads((GOLDEN / "job-1gpu.1000.layout.json").read_text())
    page = tmp_path / "wide.html"
    page.write_text(html.replace("max-width: 740px;", "", 1))
    problems = layout_differences(layout(page, 1000), want, 1000)
    assert any(p.startswith("box 0 <div>: x 12 width 976 px, stored x 12 width 740 px") for p in problems), problems
    page = tmp_path / "overflow.html"
    page.write_text(re.sub(r'<img ', '<img style="min-width: 720px" ', html, count=1))
    got = layout(page, 400)
    assert got["scroll_width"] > 400
    assert layout_differences(got, json.loads((GOLDEN / "job-1gpu.400.layout.json").read_text()), 400)[0] \
        .startswith(f"the page is {got['scroll_width']} px wide in a 400 px window")
