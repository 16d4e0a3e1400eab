#!/usr/bin/env python3
"""Generate the synthetic host trees under tests/data/hosts/ (and unpack the
recorded H200 VM).

Usage: ``python tests/data/hosts/make_fake_hosts.py [--h200 ../shared/data/hosts/h200-vm]``

Each host gets ``sys/`` (CPU topology, NUMA nodes, PCI devices as symlinks
into a ``sys/devices/pci*`` hierarchy like the kernel's, InfiniBand and net
classes), ``proc/`` (``driver/nvidia/gpus/<bdf>/information``,
``self/status``) and, where stated, ``nvml.json`` in the FakeNvml format
(``gsrun/nvml.py``). Layouts:

- ``server-2s8g``: 2 sockets x 16 cores x SMT2 (node0 0-15,32-47), 8 GPUs
  behind 4 PCIe switches, one IB HCA per switch (2 per socket), NVML with
  ``numa_node`` NOT_SUPPORTED;
- ``amd-nps4``: 2 sockets x NPS4 = 8 nodes x 8 cores x SMT2, one GPU per
  node in scrambled PCI order, minor numbers != NVML index (field case 8:
  ``0000:01:00.0`` minor 4 = NVML 0, ``0000:c1:00.0`` minor 0 = NVML 6),
  4 HCAs on the even nodes;
- ``vm-numa-minus1``: 2 nodes, every PCI ``numa_node`` -1 and
  ``local_cpulist`` 0-63 (field case 1); NVML affinity says GPU0,1 node0,
  GPU2 node1, GPU3 all CPUs (unknown);
- ``cpuset-job``: 112 CPUs (node0 0-27,56-83), 8 GPUs (0-3 node0, 4-7
  node1); job cpuset 0-15,56-71, NVML recorded inside it (GPU4-7 affinity
  empty, field case 3);
- ``case4-l4``: 8 GPUs, sysfs map 9f,a1,a3,a5 -> node0, ae,b0,b2,b4 -> node1,
  NVML ``numa_node`` NOT_SUPPORTED (field case 4);
- ``case7-mixed``: P100 ``0000:04:00.0`` (NVML 0) + A5000 ``0000:65:00.0``
  (NVML 1) on two nodes (field case 7);
- ``ci-emulated``: 2 CPUs, 1 node, no GPU, no NVIDIA driver (the CI cluster);
- ``numa-memless`` (variant 1): node0 CPUs 0-15 with memory, node1
  CPUs 16-31 with ``MemTotal: 0 kB`` (a POWER LPAR), node2 memory only (no
  CPUs: GPU/HBM memory as a NUMA node); distances 1->0 20, 1->2 40; GPU0 on
  node0, GPU1 on node1, GPU2 with sysfs ``numa_node`` 2;
- ``vm-spread`` (variant 2): a VM with 2 vNUMA nodes of 16 CPUs,
  4 GPUs with ``numa_node`` -1, ``local_cpulist`` and NVML affinity all CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fmt(cpus):
    cs = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        parts.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(parts)


def words(cpus, nwords=2):
    w = [0] * nwords
    for c in cpus:
        w[c // 64] |= 1 << (c % 64)
    return w


def _fresh(root: Path) -> Path:
    """Empty the generated parts of a host dir, keeping golden/."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("sys", "proc"):
        if (root / name).exists():
            shutil.rmtree(root / name)
    for name in ("nvml.json", "nvidia-smi-topo.txt"):
        (root / name).unlink(missing_ok=True)
    return root


def put(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")


def link(root: Path, rel: str, target_rel: str) -> None:
    """Relative symlink root/rel -> root/target_rel."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.exists():
        p.unlink()
    os.symlink(os.path.relpath(root / target_rel, p.parent), p)


def pci_device(root: Path, chain: list[str], attrs: dict[str, str]) -> str:
    """Create sys/devices/pci<dom>:<bus>/<chain...> with attrs; link it from
    sys/bus/pci/devices/<bdf>. Returns the device dir (relative)."""
    dom_bus = chain[0][:7]  # "0000:15"
    rel = "sys/devices/pci" + dom_bus + "/" + "/".join(chain)
    for k, v in attrs.items():
        put(root, f"{rel}/{k}", v)
    link(root, f"sys/bus/pci/devices/{chain[-1]}", rel)
    return rel


def make_host(name: str, nodes: dict[int, list[int]], siblings: dict[int, list[int]],
              gpus: list[dict], nics: list[dict] | None = None, distances=None,
              nvml: bool = True, status_allowed: str | None = None, nvml_affinity=None,
              nvml_minor=True, nvml_only: list[int] | None = None,
              mem_kb: dict[int, int] | None = None) -> Path:
    root = _fresh(HERE / name)
    cpus = sorted(c for cs in nodes.values() for c in cs)
    mem_kb = mem_kb or {}
    put(root, "sys/devices/system/cpu/online", fmt(cpus))
    put(root, "sys/devices/system/cpu/present", fmt(cpus))
    for c in cpus:
        put(root, f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list",
            fmt(siblings.get(c, [c])))
    ids = sorted(nodes)
    put(root, "sys/devices/system/node/online", fmt(ids))
    for n in ids:
        put(root, f"sys/devices/system/node/node{n}/cpulist", fmt(nodes[n]))
        total = mem_kb.get(n, 64 * 1024 * 1024)
        put(root, f"sys/devices/system/node/node{n}/meminfo",
            f"Node {n} MemTotal:       {total} kB\nNode {n} MemFree:        {total * 15 // 16} kB")
        d = [distances(n, m) if distances else (10 if n == m else 21) for m in ids]
        put(root, f"sys/devices/system/node/node{n}/distance", " ".join(map(str, d)))
    allowed = status_allowed or fmt(cpus)
    put(root, "proc/self/status", f"Name:\tpython3\nCpus_allowed_list:\t{allowed}\n"
                                  f"Mems_allowed_list:\t{fmt(ids)}")
    devs = []
    for i, g in enumerate(gpus):
        bdf = g["chain"][-1]
        pci_device(root, g["chain"], {
            "vendor": "0x10de", "device": "0x2330", "class": "0x030200",
            "numa_node": str(g["sys_node"]), "local_cpulist": g["local"],
        })
        put(root, f"proc/driver/nvidia/gpus/{bdf}/information",
            f"Model: \t\t {g['name']}\nIRQ:   \t\t {100 + i}\nGPU UUID: \t {g['uuid']}\n"
            f"Bus Type: \t PCIe\nBus Location: \t {bdf}\nDevice Minor: \t {g['minor']}\n"
            f"GPU Excluded:\t No")
        aff = nvml_affinity(i, g) if nvml_affinity else g["aff"]
        devs.append({"index": i, "name": {"ok": g["name"]}, "uuid": {"ok": g["uuid"]},
                     "pci": {"ok": {"busId": "0000" + bdf, "busIdLegacy": bdf}},
                     "minor": {"ok": g["minor"]} if nvml_minor else {"error": "Not Supported", "code": 3},
                     "numa_node": {"error": "Not Supported", "code": 3},
                     "cpu_affinity_words": {"ok": words(aff)}})
    if gpus:
        put(root, "proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.0")
    for nic in nics or []:
        rel = pci_device(root, nic["chain"], {
            "vendor": "0x15b3", "class": "0x020700", "numa_node": str(nic["node"])})
        if nic.get("ib", True):
            link(root, f"sys/class/infiniband/{nic['name']}/device", rel)
            for nd in nic.get("netdevs", []):
                put(root, f"{rel}/net/{nd}/type", "32")
                link(root, f"sys/class/net/{nd}/device", rel)
        else:
            link(root, f"sys/class/net/{nic['name']}/device", rel)
            put(root, f"sys/class/net/{nic['name']}/type", "1")
    put(root, "sys/class/net/lo/type", "772")
    if nvml and gpus:
        if nvml_only is not None:
            devs = [dict(devs[k], index=j) for j, k in enumerate(nvml_only)]
        (root / "nvml.json").write_text(json.dumps(
            {"driver": {"ok": "580.0"}, "count": {"ok": len(devs)}, "devices": devs}, indent=1) + "\n")
    return root


def gpu(chain, minor, sys_node, local, aff, uuid_n, name="NVIDIA H100 80GB HBM3"):
    return {"chain": chain, "minor": minor, "sys_node": sys_node, "local": local, "aff": aff,
            "uuid": f"GPU-{uuid_n:08x}-0000-4000-8000-{uuid_n:012x}", "name": name}


def server_2s8g():
    n0 = list(range(0, 16)) + list(range(32, 48))
    n1 = list(range(16, 32)) + list(range(48, 64))
    sib = {c: sorted({c % 32, c % 32 + 32}) for c in range(64)}
    # socket 0: root port 0000:15:01.0 (switch A) and 0000:37:01.0 (switch B)
    layout = [("0000:15:01.0", "0000:16:00.0", ["0000:18:00.0", "0000:1a:00.0"], "0000:1c:00.0", 0),
              ("0000:37:01.0", "0000:38:00.0", ["0000:3a:00.0", "0000:3c:00.0"], "0000:3e:00.0", 0),
              ("0000:97:01.0", "0000:98:00.0", ["0000:9a:00.0", "0000:9c:00.0"], "0000:9e:00.0", 1),
              ("0000:b7:01.0", "0000:b8:00.0", ["0000:ba:00.0", "0000:bc:00.0"], "0000:be:00.0", 1)]
    gpus, nics = [], []
    for s, (rp, up, gbdfs, nbdf, node) in enumerate(layout):
        cpus = n0 if node == 0 else n1
        for k, b in enumerate(gbdfs):
            down = up[:8] + f"{0x10 + k:02x}" + ".0"
            m = len(gpus)
            gpus.append(gpu([rp, up, down, b], m, node, fmt(cpus), cpus, 0x5E5E0000 + m))
        nics.append({"name": f"mlx5_{s}", "chain": [rp, up, up[:8] + "1f.0", nbdf], "node": node,
                     "netdevs": [f"ib{s}"]})
    nics.append({"name": "eno1", "chain": ["0000:00:1c.0", "0000:03:00.0"], "node": 0, "ib": False})
    make_host("server-2s8g", {0: n0, 1: n1}, sib, gpus, nics)


def amd_nps4():
    nodes = {n: list(range(n * 8, n * 8 + 8)) + list(range(64 + n * 8, 64 + n * 8 + 8)) for n in range(8)}
    sib = {c: sorted({c % 64, c % 64 + 64}) for c in range(128)}
    buses = ["01", "21", "41", "61", "81", "a1", "c1", "e1"]
    gnodes = [1, 0, 3, 2, 5, 4, 7, 6]
    minors = [4, 5, 6, 7, 1, 2, 0, 3]  # NVML index i -> minor (field case 8)
    gpus = []
    for i, (b, n, m) in enumerate(zip(buses, gnodes, minors)):
        rp = f"0000:{b[0]}0:01.1"
        gpus.append(gpu([rp, f"0000:{b}:00.0"], m, n, fmt(nodes[n]), nodes[n], 0xA3D00000 + i,
                        name="NVIDIA H100 80GB HBM3"))
    nics = []
    for k, n in enumerate([0, 2, 4, 6]):
        b = f"{0x11 + 0x40 * k:02x}"
        nics.append({"name": f"mlx5_{k}", "chain": [f"0000:{b[0]}0:03.1", f"0000:{b}:00.0"], "node": n,
                     "netdevs": [f"ibp{b}s0"]})

    def dist(a, b):
        return 10 if a == b else (12 if a // 4 == b // 4 else 32)
    make_host("amd-nps4", nodes, sib, gpus, nics, distances=dist)


def vm_numa_minus1():
    n0 = list(range(0, 16)) + list(range(32, 48))
    n1 = list(range(16, 32)) + list(range(48, 64))
    sib = {c: sorted({c % 32, c % 32 + 32}) for c in range(64)}
    affs = [n0, n0, n1, list(range(64))]
    gpus = [gpu([f"0000:00:{0x10 + i:02x}.0", f"0000:{0x3b + i:02x}:00.0"], i, -1, "0-63", affs[i],
                0x7E000000 + i) for i in range(4)]
    nics = [{"name": "eth0", "chain": ["0000:00:03.0"], "node": -1, "ib": False}]
    make_host("vm-numa-minus1", {0: n0, 1: n1}, sib, gpus, nics)


def cpuset_job():
    n0 = list(range(0, 28)) + list(range(56, 84))
    n1 = list(range(28, 56)) + list(range(84, 112))
    sib = {c: sorted({c % 56, c % 56 + 56}) for c in range(112)}
    job = list(range(0, 16)) + list(range(56, 72))
    buses = ["17", "31", "4b", "65", "98", "b1", "ca", "e3"]
    gpus = []
    for i, b in enumerate(buses):
        node = 0 if i < 4 else 1
        cpus = n0 if node == 0 else n1
        gpus.append(gpu([f"0000:{int(b, 16) - 1:02x}:01.0", f"0000:{b}:00.0"], i, node, fmt(cpus), cpus, 0xC5E70000 + i,
                        name="NVIDIA A100-PCIE-40GB"))
    nics = [{"name": "mlx5_0", "chain": ["0000:30:01.0", "0000:31:00.1"], "node": 0, "netdevs": ["ib0"]}]
    make_host("cpuset-job", {0: n0, 1: n1}, sib, gpus, nics, status_allowed=fmt(job),
              nvml_affinity=lambda i, g: [c for c in g["aff"] if c in job])


def case4_l4():
    n0, n1 = list(range(0, 24)), list(range(24, 48))
    buses = ["9f", "a1", "a3", "a5", "ae", "b0", "b2", "b4"]
    gpus = []
    for i, b in enumerate(buses):
        node = 0 if i < 4 else 1
        cpus = n0 if node == 0 else n1
        gpus.append(gpu([f"0000:{b}:00.0"], i, node, fmt(cpus), cpus, 0x14000000 + i, name="NVIDIA L4"))
    make_host("case4-l4", {0: n0, 1: n1}, {}, gpus)


def case7_mixed():
    n0, n1 = list(range(0, 8)), list(range(8, 16))
    gpus = [dict(gpu(["0000:00:01.0", "0000:04:00.0"], 0, 0, fmt(n0), n0, 0, name="Tesla P100-PCIE-16GB"),
                 uuid="GPU-aaaaaaaa-1111-2222-3333-444444444444"),
            dict(gpu(["0000:64:01.0", "0000:65:00.0"], 1, 1, fmt(n1), n1, 0, name="NVIDIA RTX A5000"),
                 uuid="GPU-bbbbbbbb-1111-2222-3333-444444444444")]
    make_host("case7-mixed", {0: n0, 1: n1}, {}, gpus)


def ci_emulated():
    make_host("ci-emulated", {0: [0, 1]}, {}, [], nvml=False)


def numa_memless():
    n0, n1 = list(range(0, 16)), list(range(16, 32))
    gpus = [gpu(["0000:00:01.0", "0000:04:00.0"], 0, 0, fmt(n0), n0, 0x3E300000),
            gpu(["0000:20:01.0", "0000:24:00.0"], 1, 1, fmt(n1), n1, 0x3E300001),
            gpu(["0000:40:01.0", "0000:44:00.0"], 2, 2, "", [], 0x3E300002)]

    def dist(a, b):
        return {(0, 0): 10, (1, 1): 10, (2, 2): 10, (0, 1): 20, (1, 0): 20, (0, 2): 30, (2, 0): 30,
                (1, 2): 40, (2, 1): 40}[(a, b)]
    make_host("numa-memless", {0: n0, 1: n1, 2: []}, {}, gpus, distances=dist, mem_kb={1: 0})


def vm_spread():
    n0, n1 = list(range(0, 16)), list(range(16, 32))
    every = n0 + n1
    gpus = [gpu([f"0000:00:{0x10 + i:02x}.0", f"0000:{0x3b + i:02x}:00.0"], i, -1, fmt(every), every,
                0x5B000000 + i) for i in range(4)]
    make_host("vm-spread", {0: n0, 1: n1}, {}, gpus)


def h200(src: Path):
    root = _fresh(HERE / "h200-vm")
    with tarfile.open(src / "h200-vm-tree.tar.gz") as t:
        members = [m for m in t.getmembers() if (m.isfile() or m.isdir()) and not m.name.startswith("/") and ".." not in m.name.split("/")]
        t.extractall(root, members=members)  # noqa: S202 - regular files only, no absolute or .. paths
    shutil.copy(src / "h200-vm-nvml.json", root / "nvml.json")  # already FakeNvml's format
    for p in root.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--h200", type=Path, default=Path(__file__).resolve().parents[4] / "shared" / "data" / "hosts" / "h200-vm")
    a = ap.parse_args()
    for f in (server_2s8g, amd_nps4, vm_numa_minus1, cpuset_job, case4_l4, case7_mixed, ci_emulated,
              numa_memless, vm_spread):
        f()
    if (a.h200 / "h200-vm-tree.tar.gz").is_file():
        h200(a.h200)


if __name__ == "__main__":
    main()
