"""The one journal (gsrun.node.journal): header, boot awareness, lock, and
journals of the release before it (format 1) still restored."""

from __future__ import annotations

import fcntl
import io
import json
import os
from pathlib import Path

import pytest

from gsrun.base.errors import NodeError
from gsrun.base.log import JobLog
from gsrun.facts.hostfs import HostFS
from gsrun.node import journal, mig, tuning
from helpers.fake_mig import FakeMig
from helpers.tuning_tree import diff, make_tree, snapshot

MIG_DATA = Path(__file__).resolve().parent.parent / "data" / "nvml" / "h200-mig.json"


def quiet(msg):
    pass


def with_boot(root: Path, bid: str) -> HostFS:
    p = root / "proc/sys/kernel/random"
    p.mkdir(parents=True, exist_ok=True)
    (p / "boot_id").write_text(bid + "\n")
    return HostFS(root)


def test_write_load_header_mode(tmp_path):
    host = with_boot(tmp_path / "h", "b-1")
    j = journal.Journal(tmp_path / "x.json", "mps", hostfs=host)
    j.write({"job_id": "7", "state": "running", "journal": "ignored"})
    raw = json.loads((tmp_path / "x.json").read_text())
    assert raw["job_id"] == "7" and raw["state"] == "running"          # owner's fields stay on top
    assert raw["journal"]["format"] == 2 and raw["journal"]["kind"] == "mps"
    assert raw["journal"]["boot_id"] == "b-1" and raw["journal"]["pid"] == os.getpid()
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o600
    got = j.load()
    assert got.data == {"job_id": "7", "state": "running"} and got.format == 2 and not got.earlier_boot
    (host.root / "proc/sys/kernel/random/boot_id").write_text("b-2\n")
    assert journal.Journal(tmp_path / "x.json", "mps", hostfs=host).load().earlier_boot is True
    j.remove()
    assert not j.exists() and j.load() is None
    j.remove()                                                          # absent is fine


def test_corrupt_or_symlink_is_not_loaded(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    assert journal.Journal(tmp_path / "bad.json", "mig").load() is None
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert journal.Journal(tmp_path / "link.json", "mig").load() is None


def test_lock_is_exclusive_and_bounded(tmp_path):
    j = journal.Journal(tmp_path / "x.json", "mig")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(NodeError, match="lock timeout"):
            with j.lock(0.05):
                pass
    finally:
        os.close(fd)
    with j.lock(0.05):
        pass


def test_format1_tuning_baseline_is_restored_then_rewritten(tmp_path):
    """A node upgraded with a journal of the previous release on it."""
    root = make_tree(tmp_path / "h")
    base = snapshot(root)
    host = HostFS(root)
    state = tmp_path / "state"
    rep = tuning.prolog_tune(host, str(state), "1", "swappiness=10,thp=never", None, None, exclusive=True,
                             log=quiet)
    assert rep["applied"] == ["swappiness", "thp"]
    bl = state / "tuning/baseline.json"
    doc = json.loads(bl.read_text())
    assert doc["journal"]["kind"] == "tuning" and "boot_id" not in doc
    # rewrite both journals the way the previous release wrote them
    old = {"version": 1, "boot_id": doc["journal"]["boot_id"], "entries": doc["entries"]}
    bl.write_text(json.dumps(old))
    jobf = state / "tuning/jobs/1.json"
    jobf.write_text(json.dumps({k: v for k, v in json.loads(jobf.read_text()).items() if k != "journal"}))
    assert tuning.status(host, str(state))["changes"][0]["key"] == "swappiness"
    rep2 = tuning.prolog_tune(host, str(state), "2", "swappiness=10", None, None, exclusive=True, log=quiet)
    assert rep2["reused"] == ["swappiness"]
    assert json.loads(bl.read_text())["journal"]["format"] == 2          # next write is the new format
    tuning.epilog_restore(host, str(state), "2", log=quiet)
    out = tuning.epilog_restore(host, str(state), "1", log=quiet)
    assert out["ok"] and out["last_job"] and diff(base, snapshot(root)) == []


def test_format1_tuning_baseline_from_earlier_boot_is_dropped(tmp_path):
    root = make_tree(tmp_path / "h")
    host = with_boot(root, "new-boot")
    (tmp_path / "state/tuning/jobs").mkdir(parents=True)
    (tmp_path / "state/tuning/baseline.json").write_text(json.dumps(
        {"version": 1, "boot_id": "old-boot", "entries": [
            {"key": "swappiness", "prior": "33", "value": "10", "owner": "1", "holders": ["1"]}]}))
    (tmp_path / "state/tuning/jobs/1.json").write_text(json.dumps({"version": 1, "job_id": "1"}))
    logs = []
    out = tuning.restore(host, str(tmp_path / "state"), all_jobs=True, log=logs.append)
    assert out["ok"] and host.read("proc/sys/vm/swappiness").strip() != "33"      # stale value not written
    assert any("from boot old-boot" in m for m in logs)


def test_format1_mig_journal_is_restored(tmp_path):
    f = FakeMig.from_recording(MIG_DATA, gpus=1)
    before = f.snapshot(0)
    mig.prolog_apply(f, tmp_path, "5", [0], "7g.141gb", log=quiet)
    p = tmp_path / "5" / "mig.json"
    doc = json.loads(p.read_text())
    assert doc["journal"]["kind"] == "mig" and doc["version"] == 1
    p.write_text(json.dumps({k: v for k, v in doc.items() if k != "journal"}))     # previous release
    out = mig.restore_crashed(f, tmp_path, log=quiet)
    assert out["5"]["restored"] is True and f.snapshot(0) == before and not p.exists()


def test_hook_log_has_no_doubled_prefix():
    buf = io.StringIO()
    log = JobLog("990009", "prolog", stream=buf, use_syslog=False)
    log("gsrun: tune: job 990009: swappiness 60 -> 10")
    log.error("gsrun: prolog: bad SLURM_JOB_UID: 'x'")
    log.error("tuning: failed after 0.100 s: gsrun: prolog: MIG layout refused: no")
    log("draining gpu01: gsrun: GPU(s) lost during the job: [1]")     # a Slurm reason is not a header
    assert buf.getvalue().splitlines() == [
        "gsrun[990009]: prolog: tune: job 990009: swappiness 60 -> 10",
        "gsrun[990009]: prolog: bad SLURM_JOB_UID: 'x'",
        "gsrun[990009]: prolog: tuning: failed after 0.100 s: MIG layout refused: no",
        "gsrun[990009]: prolog: draining gpu01: gsrun: GPU(s) lost during the job: [1]",
    ]
