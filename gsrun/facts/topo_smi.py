"""Fallback parser of ``nvidia-smi topo -m`` (field case 2), used only when
NVML and sysfs leave a GPU's locality unknown. The layout varies with the
driver: rows split on *single* TABs (a blank ``CPU Affinity`` is data, case
3); link columns counted from the header, the rest named from both ends;
ANSI underlines stripped; the ``Legend:`` block ends the table (``NIC
Legend`` read). ``N/A`` and blanks are None. ``GPU NUMA ID`` is the GPU's own
memory node, never a CPU target (case 4). :func:`run_topo_matrix` is the one
subprocess call.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from gsrun.base.cpulist import parse_cpulist
from gsrun.base.errors import InputError

_ANSI = re.compile(r"\x1b?\[[0-9;]*m")
_DEV_COL = re.compile(r"^(GPU|NIC)[0-9]+$|^mlx[0-9_]+$")


@dataclass(frozen=True)
class SmiGpuRow:
    """One ``GPUn`` row. ``index`` is nvidia-smi's index (NVML order);
    ``cpus`` None when blank or ``N/A``; ``numa_node`` the CPU-side node
    (``NUMA Affinity``); ``gpu_numa_id`` the GPU's own node (Grace only)."""

    index: int
    links: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None
    numa_node: int | None = None
    gpu_numa_id: int | None = None


@dataclass(frozen=True)
class SmiTopo:
    gpus: list[SmiGpuRow]
    nics: dict[str, str]  # "NIC0" -> "mlx5_0" from the NIC Legend


def _cell(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v in ("", "N/A") else v


def _int_or_none(v: str | None) -> int | None:
    v = _cell(v)
    if v is None:
        return None
    # "0-1" appears for GPUs affine to several nodes: no single node
    return int(v) if v.isdigit() else None


def parse_topo_matrix(text: str) -> SmiTopo:
    """``nvidia-smi topo -m`` output -> :class:`SmiTopo`.

    Raises:
        InputError: no header line with ``CPU Affinity`` (not topo -m output,
            or nvidia-smi printed an error such as the NVML version mismatch).
    """
    lines = [_ANSI.sub("", ln.rstrip("\r\n")) for ln in text.splitlines()]
    header: list[str] | None = None
    rows: list[SmiGpuRow] = []
    nics: dict[str, str] = {}
    in_legend = False
    for ln in lines:
        s = ln.strip()
        if s.startswith("Legend:"):
            in_legend = True
            continue
        if in_legend:
            m = re.match(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$", ln)
            if m:
                nics[m.group(1)] = m.group(2)
            continue
        if header is None:
            if "CPU Affinity" in ln:
                header = [c.strip() for c in ln.split("\t")]
                if header and header[0] == "":
                    header = header[1:]
            continue
        if not s:
            continue
        fields = ln.split("\t")
        name = fields[0].strip()
        m = re.match(r"^GPU([0-9]+)$", name)
        if not m:
            continue  # NIC rows, stray lines
        links_cols = [c for c in header if _DEV_COL.match(c)]
        tail_cols = header[len(links_cols):]
        nl = len(links_cols)
        links = {c: fields[1 + i].strip() for i, c in enumerate(links_cols) if 1 + i < len(fields)}
        tail = fields[1 + nl:]
        named: dict[str, str | None] = {c: None for c in tail_cols}
        if tail_cols and tail:
            named[tail_cols[0]] = tail[0]
            if len(tail_cols) > 1 and len(tail) > 1:
                named[tail_cols[-1]] = tail[-1]
                middle_vals = [v for v in tail[1:-1] if v.strip()]
                middle_cols = tail_cols[1:-1]
                for col, val in zip(reversed(middle_cols), reversed(middle_vals)):
                    named[col] = val
        cpu_text = _cell(named.get("CPU Affinity"))
        cpus = None
        if cpu_text is not None:
            try:
                cpus = parse_cpulist(cpu_text) or None
            except InputError:
                cpus = None
        rows.append(SmiGpuRow(index=int(m.group(1)), links=links, cpus=cpus,
                              numa_node=_int_or_none(named.get("NUMA Affinity")),
                              gpu_numa_id=_int_or_none(named.get("GPU NUMA ID"))))
    if header is None:
        raise InputError("topology", "not nvidia-smi topo -m output",
                         repr(text[:80]), hint="run `nvidia-smi topo -m` by hand to see the error")
    return SmiTopo(gpus=rows, nics=nics)


def run_topo_matrix(timeout_s: float = 10.0) -> str | None:
    """Text of ``nvidia-smi topo -m`` on the live host, or None when
    nvidia-smi is missing, fails (exit 18: driver/library mismatch) or times
    out (a wedged driver)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True,
                           timeout=timeout_s, check=False, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None
