"""Golden report mails: the view, the text part, the HTML part and the whole
MIME message, for the jobs in ``tests/data/golden/summaries/`` (1 GPU,
8 GPUs, FAILED after 10 min, CANCELLED before start).

Per job, under ``tests/data/golden/mail/<job>/``:

- ``view.json``: :func:`gsrun.report.mail.mail_view` (every value the
  templates print, already formatted);
- ``text.txt`` / ``html.html``: :func:`~gsrun.report.mail.render_text` /
  :func:`~gsrun.report.mail.render_html` of that view;
- ``message.eml``: :func:`~gsrun.report.mail.build_message` as it goes on the
  wire (:func:`~gsrun.report.mail.wire_bytes`), with the report text of
  :func:`gsrun.report.render.render_text` and a fixed 3x2 PNG standing in for
  the matplotlib timeline (matplotlib's bytes vary between versions).

The report text passed to the view and the message is the golden
``report/<job>.txt`` rendering (as the EpilogSlurmctld passes it).

Normalised in ``message.eml``: the ``Date:`` header (a fixed epoch is passed,
but ``formatdate(localtime=True)`` prints this host's time zone) becomes
``Date: <DATE>``; the MIME boundaries (random per message) become
``<BOUNDARY-1>``, ``<BOUNDARY-2>`` in order of appearance. ``Message-ID`` is
derived from the job and is kept as it is. Regenerate with
``GSRUN_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import json
import re
import struct
import zlib

import pytest

from gsrun.report import mail
from gsrun.report.records import JobSummary
from gsrun.report.render import render_text as report_text
from helpers.golden import check_json, check_text
from helpers.paths import DATA

GOLDEN = DATA / "golden"
JOBS = ("job-1gpu", "job-8gpu", "job-failed", "job-cancelled", "job-tuned")
FROM = "gsrun@cluster.example.org"
DATE = 1_760_000_000.0
CID = "timeline.{jid}@cluster.example.org"


def tiny_png(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG built by hand (signature, IHDR, IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes([255, 0, 0] * width) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def summary(job: str) -> JobSummary:
    return JobSummary.from_json(json.loads((GOLDEN / "summaries" / f"{job}.json").read_text()))


def normalise_message(wire: bytes) -> str:
    text = wire.decode("ascii")
    text = re.sub(r"(?m)^Date: .*\r?$", "Date: <DATE>", text)
    bounds: list[str] = []
    for b in re.findall(r'boundary="([^"]+)"', text):
        if b not in bounds:
            bounds.append(b)
    for i, b in enumerate(bounds, 1):
        text = text.replace(b, f"<BOUNDARY-{i}>")
    return text


@pytest.mark.parametrize("job", JOBS)
def test_golden_mail_parts(job):
    s = summary(job)
    rt = report_text(s)
    jid = s.job.array or s.job.id
    view = mail.mail_view(s, rt, True, CID.format(jid=jid))
    d = GOLDEN / "mail" / job
    check_json(d / "view.json", view, f"mail_view({job})")
    check_text(d / "text.txt", mail.render_text(view), f"mail text part ({job})")
    check_text(d / "html.html", mail.render_html(view), f"mail HTML part ({job})")


@pytest.mark.parametrize("job", JOBS)
def test_golden_mail_message(job):
    s = summary(job)
    msg = mail.build_message(s, report_text(s), tiny_png(), s.job.mail_user, FROM, date=DATE)
    got = normalise_message(mail.wire_bytes(msg))
    assert got.count("<BOUNDARY-") >= 4 and "<DATE>" in got
    check_text(GOLDEN / "mail" / job / "message.eml", got, f"build_message({job})")
