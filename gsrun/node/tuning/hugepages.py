"""Explicit hugepages per NUMA node: ``hugepages`` (``SIZE:N``).

``/sys/devices/system/node/nodeN/hugepages/hugepages-<kB>kB/nr_hugepages``
on the NUMA nodes near the job's GPUs (:class:`HugepagesKnob`).
"""

from __future__ import annotations

from gsrun.node.tuning.knob import ScopedKnob
import re
from gsrun.facts.hostfs import meminfo_kb
from gsrun.request.tune import parse_hugepages


NODE = "sys/devices/system/node"
_HP_DIR = r"^hugepages-([0-9]+)kB$"


class HugepagesKnob(ScopedKnob):
    """Explicit hugepages per NUMA node: value ``{"node0/2048": "0", ...}``
    (node, page size in kB) from ``nodeN/hugepages/hugepages-<kB>kB/nr_hugepages``.

    ``SIZE:N`` asks at least N pages of SIZE on every NUMA node near the
    job's GPUs (never lowers a larger pool). The kernel may give fewer
    (fragmented memory): the read-back is the verify, and a shortfall fails
    with the counts. Refused when the pages missing exceed the node's
    ``MemFree`` (``nodeN/meminfo``).
    """

    key = "hugepages"
    what = "hugepages"
    unsupported_reason = "not supported here (no sys/devices/system/node/node*/hugepages)"

    def _rel(self, k):
        node, kb = k.split("/")
        return f"{NODE}/{node}/hugepages/hugepages-{kb}kB/nr_hugepages"

    def read(self, h):
        out = {}
        for n in sorted((d for d in h.listdir(NODE) if re.fullmatch(r"node[0-9]+", d)), key=lambda s: int(s[4:])):
            for d in h.listdir(f"{NODE}/{n}/hugepages"):
                m = re.match(_HP_DIR, d)
                if m:
                    v = h.read(f"{NODE}/{n}/hugepages/{d}/nr_hugepages")
                    if v is not None:
                        out[f"{n}/{m.group(1)}"] = v.strip()
        return out or None

    def resolve(self, h, value, scope):
        kb, count = parse_hugepages(value)
        cur = self.read(h)
        if cur is None:
            return "unsupported", None, self.unsupported_reason
        nodes = scope.gpu_nodes() if scope else []
        if not nodes:
            return "unsupported", None, "NUMA node of the job's GPUs unknown (no GPU found, or numa_node -1 on a multi-node host)"
        target, notes = {}, []
        for n in nodes:
            k = f"node{n}/{kb}"
            if k not in cur:
                return "unsupported", None, f"no {kb} kB hugepages on NUMA node {n} (hugepages-{kb}kB absent)"
            have = int(cur[k]) if cur[k].isdigit() else 0
            need_kb = max(0, count - have) * kb
            free_kb = meminfo_kb(h.read(f"{NODE}/node{n}/meminfo") or "").get("MemFree")
            if free_kb is None:
                return "refused", None, f"NUMA node {n}: MemFree unreadable (nodeN/meminfo), cannot check {value}"
            if need_kb > free_kb:
                return "refused", None, (f"{value} on NUMA node {n} needs {need_kb} kB more ({count - have} pages of "
                                         f"{kb} kB), MemFree there is {free_kb} kB")
            target[k] = str(max(count, have))
            notes.append(f"node {n}")
        return "ok", target, f"{count} x {kb} kB on NUMA " + ", ".join(notes)
