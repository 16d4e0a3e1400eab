"""Whether a job holds its nodes, decided from the job record each Slurm release
prints (gsrun.request.job.exclusive_from_record over gsrun.facts.slurm.parse_job_record),
on the ``scontrol -o show job`` lines of tests/data/slurm-records/ (assembled from
each release's source, its README says which), and on forged lines."""

from __future__ import annotations

import pytest

from gsrun.facts.slurm import parse_job_record
from gsrun.request.job import exclusive_from_record, request_from_job_record
from helpers.paths import DATA

RECORDS = DATA / "slurm-records"

#: case -> whether node-wide tuning may treat the job as holding its nodes
WANT = {
    "exclusive": True,              # --exclusive
    "partition-exclusive": True,    # partition OverSubscribe=EXCLUSIVE
    "shared": False,                # no option, partition OverSubscribe=NO (the default)
    "oversubscribe": False,         # --oversubscribe
    "partition-force4": False,      # partition OverSubscribe=FORCE:4
    "exclusive-user": False,        # --exclusive=user: other jobs of the user share the node
    "exclusive-mcs": False,         # --exclusive=mcs: other jobs of the MCS label share the node
    "exclusive-topo": False,        # --exclusive=topo: no whole-node flag of its own
}
#: release -> the key that decides
KEY = {"22.05": "OverSubscribe", "24.11": "OverSubscribe", "26.05": "Exclusive"}

CASES = sorted((p.parent.name, p.stem) for p in RECORDS.glob("*/*.txt"))


def test_every_release_has_the_cases():
    assert {r for r, _ in CASES} == set(KEY)
    for release in KEY:
        have = {c for r, c in CASES if r == release}
        assert have == set(WANT) - ({"exclusive-topo"} if release == "22.05" else set()), release


@pytest.mark.parametrize("release,case", CASES, ids=[f"{r}-{c}" for r, c in CASES])
def test_recorded_record_decides_exclusivity(release, case):
    text = (RECORDS / release / f"{case}.txt").read_text()
    rec = parse_job_record(text, "4242")
    assert rec is not None
    req = request_from_job_record(rec, text.strip())
    assert (req.exclusive, req.exclusive_source) == (WANT[case], f"job record {KEY[release]}")
    assert req.tune == "swappiness=10"
    # the line kept in the record, as comment_from_slurm keeps it; without any line: not exclusive
    assert exclusive_from_record({**rec, "__line__": text}) == (WANT[case], f"job record {KEY[release]}")
    assert exclusive_from_record(rec) == (False, "job record (ambiguous)")


def _line(release: str, case: str, name: str = "train.sh", comment: str | None = None) -> str:
    line = (RECORDS / release / f"{case}.txt").read_text().strip()
    line = line.replace("JobName=train.sh ", f"JobName={name} ", 1)
    if comment is not None:
        line = line.replace("Comment=gsrun:tune=swappiness=10", f"Comment={comment}", 1)
    return line


@pytest.mark.parametrize("release,case,name,comment", [
    # a release without Exclusive=: a user-written Exclusive=NODE is not Slurm's
    ("22.05", "shared", "x Exclusive=NODE", None),
    ("24.11", "shared", "x", "gsrun:tune=swappiness=10 Exclusive=NODE"),
    ("24.11", "exclusive-user", "x Exclusive=NODE Contiguous=0", None),
    # both keys forged as Slurm prints them: OverSubscribe= twice
    ("24.11", "shared", "x OverSubscribe=NO Exclusive=NODE", None),
    ("22.05", "shared", "x", "gsrun:tune=swappiness=10 OverSubscribe=NO"),
    # 26.05: a second Exclusive= (either value) leaves nothing to trust
    ("26.05", "shared", "x Exclusive=NODE", None),
    ("26.05", "shared", "x", "gsrun:tune=swappiness=10 Exclusive=NODE"),
    ("26.05", "exclusive", "x Exclusive=NODE", None),
    ("26.05", "exclusive-user", "x OverSubscribe=NO Exclusive=NODE", None),
])
def test_forged_exclusivity_counts_as_not_exclusive(release, case, name, comment):
    line = _line(release, case, name, comment)
    rec = parse_job_record(line, "4242")
    assert rec is not None
    assert exclusive_from_record(rec, line) == (False, "job record (ambiguous)")
    assert exclusive_from_record({**rec, "__line__": line}) == (False, "job record (ambiguous)")
    assert request_from_job_record(rec, line).exclusive is False


def test_newline_in_a_name_is_not_one_record():
    line = _line("26.05", "shared", "n OverSubscribe=NO Exclusive=NODE\ny")
    assert parse_job_record(line, "4242") is None
    rec = parse_job_record(_line("26.05", "exclusive"), "4242")
    assert exclusive_from_record(rec, line)[0] is False


def test_harmless_user_text_keeps_the_answer():
    line = _line("26.05", "exclusive", "exclusive-run", "gsrun:tune=swappiness=10 see Exclusive: NODE")
    rec = parse_job_record(line, "4242")
    assert exclusive_from_record(rec, line) == (True, "job record Exclusive")


def test_no_record_is_unknown():
    assert exclusive_from_record(None) == (None, None)
