"""Hold ``/dev/cpu_dma_latency`` open for a job (``--tune cstate=...``).

PM QoS (Documentation/power/pm_qos_interface.rst): while the file is open
after a 32-bit latency (us) was written, no CPU enters an idle state with a
longer exit latency; closing it drops the request (nothing to journal). The
node monitor holds it from ``begin`` to ``end``. Under a fake host root the
file is opened read-only and nothing is written.
"""

from __future__ import annotations

import os
import struct

DMA_LATENCY = "dev/cpu_dma_latency"
MAX_US = 2_000_000_000


def hold(hostfs, latency_us: int) -> tuple[int | None, str]:
    """Request ``latency_us`` (0 - 2e9) -> ``(fd to keep open, note)``; fd
    None: not held, the note says why (no PM QoS, not root, bad value)."""
    if not isinstance(latency_us, int) or not 0 <= latency_us <= MAX_US:
        return None, f"cpu_dma_latency: bad latency {latency_us!r}"
    path = hostfs.path(DMA_LATENCY)
    if not os.path.exists(path):
        return None, f"cpu_dma_latency: {path} absent (kernel without PM QoS?)"
    try:
        if hostfs.is_real:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, struct.pack("=i", latency_us))
        else:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        return None, f"cpu_dma_latency: {path}: {e.strerror}"
    return fd, f"cpu_dma_latency held at {latency_us} us ({path})"
