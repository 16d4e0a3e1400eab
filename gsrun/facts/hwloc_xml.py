"""A host topology from an hwloc XML export (``lstopo --of xml``), as the
:class:`~gsrun.facts.topology.Topology` the plan takes (``--topology-xml``,
``GSRUN_TOPOLOGY_XML``; e.g. LLNL mpibind's recorded machines), with
``xml.etree``. Both formats: v1 nests ``NUMANode`` above its CPUs with
``<distances>``/``<latency>`` (times ``latency_base``); v2 (``version="2.0"``)
attaches them as memory children, with ``<distances2>`` (``<indexes>``,
chunked ``<u64values>``). CPU-less nodes are ``cpuset="0x0"``; a zero
``local_memory`` is omitted. Anything not hwloc XML (another root, unknown
version, a DTD subset or entity, no ``PU``, a bad bitmap) is an InputError.

GPUs are ``PCIDev`` of class ``03xx``, vendor ``10de`` (name from
``GPUModel``, UUID from ``NVIDIAUUID``); locality is the nearest non-I/O
ancestor's cpuset; the minor number is the position in PCI order (an export
has no ``/dev/nvidiaN``). NICs: ``OpenFabrics`` (``ib``) or network (``eth``)
OS devices.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gsrun.base.errors import InputError
from gsrun.facts.topology import Gpu, Nic, NumaNode, Topology

_BITMAP = re.compile(r"^(0x[0-9a-fA-F]{1,8})?(,(0x[0-9a-fA-F]{1,8})?)*$")
_PCI_TYPE = re.compile(r"^([0-9a-f]{4}) \[([0-9a-f]{4}):([0-9a-f]{4})\]")
_BUSID = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
MAX_BYTES = 64 << 20
MAX_CPUS = 1 << 16


def _fail(what: str, detail: str) -> InputError:
    return InputError("topology", what, detail,
                      hint="give an hwloc XML export (lstopo --of xml FILE), v1 or v2")


def parse_bitmap(text: str | None) -> set[int]:
    """An hwloc bitmap (``0x0000ffff,0xffffffff,,0x0``: 32-bit hex words,
    most significant first, an empty word is 0) as a set of indices.

    Raises:
        InputError: not such a bitmap (hwloc's infinite ``0xf...f`` form
            included: an export never holds one for a cpuset).
    """
    if text is None or text == "":
        return set()
    if not _BITMAP.match(text) or len(text) > MAX_CPUS:
        raise _fail("malformed bitmap", repr(text[:80]))
    out: set[int] = set()
    for i, word in enumerate(reversed(text.split(","))):
        v = int(word, 16) if word else 0
        b = 0
        while v:
            if v & 1:
                out.add(i * 32 + b)
            v >>= 1
            b += 1
    return out


def _int_attr(el: ET.Element, name: str) -> int | None:
    v = el.get(name)
    if v is None:
        return None
    if not v.isdigit():
        raise _fail(f"{name} is not a number", repr(v[:40]))
    return int(v)


def _info(el: ET.Element, name: str) -> str | None:
    return next((i.get("value") for i in el.findall("info") if i.get("name") == name), None)


def _load(source: str | Path) -> tuple[ET.Element, str]:
    p = Path(source)
    try:
        data = p.read_bytes()[:MAX_BYTES + 1]
    except OSError as e:
        raise InputError("topology", "cannot read hwloc XML", f"{p}: {e.strerror}",
                         hint="check the --topology-xml / GSRUN_TOPOLOGY_XML path") from None
    if len(data) > MAX_BYTES:
        raise _fail("file too large", f"{p}: over {MAX_BYTES >> 20} MiB")
    head = data[:4096]
    if b"<!ENTITY" in data or re.search(rb"<!DOCTYPE[^>]*\[", head):
        raise _fail("DTD internal subset or entity declaration", str(p))
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise _fail("not well-formed XML", f"{p}: {e}") from None
    if root.tag != "topology":
        raise _fail("root element is not <topology>", f"{p}: <{root.tag}>")
    version = root.get("version")
    if version is None:
        fmt = "1"
    elif version in ("2.0",) or re.fullmatch(r"2\.[0-9]+", version):
        fmt = "2"
    else:
        raise _fail("unknown hwloc XML version", f"{p}: {version!r}")
    return root, fmt


def _walk(el: ET.Element, parents: list[ET.Element], out: list[tuple[ET.Element, list[ET.Element]]]):
    for child in el.findall("object"):
        out.append((child, parents))
        _walk(child, parents + [child], out)


def _distances(root: ET.Element, fmt: str, numa_doc_order: list[int]) -> dict[int, dict[int, int]]:
    """node -> {node: SLIT distance} (empty when the export has none)."""
    if fmt == "2":
        for d in root.iter("distances2"):
            if d.get("type") != "NUMANode" or d.get("indexing") != "os":
                continue
            idx_el, val_els = d.find("indexes"), d.findall("u64values")
            if idx_el is None or not val_els:
                raise _fail("distances2 without indexes/u64values", "")
            ids = (idx_el.text or "").split()
            # hwloc writes long matrices as several <u64values> chunks, in order
            vals = [v for el in val_els for v in (el.text or "").split()]
            if not all(x.isdigit() for x in ids + vals) or len(vals) != len(ids) ** 2:
                raise _fail("malformed distances2", f"{len(ids)} indexes, {len(vals)} values")
            n = len(ids)
            return {int(ids[i]): {int(ids[j]): int(vals[i * n + j]) for j in range(n)} for i in range(n)}
        return {}
    for d in root.iter("distances"):
        n = _int_attr(d, "nbobjs")
        vals = [x.get("value", "") for x in d.findall("latency")]
        try:
            base = float(d.get("latency_base", "1"))
            fl = [float(v) for v in vals]
        except ValueError:
            raise _fail("malformed distances", repr(vals[:4])) from None
        if n is None or len(fl) != n * n:
            raise _fail("malformed distances", f"nbobjs {n}, {len(fl)} values")
        if n != len(numa_doc_order):
            continue  # a matrix over other objects (not the NUMA nodes)
        ids = numa_doc_order
        return {ids[i]: {ids[j]: int(round(fl[i * n + j] * base)) for j in range(n)} for i in range(n)}
    return {}


def read_topology_xml(source: str | Path) -> Topology:
    """The topology in an hwloc XML export (v1 or v2).

    Raises:
        InputError: the file is unreadable or not a valid hwloc XML export
            (see the module doc); the message names the problem.
    """
    root, fmt = _load(source)
    objs: list[tuple[ET.Element, list[ET.Element]]] = []
    _walk(root, [], objs)
    machine = next((el for el, _ in objs if el.get("type") == "Machine"), None)
    if machine is None:
        raise _fail("no Machine object", str(source))
    allowed = parse_bitmap(machine.get("cpuset")) if machine.get("cpuset") else None
    pus = []
    for el, _ in objs:
        if el.get("type") == "PU":
            i = _int_attr(el, "os_index")
            if i is None or i >= MAX_CPUS:
                raise _fail("PU without a valid os_index", repr(el.get("os_index")))
            if allowed is None or i in allowed:
                pus.append(i)
    if not pus:
        raise _fail("no PU object", str(source))
    cpus = sorted(set(pus))
    online = set(cpus)

    cores: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for el, _ in objs:
        if el.get("type") != "Core":
            continue
        ids = tuple(sorted(x for x in (_int_attr(p, "os_index") for p in el.iter("object")
                                        if p.get("type") == "PU") if x in online and x not in seen))
        if ids:
            seen.update(ids)
            cores.append(ids)
    cores += [(c,) for c in cpus if c not in seen]
    cores.sort(key=lambda t: t[0])

    numa = []
    for el, _ in objs:
        if el.get("type") == "NUMANode":
            i = _int_attr(el, "os_index")
            if i is None:
                raise _fail("NUMANode without os_index", "")
            numa.append((i, sorted(parse_bitmap(el.get("cpuset")) & online),
                         _int_attr(el, "local_memory") or 0))
    dist = _distances(root, fmt, [i for i, _, _ in numa])
    if numa:
        nodes = [NumaNode(i, tuple(c), mem, dict(dist.get(i, {}))) for i, c, mem in sorted(numa)]
    else:
        nodes = [NumaNode(0, tuple(cpus), None, {0: 10})]
    with_cpus = [n for n in nodes if n.cpus]

    def locality(parents: list[ET.Element]) -> set[int]:
        for a in reversed(parents):
            if a.get("type") not in _IO_TYPES and a.get("cpuset") is not None:
                return parse_bitmap(a.get("cpuset")) & online
        return set(online)

    def pci_chain(el: ET.Element, parents: list[ET.Element]) -> tuple[str, ...]:
        return tuple(a.get("pci_busid").lower() for a in parents + [el]
                     if a.get("type") in ("Bridge", "PCIDev") and a.get("pci_busid")
                     and _BUSID.match(a.get("pci_busid")))

    gpus_raw, nics = [], []
    for el, parents in objs:
        if el.get("type") != "PCIDev":
            continue
        bus = el.get("pci_busid") or ""
        m = _PCI_TYPE.match(el.get("pci_type") or "")
        if not _BUSID.match(bus) or not m:
            raise _fail("PCIDev without a valid pci_busid/pci_type", f"{bus!r} {el.get('pci_type')!r}")
        cls, vendor = m.group(1), m.group(2)
        local = locality(parents)
        hit = [n.id for n in with_cpus if set(n.cpus) & local]
        node = hit[0] if len(hit) == 1 else None
        osdevs = [o for o in el.iter("object") if o.get("type") == "OSDev"]
        if vendor == "10de" and cls.startswith("03"):
            model = next((_info(o, "GPUModel") for o in osdevs if _info(o, "GPUModel")), None)
            uuid = next((_info(o, "NVIDIAUUID") for o in osdevs if _info(o, "NVIDIAUUID")), None)
            gpus_raw.append((bus.lower(), model or _info(el, "PCIDevice"), uuid, node, sorted(local),
                             pci_chain(el, parents)))
            continue
        ib = [o.get("name") for o in osdevs if o.get("osdev_type") == "3" or o.get("subtype") == "OpenFabrics"]
        net = [o.get("name") for o in osdevs if o.get("osdev_type") == "2" or o.get("subtype") == "Network"]
        if ib and ib[0]:
            nics.append(Nic(ib[0], "ib", node, bus.lower(), tuple(x for x in net if x), pci_chain(el, parents)))
        elif cls.startswith("02") and net and net[0]:
            nics.append(Nic(net[0], "eth", node, bus.lower(), tuple(x for x in net if x), pci_chain(el, parents)))
    gpus = []
    for minor, (bus, name, uuid, node, local, chain) in enumerate(sorted(gpus_raw)):
        gpus.append(Gpu(pci_bus_id=bus, minor=minor, nvml_index=None, uuid=uuid, name=name, numa_node=node,
                        numa_source="hwloc XML locality" if node is not None else "unknown",
                        local_cpus=tuple(local), pci_path=chain))
    version = _info(machine, "hwlocVersion") or "?"
    notes = [f"from hwloc XML v{fmt} (hwloc {version}): {Path(source).name}"]
    for g in gpus:
        if g.numa_node is None:
            notes.append(f"GPU {g.pci_bus_id}: locality {len(g.local_cpus)} CPUs spanning NUMA nodes "
                         "(no NUMA locality)")
    return Topology(cpus_online=tuple(cpus), cores=tuple(cores), nodes=tuple(nodes), gpus=tuple(gpus),
                    nics=tuple(sorted(nics, key=lambda n: n.name)), notes=tuple(notes))


__all__ = ["read_topology_xml", "parse_bitmap"]
