"""The get/set protocol every tuning area implements, and the one write path.

A :class:`ScopedKnob` (cstate, irq, hugepages) depends on the job:
``resolve(h, value, scope)`` turns the request word into a target (files and
values) kept in the journal entry; its ``prior`` holds only those files. Every
write goes through :func:`kernel_write`.
"""

from __future__ import annotations

import errno
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from gsrun.base.errors import InputError
import re
from gsrun.base.cpulist import parse_cpulist


_CPU = re.compile(r"^cpu[0-9]+$")
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
BAN_PREFIX = "ban:"      # an irq part that is a ban file: "ban:/run/gsrun/irqbalance-ban/45"


def bracket_word(text: str | None) -> str | None:
    """``"always [madvise] never"`` -> ``"madvise"``; None if no bracketed word."""
    if text is None:
        return None
    m = re.search(r"\[([^\]\s]+)\]", text)
    return m.group(1) if m else None


def bracket_choices(text: str | None) -> list[str]:
    """``"always [madvise] never"`` -> ``["always", "madvise", "never"]``."""
    return [] if text is None else [w.strip("[]") for w in text.split()]


def kernel_write(hostfs, rel: str, value: str) -> None:
    """Write ``value`` to a /proc or /sys file like ``echo value > file``;
    under a fake root also as the kernel answers (THP brackets the new word,
    EINVAL for an unknown one; a dirty ratio zeroes its ``_bytes`` sibling).

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


class Knob(ABC):
    """One setting: a get/set pair of JSON-able values (``read`` None: not on this host)."""

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


@dataclass(frozen=True, slots=True)
class JobScope:
    """The job's devices and CPUs on this node, for ``cstate``/``irq``/``hugepages``.
    ``devices``: ``[{"bdf", "kind": "gpu"|"nic", "name", "numa_node": int |
    None}]``; ``cpus``: its cgroup cpuset, else all online CPUs;
    ``node_cpus``: NUMA node -> CPUs; ``cpus_source``: shown in reasons."""
    devices: list = field(default_factory=list)
    cpus: list = field(default_factory=list)
    node_cpus: dict = field(default_factory=dict)
    cpus_source: str = ""

    def device_node(self, dev: dict) -> int | None:
        """The device's NUMA node; the only one on a one-node host (a VM's -1)."""
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
    """``v`` with its dicts, lists and tuples copied all the way down."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


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


def _is_scoped(knob) -> bool:
    return isinstance(knob, ScopedKnob)


def replaceable(name: str):
    """``gsrun.node.tuning.<name>`` at call time (a crash test replaces it on the package)."""
    return getattr(sys.modules["gsrun.node.tuning"], name)
