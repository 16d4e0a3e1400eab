"""Real machines' topologies (LLNL mpibind's 19 hwloc XML exports, v1 and v2)
read with ``--topology-xml`` (:mod:`gsrun.facts.hwloc_xml`), through the
public entry points ``gsrun-bind --plan --json --topology-xml FILE`` and
``gsrun-node topology --topology-xml FILE``.

The files stay in ``../shared/data/topologies/mpibind/`` (SOURCE.md there);
read through ``helpers.paths.SHARED``, never copied into the project.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from helpers.paths import SHARED
from gsrun.base.cpulist import parse_cpulist
from gsrun.base.errors import InputError
from gsrun.facts.hwloc_xml import parse_bitmap, read_topology_xml
from gsrun.wrapper.bind import main as bind_main
from gsrun.admin.node import cli as node_cli

MPIBIND = SHARED / "data" / "topologies" / "mpibind"
FILES = sorted(p.name for p in MPIBIND.glob("*.xml")) if MPIBIND.is_dir() else []
NVIDIA = {"coral-butte-hwloc1.xml", "coral-ea-hwloc1.xml", "coral-lassen-hwloc1.xml", "coral-lassen.xml",
          "coral-rzansel-hwloc1.xml", "cts1-pascal.xml", "g4dnmetal.xml"}   # SOURCE.md: PCI vendor 10de
needs_shared = pytest.mark.skipif(not FILES, reason=f"{MPIBIND} absent: the real topologies live in ../shared "
                                                    "beside the checkout (CI has it)")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_"))]:
        monkeypatch.delenv(k)


def plan_json(name, gpus, n):
    args = ["--plan", "--json", "--topology-xml", str(MPIBIND / name), "--ntasks-per-node", str(n)]
    if gpus:
        args += ["--gpus", ",".join(map(str, gpus))]
    res = CliRunner().invoke(bind_main, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["ranks"]


def test_bitmap_parser_v1_and_v2_forms():
    assert parse_bitmap("0x00000101") == {0, 8}
    assert parse_bitmap("0xf0000000,,,,,,,0x00000101") == {0, 8, 252, 253, 254, 255}
    assert parse_bitmap("0x0000ffff,0xffffffff,0xffffffff,,,0x0") == set(range(96, 176))
    assert parse_bitmap("0x0") == set()
    with pytest.raises(InputError, match="malformed bitmap"):
        parse_bitmap("0xzz")


@pytest.mark.parametrize("text,what", [
    ("<nottopology/>", "root element is not <topology>"),
    ('<topology version="3.0"><object type="Machine"/></topology>', "unknown hwloc XML version"),
    ('<!DOCTYPE topology [<!ENTITY a "x">]><topology/>', "entity declaration"),
    ("<topology><object type='Machine' cpuset='0x1'/></topology>", "no PU object"),
    ("<topology", "not well-formed XML"),
])
def test_strict_parser_refuses_what_is_not_hwloc(tmp_path, text, what):
    f = tmp_path / "t.xml"
    f.write_text(text)
    with pytest.raises(InputError, match=re.escape(what)):
        read_topology_xml(f)


@needs_shared
def test_all_nineteen_present():
    assert len(FILES) == 19, FILES


@needs_shared
@pytest.mark.parametrize("name", FILES)
def test_node_topology_prints_table(name):
    res = CliRunner().invoke(node_cli, ["topology", "--topology-xml", str(MPIBIND / name)])
    assert res.exit_code == 0, res.output
    t = read_topology_xml(MPIBIND / name)
    assert "NUMA nodes:" in res.stdout
    for n in t.nodes:
        assert f"  node{n.id}: CPUs " in res.stdout
    assert f"note: from hwloc XML v" in res.stdout
    if name in NVIDIA:
        assert len(t.gpus) >= 2 and all(g.pci_bus_id in res.stdout for g in t.gpus)
    else:
        assert not t.gpus and "(no NVIDIA GPU found on this host)" in res.stdout


@needs_shared
@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("per_node", ["1", "2", "4", "all"])
def test_invariants(name, per_node):
    t = read_topology_xml(MPIBIND / name)
    node_cpus = {n.id: set(n.cpus) for n in t.nodes}
    has_mem = {n.id for n in t.nodes if n.has_memory}
    if name in NVIDIA:
        k = len(t.gpus) if per_node == "all" else int(per_node)
        if k > len(t.gpus):
            pytest.skip(f"{name} has {len(t.gpus)} GPUs")
        gpus = [g.minor for g in t.gpus][:k]
    else:
        k = len([n for n in t.nodes if n.cpus]) if per_node == "all" else int(per_node)
        gpus = []
    ranks = plan_json(name, gpus, k)
    assert len(ranks) == k
    seen: set[int] = set()
    used = []
    for r in ranks:
        cpus = set(r["cpus"])
        assert cpus and cpus <= set(t.cpus_online)
        assert not seen & cpus, f"rank {r['local_rank']} overlaps"
        seen |= cpus
        assert set(r["mem_nodes"]) <= has_mem, f"memory policy names a node without memory: {r}"
        if gpus:
            g = t.gpu_by_minor(r["gpu"]["index"])
            used.append(g.minor)
            if g.numa_node is not None and node_cpus[g.numa_node]:
                assert cpus <= node_cpus[g.numa_node], (r, g)
            # memory-only nodes (POWER9 GPU memory 252-255, KNL MCDRAM) are never CPU targets
    if gpus:
        assert sorted(used) == sorted(gpus), "every GPU used once"


@needs_shared
def test_memory_only_nodes_read_as_cpu_less():
    t = read_topology_xml(MPIBIND / "coral-lassen-hwloc1.xml")
    gpu_mem = [n for n in t.nodes if n.id >= 252]
    assert len(gpu_mem) == 4 and all(not n.cpus and n.has_memory for n in gpu_mem)
    knl = read_topology_xml(MPIBIND / "knl-snc4-flat-hwloc1.xml")
    assert [n.id for n in knl.nodes if not n.cpus] == [4, 5, 6, 7]
    assert t.node(0).distances[8] == 40 and t.node(0).distances[252] == 80       # v1 latency x base
    v2 = read_topology_xml(MPIBIND / "coral-lassen.xml")
    assert v2.node(0).distances == {0: 10, 8: 40}                                 # v2 distances2


# ------------------------------------------------------- mpibind's expected mappings

#: mpibind's unrestricted, GPU-optimised cases at smt 0 (the v1 file has no
#: parameter lines, so cases are picked by their description)
COMPARABLE = {"Map one task to every core", "Map one task greedily", "Map 1 task greedily",
              "Map two tasks greedily"}


def _expected(name):
    """(description, cpus per task, gpus per task) of mpibind's test-suite/expected file."""
    text = (MPIBIND / "expected" / name).read_text()
    out = []
    for m in re.finditer(r'^([^#"\n][^\n]*)\n"[^"]*"\n"([^"]*)"\n"([^"]*)"', text, re.M):
        cpus = [set(parse_cpulist(x)) if x else set() for x in m.group(2).split(";")]
        gpus = [parse_cpulist(x) if x else [] for x in m.group(3).split(";")]
        out.append((m.group(1).strip(), cpus, gpus))
    return out


@needs_shared
@pytest.mark.parametrize("xml,expected", [("coral-lassen.xml", "expected.coral-lassen"),
                                          ("coral-lassen-hwloc1.xml", "expected.coral-lassen.v1")])
def test_gpu_to_cpu_association_matches_mpibind(xml, expected):
    """For each of mpibind's unrestricted GPU-optimised cases, the NUMA node
    each GPU's CPUs come from. mpibind numbers GPUs in PCI order, as our
    minor numbers from an export do. Differences, each asserted:

    1. a task owning several GPUs: mpibind gives a task GPUs of one node
       (GPUs 0,1 / 2,3) and, with one task, the whole machine; gsrun gives
       rank r GPUs {i : i % n == r} (so ``LOCAL_RANK % device_count`` selects
       the rank's own GPU) and binds the rank to its *first* GPU's node. So
       for the first GPU of each rank the node agrees with mpibind; a second
       GPU of the rank may sit on another node, where mpibind would put the
       task's CPUs on that GPU's node too.
    2. CPUs within the node: mpibind (smt 0) gives one PU per core; gsrun
       gives all hardware threads of whole cores. Only the node is compared.
    """
    t = read_topology_xml(MPIBIND / xml)
    cases = [c for c in _expected(expected) if c[0] in COMPARABLE]
    assert len(cases) == 3, [c[0] for c in _expected(expected)]
    compared = differ = 0
    for params, mcpus, mgpus in cases:
        n = len(mcpus)
        mp: dict[int, set[int]] = {}
        for cpus, gl in zip(mcpus, mgpus):
            for g in gl:
                mp.setdefault(g, set()).update({t.node_of_cpu(c) for c in cpus})
        ranks = plan_json(xml, [g.minor for g in t.gpus], n)
        ours: dict[int, set[int]] = {}
        first = set()
        for r in ranks:
            nodes = {t.node_of_cpu(c) for c in r["cpus"]}
            own = [i for i in range(len(t.gpus)) if (i % n == r["local_rank"] if len(t.gpus) > n
                                                     else i == r["local_rank"] % len(t.gpus))]
            first.add(own[0])
            for g in own:
                ours.setdefault(g, set()).update(nodes)
        for g in mp:
            if g in first:
                assert ours[g] <= mp[g], (params, g, ours[g], mp[g])      # agrees
                compared += 1
            else:                                                            # difference 1
                owner = next(r for r in ranks if g in [i for i in range(len(t.gpus)) if i % n == r["local_rank"]])
                assert ours[g] == {t.gpu_by_minor(owner["gpu"]["index"]).numa_node}
                differ += ours[g] != mp[g]
    # 40 tasks: 4 GPUs first-owned; 2 tasks: GPUs 0, 1 first-owned; 1 task: GPU 0
    assert compared == 4 + 2 + 1
    # where they differ: 2 tasks, GPU 2 (ours node 0 with rank 0, mpibind node 8), GPU 1 (ours
    # node 8 with rank 1, mpibind node 0); 1 task: GPUs 1, 2, 3 (ours node 0, mpibind the whole
    # machine, nodes 0 and 8; for GPU 0 too, where ours is the subset {0})
    assert differ == 5


@needs_shared
def test_env_var_and_refusals(tmp_path):
    f = str(MPIBIND / "g4dnmetal.xml")
    res = CliRunner().invoke(bind_main, ["--plan", "--json", "--gpus", "4", "--ntasks-per-node", "1"],
                             env={"GSRUN_TOPOLOGY_XML": f})
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)["ranks"]
    t = read_topology_xml(f)
    assert r["numa_node"] == 1 and set(r["cpus"]) == set(t.node(1).cpus)     # 0000:e7:00.0, socket 1
    res = CliRunner().invoke(bind_main, ["--plan", "--topology-xml", f, "--host-root", str(tmp_path)])
    assert res.exit_code == 2 and "--topology-xml and --host-root both given" in res.output
    res = CliRunner().invoke(bind_main, ["--topology-xml", f, "--", "true"])
    assert res.exit_code == 2 and "--topology-xml plans only" in res.output
