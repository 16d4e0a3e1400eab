"""Golden JS1 blobs: what :func:`gsrun.report.summary.js1_blob` stores in
AdminComment for every stored job summary, decoded (``js1/<job>.json``).

Inputs: the golden job summaries (``golden/summaries/job-*.json``: 1 and 8
H200s, failed, cancelled, tuned) and the summary fixtures
(``summaries/<case>/summary.json``: two nodes, a lost GPU, MIG, NVML that
could not start, no sampler, cancelled). A job without a blob (jobstats
stores ``Short`` / ``None`` then) has ``null``. The decoded JSON is compared,
not the base64 text (gzip's bytes may differ between zlib builds); the text
is checked against the 8 KiB bound and AdminComment's allow-list.
Regenerate with ``GSRUN_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import json

import pytest

from gsrun.report import accounting
from gsrun.report.records import JobSummary
from gsrun.report.summary import JS1_MAX_CHARS, decode_js1, js1_blob
from helpers.golden import check_json
from helpers.paths import DATA

GOLDEN = DATA / "golden"
JOBS = {**{j: GOLDEN / "summaries" / f"{j}.json"
           for j in ("job-1gpu", "job-8gpu", "job-failed", "job-cancelled", "job-tuned")},
        **{c: DATA / "summaries" / c / "summary.json"
           for c in ("two-nodes", "lost-gpu", "mig", "nvml-fail", "no-sampler", "cancelled")}}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_golden_js1(job):
    text = js1_blob(JobSummary.from_json(json.loads(JOBS[job].read_text())))
    if text is not None:
        assert len(text) <= JS1_MAX_CHARS and accounting.valid_js1(text)
    check_json(GOLDEN / "js1" / f"{job}.json", decode_js1(text) if text else None, f"js1_blob({job})")
