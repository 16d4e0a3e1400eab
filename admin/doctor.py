"""``gsrun-node doctor``: what this node can do for gsrun, in one table.

Each ``check_*(ctx) -> Check`` reads through the node's HostFS (``--host-root``),
NVML and bounded subprocesses, and says ``ok``/``warn``/``fail``/``n/a`` with a
detail, a hint and ``data`` for ``--json``. Each runs in its own thread with
its own timeout (:data:`TIMEOUTS_S`): a hang is ``fail: timed out``.
"""

from __future__ import annotations

import glob
import re
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import gsrun
from gsrun.base.errors import GsrunError
from gsrun.base.proc import SAFE_PATH
from gsrun.daemon import server
from gsrun.facts.cgroup import read_mounts
from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import NvmlUnavailable, is_na, open_nvml
from gsrun.facts.slurm import expand_hostlist, parse_gres_count, parse_oneliner
from gsrun.facts.topology import read_topology, sysfs_gpu_bdfs
from gsrun.facts.memlock import memlock_propagated, parse_memlock, rdma_devices, rdma_text
from gsrun.node.tuning import (DMA_LATENCY, HugepagesKnob, IRQ, NODE, PCI, bracket_word, governor_cpus, idle_states,
                               irqbalance_check, irqbalance_policy_script, pids_by_comm, read_meminfo_kb, read_swaps,
                               thp_dir)
from gsrun.report.retention import last_run, oldest_age_days
from gsrun.request.config import Config, load_config
from gsrun.spank_py.build import read_build_info
from gsrun.admin.install import detect_slurm_version, parse_slurm_conf, read_slurm_conf

STATUSES = ("ok", "warn", "fail", "n/a")
NVIDIA_MAJOR = 195
SPOOL_MIN_FREE_BYTES = 1 << 30
SPOOL_MIN_FREE_PCT = 5.0
DEFAULT_TIMEOUT_S = 10.0
TIMEOUTS_S = {"nvml": 20.0, "gpus": 20.0, "mig": 20.0, "slurm gres": 10.0, "spank": 10.0,
              "mail": 8.0, "spool": 5.0, "state dir": 5.0}
MAIL_CONNECT_TIMEOUT_S = 3.0
CPU = "sys/devices/system/cpu"
BIN_DIRS = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")   # `which` under --host-root


@dataclass
class Check:
    name: str
    status: str
    detail: str
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


def _c(name, status, detail, hint="", **data) -> Check:
    assert status in STATUSES
    return Check(name, status, detail, hint, data)


@dataclass
class Context:
    """What the checks read from; ``run`` replaces :func:`subprocess.run` (tests)."""

    hostfs: HostFS
    config_path: str | None = None
    state_dir: str | None = None
    spool_dir: str | None = None
    node: str | None = None
    slurm_conf: str | None = None
    spank_so: str | None = None
    run: Callable = subprocess.run
    environ: dict = field(default_factory=lambda: dict(os.environ))
    _cfg: Config | None = None
    _cfg_error: str | None = None
    _nvml: Any = None
    _nvml_error: NvmlUnavailable | None = None
    _nvml_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cfg(self) -> Config:
        if self._cfg is None and self._cfg_error is None:
            try:
                self._cfg = load_config(self.config_path)
            except GsrunError as e:
                self._cfg_error = str(e).replace("\n", " ")
        return self._cfg or Config()

    def nvml(self):
        if not self._nvml_lock.acquire(timeout=TIMEOUTS_S["nvml"]):
            raise NvmlUnavailable("TIMEOUT", "NVML initialisation did not return")
        try:
            if self._nvml is None and self._nvml_error is None:
                try:
                    self._nvml = open_nvml(self.hostfs)
                except NvmlUnavailable as e:
                    self._nvml_error = e
        finally:
            self._nvml_lock.release()
        if self._nvml_error is not None:
            raise self._nvml_error
        return self._nvml

    def which(self, name: str) -> str | None:
        if not name.startswith("/") and self.hostfs.is_real:
            return shutil.which(name, path=f"{self.environ.get('PATH', '')}:{SAFE_PATH}")
        for c in [name] if name.startswith("/") else [f"/{d}/{name}" for d in BIN_DIRS]:
            p = Path(c) if self.hostfs.is_real else self.hostfs.path(c)
            if p.is_file() and os.access(p, os.X_OK):
                return c
        return None

    def cmd(self, argv: list[str], timeout_s: float = 5.0) -> subprocess.CompletedProcess | None:
        env = {"PATH": SAFE_PATH, "LANG": "C"}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            return self.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env,
                            stdin=subprocess.DEVNULL, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            return None

    def slurm_conf_path(self) -> Path:
        return Path(self.slurm_conf or self.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")

    def paths(self) -> tuple[str, str]:
        cfg = self.cfg
        return (self.state_dir or self.environ.get("GSRUN_STATE_DIR") or cfg["paths.state_dir"],
                self.spool_dir or self.environ.get("GSRUN_SPOOL_DIR") or cfg["paths.spool_dir"])


# ----------------------------------------------------------------------------- checks

def read_text(path: str | Path) -> str | None:
    """The text of the (non-host-root) file ``path``; None when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def world_usable(path: str) -> str | None:
    """None when every user can run ``path``, else the first component that blocks."""
    p = os.path.realpath(path)
    for d, bits in [(p, 0o005)] + [(str(a), 0o001) for a in Path(p).parents]:
        try:
            if os.stat(d).st_mode & bits != bits:
                return d
        except OSError:
            return d
    return None


def check_install(ctx: Context) -> Check:
    """gsrun's Python must be usable by every job user (not a venv of root's pyenv)."""
    py = ctx.environ.get("GSRUN_DOCTOR_PYTHON") or sys.executable
    pkg = os.path.join(os.path.dirname(gsrun.__file__), "__init__.py")
    blocked = world_usable(py) or (None if os.stat(pkg).st_mode & 0o004 else pkg)
    data = {"python": py, "real_python": os.path.realpath(py), "package": os.path.dirname(pkg)}
    if blocked:
        return _c("install", "fail", f"{py} -> {os.path.realpath(py)}: {blocked} is not usable by other users",
                  "recreate the venv from the system Python (/usr/bin/python3 -m venv /opt/gsrun/venv) "
                  "and chmod -R a+rX it", **data)
    return _c("install", "ok", f"{os.path.dirname(pkg)} (python {os.path.realpath(py)}) readable by all users",
              **data)


def check_config(ctx: Context) -> Check:
    src = ctx.cfg.source
    if ctx._cfg_error:
        return _c("config", "fail", ctx._cfg_error, "fix the file; gsrun-node config check shows the key")
    if src == "<defaults>":
        return _c("config", "ok", "no site config file: built-in defaults",
                  "gsrun-node install writes a commented /etc/gsrun/gsrun.toml", source=src)
    return _c("config", "ok", f"{src} parses", source=src)


def _nvml_extra(nv) -> dict[str, Any]:
    """NVML library and CUDA driver versions, from the recording or pynvml."""
    out: dict[str, Any] = {}
    data = getattr(nv, "data", None)
    if isinstance(data, dict):
        for k in ("nvml", "cuda"):
            e = data.get(k)
            if isinstance(e, dict) and "ok" in e:
                out[k] = e["ok"]
    elif hasattr(nv, "nv"):
        for k, fn in (("nvml", "nvmlSystemGetNVMLVersion"), ("cuda", "nvmlSystemGetCudaDriverVersion")):
            f = getattr(nv.nv, fn, None)
            if f is not None:
                v = nv._call(f)
                if not is_na(v):
                    out[k] = v
    return out


def check_nvml(ctx: Context) -> Check:
    try:
        nv = ctx.nvml()
    except NvmlUnavailable as e:
        pci = sysfs_gpu_bdfs(ctx.hostfs)
        if e.code_name == "LIB_RM_VERSION_MISMATCH":
            return _c("nvml", "fail", f"NVML library and kernel driver differ: {e.detail or e.code_name}",
                      "the driver was upgraded without a reboot: drain the node and reboot "
                      "(the prolog refuses GPU jobs until then)", error=e.code_name)
        if e.code_name == "TIMEOUT":
            return _c("nvml", "fail", "NVML did not answer", "check nvidia-smi; a GPU may be wedged",
                      error=e.code_name)
        if pci:
            return _c("nvml", "fail", f"{len(pci)} NVIDIA GPU(s) on PCI but NVML unavailable: {e.code_name}",
                      "install/load the NVIDIA driver (nvidia-smi must work)", error=e.code_name, pci=pci)
        return _c("nvml", "n/a", f"no NVIDIA driver/GPU here ({e.code_name})",
                  "GPU figures will be empty; CPU figures still work", error=e.code_name)
    drv = nv.driver_version()
    extra = _nvml_extra(nv)
    drv_s = None if is_na(drv) else str(drv)
    lib, cuda = extra.get("nvml"), extra.get("cuda")
    cuda_s = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None
    detail = f"driver {drv_s or '?'}, NVML {lib or '?'}" + (f", CUDA {cuda_s}" if cuda_s else "") + \
        f", {nv.count()} GPU(s)"
    data = {"driver": drv_s, "nvml": lib, "cuda": cuda_s, "count": nv.count()}
    if drv_s and lib and not str(lib).endswith(drv_s):
        return _c("nvml", "warn", detail + f": library {lib} does not match driver {drv_s}",
                  "reboot after the driver upgrade so the library and the kernel module agree", **data)
    return _c("nvml", "ok", detail, **data)


def check_gpus(ctx: Context) -> Check:
    try:
        nv = ctx.nvml()
    except NvmlUnavailable:
        nv = None
    topo = read_topology(ctx.hostfs, nv if nv is not None else False)
    if not topo.gpus:
        return _c("gpus", "n/a", "no NVIDIA GPU found (NVML, sysfs, /proc/driver/nvidia)",
                  notes=list(topo.notes), numa_nodes=len(topo.nodes))
    gpus, parts = [], []
    for g in topo.gpus:
        raw = ctx.hostfs.read_int(f"sys/bus/pci/devices/{g.pci_bus_id}/numa_node")
        gpus.append({"pci_bus_id": g.pci_bus_id, "minor": g.minor, "nvml_index": g.nvml_index,
                     "name": g.name, "uuid": g.uuid, "numa_node": g.numa_node, "numa_source": g.numa_source,
                     "sysfs_numa_node": raw})
        where = "NUMA ?" if g.numa_node is None else f"NUMA {g.numa_node}"
        if raw is not None and raw < 0 and g.numa_node is not None:
            where += f" (sysfs -1, from {g.numa_source})"
        parts.append(f"nvidia{g.minor if g.minor is not None else '?'} {g.pci_bus_id} {where}")
    detail = f"{len(topo.gpus)} x {topo.gpus[0].name or 'GPU'}: " + "; ".join(parts)
    hint = ("NUMA node unknown: tasks get cores but no memory binding (check BIOS/ACPI SRAT; nvidia-smi topo -m)"
            if any(g["numa_node"] is None for g in gpus) else
            "minor number unknown: Slurm gres indices cannot be mapped" if any(g["minor"] is None for g in gpus)
            else "")
    return _c("gpus", "warn" if hint else "ok", detail, hint, gpus=gpus, numa_nodes=len(topo.nodes))


def parse_gres_conf(text: str, node: str | None) -> list[str]:
    """Device files (hostlist-expanded; kept as written when they do not
    expand) of gres.conf's ``Name=gpu`` lines that apply to ``node``."""
    files: list[str] = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kv = {k.lower(): v for k, v in (t.split("=", 1) for t in line.split() if "=" in t)}
        if kv.get("name") != "gpu" or "file" not in kv:
            continue
        if "nodename" in kv and node is not None:
            try:
                if node not in expand_hostlist(kv["nodename"]):
                    continue
            except GsrunError:
                continue
        try:
            files += expand_hostlist(kv["file"])
        except GsrunError:
            files.append(kv["file"])
    return files


def check_slurm_gres(ctx: Context) -> Check:
    """``Gres=`` of ``scontrol -o show node`` and gres.conf's files (NVIDIA char devices, major 195)."""
    node = ctx.node or ctx.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    cp = ctx.cmd(["scontrol", "-o", "show", "node", node])
    if cp is None or cp.returncode != 0 or not cp.stdout.strip():
        why = "scontrol not found or timed out" if cp is None else \
            ((cp.stderr or cp.stdout).strip().splitlines() or ["no answer"])[-1][:120]
        return _c("slurm gres", "n/a", f"node {node} unknown to Slurm here ({why})",
                  "give --node NAME (the NodeName in slurm.conf) and SLURM_CONF", node=node)
    gres = parse_oneliner(cp.stdout.splitlines()[0]).get("Gres", "")
    n = parse_gres_count(gres) if gres and gres != "(null)" else 0
    conf = ctx.slurm_conf_path().with_name("gres.conf")
    files = parse_gres_conf(read_text(conf), node)
    fake = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            fake.append(f"{f} missing")
            continue
        if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != NVIDIA_MAJOR:
            kind = f"char {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if stat.S_ISCHR(st.st_mode) else "not a device"
            fake.append(f"{f} ({kind})")
    try:
        found = ctx.nvml().count()
    except NvmlUnavailable:
        found = len(sysfs_gpu_bdfs(ctx.hostfs))
    detail = f"node {node}: Gres={gres or '(none)'}, gres.conf {len(files)} file(s), {found} GPU(s) visible"
    data = {"node": node, "gres": gres, "gres_gpus": n, "gres_files": files, "visible_gpus": found,
            "not_nvidia_devices": fake}
    if fake:
        return _c("slurm gres", "warn", detail + f"; {len(fake)} gres file(s) are not NVIDIA devices: "
                  f"{fake[0]}{' ...' if len(fake) > 1 else ''} (emulated GPUs?)",
                  "on a real node gres.conf File= must name /dev/nvidiaN (major 195)", **data)
    if n and n != found:
        return _c("slurm gres", "warn", detail + f": Slurm has {n}, NVML sees {found}",
                  "fix gres.conf/slurm.conf Gres= or the driver", **data)
    return _c("slurm gres", "ok", detail, **data)


def check_cpufreq(ctx: Context) -> Check:
    cpus = governor_cpus(ctx.hostfs)
    if not cpus:
        return _c("cpufreq", "n/a", "not supported here (no cpufreq/scaling_governor: VM or driver off)",
                  "governor= tuning is reported as unsupported and skipped")
    avail = (ctx.hostfs.read(f"{CPU}/{cpus[0]}/cpufreq/scaling_available_governors") or "").split()
    cur = sorted({ctx.hostfs.read(f"{CPU}/{c}/cpufreq/scaling_governor") or "?" for c in cpus})
    driver = ctx.hostfs.read(f"{CPU}/{cpus[0]}/cpufreq/scaling_driver")
    detail = f"{len(cpus)} CPUs, driver {driver or '?'}, now {','.join(cur)}; available: {' '.join(avail) or '?'}"
    data = {"cpus": len(cpus), "driver": driver, "current": cur, "available": avail}
    if "performance" not in avail:
        return _c("cpufreq", "warn", detail, "no 'performance' governor: governor=performance is refused", **data)
    return _c("cpufreq", "ok", detail, **data)


def check_swap(ctx: Context) -> Check:
    swaps = read_swaps(ctx.hostfs)
    sw = ctx.hostfs.read_int("proc/sys/vm/swappiness")
    if swaps is None:
        return _c("swap", "n/a", "/proc/swaps unreadable")
    total_kb = read_meminfo_kb(ctx.hostfs).get("SwapTotal", sum(s["size_kb"] for s in swaps))
    data = {"areas": [s["name"] for s in swaps], "total_kb": total_kb, "swappiness": sw}
    if not swaps:
        return _c("swap", "ok", f"no swap; vm.swappiness {sw}", **data)
    return _c("swap", "ok", f"{len(swaps)} area(s), {total_kb / 1048576:.1f} GiB; vm.swappiness {sw}",
              "swap=off requests turn them off for exclusive jobs and back on after", **data)


def check_thp(ctx: Context) -> Check:
    d = thp_dir(ctx.hostfs)
    en = ctx.hostfs.read(f"{d}/enabled")
    de = ctx.hostfs.read(f"{d}/defrag")
    if en is None:
        return _c("thp", "n/a", "no transparent_hugepage in sysfs", "thp= tuning is skipped")
    where = " (RHEL 6 path redhat_transparent_hugepage)" if "redhat" in d else ""
    return _c("thp", "ok", f"enabled [{bracket_word(en)}], defrag [{bracket_word(de) or '?'}]{where}",
              enabled=bracket_word(en), defrag=bracket_word(de), enabled_choices=en, defrag_choices=de)


def check_cstate(ctx: Context) -> Check:
    """``cstate=``: cpu0's idle states (exit latency, us) and ``/dev/cpu_dma_latency``."""
    h = ctx.hostfs
    st = idle_states(h)
    hold = h.exists(DMA_LATENCY)
    driver = (h.read(f"{CPU}/cpuidle/current_driver") or "").strip() or None
    first = next(iter(st.values()), [])
    data = {"cpus": len(st), "driver": driver, "states": [{"state": s, "name": n, "latency_us": lat}
                                                         for s, lat, n in first],
            "cpu_dma_latency": hold}
    dma = "/dev/cpu_dma_latency present" if hold else "no /dev/cpu_dma_latency"
    if st:
        shown = ", ".join(f"{n or s} {'?' if lat is None else lat} us" for s, lat, n in first)
        return _c("cstate", "ok", f"{len(st)} CPUs with idle states (driver {driver or '?'}): {shown}; {dma}", **data)
    if hold:
        return _c("cstate", "ok", f"no switchable idle states (cpuidle driver {driver or 'unknown'}; none in most VMs); {dma}",
                  "cstate= holds /dev/cpu_dma_latency only (the host's idle states are the hypervisor's)", **data)
    return _c("cstate", "n/a", f"no cpuidle states (driver {driver or 'unknown'}) and {dma}",
              "cstate= is reported as unsupported and skipped", **data)


def check_irq(ctx: Context) -> Check:
    """``irq=local``: the GPUs' MSI IRQs, whether their affinity files are
    writable (a kernel-managed IRQ says EIO only at apply), and whether
    irqbalance runs with gsrun's policy script (else ``irq=local`` is refused)."""
    h = ctx.hostfs
    irqs = [n for n in h.listdir(IRQ) if n.isdigit()]
    if not irqs:
        return _c("irq", "n/a", "no /proc/irq here", "irq= tuning is reported as unsupported and skipped")
    cfg = ctx.cfg
    pids, problem = irqbalance_check(h, cfg["tuning.irqbalance_policy_script"], cfg["tuning.irqbalance_ban_dir"])
    gpus, parts, unwritable = [], [], 0
    for bdf in sorted(sysfs_gpu_bdfs(h)):
        msi = sorted((n for n in h.listdir(f"{PCI}/{bdf}/msi_irqs") if n.isdigit()), key=int)
        files = {}
        for n in msi:
            f = next((f for f in (f"{IRQ}/{n}/smp_affinity_list", f"{IRQ}/{n}/smp_affinity") if h.exists(f)), None)
            if f is not None:
                files[n] = f
        writable = [n for n in files if os.access(h.path(files[n]), os.W_OK)]
        unwritable += len(files) - len(writable)
        gpus.append({"bdf": bdf, "msi_irqs": [int(n) for n in msi], "writable": [int(n) for n in writable]})
        parts.append(f"{bdf} {len(msi)} MSI IRQs, {len(writable)} writable")
    data = {"irqs": len(irqs), "gpus": gpus, "irqbalance_pids": pids, "root": os.geteuid() == 0,
            "irqbalance_policy_script": [irqbalance_policy_script(h, p) for p in pids],
            "irqbalance_uses_gsrun_policy": bool(pids) and problem is None}
    detail = f"{len(irqs)} IRQs; " + ("; ".join(parts) if parts else "no NVIDIA GPU on PCI")
    if problem:
        return _c("irq", "warn", detail + f"; irqbalance runs (pid {pids[0]}) without gsrun's policy script",
                  f"irq=local is refused: {problem}", **data)
    if pids:
        detail += f"; irqbalance (pid {pids[0]}) uses gsrun's policy script {cfg['tuning.irqbalance_policy_script']}"
    if not gpus:
        return _c("irq", "n/a", detail, "irq=local pins the job GPUs' IRQs; there are none here", **data)
    if not any(g["msi_irqs"] for g in gpus):
        return _c("irq", "warn", detail, "no MSI IRQs listed for the GPUs (driver not loaded?): irq=local skips them",
                  **data)
    if unwritable:
        return _c("irq", "warn", detail + f"; {unwritable} not writable"
                  + ("" if os.geteuid() == 0 else " by this user (doctor is not root)"),
                  "the prolog runs as root; as root, an unwritable affinity file is skipped with its reason", **data)
    return _c("irq", "ok", detail, **data)


def check_hugepages(ctx: Context) -> Check:
    """``hugepages=``: pool and free counts per page size and NUMA node."""
    h = ctx.hostfs
    pools = HugepagesKnob().read(h)
    if not pools:
        return _c("hugepages", "n/a", "no per-node hugepages in sysfs (sys/devices/system/node/node*/hugepages)",
                  "hugepages= tuning is reported as unsupported and skipped")
    rows, by_node = [], {}
    for k, nr in sorted(pools.items(), key=lambda kv: tuple(int(x.lstrip("node")) for x in kv[0].split("/"))):
        node, kb = k.split("/")
        free = (h.read(f"{NODE}/{node}/hugepages/hugepages-{kb}kB/free_hugepages") or "").strip() or None
        size = f"{int(kb) // 1048576}G" if int(kb) >= 1048576 else f"{int(kb) // 1024}M"
        rows.append({"node": int(node[4:]), "size_kb": int(kb), "nr": int(nr) if nr.isdigit() else None,
                     "free": int(free) if free and free.isdigit() else None})
        by_node.setdefault(node, []).append(f"{size} {nr}" + (f" ({free} free)" if free is not None else ""))
    detail = "; ".join(f"{n}: {', '.join(v)}" for n, v in by_node.items())
    return _c("hugepages", "ok", detail, pools=rows)


def check_memlock(ctx: Context) -> Check:
    """Pinned memory for jobs: slurmd's ``RLIMIT_MEMLOCK`` (what jobs inherit),
    ``PropagateResourceLimits[Except]`` and the RDMA devices; a limited hard
    limit warns (gsrun-bind raises soft limits to the hard one)."""
    h = ctx.hostfs
    pids = pids_by_comm(h, "slurmd")
    lim = parse_memlock(h.read(f"proc/{pids[0]}/limits")) if pids else None
    conf_path = ctx.slurm_conf_path()
    text = read_text(conf_path)
    conf = None if text is None else parse_slurm_conf(text)
    rdma = rdma_devices(h)
    data = {"slurmd_pid": pids[0] if pids else None, "slurmd_memlock": list(lim) if lim else None,
            "slurm_conf": str(conf_path), "propagated": None if conf is None else memlock_propagated(conf),
            "rdma_devices": rdma}
    parts, hints = [], []
    if not pids:
        parts.append("slurmd: n/a (not running here)")
    elif lim is None:
        parts.append(f"slurmd pid {pids[0]}: limits unreadable")
    else:
        parts.append(f"slurmd pid {pids[0]}: RLIMIT_MEMLOCK soft {lim[0]}, hard {lim[1]}")
        if lim[1] != "unlimited":
            hints.append("LimitMEMLOCK=infinity in slurmd's unit (systemctl edit slurmd; no systemd: ulimit -l unlimited "
                         "where slurmd starts), restart slurmd")
        elif lim[0] != "unlimited":
            parts[-1] += " (gsrun-bind raises each task's soft limit to the hard one)"
    if conf is None:
        parts.append(f"{conf_path} unreadable")
    else:
        prl = conf.get("propagateresourcelimits", "ALL (default)")
        pre = conf.get("propagateresourcelimitsexcept")
        parts.append(f"PropagateResourceLimits={prl}" + (f", PropagateResourceLimitsExcept={pre}" if pre else ""))
        if data["propagated"]:
            parts[-1] += ": jobs get the submitting shell's MEMLOCK limit"
            hints.append("slurm.conf PropagateResourceLimitsExcept=MEMLOCK")
    parts.append(rdma_text(rdma))
    detail = "; ".join(parts)
    if hints:
        return _c("memlock", "warn", detail, "; ".join(hints) + " (pinned DataLoader/NCCL buffers"
                  + (" and RDMA registrations" if rdma else "") + " need unlimited; each job's report says so "
                  "in its node settings)", **data)
    if not pids and conf is None:
        return _c("memlock", "n/a", detail, **data)
    return _c("memlock", "ok", detail, **data)


def _slurm_cgroup_dirs(fs: HostFS, base: str, max_depth: int = 3) -> list[str]:
    found: list[str] = []
    frontier = [base.strip("/")]
    for _ in range(max_depth):
        nxt = []
        for d in frontier:
            for name in fs.listdir(d):
                rel = f"{d}/{name}" if d else name
                if not fs.path(rel).is_dir() or name.endswith((".mount", ".socket", ".swap")):
                    continue
                if name.startswith("slurm"):
                    found.append("/" + rel)
                elif name.startswith("system.slice"):
                    nxt.append(rel)
        frontier = nxt[:50]
    return sorted(found)


def check_cgroup(ctx: Context) -> Check:
    m = read_mounts(ctx.hostfs)
    if m.version is None:
        return _c("cgroup", "warn", "no cgroup mount visible in /proc/self/mountinfo",
                  "job CPU/memory figures fall back to the job's processes")
    dirs: list[str] = []
    if m.version == 2 and m.v2:
        dirs = _slurm_cgroup_dirs(ctx.hostfs, m.v2[0])
        detail = f"v2 at {m.v2[0]}"
    else:
        for ctrl in ("cpuset", "memory", "devices", "cpuacct", "freezer"):
            if ctrl in m.v1:
                dirs += _slurm_cgroup_dirs(ctx.hostfs, m.v1[ctrl][0], 1)
        detail = f"v1 ({', '.join(sorted(m.v1))})"
    data = {"version": m.version, "v2": m.v2, "v1": {k: v[0] for k, v in m.v1.items()}, "slurm_dirs": dirs}
    if dirs:
        return _c("cgroup", "ok", f"{detail}; Slurm: {', '.join(dirs[:3])}", **data)
    return _c("cgroup", "ok", f"{detail}; no Slurm cgroup yet",
              "Slurm creates its cgroups with proctrack/cgroup or task/cgroup at the first job; "
              "without them job figures come from the job's processes", **data)


def check_mps(ctx: Context) -> Check:
    name = ctx.cfg["mps.control_bin"]
    ctl = ctx.which(name)
    srv = ctx.which("nvidia-cuda-mps-server")
    if not ctx.cfg["mps.enabled"]:
        return _c("mps", "n/a", "mps.enabled = false", control=ctl, server=srv)
    if ctl and srv:
        return _c("mps", "ok", f"{ctl}, {srv}", control=ctl, server=srv)
    return _c("mps", "warn", f"{name} {'found' if ctl else 'not found'}, nvidia-cuda-mps-server "
              f"{'found' if srv else 'not found'}",
              "install the NVIDIA MPS binaries (nvidia-utils / CUDA toolkit); --gs-mps jobs run without MPS",
              control=ctl, server=srv)


def check_numactl(ctx: Context) -> Check:
    p = ctx.which("numactl")
    if p:
        return _c("numactl", "ok", p, path=p)
    return _c("numactl", "warn", "numactl not found", "install numactl: gsrun-bind uses it to bind memory", path=p)


def check_mig(ctx: Context) -> Check:
    try:
        nv = ctx.nvml()
    except NvmlUnavailable as e:
        return _c("mig", "n/a", f"no NVML ({e.code_name})")
    per, parts = [], []
    for i in range(nv.count()):
        mode = nv.get(i, "mig_mode")
        profs = nv.get(i, "gpu_instance_profiles")
        if is_na(mode):
            per.append({"index": i, "capable": False, "reason": mode.reason})
            parts.append(f"GPU{i}: not MIG capable")
            continue
        cur, pend = (list(mode) + [None, None])[:2]
        names = sorted({p["info"]["name"] for p in profs.values() if isinstance(p, dict) and "info" in p}) \
            if isinstance(profs, dict) else []
        per.append({"index": i, "capable": True, "current": cur, "pending": pend, "profiles": names})
        txt = f"GPU{i}: MIG {'enabled' if cur == 1 else 'disabled'}"
        if pend is not None and pend != cur:
            txt += f" (pending {'enabled' if pend == 1 else 'disabled'}: reset the GPU)"
        parts.append(txt + (f", {len(names)} profiles ({names[0]} ...)" if names else ""))
    if not per:
        return _c("mig", "n/a", "no GPUs", gpus=per)
    if not any(p["capable"] for p in per):
        return _c("mig", "n/a", "; ".join(parts), "--gs-mig needs A100/H100/H200-class GPUs", gpus=per)
    if any(p.get("pending") is not None and p.get("pending") != p.get("current") for p in per if p["capable"]):
        return _c("mig", "warn", "; ".join(parts), "a MIG mode change is pending a GPU reset", gpus=per)
    return _c("mig", "ok", "; ".join(parts), gpus=per)


def find_spank_so(ctx: Context) -> str | None:
    """``--spank-so``, else the first ``gsrun_spank.so`` in PlugStackConfig or its ``include``s."""
    if ctx.spank_so:
        return ctx.spank_so
    conf = ctx.slurm_conf_path()
    ps = parse_slurm_conf(read_text(conf)).get("plugstackconfig")
    todo = [Path(ps) if ps else conf.with_name("plugstack.conf")]
    seen = 0
    while todo and seen < 32:
        p = todo.pop(0)
        seen += 1
        for line in (read_text(p) or "").splitlines():
            w = line.split("#", 1)[0].split()
            if len(w) >= 2 and w[0] in ("required", "optional") and w[1].endswith("gsrun_spank.so"):
                return w[1]
            if len(w) >= 2 and w[0] == "include":
                todo += [Path(x) for x in sorted(glob.glob(w[1]))[:16]]
    return None


def check_spank(ctx: Context) -> Check:
    so = find_spank_so(ctx)
    sv = detect_slurm_version(run=ctx.run)
    running = sv.version if sv else None
    if not so:
        return _c("spank", "n/a", f"gsrun SPANK plugin not in plugstack.conf (Slurm {running or '?'})",
                  "optional: gsrun-node spank build && gsrun-node spank install (--gs-* options)",
                  slurm=running)
    if not Path(so).is_file():
        return _c("spank", "fail", f"plugstack names {so}, which does not exist",
                  "a 'required' plugin that is missing fails every job: reinstall it or remove the line",
                  so=so, slurm=running)
    info = read_build_info(so)
    built = info.get("slurm_version")
    data = {"so": so, "built_for": built, "slurm": running, "python": info.get("python_version")}
    if not built:
        return _c("spank", "warn", f"{so}: build info unknown", "rebuild with gsrun-node spank build", **data)
    if running and built.split(".")[:2] != running.split(".")[:2]:
        return _c("spank", "fail", f"{so} built for Slurm {built}, running {running}",
                  "rebuild after the Slurm upgrade: gsrun-node spank build && gsrun-node spank install", **data)
    return _c("spank", "ok", f"{so} built for Slurm {built} (running {running or '?'}), "
              f"Python {info.get('python_version', '?')}", **data)


def check_spool(ctx: Context) -> Check:
    _, spool = ctx.paths()
    p = Path(spool)
    if not p.is_dir():
        return _c("spool", "fail", f"{spool} missing", "run gsrun-node install", path=spool)
    du = shutil.disk_usage(p)
    pct = 100.0 * du.free / du.total if du.total else 0.0
    detail = f"{spool}: {du.free / 2**30:.1f} GiB free ({pct:.0f}%)"
    data = {"path": spool, "free_bytes": du.free, "total_bytes": du.total}
    if du.free < SPOOL_MIN_FREE_BYTES or pct < SPOOL_MIN_FREE_PCT:
        return _c("spool", "warn", detail, "summaries and mails need room; prune old jobs/", **data)
    return _c("spool", "ok", detail, **data)


def check_state(ctx: Context) -> Check:
    state, _ = ctx.paths()
    p = Path(state)
    if not p.is_dir():
        parent = p.parent
        if parent.is_dir() and os.access(parent, os.W_OK):
            return _c("state dir", "ok", f"{state} not created yet; {parent} is writable (prolog creates it)",
                      path=state)
        return _c("state dir", "fail", f"{state} missing and {parent} not writable", "run gsrun-node install",
                  path=state)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != 0:
        return _c("state dir", "fail", f"{state} is a symlink or not owned by root (uid {st.st_uid})",
                  "remove it; gsrun-node install recreates it", path=state)
    try:
        tempfile.TemporaryFile(prefix=".doctor-", dir=p).close()
    except OSError as e:
        return _c("state dir", "fail", f"{state} not writable: {e.strerror}",
                  "read-only /run? the prolog cannot journal changes", path=state)
    return _c("state dir", "ok", f"{state} writable, mode {oct(st.st_mode & 0o7777)[2:]}", path=state)


HOOK_MAX_BYTES = 65536      # a hook script read to see what it runs
HOOKS_PER_LINE_MAX = 64     # files a Prolog=/Epilog= glob may name


def hook_wiring(conf: dict[str, str], sock: str) -> dict[str, str]:
    """For slurm.conf's ``prolog`` and ``epilog``: ``"daemon"`` when a script
    it names runs ``gsrun-hook`` on ``sock``, ``"direct"`` when one runs gsrun
    otherwise, ``"other"``, or ``"unset"``."""
    out = {}
    for key in ("prolog", "epilog"):
        found = "other" if conf.get(key) else "unset"     # an unset key names no script
        for text in _hook_texts(conf, key):
            if "gsrun-hook" in text and sock in text:
                found = "daemon"
                break
            if "gsrun" in text:
                found = "direct"
        out[key] = found
    return out


def check_daemon(ctx: Context) -> Check:
    """The node daemon answers (and on ``ctld.sock`` for a non-root SlurmUser),
    is this release, and slurm.conf's hooks run its client."""
    state, _ = ctx.paths()
    sock = os.path.join(state, server.SOCKET_NAME)
    try:
        st = server.ping(sock)
    except GsrunError as e:
        return _c("daemon", "fail", f"not answering on {sock}: {e.detail.removeprefix(sock + ': ')}",
                  "systemctl enable --now gsrun-daemon (the unit gsrun-node install writes; no systemd: docs/ADMIN.md, "
                  "'Hosts without systemd'); until it runs, every prolog fails and Slurm drains the node", socket=sock)
    data = {"socket": sock, "pid": st.get("pid"), "version": st.get("version"), "served": st.get("served")}
    conf_path, conf = read_slurm_conf({"SLURM_CONF": ctx.slurm_conf} if ctx.slurm_conf else ctx.environ)
    wiring = hook_wiring(conf, sock) if conf_path else {}
    data["hooks"] = wiring
    detail = f"pid {st.get('pid')} answers on {sock} ({st.get('served')} requests served)"
    if st.get("version") != gsrun.__version__:
        return _c("daemon", "warn", f"{detail}; it runs gsrun {st.get('version')}, this is {gsrun.__version__}",
                  f"systemctl reload gsrun-daemon, or kill -HUP {st.get('pid')} (it also re-executes at the next hook)", **data)
    user = (conf.get("slurmuser") or "root").strip()
    if conf.get("epilogslurmctld") and user not in ("root", "0"):
        csock = os.path.join(os.path.dirname(sock), server.CTLD_SOCKET_NAME)
        try:
            server.ping(csock)
        except GsrunError as e:
            return _c("daemon", "fail", f"{detail}; EpilogSlurmctld runs as SlurmUser={user[:40]} and finds no "
                      f"daemon on {csock}: {e.detail.removeprefix(csock + ': ')}",
                      "run gsrun-node install again (it starts the daemon with --ctld-user), then restart "
                      "the daemon; until then no job gets its report", **data)
    bad = [k for k, v in wiring.items() if v != "daemon"]
    if bad:
        why = {"direct": "runs gsrun without the daemon's client", "other": "does not run gsrun",
               "unset": "is not set"}
        return _c("daemon", "warn", detail + "; " + "; ".join(
            f"{conf_path}: {k.capitalize()}= {why[wiring[k]]}" for k in bad),
            "point Prolog=/Epilog= at the hooks `gsrun-node install` writes (they go through gsrun-hook)", **data)
    return _c("daemon", "ok", detail + ("; Prolog= and Epilog= go through it" if wiring else ""), **data)


_LOG_FILE_IN_HOOK = re.compile(r"GSRUN_LOG_FILE=([^\s;'\"]+)")


def _hook_texts(conf: dict[str, str], key: str):
    """The (bounded) texts of the scripts slurm.conf's ``key`` names (a path or a glob)."""
    for path in sorted(glob.glob(conf.get(key) or ""))[:HOOKS_PER_LINE_MAX]:
        try:
            with open(path, "rb") as f:
                yield f.read(HOOK_MAX_BYTES).decode("utf-8", "replace")
        except OSError:
            continue


def check_log(ctx: Context) -> Check:
    """Where the hooks' log lines go: syslog (``/dev/log``) and/or the hooks'
    ``GSRUN_LOG_FILE``; neither warns."""
    try:
        syslog = stat.S_ISSOCK(os.stat(ctx.hostfs.path("/dev/log")).st_mode)
    except OSError:
        syslog = False
    conf_path, conf = read_slurm_conf({"SLURM_CONF": ctx.slurm_conf} if ctx.slurm_conf else ctx.environ)
    files = set()
    for key in ("prolog", "epilog"):
        for text in _hook_texts(conf, key):
            files.update(_LOG_FILE_IN_HOOK.findall(text))
    where = (["syslog (/dev/log)"] if syslog else []) + sorted(files)
    if not where:
        return _c("log", "warn", "no syslog daemon (/dev/log is not a socket) and the hooks set no GSRUN_LOG_FILE: "
                  "their log lines are lost", "run a syslog daemon, or gsrun-node install --log-file "
                  "/var/log/gsrun.log (the hooks it writes set it)", syslog=False, files=[])
    return _c("log", "ok", "the hooks log to " + " and ".join(where), syslog=syslog, files=sorted(files))


def check_mail(ctx: Context) -> Check:
    cfg = ctx.cfg
    if not cfg["mail.enabled"] or cfg["mail.policy"] == "never":
        return _c("mail", "n/a", "mail disabled (mail.enabled / mail.policy)")
    prog = cfg["mail.mailprog"]
    if prog:
        ok = os.path.isfile(prog) and os.access(prog, os.X_OK)
        return _c("mail", "ok" if ok else "fail", f"mailprog {prog} {'executable' if ok else 'missing'}",
                  "" if ok else "install it or set mail.mailprog = \"\" to use SMTP", mailprog=prog)
    host, port = cfg["mail.smtp_host"], cfg["mail.smtp_port"]
    t0 = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=MAIL_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return _c("mail", "warn", f"SMTP {host}:{port} not reachable: {e.strerror or e}",
                  "mails stay queued and are retried (gsrun-node mail flush); set mail.smtp_host or "
                  "mail.mailprog; only the slurmctld host sends mail", host=host, port=port)
    return _c("mail", "ok", f"SMTP {host}:{port} accepts connections ({time.monotonic() - t0:.2f} s)",
              host=host, port=port)


SPOOL_MAX_USED_PCT = 90.0


def _ago(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.0f} h" if hours < 48 else f"{hours / 24:.0f} days"


def check_retention(ctx: Context) -> Check:
    """``warn`` when job directories outlive ``spool.retention_days``, prune
    has not run for 2 days or the spool is over :data:`SPOOL_MAX_USED_PCT` % full."""
    _, spool = ctx.paths()
    days = ctx.cfg["spool.retention_days"]
    if not Path(spool, "jobs").is_dir():
        return _c("retention", "n/a", f"{spool}/jobs not created yet", path=spool)
    try:
        n, oldest = oldest_age_days(spool)
    except GsrunError as e:
        return _c("retention", "warn", str(e).replace("\n", " "), "inspect the spool", path=spool)
    du = shutil.disk_usage(spool)
    used = 100.0 * (du.total - du.free) / du.total if du.total else 0.0
    last = last_run(spool)
    last_h = None if last is None else max(0.0, (time.time() - last["time"]) / 3600.0)
    data = {"path": spool, "job_dirs": n, "oldest_days": None if oldest is None else round(oldest, 1),
            "retention_days": days, "used_pct": round(used, 1),
            "last_prune_hours": None if last_h is None else round(last_h, 1)}
    detail = (f"{n} job directories, oldest {oldest:.0f} days" if oldest is not None else "no job directories") \
        + f"; filesystem {used:.0f}% used; retention {days or 'forever'}" + (" days" if days else "") \
        + ("; prune never ran" if last is None else
           f"; last prune {_ago(last_h)} ago (removed {last.get('removed', 0)})")
    if used > SPOOL_MAX_USED_PCT:
        return _c("retention", "warn", detail, "run gsrun-node prune (see docs/ADMIN.md, the prune timer)", **data)
    if days and last_h is not None and last_h > 48 and n:
        return _c("retention", "warn", detail,
                  "gsrun-node prune has not run for 2 days: is gsrun-prune.timer enabled (systemctl list-timers "
                  "gsrun-prune.timer), or its cron line in place without systemd?", **data)
    if days and oldest is not None and oldest > days + 1:
        return _c("retention", "warn", detail,
                  "job directories outlive spool.retention_days: enable the gsrun-prune timer or its cron line "
                  "(docs/ADMIN.md), or run gsrun-node prune --dry-run", **data)
    return _c("retention", "ok", detail, **data)


CHECKS: tuple[tuple[str, Callable[[Context], Check]], ...] = (
    ("install", check_install), ("config", check_config), ("nvml", check_nvml), ("gpus", check_gpus), ("slurm gres", check_slurm_gres),
    ("mig", check_mig), ("cpufreq", check_cpufreq), ("swap", check_swap), ("thp", check_thp),
    ("cstate", check_cstate), ("irq", check_irq), ("hugepages", check_hugepages), ("memlock", check_memlock),
    ("cgroup", check_cgroup), ("mps", check_mps), ("numactl", check_numactl), ("spank", check_spank),
    ("spool", check_spool), ("retention", check_retention), ("state dir", check_state), ("daemon", check_daemon),
    ("log", check_log), ("mail", check_mail),
)


def run_check(name: str, fn: Callable[[Context], Check], ctx: Context, timeout_s: float | None = None) -> Check:
    timeout_s = TIMEOUTS_S.get(name, DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s
    box: dict[str, Any] = {}

    def target():
        try:
            box["r"] = fn(ctx)
        except Exception as e:  # noqa: BLE001 - a broken check is a result, not a crash
            box["e"] = e

    t0 = time.monotonic()
    th = threading.Thread(target=target, name=f"doctor-{name}", daemon=True)
    th.start()
    th.join(timeout_s)
    dt = round(time.monotonic() - t0, 3)
    if th.is_alive():
        r = _c(name, "fail", f"timed out after {timeout_s:g} s", "something on this node hangs; see the detail "
               "of the checks above and below")
    elif "e" in box:
        e = box["e"]
        r = _c(name, "fail", f"check failed: {str(e).splitlines()[0] if str(e).strip() else type(e).__name__}",
               "a bug in doctor or an unreadable file; please report with --json")
    else:
        r = box["r"]
    r.name = name
    r.detail = " ".join(r.detail.split())
    r.duration_s = dt
    return r


def run_all(ctx: Context, only: list[str] | None = None) -> list[Check]:
    return [run_check(n, fn, ctx) for n, fn in CHECKS if not only or n in only]


def render_table(checks: list[Check]) -> str:
    w = max(len(c.name) for c in checks) if checks else 5
    lines = [f"{'check':<{w}}  {'status':<6}  detail", f"{'-' * w}  ------  {'-' * 40}"]
    for c in checks:
        lines.append(f"{c.name:<{w}}  {c.status:<6}  {c.detail}")
        if c.hint and c.status != "ok":
            lines.append(f"{'':<{w}}  {'':<6}  hint: {c.hint}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    lines.append(f"\n{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, {counts['n/a']} n/a")
    return "\n".join(lines)


def to_json(checks: list[Check], ctx: Context) -> str:
    return json.dumps({"schema": "gsrun.doctor/1", "host": socket.gethostname(),
                       "host_root": str(ctx.hostfs.root), "time": int(time.time()),
                       "checks": [asdict(c) for c in checks],
                       "counts": {s: sum(1 for c in checks if c.status == s) for s in STATUSES}},
                      indent=1, default=str)


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0
