"""Topology facts from recorded/fake host trees (field cases 1, 4, 7, 8 in
docs/field-cases.md)."""

import json
import shutil

import pytest

from helpers.paths import DATA
from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import FakeNvml
from gsrun.facts.topology import read_allowed_mems, read_topology

HOSTS = DATA / "hosts"


def topo(name, **kw):
    return read_topology(HostFS(HOSTS / name), **kw)


def test_h200_vm_recorded():
    t = topo("h200-vm")
    assert t.cpus_online == tuple(range(16))
    assert [n.id for n in t.nodes] == [0]
    assert len(t.cores) == 16  # no SMT on the VM
    (g,) = t.gpus
    assert g.pci_bus_id == "0000:00:06.0"
    assert g.minor == 0 and g.nvml_index == 0
    assert g.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    # sysfs numa_node is -1 on the VM; NVML affinity [65535, 0...] = CPUs 0-15 = node0
    assert g.numa_node == 0 and g.numa_source == "NVML CPU affinity"
    assert g.local_cpus == tuple(range(16))
    assert t.nics == ()  # eth0/ifb* have no PCI device in the recording


def test_h200_without_nvml_uses_procfs_and_single_node():
    t = topo("h200-vm", nvml=False)
    (g,) = t.gpus
    assert g.minor == 0 and g.nvml_index is None
    assert g.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert g.name == "NVIDIA H200"
    assert g.numa_node == 0 and g.numa_source == "sysfs local_cpulist"


def test_case1_numa_minus_one_from_nvml_mask():
    t = topo("vm-numa-minus1")
    nodes = {g.pci_bus_id: (g.numa_node, g.numa_source) for g in t.gpus}
    assert nodes["0000:3b:00.0"] == (0, "NVML CPU affinity")
    assert nodes["0000:3c:00.0"] == (0, "NVML CPU affinity")
    assert nodes["0000:3d:00.0"] == (1, "NVML CPU affinity")
    assert nodes["0000:3e:00.0"] == (None, "unknown")  # mask spans both nodes
    assert any("0000:3e:00.0" in n and "unknown" in n for n in t.notes)


def test_case1_numa_minus_one_without_nvml_is_unknown_not_minus_one():
    t = topo("vm-numa-minus1", nvml=False)
    assert all(g.numa_node is None for g in t.gpus)  # local_cpulist 0-63 decides nothing


def test_case4_nvml_numa_not_supported_falls_to_sysfs():
    t = topo("case4-l4")
    got = {g.pci_bus_id[5:7]: g.numa_node for g in t.gpus}
    assert got == {"9f": 0, "a1": 0, "a3": 0, "a5": 0, "ae": 1, "b0": 1, "b2": 1, "b4": 1}
    assert all(g.numa_source == "sysfs numa_node" for g in t.gpus)


@pytest.mark.parametrize("nvml", [True, False])
def test_case8_minor_is_not_nvml_index(nvml):
    t = topo("amd-nps4", nvml=nvml)
    g0 = t.gpu_by_minor(0)
    assert g0.pci_bus_id == "0000:c1:00.0"
    assert g0.nvml_index == (6 if nvml else None)
    assert t.gpu_by_minor(4).pci_bus_id == "0000:01:00.0"
    assert len(t.nodes) == 8 and t.distance(0, 3) == 12 and t.distance(0, 4) == 32
    assert len(t.cores) == 64 and all(len(c) == 2 for c in t.cores)


def test_affinity_mask_over_64_cpus(tmp_path):
    # amd-nps4 with sysfs numa_node -1: the node must come from NVML words
    # beyond the first 64-bit word (node7 = CPUs 56-63,120-127)
    root = tmp_path / "h"
    shutil.copytree(HOSTS / "amd-nps4", root, symlinks=True)
    fs = HostFS(root)
    g = read_topology(fs).gpu_by_minor(0)
    bdf = g.pci_bus_id
    fs.path(f"sys/bus/pci/devices/{bdf}/numa_node").write_text("-1\n")
    g2 = read_topology(fs).gpu_by_minor(0)
    assert g2.numa_node == 7 and g2.numa_source == "NVML CPU affinity"
    assert 120 in g2.local_cpus and 127 in g2.local_cpus


def test_case7_nvml_in_cgroup_sees_one_gpu_renumbered(tmp_path):
    root = tmp_path / "h"
    shutil.copytree(HOSTS / "case7-mixed", root, symlinks=True)
    data = json.loads((root / "nvml.json").read_text())
    data["devices"] = [dict(data["devices"][1], index=0)]  # only the A5000, as idx 0
    (root / "nvml.json").write_text(json.dumps(data))
    t = read_topology(HostFS(root))
    by_bus = {g.pci_bus_id: g for g in t.gpus}
    assert set(by_bus) == {"0000:04:00.0", "0000:65:00.0"}
    a5000 = by_bus["0000:65:00.0"]
    assert a5000.nvml_index == 0 and a5000.minor == 1 and a5000.name == "NVIDIA RTX A5000"
    assert by_bus["0000:04:00.0"].nvml_index is None and by_bus["0000:04:00.0"].minor == 0
    assert t.gpu_by_minor(1).uuid.startswith("GPU-bbbbbbbb")


def test_nics_ib_per_socket_and_eth():
    t = topo("server-2s8g")
    ib = {n.name: n for n in t.nics if n.kind == "ib"}
    assert sorted(ib) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [ib[f"mlx5_{i}"].numa_node for i in range(4)] == [0, 0, 1, 1]
    assert ib["mlx5_0"].netdevs == ("ib0",)
    assert ib["mlx5_0"].pci_path[:2] == t.gpus[0].pci_path[:2]  # same PCIe switch
    eth = [n for n in t.nics if n.kind == "eth"]
    assert [n.name for n in eth] == ["eno1"]  # lo skipped, ib0..3 listed under their HCA


def test_ci_emulated_no_driver():
    t = topo("ci-emulated")
    assert t.gpus == () and t.cpus_online == (0, 1)
    assert any("NVML unavailable" in n for n in t.notes)


def test_no_numa_dir_and_offline_cpu(tmp_path):
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-2,4\n")  # cpu3 offline
    t = read_topology(HostFS(tmp_path), nvml=False)
    assert t.cpus_online == (0, 1, 2, 4)
    assert [(n.id, n.cpus) for n in t.nodes] == [(0, (0, 1, 2, 4))]
    assert t.cores == ((0,), (1,), (2,), (4,))


def test_allowed_mems_from_status():
    assert read_allowed_mems(HostFS(HOSTS / "cpuset-job")) == [0, 1]
    assert read_allowed_mems(HostFS(HOSTS / "ci-emulated")) == [0]


def test_fake_nvml_words_match_sysfs_on_server():
    # the generated recording is self-consistent: NVML affinity == sysfs node cpulist
    fs = HostFS(HOSTS / "server-2s8g")
    nv = FakeNvml.from_file(HOSTS / "server-2s8g/nvml.json")
    t = read_topology(fs, nvml=nv)
    for g in t.gpus:
        assert set(g.local_cpus) == set(t.node(g.numa_node).cpus)
