"""Node tuning per job: apply in the prolog, restore exactly in the epilog.

Every setting is a get/set pair (:class:`Knob`): ``read`` (fact), ``apply`` and
``restore`` (effects), ``matches``/``is_prior`` (pure). A job's tuning goes

    read facts -> plan (pure, :func:`plan_tuning`) -> journal prior value
    (atomic write + fsync) -> write -> read back and verify

Settings (all node-wide; the files are read/written through
:class:`gsrun.facts.hostfs.HostFS`, so ``--host-root DIR`` keeps every access under DIR):

- ``governor``: ``/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor`` for
  each CPU that has it, allowed = ``scaling_available_governors`` (all CPUs).
  A CPU whose governor cannot be read (EINVAL on some intel_pstate boxes) has
  an unknown prior: it is never written, it is skipped and reported, and the
  other CPUs proceed.
- ``swappiness``: ``/proc/sys/vm/swappiness`` (0-200).
- ``swap`` (``off``): ``swapoff`` of each device in ``/proc/swaps``, only when
  ``MemAvailable`` covers ``SwapTotal - SwapFree`` (``/proc/meminfo``); else
  swap stays on and ``swappiness`` is lowered instead (reason reported).
- ``dirty_ratio`` / ``dirty_background_ratio``: ``/proc/sys/vm/dirty_*``. The
  kernel keeps either the ratio or the ``_bytes`` form (writing one zeroes
  the other), so the journal records which form was in use and restore writes
  that one.
- ``thp`` / ``thp_defrag``: ``/sys/kernel/mm/transparent_hugepage/{enabled,defrag}``,
  or RHEL 6's ``/sys/kernel/mm/redhat_transparent_hugepage/`` where only that
  exists (:func:`thp_dir`); the current value is the bracketed word, allowed =
  the words in the file.
- ``zone_reclaim_mode``: ``/proc/sys/vm/zone_reclaim_mode`` (0-7).

A setting missing on the host (no cpufreq in a VM, no swap) is "unsupported",
never an error. A setting whose prior value cannot be read is never written:
no path through prolog and epilog ends with a setting different from before.

State (``<state_dir>/tuning/``, ``state_dir`` from ``--state-dir`` or
``$GSRUN_STATE_DIR``, default ``/run/gsrun``; every file a journal of
:mod:`gsrun.node.journal`: header with format, kind and boot id):

- ``lock``: ``fcntl.flock`` taken by every prolog/epilog/restore; a crashed
  holder's lock is released by the kernel.
- ``jobs/<job_id>.json``: one journal per job that ran the prolog here. The
  set of these files *is* the reference count (no counter that can drift).
- ``baseline.json``: the node baseline, an ordered list of entries
  ``{key, prior, value, owner, holders}``. An entry is written (fsync'd)
  *before* its setting is changed, so a crash at any point leaves a journal
  that restores the node. The first job changing a setting records its
  prior value; later jobs asking the same value reuse it (join ``holders``),
  a different value is refused (first job wins). The last job out restores
  the entries in reverse order and removes the file. A baseline written
  before the last reboot (its boot id is not this boot's) describes settings
  the reboot already reset: it is dropped, never written back.
"""

from __future__ import annotations

import errno
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path

from gsrun.base.errors import GsrunError, InputError, NodeError
from gsrun.base.frozen import Frozen, Slotted, factory
from gsrun.base.ids import check_job_id, is_digits
from gsrun.base.fsutil import ensure_dir
from gsrun.node.journal import Journal, boot_id as journal_boot_id
from gsrun.request.tune import TUNE_KEYS, check_tune_value, parse_tune_request

TYPE_CHECKING = False   # not `typing` at run time (the prolog imports this module for every job)
if TYPE_CHECKING:
    from typing import Any

JOURNAL_VERSION = 1
LOCK_TIMEOUT_S = 30.0
SWAP_TIMEOUT_S = 60.0
# When swap=off is unsafe (swapped pages would not fit in MemAvailable) the
# job gets this swappiness instead, unless it asked for one itself.
SWAP_FALLBACK_SWAPPINESS = "1"
# patterns, compiled (and cached by `re`) where they are used: a job that asks no tuning
# reads swappiness only, and its prolog imports no `re`
_CPU = r"^cpu[0-9]+$"

VM = "proc/sys/vm"
THP = "sys/kernel/mm/transparent_hugepage"
#: THP directories in the order tried: mainline, then RHEL 6's backport
THP_DIRS = (THP, "sys/kernel/mm/redhat_transparent_hugepage")
CPU = "sys/devices/system/cpu"
# form pairs: writing one zeroes the other (kernel mm/page-writeback.c handlers)
DIRTY_SIBLING = {f"{VM}/dirty_ratio": f"{VM}/dirty_bytes", f"{VM}/dirty_bytes": f"{VM}/dirty_ratio",
                 f"{VM}/dirty_background_ratio": f"{VM}/dirty_background_bytes",
                 f"{VM}/dirty_background_bytes": f"{VM}/dirty_background_ratio"}
BRACKET_FILES = {f"{d}/{f}" for d in THP_DIRS for f in ("enabled", "defrag")}


# --------------------------------------------------------------------------- facts

def bracket_word(text: str | None) -> str | None:
    """``"always [madvise] never"`` -> ``"madvise"``; None if no bracketed word."""
    import re

    if text is None:
        return None
    m = re.search(r"\[([^\]\s]+)\]", text)
    return m.group(1) if m else None


def bracket_choices(text: str | None) -> list[str]:
    """``"always [madvise] never"`` -> ``["always", "madvise", "never"]``."""
    return [] if text is None else [w.strip("[]") for w in text.split()]


def read_meminfo_kb(hostfs) -> dict[str, int]:
    """``/proc/meminfo`` as ``{"MemAvailable": kB, ...}`` (``{}`` if absent;
    :func:`gsrun.facts.hostfs.meminfo_kb`)."""
    from gsrun.facts.hostfs import meminfo_kb

    return meminfo_kb(hostfs.read("proc/meminfo") or "")


def _unescape_swaps(name: str) -> str:
    # /proc/swaps escapes space, tab, newline, backslash as \ooo
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), name)


def read_swaps(hostfs) -> list[dict] | None:
    """Active swap areas from ``/proc/swaps``: ``[{"name": path, "type":
    "partition"|"file", "size_kb", "used_kb", "priority", "line"}]`` in file
    order; ``[]`` with no swap; None if ``/proc/swaps`` is absent."""
    text = hostfs.read("proc/swaps")
    if text is None:
        return None
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        try:
            out.append({"name": _unescape_swaps(parts[0]), "type": parts[1], "size_kb": int(parts[2]),
                        "used_kb": int(parts[3]), "priority": int(parts[4]), "line": line})
        except ValueError:
            continue
    return out


def thp_dir(hostfs) -> str:
    """The THP sysfs directory of this host: ``sys/kernel/mm/transparent_hugepage``,
    else RHEL 6's ``sys/kernel/mm/redhat_transparent_hugepage`` where only
    that exists (the mainline path when neither does)."""
    for d in THP_DIRS:
        if hostfs.exists(f"{d}/enabled"):
            return d
    return THP


def governor_cpus(hostfs) -> list[str]:
    """CPU dir names (``cpu0`` ...) that have ``cpufreq/scaling_governor``, numeric order."""
    cpus = [c for c in hostfs.listdir(CPU) if c.startswith("cpu") and is_digits(c[3:], None)
            and hostfs.exists(f"{CPU}/{c}/cpufreq/scaling_governor")]
    return sorted(cpus, key=lambda c: int(c[3:]))


# --------------------------------------------------------------------------- effects: writes

def kernel_write(hostfs, rel: str, value: str) -> None:
    """Write ``value`` to a /proc or /sys file like ``echo value > file``.

    On the live host this is :meth:`HostFS.write`. Under a fake root it also
    shows back what the kernel would: THP files keep all choices with the new
    one bracketed (an unknown word is ``EINVAL``), and writing a dirty ratio
    zeroes its ``_bytes`` sibling (and vice versa) when the value changed.

    Raises:
        OSError: EINVAL (value refused), EROFS/EACCES (read-only, not root).
    """
    if hostfs.is_real:
        hostfs.write(rel, value)
        return
    if rel in BRACKET_FILES:
        old = hostfs.read(rel)
        choices = bracket_choices(old)
        if value not in choices:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(hostfs.path(rel)))
        hostfs.write(rel, " ".join(f"[{w}]" if w == value else w for w in choices))
        return
    sibling = DIRTY_SIBLING.get(rel)
    old = hostfs.read(rel) if sibling else None
    hostfs.write(rel, value)
    if sibling and (old or "").strip() != value.strip() and (hostfs.read(sibling) or "0").strip() != "0":
        hostfs.write(sibling, "0")


class SwapEffect:
    """``swapoff``/``swapon`` of named devices, each run with a timeout and
    never through a shell. Inject another object with ``off``/``on`` to test."""

    def __init__(self, timeout_s: float = SWAP_TIMEOUT_S):
        self.timeout_s = timeout_s

    @staticmethod
    def _bin(name: str) -> str:
        for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
            p = os.path.join(d, name)
            if os.access(p, os.X_OK):
                return p
        import shutil

        found = shutil.which(name)
        if not found:
            raise NodeError("tune", f"{name} not found", "looked in /usr/sbin, /sbin and PATH",
                            hint="install util-linux")
        return found

    def _run(self, argv: list[str]) -> None:
        from gsrun.base.proc import run_bounded

        rc, out, err = run_bounded(argv, self.timeout_s)
        if rc is None:
            raise NodeError("tune", "timed out", f"{argv[0]} after {self.timeout_s:g} s")
        if rc != 0:
            raise NodeError("tune", f"{os.path.basename(argv[0])} failed",
                            f"exit {rc}: {(err or out).strip()[:300]}")

    def off(self, hostfs, devices: list[dict]) -> None:
        for d in devices:
            _check_swap_name(d["name"])
            self._run([self._bin("swapoff"), "--", d["name"]])

    def on(self, hostfs, devices: list[dict]) -> None:
        for d in devices:
            _check_swap_name(d["name"])
            argv = [self._bin("swapon")]
            if int(d.get("priority", -1)) >= 0:
                argv += ["-p", str(int(d["priority"]))]
            self._run(argv + ["--", d["name"]])


class FakeSwapEffect:
    """Swap effect for a fake host root: edits ``<root>/proc/swaps`` (lines
    removed on ``off``, the journaled lines put back in their order on ``on``)
    and never runs ``swapoff``. Not a test double: it is what ``--host-root``
    (the local test cluster's emulated nodes, ``gsrun-node prolog --host-root``)
    does for ``swap=off``, as the fake NVML backend is for GPUs, so it stays in
    the package (:func:`default_swap_effect` picks it)."""

    def off(self, hostfs, devices: list[dict]) -> None:
        names = {d["name"] for d in devices}
        text = hostfs.read("proc/swaps") or ""
        lines = text.splitlines()
        keep = lines[:1] + [ln for ln in lines[1:] if ln.split() and _unescape_swaps(ln.split()[0]) not in names]
        hostfs.write("proc/swaps", "\n".join(keep))

    def on(self, hostfs, devices: list[dict]) -> None:
        lines = (hostfs.read("proc/swaps") or "").splitlines()
        head, body = lines[:1], lines[1:]
        active = {_unescape_swaps(ln.split()[0]): ln for ln in body if ln.split()}
        for d in devices:
            active.setdefault(d["name"], d["line"])
        order = [d["name"] for d in devices]
        ordered = [active[n] for n in order if n in active] + [ln for n, ln in active.items() if n not in order]
        hostfs.write("proc/swaps", "\n".join(head + ordered))


def _check_swap_name(name: str) -> None:
    if not name.startswith("/") or "\n" in name or "\0" in name or ".." in name.split("/"):
        raise NodeError("tune", "refusing swap device", repr(name))


def default_swap_effect(hostfs):
    """:class:`SwapEffect` on the live host, :class:`FakeSwapEffect` under a fake root."""
    return SwapEffect() if hostfs.is_real else FakeSwapEffect()


# --------------------------------------------------------------------------- knobs (get/set pairs)

class Knob(ABC):
    """One setting: a get/set pair. Values are JSON-able; ``read`` returns
    None when the setting does not exist on this host."""

    key = ""
    unsupported_reason = "not supported here"

    @abstractmethod
    def read(self, h) -> Any:
        """Current value (None: not on this host)."""

    def supported(self, current) -> bool:
        return current is not None

    def choices(self, h) -> list[str] | None:
        """Values the kernel offers here (None: fixed range, checked by syntax)."""
        return None

    def matches(self, current, target: str) -> bool:
        return current == target

    def is_prior(self, current, prior) -> bool:
        return current == prior

    @abstractmethod
    def apply(self, h, target: str, swap) -> None:
        """Write ``target``."""

    @abstractmethod
    def restore(self, h, prior, swap) -> None:
        """Write back the journaled ``prior`` value."""


class FileKnob(Knob):
    def __init__(self, key: str, rel: str, what: str):
        self.key, self.rel = key, rel
        self.unsupported_reason = f"not supported here ({what}: /{rel} absent)"

    def read(self, h):
        v = h.read(self.rel)
        return None if v is None else v.strip()

    def apply(self, h, target, swap):
        kernel_write(h, self.rel, target)

    def restore(self, h, prior, swap):
        kernel_write(h, self.rel, prior)


class BracketKnob(FileKnob):
    def read(self, h):
        return bracket_word(h.read(self.rel))

    def choices(self, h):
        return bracket_choices(h.read(self.rel))


class ThpKnob(BracketKnob):
    """``enabled`` or ``defrag`` in :func:`thp_dir` (mainline or RHEL 6 path)."""

    def __init__(self, key: str, name: str):
        super().__init__(key, f"{THP}/{name}", "transparent hugepages")
        self.name = name
        self.unsupported_reason = ("not supported here (transparent hugepages: neither "
                                   f"/{THP_DIRS[0]}/{name} nor /{THP_DIRS[1]}/{name})")

    def _rel(self, h) -> str:
        return f"{thp_dir(h)}/{self.name}"

    def read(self, h):
        return bracket_word(h.read(self._rel(h)))

    def choices(self, h):
        return bracket_choices(h.read(self._rel(h)))

    def apply(self, h, target, swap):
        kernel_write(h, self._rel(h), target)

    def restore(self, h, prior, swap):
        kernel_write(h, self._rel(h), prior)


class DirtyKnob(Knob):
    """Ratio with its ``_bytes`` sibling; value ``{"form": "ratio"|"bytes", "value": "N"}``."""

    def __init__(self, key: str):
        self.key = key
        self.ratio = f"{VM}/{key}"
        self.bytes = f"{VM}/{key.replace('_ratio', '_bytes')}"
        self.unsupported_reason = f"not supported here (/{self.ratio} absent)"

    def read(self, h):
        r = h.read(self.ratio)
        if r is None:
            return None
        b = (h.read(self.bytes) or "0").strip()
        if b not in ("", "0"):
            return {"form": "bytes", "value": b}
        return {"form": "ratio", "value": r.strip()}

    def matches(self, current, target):
        return current == {"form": "ratio", "value": target}

    def apply(self, h, target, swap):
        kernel_write(h, self.ratio, target)

    def restore(self, h, prior, swap):
        kernel_write(h, self.bytes if prior["form"] == "bytes" else self.ratio, prior["value"])


class GovernorKnob(Knob):
    """Value: ``{"cpu0": "powersave", ...}`` for CPUs with cpufreq; target a name."""

    key = "governor"
    unsupported_reason = "not supported here (no cpufreq/scaling_governor, e.g. a VM)"

    def read(self, h):
        """``{cpu: governor}`` of the CPUs whose governor reads back (a CPU
        whose read fails or is empty is left out: its prior is unknown, so
        it is never written); None when no CPU has a readable governor."""
        out = {}
        for c in governor_cpus(h):
            v = (h.read(f"{CPU}/{c}/cpufreq/scaling_governor") or "").strip()
            if v:
                out[c] = v
        return out or None

    def unreadable(self, h) -> list[str]:
        """CPUs with a ``scaling_governor`` file that cannot be read (EINVAL
        on some intel_pstate boxes): skipped, never written."""
        return [c for c in governor_cpus(h)
                if not (h.read(f"{CPU}/{c}/cpufreq/scaling_governor") or "").strip()]

    def choices(self, h):
        sets = []
        for c in governor_cpus(h):
            t = h.read(f"{CPU}/{c}/cpufreq/scaling_available_governors")
            if t is not None:
                sets.append(t.split())
        if not sets:
            return []
        common = [g for g in sets[0] if all(g in s for s in sets[1:])]
        return common

    def matches(self, current, target):
        return bool(current) and all(v == target for v in current.values())

    def is_prior(self, current, prior):
        current = current or {}
        return all(current.get(c, v) == v for c, v in prior.items())

    def apply(self, h, target, swap):
        for c, v in (self.read(h) or {}).items():  # readable CPUs only: a prior is known
            if v != target:
                kernel_write(h, f"{CPU}/{c}/cpufreq/scaling_governor", target)

    def restore(self, h, prior, swap):
        for c, v in prior.items():
            rel = f"{CPU}/{c}/cpufreq/scaling_governor"
            if h.exists(rel) and (h.read(rel) or "").strip() != v:
                kernel_write(h, rel, v)


class SwapKnob(Knob):
    """Value: the active swap areas (list from :func:`read_swaps`); target ``off``."""

    key = "swap"
    unsupported_reason = "not supported here (no active swap in /proc/swaps)"

    def read(self, h):
        return read_swaps(h)

    def supported(self, current):
        return bool(current)

    def matches(self, current, target):
        return target == "off" and current == []

    def is_prior(self, current, prior):
        names = {d["name"] for d in (current or [])}
        return all(d["name"] in names for d in prior)

    def apply(self, h, target, swap):
        swap.off(h, read_swaps(h) or [])

    def restore(self, h, prior, swap):
        names = {d["name"] for d in (read_swaps(h) or [])}
        missing = [d for d in prior if d["name"] not in names]
        if missing:
            swap.on(h, missing)


# --------------------------------------------------------------------------- job-scoped knobs (issue 20)
#
# cstate, irq and hugepages depend on the job (its GPUs, the NICs gsrun picked
# for them, its CPUs): each has ``resolve(h, value, scope)``, which turns the
# request word into a concrete target (the files to write and their values),
# called once by :func:`read_facts`; the journal entry keeps that ``target``
# beside ``value``, and its ``prior`` holds only the files the target touches.

NODE = "sys/devices/system/node"
IRQ = "proc/irq"
PCI = "sys/bus/pci/devices"
DMA_LATENCY = "dev/cpu_dma_latency"
_STATE = r"^state[0-9]+$"
_HP_DIR = r"^hugepages-([0-9]+)kB$"


class JobScope(Frozen):
    """The job's devices and CPUs on this node, for ``cstate``/``irq``/``hugepages``.

    devices: ``[{"bdf": "0000:00:06.0", "kind": "gpu"|"nic", "name": str,
    "numa_node": int | None}]`` (the job's GPUs from ``SLURM_JOB_GPUS``, the
    NICs :func:`gsrun.bind.plan.make_plan` picks for them; sysfs
    ``numa_node``, None when the kernel says -1).
    cpus: the job's CPUs here (its cgroup cpuset; all online CPUs when the
    cgroup is not there yet -- these settings are for jobs holding the node).
    node_cpus: NUMA node -> its CPUs (``sys/devices/system/node/nodeN/cpulist``).
    cpus_source: where ``cpus`` came from (shown in reasons).
    """
    __slots__ = ("devices", "cpus", "node_cpus", "cpus_source")
    _defaults = {"devices": factory(list), "cpus": factory(list), "node_cpus": factory(dict), "cpus_source": ""}

    def device_node(self, dev: dict) -> int | None:
        """The device's NUMA node; with one node on the host, that node
        (a VM's ``numa_node`` -1 then means "the only one")."""
        n = dev.get("numa_node")
        if isinstance(n, int) and n in self.node_cpus:
            return n
        return next(iter(self.node_cpus)) if len(self.node_cpus) == 1 else None

    def gpu_nodes(self) -> list[int]:
        """NUMA nodes of the job's GPUs (known ones), ascending."""
        return sorted({n for d in self.devices if d.get("kind") == "gpu"
                       for n in [self.device_node(d)] if n is not None})

    def to_dict(self) -> dict:
        return {n: _plain(getattr(self, n)) for n in self.__slots__}


def _plain(v):
    """``v`` with its dicts, lists and tuples copied all the way down (what
    ``dataclasses.asdict`` did to the fields)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


def scope_from_dict(d: dict | None) -> JobScope | None:
    if not isinstance(d, dict):
        return None
    return JobScope([dict(x) for x in d.get("devices") or []], [int(c) for c in d.get("cpus") or []],
                    {int(k): [int(c) for c in v] for k, v in (d.get("node_cpus") or {}).items()},
                    str(d.get("cpus_source") or ""))


def _dict_shortfall(after, target, what) -> str:
    bad = [f"{k}={(after or {}).get(k, '-')}" for k in target if not _dict_value_ok(after, k, target[k], what)]
    return ", ".join(bad[:6]) + (f" (+{len(bad) - 6})" if len(bad) > 6 else "")


def _dict_value_ok(after, k, want, what) -> bool:
    got = (after or {}).get(k)
    if got is None:
        return False
    if what == "hugepages":
        return got.isdigit() and int(got) >= int(want)
    if what == "irq" and not k.startswith(BAN_PREFIX):
        return _cpuset(got) == _cpuset(want)
    return got == want


def _cpuset(text) -> frozenset | None:
    from gsrun.base.cpulist import parse_cpulist

    try:
        return frozenset(parse_cpulist(text))
    except InputError:
        return None


class ScopedKnob(Knob):
    """A knob whose target depends on the job: value = ``{file key: text}``
    of the files it governs; ``resolve`` picks the files and their target."""

    what = ""

    @abstractmethod
    def resolve(self, h, value: str, scope: JobScope | None) -> tuple[str, Any, str]:
        """``("ok", target, note)``, ``("unsupported", None, why)`` or ``("refused", None, why)``."""

    def prior_of(self, current, target):
        return {k: (current or {}).get(k) for k in target}

    def matches(self, current, target):
        return isinstance(target, dict) and bool(target) and all(
            _dict_value_ok(current, k, v, self.what) for k, v in target.items())

    def is_prior(self, current, prior):
        # a file gone since (an IRQ freed, a CPU offlined) has nothing to restore
        return all((current or {}).get(k, v) == v or v is None for k, v in prior.items())

    def shortfall(self, after, target) -> str:
        return _dict_shortfall(after, target, self.what)

    @abstractmethod
    def _rel(self, k: str) -> str:
        """The host-root-relative file of part ``k`` of the setting."""

    def apply(self, h, target, swap):
        for k, v in target.items():
            kernel_write(h, self._rel(k), v)

    def restore(self, h, prior, swap):
        for k, v in prior.items():
            rel = self._rel(k)
            if v is None or not h.exists(rel):
                continue
            cur = h.read(rel)
            if cur is None or cur.strip() != v:
                kernel_write(h, rel, v)


def _cpu_dirs(h) -> list[str]:
    import re

    return sorted((c for c in h.listdir(CPU) if re.match(_CPU, c)), key=lambda c: int(c[3:]))


def idle_states(h) -> dict[str, list[tuple[str, int | None, str]]]:
    """``{"cpu0": [("state0", exit latency us or None, "POLL"), ...]}`` for every CPU
    with switchable idle states (``cpuN/cpuidle/stateK/disable`` present; ``latency``
    and ``name`` beside it). Empty with the cpuidle driver ``none`` (most VMs)."""
    import re

    out = {}
    for c in _cpu_dirs(h):
        names = sorted((s for s in h.listdir(f"{CPU}/{c}/cpuidle") if re.match(_STATE, s)), key=lambda s: int(s[5:]))
        rows = []
        for s in names:
            if h.exists(f"{CPU}/{c}/cpuidle/{s}/disable"):
                rows.append((s, h.read_int(f"{CPU}/{c}/cpuidle/{s}/latency"),
                             (h.read(f"{CPU}/{c}/cpuidle/{s}/name") or "").strip()))
        if rows:
            out[c] = rows
    return out


class CstateKnob(ScopedKnob):
    """Idle states per CPU: value ``{"cpu0/state2": "0"|"1", ...}`` from
    ``cpuN/cpuidle/stateK/disable`` (1 = the kernel will not enter it).

    ``off``: every state with exit latency > 0 us is disabled (POLL stays);
    ``c1``: only POLL and the first state above it stay; ``shallow``: states
    with ``latency`` (exit latency, us) <= ``CSTATE_SHALLOW_US`` stay. States
    already disabled stay disabled (the target only ever adds ``1``s).
    The other half of ``cstate``, holding ``/dev/cpu_dma_latency`` open, is
    :func:`cstate_hold_us` (the sampler holds the file).
    """

    key = "cstate"
    what = "cstate"
    unsupported_reason = "not supported here (no cpuN/cpuidle/stateK/disable: cpuidle driver none, e.g. a VM)"

    def _rel(self, k):
        cpu, state = k.split("/")
        return f"{CPU}/{cpu}/cpuidle/{state}/disable"

    def _states(self, h) -> dict[str, list[tuple[str, int | None, str]]]:
        return idle_states(h)

    def read(self, h):
        st = self._states(h)
        if not st:
            return None
        return {f"{c}/{s}": (h.read(f"{CPU}/{c}/cpuidle/{s}/disable") or "").strip()
                for c, rows in st.items() for s, _, _ in rows}

    def resolve(self, h, value, scope):
        from gsrun.request.tune import CSTATE_SHALLOW_US

        st = self._states(h)
        hold = h.exists(DMA_LATENCY)
        if not st:
            why = self.unsupported_reason
            if hold:
                why += f"; /dev/cpu_dma_latency held at {cstate_hold_us(value)} us by the job's sampler instead"
            return "unsupported", None, why
        target = {}
        for c, rows in st.items():
            first_real = next((i for i, (_, lat, name) in enumerate(rows) if name != "POLL" and lat != 0), None)
            for i, (s, lat, name) in enumerate(rows):
                deep = lat is None or lat > 0
                if value == "c1":
                    deep = name != "POLL" and lat != 0 and (first_real is None or i > first_real)
                elif value == "shallow":
                    deep = lat is None or lat > CSTATE_SHALLOW_US
                if deep:
                    target[f"{c}/{s}"] = "1"
        if not target:
            return "ok", {}, "no idle state deeper than asked"
        note = f"{len(target)} idle states disabled on {len(st)} cpus"
        if hold:
            note += f"; /dev/cpu_dma_latency held at {cstate_hold_us(value)} us by the sampler"
        return "ok", target, note

    def matches(self, current, target):
        return isinstance(target, dict) and all(_dict_value_ok(current, k, v, self.what) for k, v in target.items())


def cstate_hold_us(value: str) -> int:
    """Latency (us) the sampler writes to ``/dev/cpu_dma_latency`` for
    ``cstate=value``: ``off`` 0, ``c1`` 1, ``shallow`` ``CSTATE_SHALLOW_US``.
    The kernel keeps CPUs out of idle states with a longer exit latency
    while the file is open (Documentation/power/pm_qos_interface.rst)."""
    from gsrun.request.tune import CSTATE_SHALLOW_US

    return {"off": 0, "c1": 1}.get(value, CSTATE_SHALLOW_US)


def pids_by_comm(h, comm: str) -> list[int]:
    """PIDs whose ``/proc/<pid>/comm`` is ``comm`` (under the host root), ascending."""
    out = []
    for p in h.listdir("proc"):
        if p.isdigit() and (h.read(f"proc/{p}/comm") or "").strip() == comm:
            out.append(int(p))
    return sorted(out)


def irqbalance_pids(h) -> list[int]:
    """PIDs whose ``/proc/<pid>/comm`` is ``irqbalance`` (under the host root)."""
    return pids_by_comm(h, "irqbalance")


IRQBALANCE_POLICY_SCRIPT = "/usr/local/libexec/gsrun-irqbalance-policy"   # tuning.irqbalance_policy_script
IRQ_BAN_DIR = "/run/gsrun/irqbalance-ban"                                  # tuning.irqbalance_ban_dir
BAN_PREFIX = "ban:"      # an irq part that is a ban file: "ban:/run/gsrun/irqbalance-ban/45"
BAN_PRESENT, BAN_ABSENT = "present", "absent"


def irqbalance_policy_script(h, pid: int) -> str | None:
    """The policy script irqbalance ``pid`` was started with: the argument of
    ``-l X``, ``-lX``, ``--policyscript=X`` or ``--policyscript X`` in
    ``/proc/<pid>/cmdline`` (NUL-separated; under the host root). None
    without one, or when the command line cannot be read."""
    raw = h.read(f"proc/{int(pid)}/cmdline")
    if not raw:
        return None
    argv = raw.split("\0")
    for i, a in enumerate(argv[1:], 1):
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a in ("-l", "--policyscript"):
            return nxt or None
        if a.startswith("--policyscript="):
            return a.split("=", 1)[1] or None
        if a.startswith("-l") and not a.startswith("--"):
            return a[2:] or None
    return None


def irqbalance_ban_dir_of(h, pid: int) -> str | None:
    """``GSRUN_IRQ_BAN_DIR`` in irqbalance's environment (``/proc/<pid>/environ``), the
    policy script's ban directory when set; None when unset or unreadable."""
    raw = h.read(f"proc/{int(pid)}/environ")
    for kv in (raw or "").split("\0"):
        if kv.startswith("GSRUN_IRQ_BAN_DIR="):
            return kv.split("=", 1)[1] or None
    return None


def irqbalance_check(h, policy_script: str, ban_dir: str) -> tuple[list[int], str | None]:
    """``(pids, problem)``: the running irqbalance daemons and, when one of them would
    undo ``irq=local``, why (None: none runs, or each was started with gsrun's
    ``policy_script`` -- which must exist under the host root -- and its ban directory
    is ``ban_dir``). The problem text ends with the fix."""
    pids = irqbalance_pids(h)
    for pid in pids:
        script = irqbalance_policy_script(h, pid)
        if script != policy_script:
            got = f"with policy script {script}" if script else "without a policy script"
            return pids, (f"irqbalance runs {got} and would move the IRQs back within 10 s; "
                          f"fix: start it with --policyscript={policy_script} (gsrun-node install puts the "
                          "script there; docs/ADMIN.md, irqbalance), or stop it on exclusive GPU nodes")
        if not h.exists(policy_script.lstrip("/")):
            return pids, (f"irqbalance runs with --policyscript={policy_script}, which is missing; "
                          "fix: gsrun-node install (it installs the script), then restart irqbalance")
        env_dir = irqbalance_ban_dir_of(h, pid)
        if env_dir not in (None, ban_dir):
            return pids, (f"irqbalance runs with GSRUN_IRQ_BAN_DIR={env_dir}, not "
                          f"tuning.irqbalance_ban_dir {ban_dir}; fix: make them the same")
    return pids, None


def _write_ban(h, rel: str, job_note: str) -> None:
    """Create one ban file (atomic: temp file, fsync, rename; directory made 0755)."""
    from gsrun.base.fsutil import atomic_write

    p = h.path(rel)
    os.makedirs(p.parent.parent, mode=0o755, exist_ok=True)     # /run/gsrun: the state dir, normally there
    ensure_dir(p.parent, 0o755, uid=os.geteuid(), gid=os.getegid())
    atomic_write(p, job_note, mode=0o644)


def _remove_ban(h, rel: str) -> None:
    """Remove one ban file, and its directory once empty (it lives in /run: nothing to keep)."""
    p = h.path(rel)
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    try:
        os.rmdir(p.parent)
    except OSError:     # other ban files (an admin's), or gone
        pass


def irqbalance_rescan(h) -> str:
    """Ask every running irqbalance to rescan (``SIGHUP``): it runs the policy script
    for every IRQ again, so ban files written or removed since take effect. Only on
    the live host (under a host root no real process is signalled). irqbalance ignores
    a ``SIGHUP`` until it has finished one balancing pass since its start or its last
    rescan (``force_rescan`` tests ``cycle_count``): a ban then takes effect at a later
    rescan (docs/ADMIN.md, irqbalance). Returns what was done, for the item's reason."""
    import signal

    pids = irqbalance_pids(h)
    if not pids:
        return ""
    if not h.is_real:
        return "irqbalance rescan not signalled (host root)"
    sent = []
    for pid in pids:
        if (h.read(f"proc/{pid}/comm") or "").strip() != "irqbalance":   # gone or reused since listed
            continue
        try:
            os.kill(pid, signal.SIGHUP)
            sent.append(str(pid))
        except OSError:
            continue
    return "irqbalance asked to rescan (SIGHUP)" if sent else ""


class IrqKnob(ScopedKnob):
    """IRQ affinity: value ``{"42": "0-15", ...}`` from
    ``/proc/irq/N/smp_affinity_list`` for every IRQ that has one, and
    ``{"ban:<ban dir>/42": "present"}`` for every ban file in :attr:`ban_dir`.

    ``local``: each MSI/MSI-X IRQ of the job's devices (``sys/bus/pci/devices/
    <bdf>/msi_irqs/N``) goes to the job's CPUs on the device's NUMA node.
    Skipped with a reason: a device without MSI IRQs, with its NUMA node
    unknown on a multi-node host or without job CPUs there, an IRQ without
    ``smp_affinity_list``, and at write time an IRQ the kernel refuses
    (EIO: a kernel-managed IRQ; EINVAL; EACCES/EPERM/EROFS).

    irqbalance rewrites affinities every 10 s. While it runs, ``irq=local`` is
    applied only when every irqbalance was started with gsrun's policy script
    (:attr:`policy_script`, ``-l``/``--policyscript=``; :func:`irqbalance_check`):
    then the target also holds one ban file per pinned IRQ
    (``<ban dir>/<N>``, prior ``absent``), written before the masks and journaled
    with them, and irqbalance is asked to rescan (:func:`irqbalance_rescan`);
    restore removes the files, puts the masks back and asks again. Otherwise
    it is refused with the reason and the fix (docs/ADMIN.md, irqbalance).
    """

    key = "irq"
    what = "irq"
    unsupported_reason = "not supported here (no /proc/irq)"

    def __init__(self):
        self.configure()

    def configure(self, policy_script: str | None = None, ban_dir: str | None = None) -> None:
        """Set the policy script and ban directory (absolute paths on the node,
        ``tuning.irqbalance_*``; None: the defaults). Called by every entry point,
        so no value outlives one prolog, epilog or restore.

        Raises:
            InputError: a path that is not absolute or has ``..`` parts.
        """
        for v in (policy_script, ban_dir):
            if v is not None and (not v.startswith("/") or ".." in v.split("/") or "\0" in v or "\n" in v):
                raise InputError("tune", "bad irqbalance path", repr(v)[:120])
        self.policy_script = policy_script or IRQBALANCE_POLICY_SCRIPT
        self.ban_dir = (ban_dir or IRQ_BAN_DIR).rstrip("/") or "/"

    def _rel(self, k):
        if k.startswith(BAN_PREFIX):
            return k[len(BAN_PREFIX):].lstrip("/")
        return f"{IRQ}/{k}/smp_affinity_list"

    def read(self, h):
        names = [n for n in h.listdir(IRQ) if n.isdigit()]
        if not names:
            return None
        out = {}
        for n in sorted(names, key=int):
            v = h.read(self._rel(n))
            if v is not None:
                out[n] = v.strip()
        for n in sorted((b for b in h.listdir(self.ban_dir.lstrip("/")) if b.isdigit()), key=int):
            out[f"{BAN_PREFIX}{self.ban_dir}/{n}"] = BAN_PRESENT
        return out

    def prior_of(self, current, target):
        return {k: (current or {}).get(k, BAN_ABSENT if k.startswith(BAN_PREFIX) else None) for k in target}

    def is_prior(self, current, prior):
        current = current or {}
        for k, v in prior.items():
            if k.startswith(BAN_PREFIX):
                if current.get(k, BAN_ABSENT) != v:
                    return False
            elif v is not None and current.get(k, v) != v:
                return False
        return True

    def resolve(self, h, value, scope):
        import re

        from gsrun.base.cpulist import format_cpulist

        if not h.listdir(IRQ):
            return "unsupported", None, self.unsupported_reason
        if scope is None or not scope.devices:
            return "unsupported", None, "no GPU of the job found on this node (SLURM_JOB_GPUS)"
        pids, problem = irqbalance_check(h, self.policy_script, self.ban_dir)
        if problem:
            return "refused", None, problem
        job = set(scope.cpus)
        target, skipped = {}, []
        for d in scope.devices:
            bdf = d.get("bdf") or ""
            if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", bdf):
                skipped.append(f"{d.get('name') or bdf!r}: no PCI address")
                continue
            irqs = sorted((n for n in h.listdir(f"{PCI}/{bdf}/msi_irqs") if n.isdigit()), key=int)
            if not irqs:
                skipped.append(f"{bdf}: no MSI IRQs (msi_irqs empty)")
                continue
            node = scope.device_node(d)
            if node is None:
                skipped.append(f"{bdf}: NUMA node unknown (numa_node -1 on a multi-node host)")
                continue
            cpus = sorted(set(scope.node_cpus.get(node, [])) & job)
            if not cpus:
                skipped.append(f"{bdf}: no CPU of the job on NUMA node {node}")
                continue
            for n in irqs:
                if not h.exists(self._rel(n)):
                    skipped.append(f"IRQ {n} ({bdf}): no smp_affinity_list")
                    continue
                target[n] = format_cpulist(cpus)
        note = "; ".join(skipped)
        if not target:
            return "unsupported", None, "no IRQ of the job's devices can be pinned: " + (note or "none found")
        msg = f"{len(target)} IRQs"
        if pids:        # no PID in the text: the report groups nodes by it
            msg += " banned from irqbalance (ban files for its policy script)"
            # banned first (the dict's order is the order of the writes)
            target = {**{f"{BAN_PREFIX}{self.ban_dir}/{n}": BAN_PRESENT for n in target}, **target}
        return "ok", target, msg + (f"; skipped {note}" if note else "")

    def apply(self, h, target, swap):
        """Write the ban files, ask irqbalance to rescan, then the masks. Returns
        ``{"target": the parts written, "note": ...}`` when the kernel refused some
        IRQs (never all: then the first error is raised) or irqbalance was signalled."""
        done, skipped, first, notes = {}, [], None, []
        bans = [k for k in target if k.startswith(BAN_PREFIX)]
        for k in bans:
            _write_ban(h, self._rel(k), "gsrun irq=local\n")
            done[k] = target[k]
        if bans:
            rescan = irqbalance_rescan(h)
            if rescan:
                notes.append(rescan)
        for k, v in target.items():
            if k.startswith(BAN_PREFIX):
                continue
            try:
                kernel_write(h, self._rel(k), v)
                done[k] = v
            except OSError as e:
                if e.errno not in (errno.EIO, errno.EINVAL, errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                first = first or e
                skipped.append(f"IRQ {k}: {errno.errorcode.get(e.errno, e.errno)}"
                               + (" (kernel-managed)" if e.errno == errno.EIO else ""))
        if not any(not k.startswith(BAN_PREFIX) for k in done) and first is not None:
            raise first
        if skipped:
            notes.append("skipped " + "; ".join(skipped))
        return {"target": done, "note": "; ".join(notes)} if notes else None

    def restore(self, h, prior, swap):
        """Remove the ban files the job wrote, put the masks back, ask irqbalance to rescan."""
        bans = False
        for k, v in prior.items():
            if k.startswith(BAN_PREFIX) and v == BAN_ABSENT:
                _remove_ban(h, self._rel(k))
                bans = True
        super().restore(h, {k: v for k, v in prior.items() if not k.startswith(BAN_PREFIX)}, swap)
        if bans:
            irqbalance_rescan(h)


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
        import re

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
        from gsrun.facts.hostfs import meminfo_kb
        from gsrun.request.tune import parse_hugepages

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


def _is_scoped(knob) -> bool:
    return isinstance(knob, ScopedKnob)


# application order; restore is the reverse of what the journal holds
KNOBS: dict[str, Knob] = {k.key: k for k in (
    GovernorKnob(),
    FileKnob("swappiness", f"{VM}/swappiness", "vm.swappiness"),
    DirtyKnob("dirty_ratio"),
    DirtyKnob("dirty_background_ratio"),
    ThpKnob("thp", "enabled"),
    ThpKnob("thp_defrag", "defrag"),
    FileKnob("zone_reclaim_mode", f"{VM}/zone_reclaim_mode", "vm.zone_reclaim_mode"),
    SwapKnob(),
    CstateKnob(),
    IrqKnob(),
    HugepagesKnob(),
)}
assert set(KNOBS) == set(TUNE_KEYS)


# --------------------------------------------------------------------------- facts bundle + policy

class Facts(Frozen):
    """What :func:`plan_tuning` needs from the node (all JSON-able).

    current: key -> value as the knob reads it (None = unsupported).
    choices: key -> words the kernel offers (governors, THP words) or None.
    swap_used_kb / mem_available_kb: ``/proc/meminfo`` SwapTotal-SwapFree / MemAvailable.
    entries: baseline journal entries; live_jobs: job ids with a journal.
    skipped: key -> parts of the setting whose value cannot be read (CPUs
    whose governor read fails): never written, named in the item's reason.
    """
    # targets: job-scoped knobs: key -> value -> [verdict, target, note] (ScopedKnob.resolve)
    __slots__ = ("current", "choices", "swap_used_kb", "mem_available_kb", "entries", "live_jobs", "targets",
                 "skipped")
    _defaults = {"swap_used_kb": 0, "mem_available_kb": 0, "entries": factory(list), "live_jobs": factory(list),
                 "targets": factory(dict), "skipped": factory(dict)}


class Policy(Frozen):
    """From :class:`gsrun.request.config.Config` (``tuning.*``, per partition):
    ``enabled``, ``exclusive_only`` (bool), ``defaults`` (key -> value),
    ``allowed_keys`` (tuple of keys), ``partition`` (str or None)."""

    __slots__ = ("enabled", "exclusive_only", "defaults", "allowed_keys", "partition")
    _defaults = {"enabled": True, "exclusive_only": True, "defaults": factory(dict), "allowed_keys": TUNE_KEYS,
                 "partition": None}

    @classmethod
    def from_config(cls, cfg, partition: str | None) -> "Policy":
        """Raises ConfigError/InputError if ``tuning.defaults`` does not parse."""
        if cfg is None:
            return cls(partition=partition)
        return cls(enabled=bool(cfg.get("tuning.enabled", partition)),
                   exclusive_only=bool(cfg.get("tuning.exclusive_only", partition)),
                   defaults=parse_tune_request(cfg.get("tuning.defaults", partition) or ""),
                   allowed_keys=tuple(cfg.get("tuning.allowed_keys", partition)),
                   partition=partition)


class PlanItem(Slotted):
    """One decision. action: ``apply`` (write), ``unchanged`` (already the
    value; journaled so later jobs see who holds it), ``reuse`` (another job
    set this value), ``refused``, ``unsupported``; after the run also
    ``applied``, ``failed``, ``rolled_back``, ``skipped`` (not attempted after a failure).
    ``source``: ``"request"`` | ``"default"`` | ``"fallback"``; ``holder``: the
    job that set the value (reuse/refused conflict); ``target``: job-scoped
    knobs: the files and values ``value`` resolved to. Mutable (the run
    updates ``action``, ``reason``, ``target``)."""

    __slots__ = ("key", "action", "value", "source", "reason", "prior", "holder", "target")

    def __init__(self, key: str, action: str, value: str | None = None, source: str = "", reason: str = "",
                 prior: Any = None, holder: str | None = None, target: Any = None):
        self.key, self.action, self.value, self.source, self.reason = key, action, value, source, reason
        self.prior, self.holder, self.target = prior, holder, target


    def to_dict(self) -> dict:
        """The fields as a dict (``prior``/``target`` copied), in field order."""
        return {n: _plain(getattr(self, n)) for n in self.__slots__}


# --------------------------------------------------------------------------- decisions (pure)

def plan_tuning(job_id: str, request: dict[str, str], request_error: str | None, policy: Policy,
                exclusive: bool, facts: Facts) -> list[PlanItem]:
    """Decide what to do for each key. Pure: no I/O.

    Per key the job's request is tried first, then the site default; a
    request value that is not allowed is refused (with the reason) and the
    default is used instead. Items come in application order (:data:`KNOBS`).
    """
    items: list[PlanItem] = []
    if request_error:
        items.append(PlanItem("request", "refused", None, "request", request_error))
    if not policy.enabled:
        for k, v in list(request.items()) + list(policy.defaults.items()):
            items.append(PlanItem(k, "refused", v, "request" if k in request else "default",
                                  "tuning disabled (tuning.enabled = false)"))
        return items
    wanted: dict[str, list[tuple[str, str]]] = {}
    for k, v in request.items():
        wanted.setdefault(k, []).append((v, "request"))
    for k, v in policy.defaults.items():
        wanted.setdefault(k, []).append((v, "default"))
    # swap=off unsafe -> swappiness fallback (decided before swappiness is planned)
    swap_ok, swap_why = True, ""
    if any(v == "off" for v, _ in wanted.get("swap", [])) and facts.swap_used_kb > facts.mem_available_kb:
        swap_ok = False
        swap_why = (f"swapped pages ({facts.swap_used_kb} kB) exceed MemAvailable "
                    f"({facts.mem_available_kb} kB); swap stays on, swappiness only")
        if "swappiness" not in wanted:
            wanted["swappiness"] = [(SWAP_FALLBACK_SWAPPINESS, "fallback")]
    live = set(facts.live_jobs) - {job_id}
    by_key = {e["key"]: e for e in facts.entries}
    for key in KNOBS:
        knob = KNOBS[key]
        for value, source in wanted.get(key, []):
            item = _decide(job_id, key, knob, value, source, policy, exclusive, facts, by_key.get(key),
                           live, swap_ok, swap_why)
            items.append(item)
            if item.action != "refused":
                break
    return items


def _decide(job_id, key, knob, value, source, policy, exclusive, facts, entry, live, swap_ok, swap_why):
    def refuse(why, holder=None):
        return PlanItem(key, "refused", value, source, why, holder=holder)

    if source == "request" and key not in policy.allowed_keys:
        where = f" for partition {policy.partition}" if policy.partition else ""
        return refuse(f"key not allowed by tuning.allowed_keys{where}")
    if policy.exclusive_only and not exclusive:
        return refuse("node-wide setting needs a job with the node exclusively (tuning.exclusive_only)")
    problem = check_tune_value(key, value)
    if problem:
        return refuse(problem)
    held_by = [j for j in (entry or {}).get("holders", []) if j in live]
    if entry and held_by:
        if entry["value"] != value:
            return refuse(f"conflicts with {key}={entry['value']} set by running job {held_by[0]} "
                          f"(first job wins)", holder=held_by[0])
        return PlanItem(key, "reuse", value, source, f"already set by running job {held_by[0]}",
                        prior=entry["prior"], holder=held_by[0])
    current = facts.current.get(key)
    if key == "swap" and not swap_ok:
        return refuse(swap_why)
    if _is_scoped(knob):
        verdict, target, note = facts.targets.get(key, {}).get(value) or ("unsupported", None, knob.unsupported_reason)
        if verdict == "refused":
            return refuse(note)
        if verdict != "ok":
            return PlanItem(key, "unsupported", value, source, note)
        prior = entry["prior"] if entry else knob.prior_of(current, target)
        if knob.matches(current, target):
            return PlanItem(key, "unchanged", value, source, note or "already the value", prior=prior, target=target)
        return PlanItem(key, "apply", value, source, note, prior=prior, target=target)
    if not knob.supported(current) and not entry:
        return PlanItem(key, "unsupported", value, source, knob.unsupported_reason)
    choices = facts.choices.get(key)
    if choices is not None and value not in choices:
        return refuse(f"{value!r} not offered by this kernel (allowed: {' '.join(choices) or 'none'})")
    prior = entry["prior"] if entry else current
    skipped = facts.skipped.get(key)
    note = (f"skipped {' '.join(skipped)}: value unreadable (prior unknown, never written)"
            if skipped else "")
    if knob.matches(current, value):
        return PlanItem(key, "unchanged", value, source, "; ".join(x for x in ("already the value", note) if x),
                        prior=prior)
    return PlanItem(key, "apply", value, source, note, prior=prior)


def format_plan(plan) -> str:
    """Text table for ``gsrun-node prolog --dry-run``; ``plan`` is a report
    from :func:`prolog_tune` or a list of :class:`PlanItem`/dicts."""
    items = plan.get("items", []) if isinstance(plan, dict) else plan
    rows = [i.to_dict() if isinstance(i, PlanItem) else dict(i) for i in items]
    if not rows:
        return "tuning: nothing to do\n"
    out = [f"{'setting':<24} {'action':<12} {'value':<14} {'from':<9} {'now':<22} reason"]
    for r in rows:
        out.append(f"{r['key']:<24} {r['action']:<12} {str(r.get('value') or '-'):<14} "
                   f"{r.get('source') or '-':<9} {_short(r.get('prior')):<22} {r.get('reason') or ''}".rstrip())
    return "\n".join(out) + "\n"


def _short(v) -> str:
    import re

    if v is None:
        return "-"
    if isinstance(v, dict) and "form" in v:
        return f"{v['value']} ({v['form']})"
    if isinstance(v, dict) and v and not all(re.match(_CPU, str(k)) for k in v):   # job-scoped: file -> value
        shown = [f"{k}={x}" for k, x in list(v.items())[:3]]
        return " ".join(shown) + (f" (+{len(v) - 3})" if len(v) > 3 else "")
    if isinstance(v, dict):
        vals = sorted(set(v.values()))
        return ",".join(vals) + f" ({len(v)} cpus)"
    if isinstance(v, list):
        return ",".join(d["name"] for d in v) or "none"
    return str(v)


# --------------------------------------------------------------------------- journal

class _State:
    """The tuning journals (:mod:`gsrun.node.journal`): ``baseline.json``
    (kind ``tuning``) and ``jobs/<id>.json`` (kind ``tuning-job``) under
    ``<state_dir>/tuning/``, all under the one lock file ``tuning/lock``."""

    def __init__(self, state_dir: str, hostfs=None):
        self.root = Path(state_dir)
        self.dir = self.root / "tuning"
        self.jobs = self.dir / "jobs"
        self.baseline = self.dir / "baseline.json"
        self.lockfile = self.dir / "lock"
        self.hostfs = hostfs

    def ensure(self) -> None:
        try:
            if not self.root.is_dir() or self.root.is_symlink():
                ensure_dir(self.root, 0o755)
            ensure_dir(self.dir, 0o700)
            ensure_dir(self.jobs, 0o700)
        except GsrunError:
            raise
        except OSError as e:
            raise NodeError("tune", "state dir unusable", f"{self.dir}: {e.strerror}",
                            hint="check --state-dir / GSRUN_STATE_DIR (tmpfs, root-writable)") from None

    def journal(self, path: Path) -> Journal:
        kind = "tuning" if path == self.baseline else "tuning-job"
        return Journal(path, kind, hostfs=self.hostfs, lock_path=self.lockfile)

    def job_path(self, job_id: str) -> Path:
        return self.jobs / f"{job_id}.json"

    def live_jobs(self) -> list[str]:
        try:
            names = os.listdir(self.jobs)
        except OSError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))

    def load_baseline(self) -> dict:
        """``{"version", "boot_id", "entries"}``: the baseline's fields, with
        ``boot_id`` the boot it was written in (journal header; format 1
        kept it in the document)."""
        j = self.journal(self.baseline)
        if not j.exists():
            return {"version": JOURNAL_VERSION, "boot_id": None, "entries": []}
        got = j.load()
        if got is None or not isinstance(got.data.get("entries"), list):
            raise NodeError("tune", "journal unreadable", str(self.baseline),
                            hint="inspect it; the prior values are needed to restore the node")
        got.data["boot_id"] = got.boot_id
        return got.data

    def save_baseline(self, data: dict) -> None:
        if data["entries"]:
            _write_json(self.baseline, {k: v for k, v in data.items() if k != "boot_id"}, self.hostfs)
        else:
            _unlink(self.baseline)

    def lock(self, timeout_s: float = LOCK_TIMEOUT_S):
        return self.journal(self.baseline).lock(timeout_s)


def _write_json(path: Path, obj, hostfs=None) -> None:
    """Write one tuning journal (the boundary test_tuning_crash kills at)."""
    try:
        Journal(path, "tuning" if path.name == "baseline.json" else "tuning-job", hostfs=hostfs).write(obj)
    except OSError as e:
        raise NodeError("tune", "cannot write journal", f"{path}: {e.strerror}",
                        hint="state dir full or read-only?") from None


def _unlink(path: Path) -> None:
    Journal(path, "tuning").remove()


def read_facts(hostfs, keys, entries=(), live_jobs=(), wanted=None, scope=None) -> Facts:
    """Read current values and kernel choices for ``keys`` (plus meminfo);
    for the job-scoped knobs, resolve each value in ``wanted`` (key -> values)
    against ``scope`` (:class:`JobScope`); name the parts of a setting whose
    value cannot be read (``skipped``: never written)."""
    current, choices, targets, skipped = {}, {}, {}, {}
    for k in keys:
        knob = KNOBS[k]
        current[k] = knob.read(hostfs)
        choices[k] = knob.choices(hostfs)
        if _is_scoped(knob):
            targets[k] = {}
            for v in (wanted or {}).get(k, []):
                if check_tune_value(k, v) is None:
                    targets[k][v] = list(knob.resolve(hostfs, v, scope))
        if isinstance(knob, GovernorKnob) and knob.unreadable(hostfs):
            skipped[k] = knob.unreadable(hostfs)
    mem = read_meminfo_kb(hostfs)
    return Facts(current, choices, max(0, mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)),
                 mem.get("MemAvailable", 0), list(entries), list(live_jobs), targets=targets, skipped=skipped)


# --------------------------------------------------------------------------- restore core

def _restore_entries(hostfs, entries: list[dict], swap, log, tag: str) -> tuple[list[dict], list[dict]]:
    """Restore ``entries`` in reverse order. Returns (results, entries not restored)."""
    results, left = [], []
    for e in reversed(entries):
        knob = KNOBS.get(e["key"])
        if knob is None:
            left.insert(0, e)
            results.append({"key": e["key"], "result": "failed", "reason": "unknown setting in journal"})
            continue
        try:
            current = knob.read(hostfs)
            if knob.is_prior(current, e["prior"]):
                results.append({"key": e["key"], "result": "already", "prior": e["prior"]})
                continue
            knob.restore(hostfs, e["prior"], swap)
            after = knob.read(hostfs)
            if not knob.is_prior(after, e["prior"]):
                raise NodeError("tune", "verify failed", f"{e['key']} reads {_short(after)} after restore, "
                                f"expected {_short(e['prior'])}")
            results.append({"key": e["key"], "result": "restored", "prior": e["prior"]})
            log(f"gsrun: tune: {tag}: restored {e['key']} = {_short(e['prior'])}")
        except (OSError, GsrunError) as err:
            left.insert(0, e)
            results.append({"key": e["key"], "result": "failed", "reason": _errtext(err)})
            log(f"gsrun: tune: {tag}: could not restore {e['key']}: {_errtext(err)}")
    return results, left


def _errtext(err) -> str:
    if isinstance(err, OSError):
        return f"{err.strerror or err} ({errno.errorcode.get(err.errno, err.errno)})"
    return str(err).splitlines()[0]


# --------------------------------------------------------------------------- public API

def prolog_tune(hostfs, state_dir: str, job_id: str, request: str | None, cfg, partition: str | None,
                exclusive: bool, dry_run: bool = False, log=print, *, swap_effect=None,
                scope: JobScope | None = None) -> dict:
    """Tune the node for ``job_id``: plan, journal, apply, verify.

    ``request`` is the job's ``key=value,...`` (``SPANK_GS_TUNE``); ``cfg`` a
    :class:`gsrun.request.config.Config` (None = built-in defaults: every key allowed
    for exclusive jobs, no defaults). ``swap_effect`` replaces the
    swapoff/swapon runner (default: real commands on ``/``, a ``/proc/swaps``
    editor under a fake root).

    ``scope`` (:class:`JobScope`): the job's GPUs, NICs and CPUs, needed by
    ``irq`` and ``hugepages`` (None: those are unsupported for the job).

    Returns a JSON-able report ``{"job_id", "dry_run", "ok", "items": [PlanItem
    dicts], "applied", "reused", "refused", "unsupported", "failed", "holds"}``
    (lists of keys; ``holds``: ``{"cpu_dma_latency_us": N}`` when ``cstate``
    was asked and not refused and ``/dev/cpu_dma_latency`` exists: the
    sampler holds it, see :func:`cstate_hold_us`). A refused or failed setting is reported, not raised; on a failed
    write or verify every change this job made is rolled back from the journal.

    Raises:
        NodeError: the state dir cannot be created/written or its journal is
            unreadable (the node cannot guarantee a restore: drain it), or the
            tuning lock is held for more than 30 s.
        InputError: ``job_id`` is not a plain job id.
    """
    check_job_id(job_id, phase="tune")
    KNOBS["irq"].configure(*irq_paths(cfg))
    policy = Policy.from_config(cfg, partition)
    req, req_err = {}, None
    if request:
        try:
            req = parse_tune_request(request)
        except InputError as e:
            req_err = f"request ignored: {e.detail}"
    tag = f"job {job_id}"
    st = _State(state_dir, hostfs)
    swap = swap_effect if swap_effect is not None else default_swap_effect(hostfs)
    keys = [k for k in KNOBS if k in req or k in policy.defaults or k == "swappiness"]
    wanted = {k: [v for v in (req.get(k), policy.defaults.get(k)) if v] for k in keys}

    if dry_run:
        data = st.load_baseline() if st.dir.is_dir() else {"entries": []}
        facts = read_facts(hostfs, keys, data["entries"], st.live_jobs(), wanted, scope)
        items = plan_tuning(job_id, req, req_err, policy, exclusive, facts)
        return _report(job_id, True, items, hostfs)

    st.ensure()
    with st.lock():
        data = st.load_baseline()
        data = _drop_if_rebooted(hostfs, st, data, log)
        _ban_dir_from_journal(data["entries"])
        live = st.live_jobs()
        facts = read_facts(hostfs, keys, data["entries"], live, wanted, scope)
        items = plan_tuning(job_id, req, req_err, policy, exclusive, facts)
        for it in items:
            if it.action == "refused":
                log(f"gsrun: tune: {tag}: refused {it.key}={it.value}: {it.reason}")
            elif it.action == "unsupported":
                log(f"gsrun: tune: {tag}: {it.key}: {it.reason}")
            elif it.key in facts.skipped and it.action in ("apply", "unchanged"):
                log(f"gsrun: tune: {tag}: {it.key}: {it.reason}")
        # register the job (it counts for the node's reference count from now on)
        job = {"version": JOURNAL_VERSION, "job_id": job_id, "pid": os.getpid(), "started_unix": time.time(),
               "request": request or "", "partition": partition, "exclusive": bool(exclusive),
               "state": "prolog", "holds": []}
        if not any(it.action in ("apply", "unchanged", "reuse") for it in items):
            # nothing to change or to join (most jobs): the registration is the only write, in
            # its final state; the baseline is left as it is
            job["state"] = "applied"
            _write_json(st.job_path(job_id), job, hostfs)
            return _report(job_id, False, items, hostfs)
        _write_json(st.job_path(job_id), job, hostfs)
        by_key = {e["key"]: e for e in data["entries"]}
        added: list[dict] = []
        failed = None
        for it in items:
            if it.action not in ("apply", "unchanged", "reuse"):
                continue
            e = by_key.get(it.key)
            if e is None:
                e = {"key": it.key, "prior": it.prior, "value": it.value, "owner": job_id, "holders": [job_id]}
                if it.target is not None:
                    e["target"] = it.target
                data["entries"].append(e)
                by_key[it.key] = e
                added.append(e)
            else:  # reuse, or an orphaned entry (its holders are gone) taken over
                e["holders"] = [j for j in e.get("holders", []) if j in live and j != job_id] + [job_id]
                if it.action != "reuse":
                    e["value"], e["owner"] = it.value, job_id
                    if it.target is not None:
                        e["target"] = it.target
                        e["prior"] = {**KNOBS[it.key].prior_of(facts.current.get(it.key), it.target),
                                      **(e.get("prior") or {})}
            if it.action != "apply":
                continue
            st.save_baseline(data)      # journal before change
            knob = KNOBS[it.key]
            target = it.value if it.target is None else it.target
            try:
                note = knob.apply(hostfs, target, swap)
                if note:        # some files refused by the kernel (IRQs): skipped with the reason
                    target = it.target = e["target"] = note["target"]
                    it.reason = "; ".join(x for x in (it.reason, note["note"]) if x)
                after = knob.read(hostfs)
                if not knob.matches(after, target):
                    got = knob.shortfall(after, target) if _is_scoped(knob) else _short(after)
                    raise NodeError("tune", "verify failed", f"{it.key} reads {got} after writing {it.value}")
                it.action = "applied"
                log(f"gsrun: tune: {tag}: {it.key} {_short(it.prior)} -> {it.value}")
            except (OSError, GsrunError) as err:
                it.action, it.reason = "failed", _errtext(err)
                failed = it
                log(f"gsrun: tune: {tag}: {it.key}={it.value} failed: {it.reason}; rolling back")
                break
        if failed is not None:
            for it in items:
                if it.action == "apply":
                    it.action, it.reason = "skipped", f"not attempted after {failed.key} failed"
            results, left = _restore_entries(hostfs, added, swap, log, tag)
            ok_keys = {r["key"] for r in results if r["result"] in ("restored", "already")}
            gone = [e for e in added if e["key"] in ok_keys]
            data["entries"] = [e for e in data["entries"] if not any(e is g for g in gone)]
            for it in items:
                if it.key in ok_keys and it.action in ("applied", "unchanged"):
                    it.action, it.reason = "rolled_back", f"rolled back after {failed.key} failed"
        st.save_baseline(data)
        job["state"] = "failed" if failed else "applied"
        job["holds"] = [e["key"] for e in data["entries"] if job_id in e.get("holders", [])]
        _write_json(st.job_path(job_id), job, hostfs)
    return _report(job_id, False, items, hostfs)


def _report(job_id, dry_run, items, hostfs=None) -> dict:
    rows = [i.to_dict() for i in items]

    def keys(*acts):
        return [i.key for i in items if i.action in acts]
    holds = {}
    cst = next((i for i in items if i.key == "cstate" and i.action not in ("refused", "failed", "rolled_back",
                                                                           "skipped")), None)
    if cst is not None and hostfs is not None and hostfs.exists(DMA_LATENCY):
        holds["cpu_dma_latency_us"] = cstate_hold_us(cst.value)
    return {"job_id": job_id, "dry_run": dry_run, "ok": not keys("failed"), "items": rows,
            "planned": keys("apply"), "applied": keys("applied"), "unchanged": keys("unchanged"),
            "reused": keys("reuse"), "refused": keys("refused"), "unsupported": keys("unsupported"),
            "failed": keys("failed"), "rolled_back": keys("rolled_back"), "skipped": keys("skipped"),
            "holds": holds}


def _boot_id(hostfs) -> str | None:
    return journal_boot_id(hostfs)


def _drop_if_rebooted(hostfs, st: _State, data: dict, log) -> dict:
    """A journal from an earlier boot describes settings the reboot already
    reset: drop it and its job journals instead of writing stale values. A job
    journal of an earlier boot is dropped on its own too (a job whose epilog
    never ran before the reboot, on a disk-backed state dir): it would count
    as a job on the node forever and keep every later job's settings."""
    old, now = data.get("boot_id"), _boot_id(hostfs)
    if data["entries"] and old and now and old != now:
        log(f"gsrun: tune: journal is from boot {old}, node booted as {now}: dropping it")
        for j in st.live_jobs():
            _unlink(st.job_path(j))
        data = {"version": JOURNAL_VERSION, "boot_id": now, "entries": []}
        st.save_baseline(data)
        return data
    if now:
        for j in st.live_jobs():
            got = st.journal(st.job_path(j)).load()
            if got is not None and got.earlier_boot:
                log(f"gsrun: tune: job {j}'s journal is from boot {got.boot_id}, node booted as {now}: "
                    "dropping it")
                _unlink(st.job_path(j))
    return data


def irq_paths(cfg) -> tuple[str | None, str | None]:
    """``(tuning.irqbalance_policy_script, tuning.irqbalance_ban_dir)`` of ``cfg``
    (None, None without a config: the defaults)."""
    if cfg is None:
        return None, None
    return cfg["tuning.irqbalance_policy_script"], cfg["tuning.irqbalance_ban_dir"]


def _ban_dir_from_journal(entries) -> None:
    """Point the irq knob at the ban directory the journal's ban files are in (the
    prolog's ``tuning.irqbalance_ban_dir``), so a restore removes them whatever the
    config says now."""
    for e in entries:
        for k in (e.get("prior") or {}) if e.get("key") == "irq" else ():
            if k.startswith(BAN_PREFIX):
                KNOBS["irq"].configure(None, os.path.dirname(k[len(BAN_PREFIX):]))
                return


def epilog_restore(hostfs, state_dir: str, job_id: str, log=print, *, swap_effect=None,
                   irq_ban_dir: str | None = None) -> dict:
    """The job leaves the node: drop its journal; if no other job with a
    journal remains, restore the node baseline (reverse order, idempotent).

    Returns ``{"job_id", "last_job": bool, "remaining_jobs": [...], "restored":
    [{key, result, ...}], "left": [keys not restored], "ok": bool}``.
    Concurrent epilogs serialise on the lock: exactly one sees itself last.

    Raises:
        NodeError: state dir unusable, journal unreadable, lock timeout.
    """
    check_job_id(job_id, phase="tune")
    KNOBS["irq"].configure(None, irq_ban_dir)
    return _leave(hostfs, state_dir, [job_id], False, log, swap_effect)


def restore(hostfs, state_dir: str, job_id: str | None = None, all_jobs: bool = False, log=print,
            *, swap_effect=None, irq_ban_dir: str | None = None) -> dict:
    """``gsrun-node restore --job ID`` (as the epilog of ID) or ``--all``
    (drop every job journal, stale ones of crashed jobs included, and restore
    the baseline). Same report as :func:`epilog_restore`.

    Raises:
        InputError: neither or both of ``job_id`` and ``all_jobs``.
        NodeError: as :func:`epilog_restore`.
    """
    if bool(job_id) == bool(all_jobs):
        raise InputError("restore", "what to restore", "give exactly one of --job ID or --all")
    KNOBS["irq"].configure(None, irq_ban_dir)
    if job_id:
        check_job_id(job_id, phase="tune")
        return _leave(hostfs, state_dir, [job_id], False, log, swap_effect)
    return _leave(hostfs, state_dir, [], True, log, swap_effect)


def _leave(hostfs, state_dir, job_ids, all_jobs, log, swap_effect) -> dict:
    st = _State(state_dir, hostfs)
    swap = swap_effect if swap_effect is not None else default_swap_effect(hostfs)
    tag = "restore --all" if all_jobs else f"job {job_ids[0]}"
    report = {"job_id": None if all_jobs else job_ids[0], "all_jobs": all_jobs, "had_journal": False,
              "last_job": False, "remaining_jobs": [], "restored": [], "left": [], "ok": True}
    if not st.dir.is_dir():
        report["last_job"] = True
        return report
    with st.lock():
        data = st.load_baseline()
        data = _drop_if_rebooted(hostfs, st, data, log)
        live = st.live_jobs()
        leaving = live if all_jobs else [j for j in job_ids if j in live]
        report["had_journal"] = bool(leaving)
        for j in leaving:           # leave first: a crash below leaves a job-less baseline,
            _unlink(st.job_path(j))  # which the next epilog or restore --all puts back
        remaining = [j for j in live if j not in leaving]
        report["remaining_jobs"] = remaining
        if remaining:
            changed = False
            for e in data["entries"]:
                holders = [h for h in e.get("holders", []) if h not in leaving]
                if holders != e.get("holders", []):
                    e["holders"], changed = holders, True
            if changed:             # a job that held nothing leaves the baseline as it is
                st.save_baseline(data)
            if data["entries"]:
                log(f"gsrun: tune: {tag}: jobs {', '.join(remaining)} still on the node; node settings kept")
            return report
        report["last_job"] = True
        if not data["entries"]:     # nothing was changed on the node: no baseline to restore or remove
            return report
        results, left = _restore_entries(hostfs, data["entries"], swap, log, tag)
        data["entries"] = left
        st.save_baseline(data)
        report["restored"] = results
        report["left"] = [e["key"] for e in left]
        report["ok"] = not left
    return report


def status(hostfs, state_dir: str) -> dict:
    """What is changed on the node and by which job (``gsrun-node status --json``).

    Returns ``{"jobs": [...], "changes": [{key, prior, value, owner, holders,
    current, in_effect}], "boot_id"}``; read without the lock (journal files
    are replaced atomically).
    """
    st = _State(state_dir, hostfs)
    data = st.load_baseline() if st.dir.is_dir() else {"entries": [], "boot_id": None}
    changes = []
    for e in data["entries"]:
        knob = KNOBS.get(e["key"])
        cur = knob.read(hostfs) if knob else None
        if knob is not None and _is_scoped(knob):   # only the files this entry governs
            cur = {k: (cur or {}).get(k) for k in (e.get("target") or {})}
        changes.append({**e, "current": cur,
                        "in_effect": bool(knob and knob.matches(cur, e.get("target", e["value"])))})
    return {"jobs": st.live_jobs(), "changes": changes, "boot_id": data.get("boot_id"),
            "state_dir": str(st.dir)}


def format_status(st: dict) -> str:
    """Text for ``gsrun-node status``."""
    lines = [f"tuning jobs on node: {', '.join(st['jobs']) or 'none'}"]
    for c in st["changes"]:
        lines.append(f"  {c['key']:<24} {c['value']:<12} (was {_short(c['prior'])}) by job {c['owner']}, "
                     f"held by {', '.join(c.get('holders') or []) or 'nobody'}"
                     + ("" if c["in_effect"] else f"; now reads {_short(c['current'])}"))
    if not st["changes"]:
        lines.append("  no node setting changed")
    return "\n".join(lines) + "\n"
