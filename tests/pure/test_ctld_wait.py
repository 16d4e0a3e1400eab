"""EpilogSlurmctld's wait for missing node summaries (issue 24, item 2):
each file parsed once, only missing nodes looked for, backoff, a bounded total."""

from __future__ import annotations

import json

from gsrun.base.paths import Paths
from gsrun.epilog.ctld import merge
from gsrun.report.summary import node_summary


def test_missing_node_waited_with_backoff_then_reported(tmp_path):
    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("91")
    d.mkdir(parents=True)
    for n in ("a1", "a2"):
        (d / f"node-{n}.json").write_text(json.dumps(node_summary(None, {"job_id": "91", "node": n}, 100.0)))
    pauses = []

    def sleep(s):
        pauses.append(s)
        if len(pauses) == 3:      # a3's epilog writes late: taken at the next look
            (d / "node-a3.json").write_text(json.dumps(node_summary(None, {"job_id": "91", "node": "a3"}, 100.0)))

    job = {"id": "91", "nodes": ["a1", "a2", "a3", "a4"]}
    out = merge(paths, job, None, wait_s=1.0, sleep=sleep)
    assert out["nodes_missing"] == ["a4"]
    assert [n["node"] for n in out["nodes_detail"]] == ["a1", "a2", "a3"]
    assert pauses[:3] == [0.1, 0.2, 0.4] and sum(pauses) <= 1.0 + 1e-9
