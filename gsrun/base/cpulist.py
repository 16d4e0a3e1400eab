"""Parse and format Linux CPU lists (``0-3,8,10-11``) and hex masks.

Pure functions. The kernel writes lists in ``/sys/devices/system/node/node*/cpulist``,
``/sys/bus/pci/devices/*/local_cpulist`` and ``Cpus_allowed_list`` in
``/proc/<pid>/status``; masks (``ffff,00000000``) in ``local_cpus``. NVML's
``nvmlDeviceGetCpuAffinity`` returns a list of 64-bit words, lowest CPUs first.
"""

from __future__ import annotations

from collections.abc import Iterable

from gsrun.base.errors import InputError

MAX_CPUS = 1 << 16  # bound on CPU ids we accept from any input
#: Most CPU ids one list may name, counted before expanding (slack for overlapping hand-written lists)
MAX_LIST_IDS = 4 * MAX_CPUS


def parse_cpulist(text: str | None) -> list[int]:
    """``"0-3,8"`` (or the stride form ``0-15:2``) -> ``[0, 1, 2, 3, 8]``, sorted, unique.

    Raises:
        InputError: a token not ``N``, ``N-M`` or ``N-M:S`` (a mask given for a
            list?), a CPU id >= 65536 (checked before expanding), or more than
            :data:`MAX_LIST_IDS` ids.
    """
    text = (text or "").strip()
    if not text:
        return []
    out: set[int] = set()
    named = 0
    for tok in text.split(","):
        tok = tok.strip()
        if not tok:
            continue
        stride = 1
        if ":" in tok:
            tok, s = tok.split(":", 1)
            stride = _int(s, text)
            if stride < 1:
                raise InputError("cpulist", "bad stride", repr(text))
        if "-" in tok:
            a, b = tok.split("-", 1)
            lo, hi = _int(a, text), _int(b, text)
            if hi < lo:
                raise InputError("cpulist", "bad range", repr(text))
            if hi >= MAX_CPUS:
                raise InputError("cpulist", "CPU id out of range", repr(text))
            ids = range(lo, hi + 1, stride)
            named += len(ids)
            if named > MAX_LIST_IDS:
                raise InputError("cpulist", "list too long", f"{repr(text)[:60]}... names over {MAX_LIST_IDS} CPU ids",
                                 hint="give each CPU once, in the kernel's list form, e.g. 0-3,8")
            out.update(ids)
        else:
            out.add(_int(tok, text))
    if out and max(out) >= MAX_CPUS:
        raise InputError("cpulist", "CPU id out of range", repr(text))
    return sorted(out)


def _int(s: str, whole: str) -> int:
    s = s.strip()
    if not s.isdigit():
        raise InputError("cpulist", "not a CPU list", repr(whole),
                         hint="use the kernel's list form, e.g. 0-3,8")
    if len(s) > 9:   # far above MAX_CPUS; int() refuses 4300 digits with a ValueError
        raise InputError("cpulist", "CPU id out of range", repr(whole))
    return int(s)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``; empty -> ``""``."""
    cs = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        parts.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(parts)


def words_to_cpus(words: Iterable[int], bits: int = 64) -> list[int]:
    """NVML affinity words (``nvmlDeviceGetCpuAffinity``), lowest word first ->
    CPU ids. ``[0xFFFF, 0]`` -> ``[0..15]``."""
    return [w * bits + b for w, word in enumerate(words) for b in range(bits) if int(word) >> b & 1]


def parse_cpumask(text: str | None) -> list[int]:
    """A kernel hex CPU mask (``/proc/irq/N/smp_affinity``: 32-bit words, most
    significant first, ``00000000,0000ff00`` -> ``[8..15]``) -> CPU ids.

    Raises:
        InputError: not such a mask, or more than :data:`MAX_CPUS` bits.
    """
    t = (text or "").strip()
    words = t.split(",") if t else []
    if not words or len(words) * 32 > MAX_CPUS or any(
            not w or len(w) > 8 or any(c not in "0123456789abcdefABCDEF" for c in w) for w in words):
        raise InputError("input", "bad CPU mask", repr(t)[:80], hint="comma-separated hex words, e.g. ff,00000000")
    return words_to_cpus((int(w, 16) for w in reversed(words)), 32)


def format_cpumask(cpus: Iterable[int]) -> str:
    """CPU ids -> the kernel's hex mask (:func:`parse_cpumask`): ``[0, 64]`` ->
    ``00000001,00000000,00000001``, ``[]`` -> ``00000000``.

    Raises:
        InputError: a CPU id below 0 or at least :data:`MAX_CPUS`.
    """
    ids = sorted(set(int(c) for c in cpus))
    if ids and (ids[0] < 0 or ids[-1] >= MAX_CPUS):
        raise InputError("input", "bad CPU id", str(ids[0] if ids[0] < 0 else ids[-1]))
    n = (ids[-1] // 32 + 1) if ids else 1
    words = [0] * n
    for c in ids:
        words[c // 32] |= 1 << (c % 32)
    return ",".join(f"{w:08x}" for w in reversed(words))
