"""The human table of ``gsrun-bind --show`` (pure): GPU/NIC connection
matrix like ``nvidia-smi topo -m``, NUMA nodes, and a plan's binding per rank.
"""

from __future__ import annotations

from gsrun.base.cpulist import format_cpulist
from gsrun.facts.topology import Topology
from gsrun.bind.plan.rules import Plan


def _link(topo: Topology, a_node: int | None, a_path: tuple[str, ...],
          b_node: int | None, b_path: tuple[str, ...]) -> str:
    """nvidia-smi-like connection type from sysfs paths and nodes: PIX/PXB
    (common PCI bridge), PHB (same root port), NODE (same node), SYS."""
    k = 0
    for x, y in zip(a_path, b_path):
        if x != y:
            break
        k += 1
    if k >= 2:
        return "PIX" if len(a_path) - k <= 1 and len(b_path) - k <= 1 else "PXB"
    if k == 1:
        return "PHB"
    if a_node is not None and a_node == b_node:
        return "NODE"
    return "SYS" if a_node is not None and b_node is not None else "?"


def render_table(topology: Topology, plan: Plan | None) -> str:
    """Human table like ``nvidia-smi topo -m`` (GPU/NIC connection matrix,
    CPU affinity, NUMA node) followed by the plan's binding per rank."""
    topo = topology
    gpus = list(topo.gpus)
    nics = list(topo.nics)
    cols = [f"GPU{g.minor if g.minor is not None else i}" for i, g in enumerate(gpus)] + \
           [f"NIC{i}" for i in range(len(nics))]
    paths = [(g.numa_node, g.pci_path) for g in gpus] + [(n.numa_node, n.pci_path) for n in nics]
    lines = []
    head = ["", *cols, "CPU Affinity", "NUMA Affinity", "Bus Id", "UUID"]
    rows = [head]
    for i, g in enumerate(gpus):
        links = ["X" if j == i else _link(topo, *paths[i], *paths[j]) for j in range(len(cols))]
        rows.append([cols[i], *links, format_cpulist(g.local_cpus) or "N/A",
                     str(g.numa_node) if g.numa_node is not None else "N/A",
                     g.pci_bus_id, g.uuid or "N/A"])
    for k, n in enumerate(nics):
        i = len(gpus) + k
        links = ["X" if j == i else _link(topo, *paths[i], *paths[j]) for j in range(len(cols))]
        rows.append([cols[i], *links, "", str(n.numa_node) if n.numa_node is not None else "N/A",
                     n.pci_bus_id or "", ""])
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    if not gpus:
        lines.append("(no NVIDIA GPU found on this host)")
    if nics:
        lines.append("")
        lines.append("NIC Legend:")
        for k, n in enumerate(nics):
            lines.append(f"  NIC{k}: {n.name}" + (f" ({','.join(n.netdevs)})" if n.netdevs else ""))
    lines.append("")
    lines.append("NUMA nodes:")
    for n in topo.nodes:
        mem = f", {n.mem_total_bytes / 2**30:.1f} GiB" if n.mem_total_bytes else ""
        lines.append(f"  node{n.id}: CPUs {format_cpulist(n.cpus) or '-'}{mem}")
    if plan is not None:
        lines.append("")
        lines.append(f"Binding ({len(plan.ranks)} local ranks, allowed CPUs "
                     f"{format_cpulist(plan.allowed_cpus)}):")
        brows = [["rank", "gpu", "cpus", "mem", "nic", "reason"]]
        for r in plan.ranks:
            brows.append([str(r.local_rank), r.gpu.label() if r.gpu else "-",
                          format_cpulist(r.cpus), format_cpulist(r.mem_nodes) or "-",
                          r.nic.name if r.nic else "-", r.reason])
        bw = [max(len(x[c]) for x in brows) for c in range(5)]
        for x in brows:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(x[:5], bw)) + "  " + x[5])
        for w in plan.warnings:
            lines.append(f"warning: {w}")
    for note in topo.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
