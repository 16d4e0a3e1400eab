"""Explicit hugepages per NUMA node: ``hugepages`` (``SIZE:N``).

``/sys/devices/system/node/nodeN/hugepages/hugepages-<kB>kB/nr_hugepages``
on the NUMA nodes near the job's GPUs, and the job's own files in hugetlbfs
mounts (:func:`remove_job_hugetlbfs_files`). Per the kernel's hugetlbpage.rst,
a write allocates what it can (the file then reads the pool reached), and
lowering below the pages in use leaves the excess as surplus until freed.
"""

from __future__ import annotations

import os
import re
import stat
from contextlib import suppress

from gsrun.base.errors import NodeError
from gsrun.facts.hostfs import meminfo_kb
from gsrun.node.tuning.knob import ScopedKnob, kernel_write
from gsrun.request.tune import parse_hugepages


NODE = "sys/devices/system/node"
_HP_DIR = re.compile(r"^hugepages-([0-9]+)kB$")
COMPACT_ALL = "proc/sys/vm/compact_memory"
ALLOC_RETRIES = 3            # writes of nr_hugepages after one compaction, when the first got fewer pages
HUGETLBFS_MAX_FILES = 4096   # files looked at per epilog in hugetlbfs mounts (bounded work)
HUGETLBFS_MAX_DEPTH = 4      # directory levels below a mount point
HOLDERS_SHOWN = 6            # holders named in a reason, the rest counted


def _pool_dir(k: str) -> str:
    node, kb = k.split("/")
    return f"{NODE}/{node}/hugepages/hugepages-{kb}kB"


def _int(text: str | None) -> int | None:
    t = (text or "").strip()
    return int(t) if t.isascii() and t.isdigit() else None


def pool_counts(h, k: str) -> dict[str, int | None]:
    """``{"nr", "free", "surplus"}`` pages of pool ``k`` (``"node0/2048"``), None where unreadable."""
    d = _pool_dir(k)
    return {n: _int(h.read(f"{d}/{f}")) for n, f in (("nr", "nr_hugepages"), ("free", "free_hugepages"),
                                                      ("surplus", "surplus_hugepages"))}


def in_use(counts: dict) -> int:
    """Pages of a pool held now: ``nr - free`` (0 when unknown; reserved pages count as free)."""
    nr, free = counts.get("nr"), counts.get("free")
    return max(0, nr - free) if nr is not None and free is not None else 0


def hugetlbfs_mounts(h) -> list[str]:
    """Mount points of hugetlbfs (``/proc/mounts``, fstype ``hugetlbfs``; octal
    escapes of the path undone), host-root relative, at most 64."""
    out = []
    for line in (h.read("proc/mounts") or "").splitlines()[:4096]:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "hugetlbfs":
            p = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            if p.startswith("/") and "\0" not in p and ".." not in p.split("/"):
                out.append(p.lstrip("/"))
    return out[:64]


def job_hugetlbfs_files(h, uid: int) -> list[str]:
    """Regular files of ``uid`` in hugetlbfs mounts (host-root relative, sorted;
    no link followed; bounded by :data:`HUGETLBFS_MAX_FILES`, :data:`HUGETLBFS_MAX_DEPTH`)."""
    found, seen = [], 0
    for mount in hugetlbfs_mounts(h):
        stack = [(mount, 0)]
        while stack and seen < HUGETLBFS_MAX_FILES:
            rel, depth = stack.pop()
            for name in sorted(h.listdir(rel)):
                seen += 1
                if seen > HUGETLBFS_MAX_FILES:
                    break
                p = f"{rel}/{name}"
                try:
                    st = os.lstat(h.path(p))
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) and depth < HUGETLBFS_MAX_DEPTH:
                    stack.append((p, depth + 1))
                elif stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                    found.append(p)
    return sorted(found)


def remove_job_hugetlbfs_files(h, uid: int, log=print) -> list[str]:
    """Remove the job user's (never root's) files in hugetlbfs mounts, which keep
    their pages out of the pool, before the pool is restored. -> the paths removed."""
    if uid <= 0:
        return []
    gone = []
    for rel in job_hugetlbfs_files(h, uid):
        try:
            os.unlink(h.path(rel))
            gone.append(rel)
        except OSError as e:
            log(f"gsrun: tune: hugepages: cannot remove /{rel}: {e.strerror}")
    if gone:
        log(f"gsrun: tune: hugepages: removed {len(gone)} file(s) of uid {uid} in hugetlbfs: "
            + ", ".join("/" + g for g in gone[:HOLDERS_SHOWN]))
    return gone


def holders_text(h, k: str, left: int) -> str:
    """Who still holds ``left`` pages of pool ``k``: hugetlbfs files (with their
    uid), else processes (MAP_HUGETLB or shared memory: no file to name)."""
    files = []
    for mount in hugetlbfs_mounts(h):
        for name in sorted(h.listdir(mount))[:HUGETLBFS_MAX_FILES]:
            try:
                st = os.lstat(h.path(f"{mount}/{name}"))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append(f"/{mount}/{name} (uid {st.st_uid})")
    who = ", ".join(files[:HOLDERS_SHOWN]) + (f" (+{len(files) - HOLDERS_SHOWN})" if len(files) > HOLDERS_SHOWN
                                              else "")
    return (f"{k}: {left} pages still in use (surplus_hugepages), held by " + who) if files else \
        f"{k}: {left} pages still in use (surplus_hugepages) by processes (no file in a hugetlbfs mount)"


class HugepagesKnob(ScopedKnob):
    """Explicit hugepages per NUMA node: value ``{"node0/2048": "0", ...}``
    (node, page size in kB) from ``nodeN/hugepages/hugepages-<kB>kB/nr_hugepages``.

    ``SIZE:N``: N pages for the job on every NUMA node near its GPUs, the
    target the pages in use now plus N, never below the pool (512 in use and
    4096 asked: 4608); per-node files only. Refused when the pages missing
    exceed the node's ``MemFree``. A short pool gets one compaction and
    :data:`ALLOC_RETRIES` more writes, then the job starts with what it got.
    """

    key = "hugepages"
    what = "hugepages"
    unsupported_reason = "not supported here (no sys/devices/system/node/node*/hugepages)"

    def _rel(self, k):
        return f"{_pool_dir(k)}/nr_hugepages"

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
            used = in_use(pool_counts(h, k))
            want = max(have, used + count)
            need_kb = (want - have) * kb
            free_kb = meminfo_kb(h.read(f"{NODE}/node{n}/meminfo") or "").get("MemFree")
            if free_kb is None:
                return "refused", None, f"NUMA node {n}: MemFree unreadable (nodeN/meminfo), cannot check {value}"
            if need_kb > free_kb:
                return "refused", None, (f"{value} on NUMA node {n} needs {need_kb} kB more ({want - have} pages of "
                                         f"{kb} kB), MemFree there is {free_kb} kB")
            target[k] = str(want)
            notes.append(f"node {n}" + (f" ({used} in use by others: pool {want})" if used else ""))
        return "ok", target, f"{count} x {kb} kB on NUMA " + ", ".join(notes)

    def apply(self, h, target, swap):
        """Write each pool's target; a short pool gets one compaction and up to
        :data:`ALLOC_RETRIES` more writes. -> ``{"target": sizes reached,
        "note": "short: ..."}`` when some pool stayed short, else None."""
        got, short = {}, []
        for k, v in target.items():
            want = int(v)
            kernel_write(h, self._rel(k), v)
            have = _int(h.read(self._rel(k))) or 0
            tries = 0
            if have < want:
                node = k.split("/")[0]
                compact = f"{NODE}/{node}/compact" if h.exists(f"{NODE}/{node}/compact") else COMPACT_ALL
                if h.exists(compact):
                    with suppress(OSError):
                        kernel_write(h, compact, "1")
                while have < want and tries < ALLOC_RETRIES:
                    tries += 1
                    kernel_write(h, self._rel(k), v)
                    have = _int(h.read(self._rel(k))) or 0
            got[k] = str(have)
            if have < want:
                c = pool_counts(h, k)
                usable = c["free"] if c["free"] is not None else "?"
                asked = want - (in_use(c) if c["free"] is not None else 0)
                short.append(f"{k}: got {have} of {want} pages ({usable} free for the job, asked {max(asked, 0)} "
                             f"more; after compaction and {tries} retries)")
        if not short:
            return None
        return {"target": got, "note": "short: " + "; ".join(short)}

    def restore(self, h, prior, swap):
        """Write the prior pool sizes back. Raises NodeError naming the holders
        when a pool keeps surplus pages (in use: freed when they let go)."""
        super().restore(h, prior, swap)
        held = []
        for k, v in prior.items():
            if v is None or not h.exists(self._rel(k)):
                continue
            c = pool_counts(h, k)
            if c["surplus"]:
                held.append(holders_text(h, k, c["surplus"]))
        if held:
            raise NodeError("tune", "hugepages not all returned", "; ".join(held),
                            hint="the pages return to the system when their holders exit or their files are "
                                 "removed; gsrun-node restore --all checks again")
