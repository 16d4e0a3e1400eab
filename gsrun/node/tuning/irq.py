"""IRQ affinity of the job's devices: ``irq`` (``local``), and irqbalance.

``/proc/irq/N/smp_affinity_list`` of each MSI/MSI-X IRQ of the job's GPUs
and NICs, and the ban files that keep a running irqbalance (started with
gsrun's policy script) off those IRQs (:class:`IrqKnob`).
"""

from __future__ import annotations

import errno
import os

from gsrun.base.errors import InputError
from gsrun.base.fsutil import ensure_dir
from gsrun.node.tuning.knob import BAN_PREFIX, ScopedKnob, kernel_write, replaceable
from gsrun.base.fsutil import atomic_write
import signal
import re
from gsrun.base.cpulist import format_cpulist


IRQ = "proc/irq"
PCI = "sys/bus/pci/devices"


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
            replaceable("_write_ban")(h, self._rel(k), "gsrun irq=local\n")
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
