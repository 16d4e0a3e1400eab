"""Hold ``/dev/cpu_dma_latency`` open for a job (``--tune cstate=...``).

The kernel's PM QoS interface (Documentation/power/pm_qos_interface.rst):
while a process keeps ``/dev/cpu_dma_latency`` open after writing a 32-bit
latency in microseconds, no CPU enters an idle state whose exit latency is
longer. Closing the file -- or the holder dying, for any reason -- drops the
request: there is nothing to journal or restore.

**Who holds it**: the node monitor (:mod:`gsrun.node.monitor`), the one
process gsrun keeps for every job's lifetime; the prolog's ``begin`` request
carries ``dma_latency_us`` when the tuning report has
``holds.cpu_dma_latency_us`` (:func:`gsrun.node.tuning.cstate_hold_us`). The
epilog's ``end`` closes the job's descriptor, which releases it. **On a
crash** of the monitor the request ends with it: CPUs may enter deep idle
states again until a new monitor takes the job up (slower, never wrong); the
epilog has nothing to undo, and the job's state note says when it was taken.

Under a fake host root (``--host-root``) the file is ``<root>/dev/
cpu_dma_latency`` (a plain file the tests create): it is opened read-only and
nothing is written, so neither the real ``/dev`` nor the fake tree changes;
the open descriptor is still visible in ``/proc/<monitor>/fd``.
"""

from __future__ import annotations

import os
import struct

DMA_LATENCY = "dev/cpu_dma_latency"
MAX_US = 2_000_000_000


def hold(hostfs, latency_us: int) -> tuple[int | None, str]:
    """Open ``/dev/cpu_dma_latency`` under ``hostfs`` and request
    ``latency_us`` (0 - 2e9). Returns ``(fd, note)``: keep ``fd`` open for
    the job (``None``: not held, ``note`` says why: file absent (no PM QoS
    in this kernel), permission (not root), bad value)."""
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
