"""Fake host trees for the tuning tests (no tests here).

A tree is the real H200 VM recording (``tests/data/hosts/h200-vm/h200-vm-tree.tar.gz``: the
project's own probe of the device machine, no cpufreq, no swap) unpacked under tmp_path, plus -- when asked -- synthetic
cpufreq dirs for 4 CPUs and an active swap file.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from gsrun.facts.hostfs import HostFS

from helpers.paths import DATA, REPO  # noqa: E402  (REPO re-exported)

TARBALL = DATA / "hosts" / "h200-vm" / "h200-vm-tree.tar.gz"
SWAP_LINE = "/swapfile                               file\t\t8388604\t\t524288\t\t-2"
SWAP_LINE2 = "/dev/nvme0n1p3                          partition\t16777212\t0\t\t5"


_CACHE: list[Path] = []


def _unpacked() -> Path:
    """The tarball unpacked once per test session (regular files and dirs only)."""
    if not _CACHE:
        dest = Path(tempfile.mkdtemp(prefix="gsrun-h200-tree-"))
        _CACHE.append(dest)
        atexit.register(shutil.rmtree, dest, True)
        with tarfile.open(TARBALL) as t:
            for m in t.getmembers():
                parts = Path(m.name).parts
                if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                    continue
                if m.isdir():
                    (dest / m.name).mkdir(parents=True, exist_ok=True)
                else:
                    (dest / m.name).parent.mkdir(parents=True, exist_ok=True)
                    (dest / m.name).write_bytes(t.extractfile(m).read())
    return _CACHE[0]


def make_tree(root: Path, cpufreq_cpus: int = 4, swap: bool = True, swapped_kb: int = 524288,
              mem_available_kb: int | None = None, dirty_bytes: int = 0, dirty_background_bytes: int = 0,
              governor: str = "powersave") -> Path:
    shutil.copytree(_unpacked(), root, dirs_exist_ok=True)
    for c in range(cpufreq_cpus):
        d = root / f"sys/devices/system/cpu/cpu{c}/cpufreq"
        d.mkdir(parents=True, exist_ok=True)
        (d / "scaling_governor").write_text(governor + "\n")
        (d / "scaling_available_governors").write_text("performance powersave \n")
    if swap:
        swaps = root / "proc/swaps"
        swaps.write_text(swaps.read_text().rstrip("\n") + "\n" + SWAP_LINE + "\n" + SWAP_LINE2 + "\n")
        mi = root / "proc/meminfo"
        lines = []
        total = 8388604 + 16777212
        for ln in mi.read_text().splitlines():
            if ln.startswith("SwapTotal:"):
                ln = f"SwapTotal:      {total} kB"
            elif ln.startswith("SwapFree:"):
                ln = f"SwapFree:       {total - swapped_kb} kB"
            elif ln.startswith("MemAvailable:") and mem_available_kb is not None:
                ln = f"MemAvailable:   {mem_available_kb} kB"
            lines.append(ln)
        mi.write_text("\n".join(lines) + "\n")
    vm = root / "proc/sys/vm"
    if dirty_bytes:
        (vm / "dirty_bytes").write_text(f"{dirty_bytes}\n")
        (vm / "dirty_ratio").write_text("0\n")
    if dirty_background_bytes:
        (vm / "dirty_background_bytes").write_text(f"{dirty_background_bytes}\n")
        (vm / "dirty_background_ratio").write_text("0\n")
    return root


# Idle states as intel_idle shows them on a Sapphire Rapids host (name, exit latency us).
IDLE_STATES = (("POLL", 0), ("C1", 1), ("C1E", 2), ("C6", 170))
GPU_BDF = "0000:00:06.0"
GPU_IRQS = tuple(range(42, 50))     # the real H200 VM: MSI-X 42-49 (PCI-MSIX-0000:00:06.0 0..7-edge nvidia)
OTHER_IRQS = (1, 24, 25)


def add_host_tuning(root: Path, cpus: int = 16, cpuidle: bool = True, irqs: bool = True, hugepages: bool = True,
                    dma_latency: bool = True, node_free_kb: int | None = None, irqbalance: bool = False,
                    irqbalance_args: tuple[str, ...] = ("--foreground",), irqbalance_env: str = "",
                    policy_script: str | None = None) -> Path:
    """The files ``cstate``, ``irq`` and ``hugepages`` use, as the real H200 VM
    shows them (``tests/gpu/tuning_real.py`` prints them), plus a bare-metal
    cpuidle tree the VM lacks: ``cpuN/cpuidle/stateK/{name,latency,disable}``
    (:data:`IDLE_STATES`), ``msi_irqs`` of the GPU and ``/proc/irq/N/
    smp_affinity_list`` ("0-15"), ``node0/hugepages/hugepages-{2048,1048576}kB/
    nr_hugepages`` (0), ``dev/cpu_dma_latency`` (empty file), and with
    ``irqbalance`` a ``proc/4321/comm`` naming it, its ``cmdline`` (``irqbalance_args``)
    and ``environ``; ``policy_script`` (an absolute path) is created under the root
    from ``templates/irqbalance-policy.sh``."""
    cpu = root / "sys/devices/system/cpu"
    if cpuidle:
        for c in range(cpus):
            for k, (name, lat) in enumerate(IDLE_STATES):
                d = cpu / f"cpu{c}/cpuidle/state{k}"
                d.mkdir(parents=True, exist_ok=True)
                (d / "name").write_text(name + "\n")
                (d / "latency").write_text(f"{lat}\n")
                (d / "disable").write_text("0\n")
    if irqs:
        msi = root / f"sys/bus/pci/devices/{GPU_BDF}/msi_irqs"
        msi.mkdir(parents=True, exist_ok=True)
        for n in GPU_IRQS + OTHER_IRQS:
            d = root / f"proc/irq/{n}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "smp_affinity_list").write_text(f"0-{cpus - 1}\n" if cpus > 1 else "0\n")
            if n in GPU_IRQS:
                (msi / str(n)).write_text("msix\n")
    if hugepages:
        for kb in (2048, 1048576):
            d = root / f"sys/devices/system/node/node0/hugepages/hugepages-{kb}kB"
            d.mkdir(parents=True, exist_ok=True)
            (d / "nr_hugepages").write_text("0\n")
        if node_free_kb is not None:
            mi = root / "sys/devices/system/node/node0/meminfo"
            text = mi.read_text() if mi.exists() else "Node 0 MemTotal:  4550128 kB\nNode 0 MemFree:  0 kB\n"
            lines = [f"Node 0 MemFree:         {node_free_kb} kB" if "MemFree:" in ln else ln
                     for ln in text.splitlines()]
            mi.write_text("\n".join(lines) + "\n")
    if dma_latency:
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev/cpu_dma_latency").write_bytes(b"")
    if irqbalance:
        (root / "proc/4321").mkdir(parents=True, exist_ok=True)
        (root / "proc/4321/comm").write_text("irqbalance\n")
        (root / "proc/4321/cmdline").write_text("\0".join(("/usr/sbin/irqbalance", *irqbalance_args)) + "\0")
        (root / "proc/4321/environ").write_text(irqbalance_env)
    if policy_script:
        dest = root / policy_script.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "templates" / "irqbalance-policy.sh", dest)
        dest.chmod(0o755)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (path -> bytes), and every directory."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = b"<dir>"
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = b"<link>" if os.path.islink(p) else Path(p).read_bytes()
    return out


def diff(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


class Crash(BaseException):
    """Stands in for the prolog being killed (not caught by the module)."""


class CountingHostFS(HostFS):
    """HostFS whose ``write`` crashes (``Crash``) or fails (``OSError``) on cue."""

    def __init__(self, root, crash_after: int | None = None, fail_path: str | None = None,
                 fail_errno: int = errno.EROFS, drop_writes: str | None = None):
        super().__init__(root)
        self.writes: list[str] = []
        self.crash_after = crash_after
        self.fail_path = fail_path
        self.fail_errno = fail_errno
        self.drop_writes = drop_writes

    def write(self, rel, value):
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            raise Crash(f"killed before write {len(self.writes)}")
        if self.fail_path and rel.lstrip("/").endswith(self.fail_path):
            raise OSError(self.fail_errno, os.strerror(self.fail_errno), rel)
        self.writes.append(rel)
        if self.drop_writes and rel.lstrip("/").endswith(self.drop_writes):
            return  # the kernel "accepts" but keeps the old value
        super().write(rel, value)


class RecordingSwap:
    """Fake swap effect: records calls and edits /proc/swaps like FakeSwapEffect."""

    def __init__(self):
        from gsrun.node.tuning import FakeSwapEffect
        self.inner = FakeSwapEffect()
        self.calls: list[tuple[str, list[str]]] = []

    def off(self, hostfs, devices):
        self.calls.append(("off", [d["name"] for d in devices]))
        self.inner.off(hostfs, devices)

    def on(self, hostfs, devices):
        self.calls.append(("on", [d["name"] for d in devices]))
        self.inner.on(hostfs, devices)
