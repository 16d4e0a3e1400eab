"""The controller merge at scale: timelines cut before
parsing, a bounded job-level timeline, one serialization for both copies,
a summarising gseff report for many GPUs."""

from __future__ import annotations

import copy
import json
import os

from gsrun.base.fsutil import atomic_write_json
from gsrun.base.record import ABSENT
from gsrun.base.paths import Paths
from gsrun.epilog import ctld
from gsrun.epilog.ctld import _node_without_timelines, merge, write_summary
from gsrun.report.records import JobInfo, NodeSummary
from gsrun.report.render import render_text
from gsrun.report.summary import JOB_TIMELINE_POINTS, KEEP_GPU_TIMELINES, JobTimeline, job_summary
from helpers.paths import DATA

NODE = DATA / "summaries" / "two-nodes" / "node-gpu-a01.json"


def _without(d: dict) -> dict:
    d = copy.deepcopy(d)
    d.pop("cpu_timeline", None)
    for g in d["gpus"]:
        g.pop("timeline", None)
    return d


def test_cut_parse_equals_full_parse_minus_timelines(tmp_path):
    full = json.loads(NODE.read_text())
    p = tmp_path / "node-x.json"
    atomic_write_json(p, full, mode=0o600)       # as the node epilog writes it
    assert _node_without_timelines(p) == _without(full)
    empty = copy.deepcopy(full)                  # empty series, a GPU with no timeline, no cpu_timeline points
    empty["cpu_timeline"] = []
    empty["gpus"][0]["timeline"] = {}
    del empty["gpus"][1]["timeline"]
    atomic_write_json(p, empty, mode=0o600)
    assert _node_without_timelines(p) == _without(empty)
    p.write_text(json.dumps(full, indent=2))    # another layout: parsed whole, timelines dropped
    assert _node_without_timelines(p) == _without(full)
    p.write_text('{"kind": "node", "gpus": [')   # corrupt
    assert _node_without_timelines(p) is None


def _nodes(n: int) -> list[dict]:
    base = json.loads(NODE.read_text())
    out = []
    for i in range(n):
        d = copy.deepcopy(base)
        d["node"] = f"n{i:03d}"
        for g in d["gpus"]:
            g["node"] = d["node"]
        out.append(d)
    return out


def _summary(job: dict, nodes: list[dict]):
    """:func:`job_summary` of node summaries in their JSON form."""
    return job_summary(JobInfo(**job), map(NodeSummary.from_json, nodes))


def test_many_gpus_get_a_bounded_job_timeline_instead_of_per_gpu_ones():
    nodes = _nodes(KEEP_GPU_TIMELINES // 2 + 1)           # 2 GPUs each: one more node than kept
    s = _summary({"id": "4242", "nodes": [n["node"] for n in nodes]}, nodes)
    assert all(g.timeline is ABSENT for g in s.gpu.devices)
    tl = s.gpu.timeline
    assert set(tl) == {"util_pct", "mem_used_bytes", "power_w"}      # sm_active_pct had no points
    assert all(len(v) <= JOB_TIMELINE_POINTS for v in tl.values())
    # every GPU's util is 50 % and power 78.45 W in the fixture: mean, max and min across them too
    assert {(p[1], p[2], p[4]) for p in tl["util_pct"]} == {(50.0, 50.0, 50.0)}
    assert {p[1] for p in tl["power_w"]} == {78.45}
    n_in = sum(p[3] for g in nodes[0]["gpus"] for p in g["timeline"]["util_pct"]) * len(nodes)
    assert sum(p[3] for p in tl["util_pct"]) == n_in              # no sample lost in the pooling
    few = _summary({"id": "4242", "nodes": ["n000"]}, _nodes(1))
    assert few.gpu.timeline is ABSENT and all(g.timeline for g in few.gpu.devices)


def test_job_timeline_coarsens_to_its_bound():
    acc = JobTimeline(width_s=1.0, max_points=10)
    acc.add_gpu({"util_pct": [[float(t), 10.0 * (t % 2), 10.0 * (t % 2), 1] for t in range(100)]})
    pts = acc.to_json()["util_pct"]
    assert len(pts) <= 10 and acc.width_s == 16.0
    assert sum(p[3] for p in pts) == 100 and pts[0][1] == 5.0 and pts[0][2] == 10.0 and pts[0][4] == 0.0


def test_merge_of_many_nodes_cuts_timelines_and_writes_one_serialization(tmp_path, monkeypatch):
    monkeypatch.setattr(ctld, "POOL_MAX_NODES", 2)
    paths = Paths(str(tmp_path / "state"), str(tmp_path / "spool"), str(tmp_path / "mps"))
    d = paths.spool_job("4242")
    d.mkdir(parents=True)
    nodes = _nodes(3)
    for n in nodes:
        atomic_write_json(d / f"node-{n['node']}.json", n, mode=0o600)
    s = merge(paths, JobInfo(**{"id": "4242", "nodes": [n["node"] for n in nodes]}), None)
    ref = _summary({"id": "4242", "nodes": [n["node"] for n in nodes]}, [_without(n) for n in nodes])
    assert s == ref and s.gpu.timeline is ABSENT
    write_summary(paths, s, os.getuid(), os.getgid())
    a, b = (d / "summary.json").read_bytes(), (d / "user-summary.json").read_bytes()
    assert a == b and json.loads(a) == s.to_json()
    assert (d / "summary.json").stat().st_mode & 0o777 == 0o600
    assert (d / "user-summary.json").stat().st_mode & 0o777 == 0o440


def test_many_gpus_are_summarised_unless_all():
    nodes = _nodes(20)                                      # 40 GPUs
    for i, n in enumerate(nodes):
        for g in n["gpus"]:
            g["util_mean_pct"] = float(i * 2 + g["index"])
    s = _summary({"id": "4242", "nodes": [n["node"] for n in nodes]}, nodes)
    text = render_text(s)
    assert "40 GPUs; busy over 40 with a figure: min 0%, 10th percentile 4%, median 20%, 90th percentile 35%, " \
           "max 39%" in text.replace("\n    ", " ")
    rows = [ln for ln in text.splitlines() if ln.startswith("  n0")]
    assert [r.split()[0] for r in rows] == ["n000", "n000", "n001", "n001", "n002",
                                            "n017", "n018", "n018", "n019", "n019"]
    every = render_text(s, all_gpus=True)
    assert len([ln for ln in every.splitlines() if ln.startswith("  n0")]) == 40


def test_findings_and_nodes_of_a_large_job_are_cut_unless_all():
    nodes = _nodes(40)                                      # 80 GPUs, 40 nodes
    for i, n in enumerate(nodes):
        for g in n["gpus"]:
            g["util_mean_pct"], g["util_idle_frac"] = (1.0, 0.99) if i % 2 else (80.0, 0.0)
    s = _summary({"id": "4242", "nodes": [n["node"] for n in nodes], "elapsed_s": 86400.0}, nodes)
    idle = next(f.text for f in s.findings if f.code == "idle_gpu")
    assert idle.count(" on n0") == 20                       # the summary keeps every node
    text = render_text(s).replace("\n     ", " ").replace("\n    ", " ")
    assert "GPUs 0, 1 on n001, GPUs 0, 1 on n003, GPUs 0, 1 on n005, GPUs 0, 1 on n007 and GPUs on 16 more " \
           "nodes (gseff --all lists them) were idle 99% of the time" in text
    assert "40 nodes (n000, n001, n002, n003, ... n039; gseff --all lists them)" in text
    assert "n021" not in text.split("\nGPUs\n")[0]
    every = render_text(s, all_gpus=True).replace("\n     ", " ").replace("\n    ", " ")
    assert idle in every and ", ".join(n["node"] for n in nodes) in every
