"""``RLIMIT_MEMLOCK`` and RDMA devices: what pinned host memory needs on a node.

setrlimit(2): an unprivileged process may raise its soft limit up to its
hard limit, never the hard limit itself; the hard limit of a Slurm task is
slurmd's (``LimitMEMLOCK=`` of its systemd unit) unless slurm.conf
propagates the submitting shell's (``PropagateResourceLimits``). Pinned
buffers (``cudaHostAlloc``, DataLoader ``pin_memory``, NCCL, and every RDMA
memory registration through ``/dev/infiniband/uverbs*``) count against it.
"""

from __future__ import annotations

import re
import resource
from contextlib import suppress

MEMLOCK_LIMIT_RE = r"^Max locked memory\s+(\S+)\s+(\S+)\s+bytes"
RDMA_SHOWN = 8


def parse_memlock(limits_text: str | None) -> tuple[str, str] | None:
    """(soft, hard) of the ``Max locked memory`` line of ``/proc/<pid>/limits``:
    a byte count or ``unlimited``; None when the line is absent. Pure."""
    m = re.search(MEMLOCK_LIMIT_RE, limits_text or "", re.M)
    return (m.group(1), m.group(2)) if m else None


def memlock_propagated(conf: dict[str, str]) -> bool:
    """Whether Slurm gives a job the submitting shell's ``RLIMIT_MEMLOCK``
    (slurm.conf ``PropagateResourceLimits``, default ``ALL``, and
    ``PropagateResourceLimitsExcept``; keys lower-cased as
    :func:`gsrun.admin.install.parse_slurm_conf` gives them). Pure."""
    except_ = {w.strip().upper() for w in conf.get("propagateresourcelimitsexcept", "").split(",")}
    if "MEMLOCK" in except_ or "ALL" in except_:
        return False
    prl = {w.strip().upper() for w in conf.get("propagateresourcelimits", "ALL").split(",")}
    return "ALL" in prl or "MEMLOCK" in prl


def rdma_devices(h) -> list[str]:
    """RDMA devices of the node (host root ``h``): the names in
    ``/sys/class/infiniband`` (``mlx5_0``...), else the ``uverbs*`` nodes of
    ``/dev/infiniband``; sorted, at most 64."""
    names = sorted(n for n in h.listdir("sys/class/infiniband") if not n.startswith("."))
    if not names:
        names = sorted(n for n in h.listdir("dev/infiniband") if n.startswith("uverbs"))
    return names[:64]


def rdma_text(devices: list[str]) -> str:
    """``"RDMA devices: mlx5_0, mlx5_1"`` or ``"no RDMA devices"`` (capped)."""
    if not devices:
        return "no RDMA devices (/sys/class/infiniband, /dev/infiniband/uverbs*)"
    more = len(devices) - RDMA_SHOWN
    return "RDMA devices: " + ", ".join(devices[:RDMA_SHOWN]) + (f" (+{more})" if more > 0 else "")


def raise_memlock_soft(getrlimit=resource.getrlimit, setrlimit=resource.setrlimit) -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_MEMLOCK`` to its hard limit (what any
    process may do, setrlimit(2)); returns ``(soft, hard)`` after (bytes,
    ``resource.RLIM_INFINITY`` = unlimited), None when unreadable. A refused
    raise leaves the limits as they were."""
    try:
        soft, hard = getrlimit(resource.RLIMIT_MEMLOCK)
    except (OSError, ValueError):
        return None
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        with suppress(OSError, ValueError):
            setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
            soft = hard
    return soft, hard


def memlock_floor(floor_text: str | None) -> int | None:
    """The floor in bytes from ``$GSRUN_MEMLOCK_MIN_BYTES`` (digits), None =
    unlimited expected (the default, and any other value)."""
    t = (floor_text or "").strip()
    return int(t) if t.isascii() and t.isdigit() else None


def memlock_problem(hard: int | None, floor_text: str | None = None) -> str | None:
    """Why a hard ``RLIMIT_MEMLOCK`` of ``hard`` bytes is too low for pinned
    memory (None: it is not, or unknown): below the floor of
    :func:`memlock_floor`. Pure."""
    if hard is None or hard == resource.RLIM_INFINITY:
        return None
    floor = memlock_floor(floor_text)
    if floor is not None and hard >= floor:
        return None
    want = "unlimited" if floor is None else f"{floor} bytes"
    return f"hard RLIMIT_MEMLOCK {hard} bytes ({hard // 1024} KiB), below {want}"
