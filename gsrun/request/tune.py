"""Parse a job's tuning request ``key=value,...`` (``SPANK_GS_TUNE``,
``gsrun --tune``, ``tuning.defaults``): syntax and fixed kernel ranges only;
:mod:`gsrun.node.tuning` decides against the node's facts.

==========================  ==============================================  =====================
key                         kernel file                                     syntax
==========================  ==============================================  =====================
governor                    cpu*/cpufreq/scaling_governor                   one of GOVERNORS
swappiness                  /proc/sys/vm/swappiness                         0-200
swap                        swapoff of the devices in /proc/swaps           off
dirty_ratio                 /proc/sys/vm/dirty_ratio                        0-100 (percent)
dirty_background_ratio      /proc/sys/vm/dirty_background_ratio             0-100 (percent)
thp                         /sys/kernel/mm/transparent_hugepage/enabled     always|madvise|never
thp_defrag                  /sys/kernel/mm/transparent_hugepage/defrag      always|defer|defer+madvise|madvise|never
zone_reclaim_mode           /proc/sys/vm/zone_reclaim_mode                  0-7 (bit mask)
cstate                      cpu*/cpuidle/state*/disable + /dev/cpu_dma_latency  shallow|c1|off
irq                         /proc/irq/N/smp_affinity_list (job's GPUs/NICs)  local
hugepages                   node*/hugepages/hugepages-<kB>/nr_hugepages      2M:N (1-1048576) | 1G:N (1-4096)
==========================  ==============================================  =====================

``cstate=shallow`` allows states with exit latency <= :data:`CSTATE_SHALLOW_US`;
``hugepages=SIZE:N`` asks N pages on each NUMA node near the job's GPUs.
"""

from __future__ import annotations

import re

from gsrun.base.errors import InputError

# Same tuple as gsrun.request.config.TUNE_KEYS (kept literal here: config imports us).
TUNE_KEYS = ("governor", "swappiness", "swap", "dirty_ratio",
             "dirty_background_ratio", "thp", "thp_defrag", "zone_reclaim_mode",
             "cstate", "irq", "hugepages")

# cstate=shallow: idle states with exit latency <= this many microseconds stay allowed
CSTATE_SHALLOW_US = 10
# hugepages=SIZE:N: SIZE word -> (page size in kB, most pages per NUMA node)
HUGEPAGE_SIZES: dict[str, tuple[int, int]] = {"2M": (2048, 1048576), "1G": (1048576, 4096)}
# allow-lists
_HUGEPAGES = r"^(2M|1G):([1-9][0-9]{0,6})$"

_INT = r"^(0|[1-9][0-9]{0,3})$"
#: the Linux kernel's cpufreq governors (drivers/cpufreq/cpufreq_*.c); which of
#: them a node offers (``scaling_available_governors``) the node decides
GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
_KEY = r"^[a-z_]{1,32}$"

# key -> (lo, hi) for integers, or a tuple of words
_RANGES: dict[str, tuple[int, int]] = {
    "swappiness": (0, 200),
    "dirty_ratio": (0, 100),
    "dirty_background_ratio": (0, 100),
    "zone_reclaim_mode": (0, 7),
}
_WORDS: dict[str, tuple[str, ...]] = {
    "swap": ("off",),
    "thp": ("always", "madvise", "never"),
    "thp_defrag": ("always", "defer", "defer+madvise", "madvise", "never"),
    "cstate": ("shallow", "c1", "off"),
    "irq": ("local",),
}

HINT = ("form: key=value[,key=value...], keys: " + ", ".join(TUNE_KEYS)
        + "; e.g. governor=performance,swappiness=10,thp=never")


def _bad(token: str, why: str) -> InputError:
    return InputError("tune", "bad tuning request", f"token {token!r}: {why}", hint=HINT)


def check_tune_value(key: str, value: str) -> str | None:
    """Problem with ``value`` for ``key`` (syntax and fixed kernel range), or None."""
    if key == "governor":
        return None if value in GOVERNORS else f"governor must be one of {'|'.join(GOVERNORS)}"
    if key == "hugepages":
        m = re.match(_HUGEPAGES, value)
        if not m or int(m.group(2)) > HUGEPAGE_SIZES[m.group(1)][1]:
            return ("hugepages must be SIZE:COUNT with SIZE 2M (COUNT 1-1048576) or 1G (COUNT 1-4096), "
                    "e.g. 2M:1024")
        return None
    if key in _RANGES:
        lo, hi = _RANGES[key]
        if not re.match(_INT, value) or not lo <= int(value) <= hi:
            return f"{key} must be an integer {lo}-{hi}"
        return None
    if key in _WORDS:
        words = _WORDS[key]
        return None if value in words else f"{key} must be one of {'|'.join(words)}"
    return f"unknown key {key!r}"


def parse_hugepages(value: str) -> tuple[int, int]:
    """``"2M:1024"`` -> ``(2048, 1024)``: (page size in kB, pages per NUMA node).

    Raises:
        InputError: not SIZE:COUNT within :data:`HUGEPAGE_SIZES`.
    """
    problem = check_tune_value("hugepages", value)
    if problem:
        raise _bad(f"hugepages={value}", problem)
    size, count = value.split(":")
    return HUGEPAGE_SIZES[size][0], int(count)


def parse_tune_request(text: str) -> dict[str, str]:
    """``"governor=performance, swappiness=10"`` -> ``{"governor": "performance",
    "swappiness": "10"}`` in the order given; blank text is ``{}``.

    Raises:
        InputError: an empty token, no ``=``, an unknown or repeated key, a
            value outside the table above (a typo in ``--tune`` or ``tuning.defaults``).
    """
    if not isinstance(text, str):
        raise InputError("tune", "bad tuning request", f"expected text, got {type(text).__name__}", hint=HINT)
    if len(text) > 1024:
        raise InputError("tune", "bad tuning request", f"{len(text)} characters (limit 1024)", hint=HINT)
    if not text.strip():
        return {}

    out: dict[str, str] = {}
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise _bad(raw, "empty entry (stray comma?)")
        if token.count("=") != 1:
            raise _bad(token, "expected exactly one key=value")
        key, value = (p.strip() for p in token.split("="))
        if not re.match(_KEY, key) or key not in TUNE_KEYS:
            raise _bad(token, f"unknown key {key!r}")
        if key in out:
            raise _bad(token, f"key {key!r} given twice")
        problem = check_tune_value(key, value)
        if problem:
            raise _bad(token, problem)
        out[key] = value
    return out
