"""Topology facts: CPUs, cores, NUMA nodes, GPUs, NICs of one host, as a
frozen :class:`Topology` read through one :class:`~gsrun.facts.hostfs.HostFS`
and :func:`gsrun.facts.nvml.open_nvml`; the plan never reads the host itself.

Sources (under ``sys/devices/system``): ``cpu/online`` (else ``present``, else
``cpuN`` dirs); cores from ``cpuN/topology/thread_siblings_list`` (else
``core_cpus_list``); nodes from ``node/nodeN/cpulist``, ``meminfo``,
``distance`` (none: one node 0). GPUs: NVML (UUID, PCI info, minor, CPU
affinity) merged by PCI bus id with ``sys/bus/pci/devices/<bdf>`` (vendor
0x10de, class 0x0300/0x0302: ``numa_node``, ``local_cpulist``) and
``proc/driver/nvidia/gpus/<bdf>/information``; GPUs NVML cannot see (a
device cgroup renumbers them from 0: field case 7, docs/field-cases.md) still
come from sysfs. NICs: ``sys/class/infiniband/<hca>/device`` and
``sys/class/net/<if>/device``.

A GPU's CPU-side node (``Gpu.numa_source`` says which): sysfs ``numa_node``
>= 0; else the NVML affinity mask or ``local_cpulist`` when within one node
(field case 1: -1 on a VM); else ``nvidia-smi topo -m`` (live host); else the
only node; else None. ``nvmlDeviceGetNumaNodeId`` is the GPU's own memory
node (NOT_SUPPORTED on x86, not a CPU target on Grace: field case 4), never used.
Memory-less and CPU-less nodes are kept as read (:attr:`NumaNode.has_memory`).
"""

from __future__ import annotations

import os
import re
from contextlib import suppress
from dataclasses import dataclass, field

from gsrun.base.cpulist import parse_cpulist, words_to_cpus
from gsrun.base.errors import InputError
from gsrun.facts.hostfs import HostFS, meminfo_kb
from gsrun.facts.nvml import Backend, NvmlUnavailable, is_na, normalize_bus_id, open_nvml
from gsrun.facts.topo_smi import parse_topo_matrix, run_topo_matrix

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible controller, 3D controller


_BDF_RE = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_SLOT_RE = re.compile(r"PCI_SLOT_NAME=(\S+)")


def is_bdf(text: str) -> bool:
    """``text`` is a PCI address in sysfs form, ``0000:3b:00.0``."""
    return _BDF_RE.fullmatch(text) is not None


def _numbered(name: str, prefix: str) -> bool:
    return name.startswith(prefix) and name[len(prefix):].isascii() and name[len(prefix):].isdigit()


NODE_DIR = "sys/devices/system/node"
CPU_DIR = "sys/devices/system/cpu"


@dataclass(frozen=True, slots=True)
class NumaNode:
    """``cpus``: online; ``mem_total_bytes`` None: no ``meminfo``;
    ``distances``: node id -> SLIT distance (10 = local)."""

    id: int
    cpus: tuple[int, ...]
    mem_total_bytes: int | None = None
    distances: dict[int, int] = field(default_factory=dict, compare=False)

    @property
    def has_memory(self) -> bool:
        """False only for ``MemTotal: 0 kB`` (POWER LPARs, some VM firmware)."""
        return self.mem_total_bytes != 0


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical NVIDIA GPU. ``pci_bus_id``: sysfs form (``0000:3b:00.0``),
    the join key; ``minor``: N of ``/dev/nvidiaN`` = Slurm's gres index;
    ``nvml_index``: NVML's index in *this* process (None: not seen);
    ``local_cpus``: near CPUs (empty: unknown); ``pci_path``: PCI addresses
    from the root port down (for NIC closeness)."""

    pci_bus_id: str
    minor: int | None
    nvml_index: int | None
    uuid: str | None
    name: str | None
    numa_node: int | None
    numa_source: str
    local_cpus: tuple[int, ...] = ()
    pci_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Nic:
    """A network device for NCCL: ``kind`` ``"ib"`` (RoCE included) or
    ``"eth"``; ``name`` the HCA (``mlx5_0``) or interface."""

    name: str
    kind: str
    numa_node: int | None
    pci_bus_id: str | None
    netdevs: tuple[str, ...] = ()
    pci_path: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Topology:
    """Everything the binding plan needs; ``notes``: how facts were found."""

    cpus_online: tuple[int, ...]
    cores: tuple[tuple[int, ...], ...]
    nodes: tuple[NumaNode, ...]
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...] = ()
    notes: tuple[str, ...] = ()

    def node(self, node_id: int) -> NumaNode | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def node_of_cpu(self, cpu: int) -> int | None:
        return next((n.id for n in self.nodes if cpu in n.cpus), None)

    def distance(self, a: int, b: int) -> int:
        """SLIT distance; without one 10 for a == b, else 20 + |a - b|."""
        if a == b:
            return 10
        n = self.node(a)
        if n and b in n.distances:
            return n.distances[b]
        return 20 + abs(a - b)

    def memory_node_near(self, node_id: int) -> int | None:
        """``node_id`` when it has memory, else the nearest node that has
        (``--membind`` on a memory-less node fails or OOMs); None: none has."""
        n = self.node(node_id)
        if n is not None and n.has_memory:
            return node_id
        cands = [x.id for x in self.nodes if x.has_memory and x.id != node_id]
        if not cands:
            return None
        return min(cands, key=lambda m: (self.distance(node_id, m), m))

    def gpu_by_minor(self, minor: int) -> Gpu | None:
        return next((g for g in self.gpus if g.minor == minor), None)


# ---------------------------------------------------------------- readers

def read_cpus_online(fs: HostFS) -> list[int]:
    for f in ("online", "present"):
        text = fs.read(f"{CPU_DIR}/{f}")
        if text:
            with suppress(InputError):
                return parse_cpulist(text)
    ids = [int(d[3:]) for d in fs.listdir(CPU_DIR) if _numbered(d, "cpu")]
    return sorted(ids)


def read_cores(fs: HostFS, cpus: list[int]) -> list[tuple[int, ...]]:
    """Physical cores as sorted tuples of online SMT siblings, by first CPU."""
    online = set(cpus)
    cores: dict[tuple[int, ...], None] = {}
    for c in cpus:
        sib = None
        for f in ("thread_siblings_list", "core_cpus_list"):
            text = fs.read(f"{CPU_DIR}/cpu{c}/topology/{f}")
            if text:
                with suppress(InputError):
                    sib = parse_cpulist(text)
                    break
        group = tuple(x for x in (sib or [c]) if x in online) or (c,)
        if c not in group:
            group = (c,)
        cores[group] = None
    # a CPU listed in two groups (inconsistent tree): keep the first group
    seen: set[int] = set()
    out = []
    for g in sorted(cores, key=lambda t: t[0]):
        g2 = tuple(x for x in g if x not in seen)
        if g2:
            seen.update(g2)
            out.append(g2)
    return out


def read_nodes(fs: HostFS, cpus: list[int]) -> list[NumaNode]:
    online = set(cpus)
    nodes = []
    names = [d for d in fs.listdir(NODE_DIR) if _numbered(d, "node")]
    for d in sorted(names, key=lambda s: int(s[4:])):
        nid = int(d[4:])
        try:
            ncpus = [c for c in parse_cpulist(fs.read(f"{NODE_DIR}/{d}/cpulist")) if c in online]
        except InputError:
            ncpus = []
        kb = meminfo_kb(fs.read(f"{NODE_DIR}/{d}/meminfo") or "").get("MemTotal")
        mem = kb * 1024 if kb is not None else None
        dist: dict[int, int] = {}
        dtext = fs.read(f"{NODE_DIR}/{d}/distance")
        if dtext:
            ids = sorted(int(x[4:]) for x in names)
            vals = dtext.split()
            if len(vals) == len(ids) and all(v.isdigit() for v in vals):
                dist = {i: int(v) for i, v in zip(ids, vals)}
        nodes.append(NumaNode(nid, tuple(ncpus), mem, dist))
    if not nodes:
        nodes = [NumaNode(0, tuple(cpus), None, {0: 10})]
    return nodes


def _pci_path(fs: HostFS, bdf: str) -> tuple[str, ...]:
    """PCI addresses from the root port down to ``bdf`` (the sysfs link);
    ``(bdf,)`` for a plain directory (a recorded subset)."""
    target = fs.readlink(f"sys/bus/pci/devices/{bdf}")
    if target is not None:
        parts = [x for x in target.split("/") if is_bdf(x)]
        if parts:
            return tuple(parts)
    return (bdf,)


def _node_from_cpus(cpus: list[int], nodes: list[NumaNode]) -> int | None:
    """The one node whose CPUs the set touches; None: empty or several."""
    s = set(cpus)
    if not s:
        return None
    hit = [n.id for n in nodes if s & set(n.cpus)]
    return hit[0] if len(hit) == 1 else None


def _read_proc_gpu(fs: HostFS, bdf: str) -> dict[str, str]:
    text = fs.read(f"proc/driver/nvidia/gpus/{bdf}/information") or ""
    out = {}
    for ln in text.splitlines():
        if ":" in ln:
            k, v = ln.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def sysfs_gpu_bdfs(fs: HostFS) -> list[str]:
    """PCI addresses of the NVIDIA GPUs in sysfs (vendor and class) and procfs."""
    out = []
    for bdf in fs.listdir("sys/bus/pci/devices"):
        base = f"sys/bus/pci/devices/{bdf}"
        vendor = (fs.read(f"{base}/vendor") or "").strip().lower()
        if vendor != NVIDIA_VENDOR:
            continue
        cls = (fs.read(f"{base}/class") or "").strip().lower()
        if cls.startswith(GPU_CLASSES):
            out.append(normalize_bus_id(bdf))
    for bdf in fs.listdir("proc/driver/nvidia/gpus"):
        b = normalize_bus_id(bdf)
        if is_bdf(b) and b not in out:
            out.append(b)
    return sorted(out)


def _nvml_gpus(nv: Backend) -> dict[str, dict]:
    """bus id -> {nvml_index, uuid, name, minor, affinity} from NVML."""
    out: dict[str, dict] = {}
    for i in range(nv.count()):
        bus = nv.get(i, "pci_bus_id")
        if is_na(bus):
            continue
        def ok(v):
            return None if is_na(v) else v
        words = ok(nv.get(i, "cpu_affinity_words"))
        minor = ok(nv.get(i, "minor"))
        out[bus] = {"nvml_index": i, "uuid": ok(nv.get(i, "uuid")), "name": ok(nv.get(i, "name")),
                    "minor": int(minor) if minor is not None else None,
                    "affinity": words_to_cpus(words) if words else []}
    return out


def read_gpus(fs: HostFS, nodes: list[NumaNode], cpus: list[int], nvml: Backend | None,
              smi_text: str | None = None) -> tuple[list[Gpu], list[str]]:
    """GPUs sorted by PCI bus id, plus notes (module doc)."""
    notes: list[str] = []
    nv = _nvml_gpus(nvml) if nvml is not None else {}
    bdfs = sorted(set(sysfs_gpu_bdfs(fs)) | set(nv))
    online = set(cpus)
    smi_rows = {}
    if smi_text:
        try:
            smi_rows = {r.index: r for r in parse_topo_matrix(smi_text).gpus}
        except InputError as e:
            notes.append(f"nvidia-smi topo -m unreadable: {e.detail}")
    gpus = []
    for pos, bdf in enumerate(bdfs):
        base = f"sys/bus/pci/devices/{bdf}"
        info = _read_proc_gpu(fs, bdf)
        n = nv.get(bdf, {})
        minor = n.get("minor")
        if minor is None and info.get("Device Minor", "").isdigit():
            minor = int(info["Device Minor"])
        uuid = n.get("uuid") or info.get("GPU UUID") or None
        name = n.get("name") or info.get("Model") or None
        sys_node = fs.read_int(f"{base}/numa_node")
        try:
            local = [c for c in parse_cpulist(fs.read(f"{base}/local_cpulist")) if c in online]
        except InputError:
            local = []
        aff = [c for c in n.get("affinity", []) if c in online]
        node, source = None, "unknown"
        if sys_node is not None and sys_node >= 0 and any(x.id == sys_node for x in nodes):
            node, source = sys_node, "sysfs numa_node"
        elif _node_from_cpus(aff, nodes) is not None:
            node, source = _node_from_cpus(aff, nodes), "NVML CPU affinity"
        elif _node_from_cpus(local, nodes) is not None:
            node, source = _node_from_cpus(local, nodes), "sysfs local_cpulist"
        else:
            idx = n.get("nvml_index", pos if not nv else None)
            row = smi_rows.get(idx) if idx is not None else None
            if row is not None and row.numa_node is not None and any(x.id == row.numa_node for x in nodes):
                node, source = row.numa_node, "nvidia-smi topo -m"
            elif len(nodes) == 1:
                node, source = nodes[0].id, "single NUMA node"
        if sys_node == -1 and source != "sysfs numa_node":
            notes.append(f"GPU {bdf}: sysfs numa_node is -1; " + (
                f"node {node} from {source}" if node is not None else
                "node unknown (NVML affinity and local_cpulist span nodes or are absent)"))
        local_cpus = aff or (local if local and set(local) != online else [])
        if not local_cpus and node is not None:
            local_cpus = list(next(x.cpus for x in nodes if x.id == node))
        gpus.append(Gpu(pci_bus_id=bdf, minor=minor, nvml_index=n.get("nvml_index"), uuid=uuid,
                        name=name, numa_node=node, numa_source=source,
                        local_cpus=tuple(local_cpus), pci_path=_pci_path(fs, bdf)))
    return gpus, notes


def read_nics(fs: HostFS) -> list[Nic]:
    """InfiniBand/RoCE HCAs and Ethernet interfaces with a PCI device (an
    HCA's interfaces listed under the HCA only)."""
    nics: list[Nic] = []
    owned: set[str] = set()
    for hca in fs.listdir("sys/class/infiniband"):
        base = f"sys/class/infiniband/{hca}/device"
        node = fs.read_int(f"{base}/numa_node")
        netdevs = tuple(fs.listdir(f"{base}/net"))
        owned.update(netdevs)
        bdf = _device_bdf(fs, base)
        nics.append(Nic(hca, "ib", node if node is not None and node >= 0 else None, bdf, netdevs,
                        _pci_path(fs, bdf) if bdf else ()))
    for ifname in fs.listdir("sys/class/net"):
        if ifname in owned or ifname == "lo":
            continue
        base = f"sys/class/net/{ifname}/device"
        if not fs.exists(base):
            continue
        node = fs.read_int(f"{base}/numa_node")
        bdf = _device_bdf(fs, base)
        nics.append(Nic(ifname, "eth", node if node is not None and node >= 0 else None, bdf,
                        (ifname,), _pci_path(fs, bdf) if bdf else ()))
    return nics


def _device_bdf(fs: HostFS, base: str) -> str | None:
    target = fs.readlink(base)
    if target is not None:
        name = os.path.basename(os.path.normpath(target))
        if is_bdf(name):
            return name
    m = _SLOT_RE.search(fs.read(f"{base}/uevent") or "")
    return normalize_bus_id(m[1]) if m else None


#: ``read_topology(fs, nvml=NVML_IF_NEEDED)``: sysfs/procfs first, NVML only
#: for what they leave unknown (see :func:`sysfs_decides`).
NVML_IF_NEEDED = "if-needed"

_GPU_UUID_RE = re.compile(r"GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def sysfs_decides(fs: HostFS, gpus: list[Gpu]) -> str | None:
    """Why NVML is still needed after reading ``gpus`` from sysfs/procfs
    alone, or None: every GPU has its minor, UUID and sysfs ``numa_node``,
    all NVML would change for the plan."""
    if not fs.listdir("sys/bus/pci/devices"):
        return "no PCI device list"
    for g in gpus:
        if g.minor is None:
            return f"GPU {g.pci_bus_id}: minor number unknown"
        if not _GPU_UUID_RE.fullmatch(g.uuid or ""):
            return f"GPU {g.pci_bus_id}: UUID unknown"
        if g.numa_source != "sysfs numa_node":
            return f"GPU {g.pci_bus_id}: sysfs numa_node does not decide"
    return None


def read_topology(fs: HostFS, nvml: Backend | None | bool | str = True,
                  smi_text: str | None = None) -> Topology:
    """All facts of the host behind ``fs``.

    ``nvml``: ``True`` opens the backend for ``fs`` (``<root>/nvml.json`` or
    the real library); ``False``/``None`` skips NVML; a :class:`Backend` is
    used as given; :data:`NVML_IF_NEEDED` opens it only when
    :func:`sysfs_decides` says so (nvmlInit + nvmlShutdown cost ~28 ms on an
    H200 node, in every bound step). NVML failing is a note, not an error.
    ``smi_text``: ``nvidia-smi topo -m`` output (live host: run only when a
    GPU's node is unknown on a multi-node host; fake root:
    ``<root>/nvidia-smi-topo.txt``).
    """
    notes: list[str] = []
    cpus = read_cpus_online(fs)
    if not cpus:
        notes.append("no online CPU list found")
    cores = read_cores(fs, cpus)
    nodes = read_nodes(fs, cpus)
    if nvml == NVML_IF_NEEDED:
        gpus, gnotes = read_gpus(fs, nodes, cpus, None)
        if sysfs_decides(fs, gpus) is None:
            notes += gnotes
            notes.append("NVML not opened: sysfs/procfs gave every GPU's minor number, UUID and NUMA node"
                         if gpus else "NVML not opened: no NVIDIA GPU in sysfs/procfs")
            return Topology(cpus_online=tuple(cpus), cores=tuple(cores), nodes=tuple(nodes),
                            gpus=tuple(gpus), nics=tuple(read_nics(fs)), notes=tuple(notes))
        nvml = True

    backend: Backend | None = None
    if nvml is True:
        try:
            backend = open_nvml(fs)
        except NvmlUnavailable as e:
            notes.append(f"NVML unavailable: {e.code_name}")
    elif isinstance(nvml, Backend):
        backend = nvml
    if smi_text is None and not fs.is_real:
        smi_text = fs.read("nvidia-smi-topo.txt")
    gpus, gnotes = read_gpus(fs, nodes, cpus, backend, smi_text)
    if fs.is_real and smi_text is None and len(nodes) > 1 and any(g.numa_node is None for g in gpus):
        text = run_topo_matrix()
        if text:
            gpus, gnotes = read_gpus(fs, nodes, cpus, backend, text)
    notes += gnotes
    return Topology(cpus_online=tuple(cpus), cores=tuple(cores), nodes=tuple(nodes),
                    gpus=tuple(gpus), nics=tuple(read_nics(fs)), notes=tuple(notes))


def read_allowed_cpus(fs: HostFS, cpus_online: list[int] | tuple[int, ...]) -> list[int]:
    """``os.sched_getaffinity(0)`` on the live host; all online CPUs under a fake root."""
    if fs.is_real:
        return sorted(os.sched_getaffinity(0))
    return sorted(cpus_online)


def read_allowed_mems(fs: HostFS) -> list[int] | None:
    """``Mems_allowed_list`` of ``proc/self/status``, None when unreadable."""
    for line in (fs.read("proc/self/status") or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            value = line[len("Mems_allowed_list:"):].split()
            if len(value) > 1:
                continue   # not one list: not the kernel's line
            try:
                return parse_cpulist(value[0] if value else "")
            except InputError:
                return None
    return None
