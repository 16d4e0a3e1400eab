"""Golden plans for 1, 4 and 8 local ranks on every recorded host
(``gsrun-bind --plan --json``, stored as ``tests/data/hosts/<host>/golden/plan-<n>.json``).

Regenerate after an intended change with ``GSRUN_REGEN_GOLDEN=1`` (see
``tests/data/golden/README.md``) and review the diff of tests/data/hosts/*/golden/.
"""

import json
import os

import pytest
from click.testing import CliRunner

from helpers.golden import check_text
from helpers.paths import DATA
from gsrun.bind.plan import plan_from_env
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import read_topology
from gsrun.wrapper.bind import main

HOSTS = DATA / "hosts"
# host -> extra inputs (the cpuset-restricted job's allowed CPUs, field case 3 in
# docs/field-cases.md)
GOLDEN_HOSTS = {"h200-vm": {}, "server-2s8g": {}, "amd-nps4": {}, "vm-numa-minus1": {},
                "cpuset-job": {"allowed": "0-15,56-71"}}


def cli_args(name, n):
    t = read_topology(HostFS(HOSTS / name))
    gpus = ",".join(str(g.minor) for g in sorted(t.gpus, key=lambda g: g.minor))
    args = ["--plan", "--json", "--host-root", str(HOSTS / name), "--gpus", gpus,
            "--ntasks-per-node", str(n)]
    if GOLDEN_HOSTS[name].get("allowed"):
        args += ["--allowed-cpus", GOLDEN_HOSTS[name]["allowed"]]
    return args


@pytest.mark.parametrize("name", sorted(GOLDEN_HOSTS))
@pytest.mark.parametrize("n", [1, 4, 8])
def test_golden_plan(name, n, monkeypatch):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_HOST"))]:
        monkeypatch.delenv(k)
    res = CliRunner().invoke(main, cli_args(name, n))
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    path = HOSTS / name / "golden" / f"plan-{n}.json"
    check_text(path, json.dumps(got, indent=2) + "\n", f"gsrun-bind plan for {name} with {n} ranks")
    want = json.loads(path.read_text())
    # the golden itself obeys the invariants
    allowed = set(range(4096))
    if GOLDEN_HOSTS[name].get("allowed"):
        from gsrun.base.cpulist import parse_cpulist
        allowed = set(parse_cpulist(GOLDEN_HOSTS[name]["allowed"]))
    for r in want["ranks"]:
        assert r["cpus"] and set(r["cpus"]) <= allowed
        assert set(r) == {"local_rank", "gpu", "numa_node", "cpus", "mem_nodes", "nic", "env", "reason"}
        assert set(r["gpu"]) == {"index", "uuid", "pci_bus_id"}


def test_cli_equals_library_plan():
    name = "server-2s8g"
    fs = HostFS(HOSTS / name)
    p = plan_from_env({"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "SLURM_NTASKS_PER_NODE": "4"}, fs)
    res = CliRunner().invoke(main, cli_args(name, 4), env={"CUDA_VISIBLE_DEVICES": "7"})
    assert json.loads(res.stdout) == p.to_json()
