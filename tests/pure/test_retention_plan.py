"""Which spool job directories ``gsrun-node prune`` drops
(:func:`gsrun.report.retention.plan_prune`, pure)."""

from __future__ import annotations

import pytest

from gsrun.report.retention import DAY_S, QUIET_S, JobDir, plan_prune

pytestmark = pytest.mark.pure

NOW = 1_800_000_000.0


def old(name, days=40, stored=True, kind="dir"):
    return JobDir(name, kind, NOW - days * DAY_S, stored)


def actions(entries, **kw):
    return {d.name: (d.action, d.reason) for d in plan_prune(entries, NOW, kw.pop("days", 30), **kw)}


def test_old_and_stored_is_removed_others_kept():
    got = actions([old("101"), old("102", stored=False), old("103", days=10), old("104_7")])
    assert got["101"][0] == "remove" and got["104_7"][0] == "remove"
    assert got["102"] == ("keep", "summary not stored in accounting (use --force)")
    assert got["103"][0] == "keep" and "younger than 30" in got["103"][1]


def test_force_removes_unstored_but_never_young_or_odd_entries():
    got = actions([old("102", stored=False), old("103", days=10, stored=False), old("evil"), old("..", kind="dir"),
                   old("105", kind="link"), old("106", kind="other"), old("1/2"), old("12345678901")],
                  force=True)
    assert got["102"] == ("remove", "not in accounting, removed by --force")
    assert all(got[n][0] == "keep" for n in ("103", "evil", "..", "105", "106", "1/2", "12345678901"))
    assert "not a directory (link)" in got["105"][1] and got["evil"][1] == "not a job id"


def test_quiet_period_wins_over_older_than_zero():
    fresh = JobDir("200", "dir", NOW - QUIET_S / 2, True)
    quiet = JobDir("201", "dir", NOW - QUIET_S - 1, True)
    future = JobDir("202", "dir", NOW + 3600, True)          # clock skew on a shared spool: keep
    got = actions([fresh, quiet, future], days=0, force=True)
    assert got["200"][0] == "keep" and "quiet period" in got["200"][1]
    assert got["201"][0] == "remove" and got["202"][0] == "keep"


def test_negative_age_is_an_error_and_order_is_by_name():
    with pytest.raises(ValueError):
        plan_prune([], NOW, -1)
    assert [d.name for d in plan_prune([old("9"), old("10"), old("1")], NOW, 30)] == ["1", "10", "9"]
