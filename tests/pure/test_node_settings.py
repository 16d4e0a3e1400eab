"""The report's "node settings during the job": the prolog record's tuning
report -> the node summary's ``settings`` -> the job summary's ``settings`` groups ->
one text line per group of identical nodes (a 1,000-node job prints one line)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from gsrun.base.record import ABSENT
from gsrun.facts.slurm import compress_hostlist, expand_hostlist
from gsrun.report.mail import mail_view
from gsrun.report.records import JobInfo, JobSummary, NodeSummary
from gsrun.report.render import render_text, settings_lines
from gsrun.report.node_end import node_settings
from gsrun.report.records import NodeSetting
from gsrun.report.summary import job_summary, settings_groups
from helpers.paths import DATA, REPO

pytestmark = pytest.mark.pure
FIX = DATA / "summaries" / "two-nodes"


def _schema(stem):
    return json.loads((REPO / "schemas" / f"{stem}.schema.json").read_text())


def prolog_record(irq_action="refused", irq_reason="irqbalance runs without gsrun's policy script", holds=None,
                  malloc=None):
    items = [
        {"key": "governor", "action": "applied", "value": "performance", "source": "request", "reason": ""},
        {"key": "swap", "action": "reuse", "value": "off", "source": "default",
         "reason": "already set by running job 41"},
        {"key": "irq", "action": irq_action, "value": "local", "source": "request", "reason": irq_reason},
        {"key": "hugepages", "action": "apply", "value": "2M:16", "source": "request", "reason": "node 0"},
    ]
    rec = {"request": {"tune": "governor=performance,irq=local"}, "steps": {"tuning": {"items": items}}}
    if holds is not None:
        rec["steps"]["tuning"]["holds"] = holds
    if malloc is not None:
        rec["request"]["malloc"] = malloc
    return rec


def _json(settings):
    """node_settings' records in their JSON form, as a node summary holds them (None stays None)."""
    return None if settings is None else [s.to_json() for s in settings]


def test_node_settings_from_the_prolog_record():
    got = node_settings(prolog_record(holds={"cpu_dma_latency_us": 1}, malloc="jemalloc"))
    assert [(s.key, s.value, s.state, s.source) for s in got] == [
        ("governor", "performance", "applied", "request"),
        ("swap", "off", "reused", "default"),
        ("irq", "local", "refused", "request"),
        ("hugepages", "2M:16", "skipped", "request"),          # "apply" left: the prolog stopped before it
        ("cpu_dma_latency", "1", "held", "request"),
        ("malloc", "jemalloc", "requested", "request"),
    ]
    assert got[2].reason == "irqbalance runs without gsrun's policy script"


def test_node_settings_unknown_none_and_step_error():
    assert node_settings(None) is None                      # no prolog record: unknown, not "none"
    assert node_settings({}) is None
    assert node_settings({"steps": {"tuning": {"skipped": "tuning.enabled = false"}}, "request": {}}) == []
    err = node_settings({"steps": {"tuning": "gsrun: tune: state dir: EROFS"}})
    assert [(s.key, s.state, s.reason) for s in err] == [("tuning", "failed", "gsrun: tune: state dir: EROFS")]
    # an allocator outside the allow-list never reaches the report (the comment is user text)
    assert node_settings({"request": {"malloc": 5}, "steps": {}}) == []


def test_node_summary_with_settings_reads_back_and_validates():
    node = json.loads((FIX / "node-gpu-a01.json").read_text())
    node["settings"] = _json(node_settings(prolog_record()))
    rec = NodeSummary.from_json(node)
    assert rec.to_json() == node
    assert rec.settings[0].key == "governor"
    jsonschema.validate(node, _schema("node-summary"), cls=jsonschema.Draft202012Validator)
    node["settings"] = None                                  # unknown is a value
    jsonschema.validate(node, _schema("node-summary"), cls=jsonschema.Draft202012Validator)


def _nodes(n, settings):
    base = json.loads((FIX / "node-gpu-a01.json").read_text())
    out = []
    for i in range(n):
        d = copy.deepcopy(base)
        d["node"] = f"gpu{i:04d}"
        d["gpus"] = [dict(g, node=d["node"]) for g in d["gpus"]]
        d["settings"] = copy.deepcopy(settings)
        out.append(d)
    return out


def _summary(nodes: list[dict]) -> JobSummary:
    """The job summary of node summaries in their JSON form."""
    job = {"id": "77", "nodes": [n["node"] for n in nodes], "state": "COMPLETED", "elapsed_s": 600.0}
    return job_summary(JobInfo(**job), map(NodeSummary.from_json, nodes))


def _reads_back(s: JobSummary) -> bool:
    return JobSummary.from_json(s.to_json()).to_json() == s.to_json()


def test_a_thousand_identical_nodes_are_one_line():
    nodes = _nodes(1000, _json(node_settings(prolog_record())))
    groups = settings_groups(map(NodeSummary.from_json, nodes))
    assert len(groups) == 1 and len(groups[0].nodes) == 1000
    s = _summary(nodes)
    assert len(s.settings) == 1
    assert settings_lines(s) == [
        "Node settings during the job: governor=performance applied; swap=off reused; "
        "irq=local refused (irqbalance runs without gsrun's policy script); hugepages=2M:16 skipped (node 0)"]
    assert _reads_back(s)
    text = render_text(s)
    assert text.count("Node settings") == 1


def test_differing_nodes_get_their_own_line_largest_group_first():
    nodes = _nodes(12, _json(node_settings(prolog_record())))
    nodes[5]["settings"] = _json(node_settings(prolog_record(irq_action="applied", irq_reason="8 IRQs")))
    nodes[7]["settings"] = None                               # no prolog record on that node
    del nodes[9]["settings"]                                  # an older node summary
    s = _summary(nodes)
    assert [len(g.nodes) for g in s.settings] == [9, 1]
    assert _reads_back(s)
    small = _summary(nodes[4:7])         # few GPUs: per-device timelines, as the schema has
    assert [len(g.nodes) for g in small.settings] == [2, 1]
    jsonschema.validate(small.to_json(), _schema("job-summary"), cls=jsonschema.Draft202012Validator)
    lines = settings_lines(s)
    assert lines[0].startswith("Node settings during the job on gpu[0000-0004,0006,0008,0010-0011] (9 nodes): ")
    assert lines[1].startswith("Node settings during the job on gpu0005: ")
    assert "irq=local applied (8 IRQs)" in lines[1]
    assert lines[2] == "Node settings unknown on gpu[0007,0009] (no prolog record)"
    assert mail_view(s, "", False, "cid")["node_settings"] == lines


def test_many_groups_are_counted_not_listed():
    nodes = _nodes(8, [])
    for i, n in enumerate(nodes):
        n["settings"] = _json(node_settings(prolog_record(irq_reason=f"reason {i}")))
    lines = settings_lines(_summary(nodes))
    assert len(lines) == 5
    assert lines[-1] == "Node settings differ on 4 more nodes in 4 groups (gseff --json: settings)"


def test_nothing_asked_prints_nothing_and_old_summaries_keep_their_keys():
    nodes = _nodes(2, [])
    s = _summary(nodes)
    assert [g.to_json() for g in s.settings] == [{"nodes": ["gpu0000", "gpu0001"], "settings": []}]
    assert settings_lines(s) == []
    old = [json.loads((FIX / f"node-gpu-a0{i}.json").read_text()) for i in (1, 2)]
    assert _summary(old).settings is ABSENT and "settings" not in _summary(old).to_json()  # fixtures from before


@pytest.mark.parametrize("names", [["gpu01", "gpu02", "gpu03", "gpu07", "login1"], ["a"], [],
                                   [f"n{i}" for i in range(1, 120)], ["gpu-a01", "gpu-a02", "gpu-b01"]])
def test_compress_hostlist_round_trips(names):
    text = compress_hostlist(names)
    assert sorted(expand_hostlist(text)) == sorted(set(names))
    if names and names[0] == "gpu01":
        assert text == "gpu[01-03,07],login1"


def test_node_settings_are_node_setting_records_that_read_back():
    """node_settings gives NodeSetting records; their JSON form reads back to the same record."""
    got = node_settings(prolog_record(holds={"cpu_dma_latency_us": 1}, malloc="jemalloc"))
    assert got and all(isinstance(s, NodeSetting) for s in got)
    for s in got:
        assert NodeSetting.from_json(s.to_json()) == s