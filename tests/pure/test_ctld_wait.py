"""EpilogSlurmctld's wait for missing node summaries:
each file parsed once, only missing nodes looked for, backoff, a bounded total."""

from __future__ import annotations

import json

from gsrun import SUMMARY_SCHEMA
from gsrun.base.paths import Paths
from gsrun.epilog.ctld import merge, write_summary
from gsrun.report.records import JobInfo, JobSummary
from gsrun.report.summary import node_record


def test_missing_node_waited_with_backoff_then_reported(tmp_path):
    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("91")
    d.mkdir(parents=True)
    for n in ("a1", "a2"):
        (d / f"node-{n}.json").write_text(json.dumps(node_record(None, {"job_id": "91", "node": n}, 100.0).to_json()))
    pauses = []

    def sleep(s):
        pauses.append(s)
        if len(pauses) == 3:      # a3's epilog writes late: taken at the next look
            a3 = node_record(None, {"job_id": "91", "node": "a3"}, 100.0)
            (d / "node-a3.json").write_text(json.dumps(a3.to_json()))

    job = {"id": "91", "nodes": ["a1", "a2", "a3", "a4"]}
    out = merge(paths, JobInfo(**job), None, wait_s=1.0, sleep=sleep)
    assert list(out.nodes_missing) == ["a4"]
    assert [n.node for n in out.nodes_detail] == ["a1", "a2", "a3"]
    assert pauses[:3] == [0.1, 0.2, 0.4] and sum(pauses) <= 1.0 + 1e-9


def test_each_node_file_is_parsed_once_and_the_real_wait_is_bounded(tmp_path, monkeypatch):
    import time

    import gsrun.epilog.ctld as ctld

    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("92")
    d.mkdir(parents=True)
    for n in ("b1", "b2"):
        (d / f"node-{n}.json").write_text(json.dumps(node_record(None, {"job_id": "92", "node": n}, 100.0).to_json()))
    reads: list[str] = []
    real = ctld.read_json
    monkeypatch.setattr(ctld, "read_json", lambda p: reads.append(p.name) or real(p))
    t0 = time.monotonic()
    out = merge(paths, JobInfo(**{"id": "92", "nodes": ["b1", "b2", "b3"]}), None, wait_s=0.5)
    took = time.monotonic() - t0
    assert list(out.nodes_missing) == ["b3"]
    assert sorted(reads) == ["node-b1.json", "node-b2.json"]     # not re-read while waiting for b3
    assert 0.5 <= took < 5.0


def test_a_node_file_of_an_earlier_job_with_the_same_id_is_not_merged(tmp_path):
    """Job ids wrap and a requeued job runs again under its id: a node summary that
    started well before this job did is an earlier run's, and the merge waits for
    this run's (found when a reused id's old spool directory was merged at once)."""
    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("93")
    d.mkdir(parents=True)

    def node(n, start):
        s = node_record(None, {"job_id": "93", "node": n}, start + 10.0).to_json()
        s["start_time"] = start
        return json.dumps(s)

    (d / "node-c1.json").write_text(node("c1", 1000.0))          # the earlier job 93
    pauses = []

    def sleep(s):
        pauses.append(s)
        if len(pauses) == 2:      # this run's epilog writes its summary over it
            (d / "node-c1.json").write_text(node("c1", 10_005.0))

    out = merge(paths, JobInfo(**{"id": "93", "nodes": ["c1"], "start_time": 10_000.0}), None, wait_s=5.0, sleep=sleep)
    assert list(out.nodes_missing) == [] and len(pauses) == 2
    assert [n.node for n in out.nodes_detail] == ["c1"]
    assert out.job.start_time == 10_000.0


def test_the_job_summary_replaces_every_nodes_live_file(tmp_path):
    """A live file a node left (a reboot: no state on the node, no epilog) goes when the job's summary is written;
    the node summaries and other files stay."""
    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("92")
    d.mkdir(parents=True)
    for name in ("user-live-a1.json", "user-live-a2.json", "node-a1.json", "prolog-a2.json"):
        (d / name).write_text("{}")
    write_summary(paths, JobSummary.from_json({"schema": SUMMARY_SCHEMA, "kind": "job", "job": {"id": "92"}}),
                  None, None)
    assert sorted(p.name for p in d.iterdir()) == ["node-a1.json", "prolog-a2.json", "summary.json"]
