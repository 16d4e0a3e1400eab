"""Typed records and their JSON contracts.

- ``schemas/*.schema.json`` are current (generated from the record classes)
  and valid JSON Schemas;
- the summaries in ``tests/data/summaries`` (written by the code before the
  records existed) are read by ``from_json`` and written back unchanged, and
  validate against the schemas;
- summaries made now from the same simulated jobs are byte-identical to
  those files (every field that existed is produced with the same name and
  value), as are ``gseff --json``'s summary and the JS1 blob;
- every finding code the mail or the report tests for is a
  :class:`~gsrun.report.records.FindingCode`, and every member is emitted.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest

from gsrun.facts.sampler_state import STATE_VERSION, SamplerState
from gsrun.report import records
from gsrun.report.records import FindingCode, JobSummary, NodeSummary
from gsrun.report.summary import decode_js1, js1_blob, node_record
from helpers.paths import data_entries, load_data_module

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "data" / "summaries"
SCHEMAS = REPO / "schemas"
FILES = sorted(p for p in FIX.glob("*/*.json"))


def _kind(p: Path):
    name = p.name.removeprefix("before-power-limit-")   # kept beside the current files (README)
    if name == "summary.json":
        return JobSummary, "job-summary"
    if name.startswith("node-"):
        return NodeSummary, "node-summary"
    return SamplerState, "sampler-state"


def _schema(stem: str) -> dict:
    return json.loads((SCHEMAS / f"{stem}.schema.json").read_text())


def _validate(doc, stem):
    jsonschema.validate(doc, _schema(stem), cls=jsonschema.Draft202012Validator)


def test_schema_files_are_current_and_valid():
    want = records.all_schemas()
    assert sorted(p.name for p in SCHEMAS.glob("*.schema.json")) == sorted(f"{s}.schema.json" for s in want)
    for stem, schema in want.items():
        on_disk = json.loads((SCHEMAS / f"{stem}.schema.json").read_text())
        assert on_disk == schema, f"schemas/{stem}.schema.json is stale: python -m gsrun.report.records schemas"
        jsonschema.Draft202012Validator.check_schema(on_disk)


def test_fixtures_exist():
    assert len([p for p in FILES if p.name == "summary.json"]) >= 6
    assert any(p.name.startswith("sampler-") for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_old_files_read_and_write_back_unchanged(path):
    cls, stem = _kind(path)
    doc = json.loads(path.read_text())
    rec = cls.from_json(doc)
    assert rec.to_json() == doc
    assert json.dumps(rec.to_json(), sort_keys=True) == json.dumps(doc, sort_keys=True)
    _validate(doc, stem)
    if cls is not SamplerState:
        assert rec.schema == "gsrun.summary/1"
    else:
        assert rec.version == STATE_VERSION


def _load_make():
    return load_data_module(FIX / "make.py", "summaries_make")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return _load_make().scenarios(tmp_path_factory.mktemp("summaries"))


def test_summaries_made_now_equal_the_old_files(generated):
    make = _load_make()
    assert sorted(generated) == sorted(p.name for p in data_entries(FIX) if p.is_dir())
    for name, (states, nodes, job) in generated.items():
        d = FIX / name
        for node, st in states.items():
            assert make.dump(st, sort=False) == (d / f"sampler-{node}.json").read_text(), (name, node)
            _validate(st, "sampler-state")
        for n in nodes:
            assert make.dump(n) == (d / f"node-{n['node']}.json").read_text(), (name, n["node"])
            _validate(n, "node-summary")
        assert make.dump(job) == (d / "summary.json").read_text(), name
        _validate(job, "job-summary")
        for f in job["findings"]:
            _validate(f, "finding")


def test_js1_blob_and_gseff_json_unchanged(generated):
    from gsrun.wrapper.gseff import load_summary

    class _Paths:
        def __init__(self, d):
            self.d = d

        def spool_job(self, _job_id):
            return self.d

    for name, (_states, _nodes, job) in generated.items():
        old = json.loads((FIX / name / "summary.json").read_text())
        job = JobSummary.from_json(job)
        assert js1_blob(job) == js1_blob(JobSummary.from_json(old))
        if js1_blob(job):
            blob = decode_js1(js1_blob(job))
            assert set(blob) == {"gpus", "nodes", "total_time", "gsrun"}
        shown = load_summary(_Paths(FIX / name), "4242").to_json()
        assert json.dumps(shown, indent=1, sort_keys=True) == json.dumps(old, indent=1, sort_keys=True)


def test_node_record_takes_the_typed_state():
    d = json.loads((FIX / "mig" / "sampler-mig-01.json").read_text())
    env = {"node": "mig-01", "job_id": d["job_id"], "cpus_on_node": 8, "gpus": [0]}
    a = node_record(d, env, d["start_time"] + 3600)
    b = node_record(SamplerState.from_json(d), env, d["start_time"] + 3600)
    assert a == b and a.gpus[0].util_mean_pct is None and a.gpus[0].util_na_reason == "MIG"


def test_older_forms_stay_as_they_were():
    doc = json.loads((FIX / "two-nodes" / "summary.json").read_text())
    old = copy.deepcopy(doc)
    for g in old["gpu"]["devices"]:
        del g["status"]                    # an older writer without "status"
    old["gpu"]["devices"][0]["future_key"] = {"x": 1}
    rec = JobSummary.from_json(old)
    assert rec.to_json() == old
    assert rec.gpu.devices[0].extra == {"future_key": {"x": 1}}
    assert not rec.gpu.devices[1].status     # ABSENT: falsy, not written


@pytest.mark.parametrize("bad", [{"schema": "gsrun.summary/2", "kind": "job", "job": {"id": "1"}},
                                 {"kind": "job", "job": {"id": "1"}},
                                 {"schema": "gsrun.summary/1", "kind": "node", "job": {"id": "1"}},
                                 {"schema": "gsrun.summary/1", "kind": "job"},
                                 [1, 2]])
def test_job_summary_refuses_other_forms(bad):
    with pytest.raises(ValueError):
        JobSummary.from_json(bad)


def test_sampler_state_refuses_a_newer_version():
    d = json.loads((FIX / "mig" / "sampler-mig-01.json").read_text())
    d["version"] = STATE_VERSION + 1
    with pytest.raises(ValueError):
        SamplerState.from_json(d)


def test_finding_code_is_a_member_else_a_newer_gsruns_text():
    known = records.Finding.from_json({"code": "idle_gpu", "severity": "warn", "text": "x", "value": None})
    assert known.code is records.FindingCode.IDLE_GPU
    newer = records.Finding.from_json({"code": "gpu_unused", "severity": "warn", "text": "x", "value": None})
    assert newer.code == "gpu_unused" and newer.to_json()["code"] == "gpu_unused"     # the report is still read


# ----------------------------------------------------------------------------- finding codes

def _codes_tested_in_python(path: Path) -> set[str]:
    """String constants compared with a finding's code (``f.get("code") in X``,
    ``f["code"] == "..."``), following module-level names, plus the members
    of every module-level ``*_CODES`` constant."""
    tree = ast.parse(path.read_text())
    consts: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value

    def strings(n) -> set[str]:
        if isinstance(n, ast.Name) and n.id in consts:
            return strings(consts[n.id])
        out = set()
        for sub in ast.walk(n):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                out.add(sub.value)
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "FindingCode" \
                    and sub.attr.isupper():
                out.add(FindingCode[sub.attr].value)
        return out

    def is_code(n) -> bool:
        return any((isinstance(s, ast.Constant) and s.value == "code") or
                   (isinstance(s, ast.Attribute) and s.attr == "code") for s in ast.walk(n))

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and is_code(node.left):
            for c in node.comparators:
                found |= strings(c)
    for name, value in consts.items():
        if name.endswith("_CODES"):
            found |= strings(value)
    return found


def _codes_tested_in_templates() -> set[str]:
    found = set()
    for p in (REPO / "templates").glob("*.j2"):
        text = p.read_text()
        for m in re.finditer(r"\bcode\s*(?:==|!=|in|not in)\s*(\[[^\]]*\]|\([^)]*\)|'[^']*'|\"[^\"]*\")", text):
            found |= set(re.findall(r"['\"]([^'\"]+)['\"]", m.group(1)))
    return found


def test_every_code_the_mail_and_report_test_for_is_emitted():
    members = {c.value for c in FindingCode}
    used = set()
    report = REPO / "gsrun" / "report"
    for path in [*sorted((report / "mail").glob("*.py")), report / "render.py", report / "findings.py"]:
        used |= _codes_tested_in_python(path)   # findings.shown_findings: the shared filter
    used |= _codes_tested_in_templates()
    assert "idle_gpu" in used                  # the walk finds the idle-GPU filter (findings.IDLE_CODES)
    assert used <= members, f"codes tested but never emitted: {sorted(used - members)}"


def test_every_code_is_emitted_by_findings():
    src = (REPO / "gsrun" / "report" / "findings.py").read_text()
    emitted = {FindingCode[m].value for m in re.findall(r"FindingCode\.([A-Z_]+)", src)}
    if 'FindingCode(f"throttle_{cause}")' in src:
        causes = re.search(r'for cause in \(([^)]*)\)', src).group(1)
        emitted |= {f"throttle_{c}" for c in re.findall(r'"(\w+)"', causes)}
    assert emitted == {c.value for c in FindingCode}


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["gpu"]["devices"].__setitem__(1, [1]), "JobSummary.gpu.devices[1]: expected an object, got list"),
    (lambda d: d["gpu"]["devices"][0].__setitem__("throttle_s", [1]),
     "JobSummary.gpu.devices[0].throttle_s: expected an object, got list"),
    (lambda d: d["nodes_detail"][0].pop("node"), "JobSummary.nodes_detail[0]: missing key 'node'"),
    (lambda d: d.__setitem__("node_notes", {"gpu-a01": 3}), "JobSummary.node_notes.gpu-a01: expected an array, got int"),
])
def test_a_wrong_shape_is_named_by_its_path(edit, where):
    """The record readers are built once per class (a 1,000-node merge reads
    8,000 GPU records): a wrong shape deep inside is still refused with its path."""
    doc = json.loads((FIX / "two-nodes" / "summary.json").read_text())
    edit(doc)
    with pytest.raises(ValueError) as e:
        JobSummary.from_json(doc)
    assert where in str(e.value)




def test_read_values_are_fresh_containers_and_scalars_kept():
    doc = json.loads((FIX / "two-nodes" / "summary.json").read_text())
    rec = JobSummary.from_json(doc)
    dev, raw = rec.gpu.devices[0], doc["gpu"]["devices"][0]
    assert isinstance(rec.job.nodes, tuple) and list(rec.job.nodes) == doc["job"]["nodes"]
    assert dev.throttle_s == raw["throttle_s"] and dev.throttle_s is not raw["throttle_s"]
    assert all(type(p) is tuple for pts in dev.timeline.values() for p in pts) and dev.timeline
    assert type(dev.util_mean_pct) is type(raw["util_mean_pct"]) and dev.util_mean_pct == raw["util_mean_pct"]
    out = rec.to_json()
    assert out == doc and out["gpu"]["devices"][0]["timeline"] is not raw["timeline"]
