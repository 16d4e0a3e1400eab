"""The sysfs-first topology read of a bound step (``read_topology(fs,
nvml=NVML_IF_NEEDED)``, what ``plan_from_env`` and ``gsrun-bind --plan
--json`` use): NVML is opened only when sysfs/procfs leave a GPU's minor
number, UUID or NUMA node undecided, and the plan is the one NVML gives on
every recorded host. Hosts whose sysfs lacks ``numa_node`` (-1) or
``local_cpulist`` fall back to NVML, or say unknown; nothing is guessed."""

import json
import shutil

import pytest

import gsrun.facts.nvml as nvml_mod
from helpers.paths import DATA
from gsrun.bind.plan import plan_from_env
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import NVML_IF_NEEDED, read_gpus, read_topology, sysfs_decides

HOSTS = DATA / "hosts"
TREES = sorted(p.name for p in HOSTS.iterdir() if (p / "sys").is_dir())


def _envs(topo):
    """Step environments over the host's GPUs: 1..all GPUs, 1/n/2n ranks,
    with and without CUDA_VISIBLE_DEVICES, and by UUID."""
    minors = [g.minor for g in topo.gpus if g.minor is not None]
    out = [{"SLURM_STEP_TASKS_PER_NODE": "2"}]
    for k in range(1, len(minors) + 1):
        gpus = ",".join(map(str, minors[:k]))
        for n in (1, k, 2 * k):
            out.append({"SLURM_STEP_GPUS": gpus, "SLURM_STEP_TASKS_PER_NODE": str(n)})
            out.append({"SLURM_STEP_GPUS": gpus, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(k))),
                        "SLURM_STEP_TASKS_PER_NODE": str(n)})
    out.append({"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in topo.gpus if g.uuid)})
    return out


def _copy(name, tmp_path):
    root = tmp_path / name
    shutil.copytree(HOSTS / name, root, symlinks=True)
    return root


def _no_nvml(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("NVML opened although sysfs/procfs decide")
    monkeypatch.setattr(nvml_mod, "open_nvml", refuse)


@pytest.mark.parametrize("name", TREES)
def test_plan_is_the_one_nvml_gives(name):
    fs = HostFS(HOSTS / name)
    full = read_topology(fs)
    first = read_topology(fs, nvml=NVML_IF_NEEDED)
    envs = _envs(full)
    assert len(envs) >= 2
    for env in envs:
        for iso in (False, True):
            a = plan_from_env(env, fs, None, iso, topology=full)
            b = plan_from_env(env, fs, None, iso, topology=first)
            assert json.dumps(b.to_json()) == json.dumps(a.to_json()), (name, env, iso)
            assert b.warnings == a.warnings


@pytest.mark.parametrize("name, opened", [("server-2s8g", False), ("amd-nps4", False), ("case4-l4", False),
                                          ("h200-vm", True), ("vm-numa-minus1", True), ("vm-spread", True),
                                          ("ci-emulated", True)])
def test_nvml_opened_only_when_sysfs_leaves_something_unknown(name, opened, monkeypatch):
    fs = HostFS(HOSTS / name)
    full = read_topology(fs)
    if not opened:
        _no_nvml(monkeypatch)
    t = read_topology(fs, nvml=NVML_IF_NEEDED)
    skipped = [n for n in t.notes if n.startswith("NVML not opened")]
    assert bool(skipped) is not opened
    assert [(g.pci_bus_id, g.minor, g.uuid, g.numa_node, g.numa_source, g.pci_path) for g in t.gpus] == \
        [(g.pci_bus_id, g.minor, g.uuid, g.numa_node, g.numa_source, g.pci_path) for g in full.gpus]
    if opened:
        assert [g.nvml_index for g in t.gpus] == [g.nvml_index for g in full.gpus]
    else:
        # NVML's enumeration index is NVML's own: unknown when it was not asked, never derived
        assert full.gpus and all(g.nvml_index is None for g in t.gpus)
        assert any(g.nvml_index is not None for g in full.gpus)


def test_h200_vm_numa_minus1_keeps_nvml_affinity_as_source():
    # numa_node -1 (the real H200 VM too): NVML's CPU affinity decides first, as documented
    fs = HostFS(HOSTS / "h200-vm")
    sysfs_only, _ = read_gpus(fs, [n for n in read_topology(fs, nvml=False).nodes], list(range(16)), None)
    assert sysfs_decides(fs, sysfs_only) == "GPU 0000:00:06.0: sysfs numa_node does not decide"
    (g,) = read_topology(fs, nvml=NVML_IF_NEEDED).gpus
    assert g.numa_source == "NVML CPU affinity" and g.nvml_index == 0


def test_numa_minus1_without_local_cpulist_or_nvml_is_unknown(tmp_path, monkeypatch):
    # a 2-socket host, one GPU with numa_node -1, no local_cpulist and no NVML:
    # NVML is tried (and absent), and the node is unknown, never guessed
    root = _copy("server-2s8g", tmp_path)
    (root / "nvml.json").unlink()
    bdf = "0000:18:00.0"
    (root / f"sys/bus/pci/devices/{bdf}/numa_node").write_text("-1\n")
    (root / f"sys/bus/pci/devices/{bdf}/local_cpulist").unlink()
    t = read_topology(HostFS(root), nvml=NVML_IF_NEEDED)
    assert any(n.startswith("NVML unavailable") for n in t.notes)
    assert not any(n.startswith("NVML not opened") for n in t.notes)
    g = next(x for x in t.gpus if x.pci_bus_id == bdf)
    assert g.numa_node is None and g.numa_source == "unknown"
    plan = plan_from_env({"SLURM_STEP_GPUS": str(g.minor), "SLURM_STEP_TASKS_PER_NODE": "1"},
                         HostFS(root), None)
    (r,) = plan.ranks
    assert r.numa_node is None and r.mem_nodes == ()
    assert f"GPU {g.minor} ({bdf}): NUMA node unknown, no memory binding" in r.warnings


def test_numa_minus1_with_nvml_takes_nvml_affinity(tmp_path):
    root = _copy("server-2s8g", tmp_path)
    bdf = "0000:18:00.0"
    (root / f"sys/bus/pci/devices/{bdf}/numa_node").write_text("-1\n")
    (root / f"sys/bus/pci/devices/{bdf}/local_cpulist").unlink()
    t = read_topology(HostFS(root), nvml=NVML_IF_NEEDED)
    g = next(x for x in t.gpus if x.pci_bus_id == bdf)
    assert (g.numa_node, g.numa_source) == (0, "NVML CPU affinity") and g.nvml_index is not None


def test_missing_local_cpulist_alone_still_decided_by_numa_node(tmp_path, monkeypatch):
    # numa_node >= 0 decides the node; local_cpulist absent changes nothing the plan uses
    root = _copy("server-2s8g", tmp_path)
    for p in (root / "sys/bus/pci/devices").glob("*/local_cpulist"):
        p.unlink()
    full = read_topology(HostFS(root))
    _no_nvml(monkeypatch)
    t = read_topology(HostFS(root), nvml=NVML_IF_NEEDED)
    assert [(g.numa_node, g.numa_source) for g in t.gpus] == [(g.numa_node, "sysfs numa_node") for g in full.gpus]
    env = {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "SLURM_STEP_TASKS_PER_NODE": "8"}
    assert plan_from_env(env, HostFS(root), None, topology=t).to_json() == \
        plan_from_env(env, HostFS(root), None, topology=full).to_json()


@pytest.mark.parametrize("field, value", [("GPU UUID", "??"), ("GPU UUID", "GPU-5e5e0000-0000"),
                                          ("Device Minor", "?")])
def test_unreadable_procfs_value_falls_back_to_nvml(tmp_path, field, value):
    root = _copy("server-2s8g", tmp_path)
    info = root / "proc/driver/nvidia/gpus/0000:18:00.0/information"
    info.write_text("".join(f"{field}: \t {value}\n" if ln.startswith(field) else ln + "\n"
                            for ln in info.read_text().splitlines()))
    fs = HostFS(root)
    t = read_topology(fs, nvml=NVML_IF_NEEDED)
    assert not any(n.startswith("NVML not opened") for n in t.notes)
    g = next(x for x in t.gpus if x.pci_bus_id == "0000:18:00.0")
    assert g.nvml_index is not None          # NVML answered what procfs could not
    assert g.minor == 0 and g.uuid == "GPU-5e5e0000-0000-4000-8000-00005e5e0000"


def test_host_without_nvidia_gpu_never_opens_nvml(tmp_path, monkeypatch):
    # a real-looking PCI list without an NVIDIA function (a CPU node; the test cluster's host)
    dev = tmp_path / "sys/bus/pci/devices/0000:00:03.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1af4\n")
    (dev / "class").write_text("0x020000\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-3\n")
    _no_nvml(monkeypatch)
    t = read_topology(HostFS(tmp_path), nvml=NVML_IF_NEEDED)
    assert t.gpus == () and "NVML not opened: no NVIDIA GPU in sysfs/procfs" in t.notes
