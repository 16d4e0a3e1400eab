"""Virtual memory settings: ``swappiness``, ``swap`` (off), ``dirty_ratio`` /
``dirty_background_ratio`` and ``zone_reclaim_mode`` (all ``/proc/sys/vm``).

- ``swappiness``: ``/proc/sys/vm/swappiness`` (0-200).
- ``swap`` (``off``): ``swapoff`` of each device in ``/proc/swaps``, only when
  ``MemAvailable`` covers ``SwapTotal - SwapFree`` (``/proc/meminfo``); else
  swap stays on and ``swappiness`` is lowered instead (reason reported).
- ``dirty_ratio`` / ``dirty_background_ratio``: the kernel keeps the ratio or
  the ``_bytes`` form (writing one zeroes the other); restore writes the one in use.
- ``zone_reclaim_mode``: ``/proc/sys/vm/zone_reclaim_mode`` (0-7).
"""

from __future__ import annotations

import os
from contextlib import suppress

from gsrun.base.errors import NodeError
from gsrun.node.tuning.knob import VM, Knob, kernel_write
from gsrun.facts.hostfs import meminfo_kb
import re
import shutil
from gsrun.base.proc import run_bounded


SWAP_TIMEOUT_S = 60.0
# swappiness instead of an unsafe swap=off (swapped pages over MemAvailable), unless one was asked
SWAP_FALLBACK_SWAPPINESS = "1"


def read_meminfo_kb(hostfs) -> dict[str, int]:
    """``/proc/meminfo`` as ``{"MemAvailable": kB, ...}`` (``{}`` if absent)."""
    return meminfo_kb(hostfs.read("proc/meminfo") or "")


def _unescape_swaps(name: str) -> str:
    # /proc/swaps escapes space, tab, newline, backslash as \ooo
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
        with suppress(ValueError):
            out.append({"name": _unescape_swaps(parts[0]), "type": parts[1], "size_kb": int(parts[2]),
                        "used_kb": int(parts[3]), "priority": int(parts[4]), "line": line})
    return out


class SwapEffect:
    """``swapoff``/``swapon`` of named devices, each run with a timeout and
    never through a shell. Inject another object with ``off``/``on`` to test."""

    def __init__(self, timeout_s: float = SWAP_TIMEOUT_S):
        self.timeout_s = timeout_s

    @staticmethod
    def _bin(name: str) -> str:
        found = shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin") or shutil.which(name)
        if not found:
            raise NodeError("tune", f"{name} not found", "looked in /usr/sbin, /sbin and PATH",
                            hint="install util-linux")
        return found

    def _run(self, argv: list[str]) -> None:
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
    """Swap effect under a fake host root: edits ``<root>/proc/swaps``, never runs ``swapoff``."""

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
