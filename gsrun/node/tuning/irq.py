"""IRQ affinity of the job's devices: ``irq`` (``local``), and irqbalance.

``/proc/irq/N/smp_affinity_list`` (else ``smp_affinity``, a hex mask) of each
MSI/MSI-X IRQ of the job's GPUs and NICs, read back through
``effective_affinity[_list]``, and the ban files that keep irqbalance (with
gsrun's policy script) off them. Errors as in ``kernel/irq/proc.c``
(``write_irq_affinity``: EIO managed or not movable, EINVAL no online CPU;
ENOSPC from the x86 vector allocator).
"""

from __future__ import annotations

import errno
import os
import re
import signal
from contextlib import suppress

from gsrun.base.cpulist import format_cpulist, format_cpumask, parse_cpulist, parse_cpumask
from gsrun.base.errors import GsrunError, InputError
from gsrun.base.fsutil import atomic_write, ensure_dir
from gsrun.node.tuning.knob import BAN_PREFIX, ScopedKnob, kernel_write, replaceable

IRQ = "proc/irq"
PCI = "sys/bus/pci/devices"
MASK_PREFIX = "mask:"    # an irq part written as a hex mask (only smp_affinity exists): "mask:45"
# errnos that skip one IRQ (kernel/irq/proc.c write_irq_affinity, x86 vector.c): the others keep theirs
IRQ_SKIP_ERRNOS = {errno.EIO: "kernel-managed or not movable", errno.ENOSPC: "no free vector on those CPUs",
                   errno.EINVAL: "refused", errno.EACCES: "", errno.EPERM: "", errno.EROFS: ""}
EFFECTIVE_SHOWN = 16     # IRQs whose effective CPUs the note lists one by one


def skip_text(e: OSError) -> str:
    """Why the kernel refused an affinity write: ``ENOSPC (no free vector on those CPUs)``."""
    why = IRQ_SKIP_ERRNOS.get(e.errno, e.strerror or "")
    return f"{errno.errorcode.get(e.errno, e.errno)}" + (f" ({why})" if why else "")


def retry_text(outcomes: list[dict], after_s: float | None) -> str:
    """``retried once 60 s into the job: IRQ 42 now on 4-11; IRQ 43 still
    skipped: ENOSPC (...)``, or ``""`` for no outcome."""
    if not outcomes:
        return ""
    words = {"applied": "now on {cpus}", "skipped": "still skipped: {reason}", "failed": "failed: {reason}",
             "gone": "gone"}
    parts = [f"IRQ {o.get('irq')} " + words.get(o.get("result"), "{reason}").format(
        cpus=o.get("cpus"), reason=o.get("reason") or "") for o in outcomes]
    when = f" {after_s:.0f} s into the job" if isinstance(after_s, (int, float)) and after_s >= 0 else ""
    return f"retried once{when}: " + "; ".join(parts)


def irq_cpus_text(text: str | None, mask: bool) -> str | None:
    """A ``/proc/irq/N`` affinity file's text as a CPU list (``smp_affinity``
    and ``effective_affinity`` are hex masks); None when absent or unreadable."""
    if text is None:
        return None
    try:
        return format_cpulist(parse_cpumask(text) if mask else parse_cpulist(text))
    except GsrunError:
        return None


def effective_cpus(h, n: str) -> str | None:
    """Where IRQ ``n`` is delivered now (``effective_affinity[_list]``), as a
    CPU list; None when the kernel does not say (before 4.15)."""
    v = irq_cpus_text(h.read(f"{IRQ}/{n}/effective_affinity_list"), False)
    if v is None:
        v = irq_cpus_text(h.read(f"{IRQ}/{n}/effective_affinity"), True)
    return v


def pids_by_comm(h, comm: str) -> list[int]:
    """PIDs whose ``/proc/<pid>/comm`` is ``comm`` (under the host root), ascending."""
    out = []
    for p in h.listdir("proc"):
        if p.isdigit() and (h.read(f"proc/{p}/comm") or "").strip() == comm:
            out.append(int(p))
    return sorted(out)


def irqbalance_pids(h) -> list[int]:
    return pids_by_comm(h, "irqbalance")


IRQBALANCE_POLICY_SCRIPT = "/usr/local/libexec/gsrun-irqbalance-policy"   # tuning.irqbalance_policy_script
IRQ_BAN_DIR = "/run/gsrun/irqbalance-ban"                                  # tuning.irqbalance_ban_dir
BAN_PRESENT, BAN_ABSENT = "present", "absent"


def irqbalance_policy_script(h, pid: int) -> str | None:
    """The policy script irqbalance ``pid`` was started with (``-l X``,
    ``-lX``, ``--policyscript[=]X`` in its cmdline), or None."""
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
    """``GSRUN_IRQ_BAN_DIR`` in irqbalance's environment, or None."""
    raw = h.read(f"proc/{int(pid)}/environ")
    for kv in (raw or "").split("\0"):
        if kv.startswith("GSRUN_IRQ_BAN_DIR="):
            return kv.split("=", 1)[1] or None
    return None


def irqbalance_check(h, policy_script: str, ban_dir: str) -> tuple[list[int], str | None]:
    """``(pids, problem)``: the running irqbalance daemons and why one would
    undo ``irq=local`` (with the fix), or None."""
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
    """Create one ban file atomically (its directory 0755)."""
    p = h.path(rel)
    os.makedirs(p.parent.parent, mode=0o755, exist_ok=True)     # /run/gsrun: the state dir, normally there
    ensure_dir(p.parent, 0o755, uid=os.geteuid(), gid=os.getegid())
    atomic_write(p, job_note, mode=0o644)


def _remove_ban(h, rel: str) -> None:
    """Remove one ban file, and its directory once empty (it lives in /run: nothing to keep)."""
    p = h.path(rel)
    with suppress(FileNotFoundError):
        os.unlink(p)
    with suppress(OSError):  # other ban files (an admin's), or gone
        os.rmdir(p.parent)


def irqbalance_rescan(h) -> str:
    """``SIGHUP`` every running irqbalance (live host only) so it rescans the
    ban files. -> what was done, for the item's reason."""
    pids = irqbalance_pids(h)
    if not pids:
        return ""
    if not h.is_real:
        return "irqbalance rescan not signalled (host root)"
    sent = []
    for pid in pids:
        if (h.read(f"proc/{pid}/comm") or "").strip() != "irqbalance":   # gone or reused since listed
            continue
        with suppress(OSError):
            os.kill(pid, signal.SIGHUP)
            sent.append(str(pid))
    return "irqbalance asked to rescan (SIGHUP)" if sent else ""


class IrqKnob(ScopedKnob):
    """IRQ affinity: ``{"42": "0-15"}`` (``smp_affinity_list``), ``{"mask:42":
    "0-15"}`` (``smp_affinity``) and ``{"ban:<ban dir>/42": "present"}``.

    ``local``: each MSI/MSI-X IRQ of the job's devices goes to the job's CPUs
    on the device's NUMA node; what cannot be pinned, or the kernel refuses
    (:data:`IRQ_SKIP_ERRNOS`), is skipped with a reason (all refused: fails).
    With irqbalance running, only when every one runs gsrun's policy script,
    ban files first (docs/ADMIN.md, irqbalance).
    """

    key = "irq"
    what = "irq"
    unsupported_reason = "not supported here (no /proc/irq)"

    def __init__(self):
        self.configure()

    def configure(self, policy_script: str | None = None, ban_dir: str | None = None) -> None:
        """Set ``tuning.irqbalance_*`` (None: the defaults), at every entry point.

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
        if k.startswith(MASK_PREFIX):
            return f"{IRQ}/{k[len(MASK_PREFIX):]}/smp_affinity"
        return f"{IRQ}/{k}/smp_affinity_list"

    def _key(self, h, n: str) -> str | None:
        """``n``, ``mask:n`` (only ``smp_affinity``) or None (neither file)."""
        if h.exists(self._rel(n)):
            return n
        if h.exists(self._rel(MASK_PREFIX + n)):
            return MASK_PREFIX + n
        return None

    def _write(self, h, k: str, cpus: str) -> None:
        """Write a CPU list to part ``k``: as a list, or as a hex mask for ``mask:`` parts."""
        if k.startswith(MASK_PREFIX):
            kernel_write(h, self._rel(k), format_cpumask(parse_cpulist(cpus)))
        else:
            kernel_write(h, self._rel(k), cpus)

    def read(self, h):
        names = [n for n in h.listdir(IRQ) if n.isdigit()]
        if not names:
            return None
        out = {}
        for n in sorted(names, key=int):
            v = h.read(self._rel(n))
            if v is not None:
                out[n] = v.strip()
                continue
            v = irq_cpus_text(h.read(self._rel(MASK_PREFIX + n)), True)
            if v is not None:
                out[MASK_PREFIX + n] = v
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
                k = self._key(h, n)
                if k is None:
                    skipped.append(f"IRQ {n} ({bdf}): no smp_affinity_list or smp_affinity")
                    continue
                target[k] = format_cpulist(cpus)
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
        """Write the ban files, ask irqbalance to rescan, then the masks. ->
        ``{"target": parts written, "note", "skipped": {part: CPU list}}``
        when some were refused (all: the first error raised) or irqbalance was
        signalled; else None."""
        done, skipped, first, notes = {}, [], None, []
        refused: dict[str, str] = {}
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
                self._write(h, k, v)
                done[k] = v
            except OSError as e:
                if e.errno not in IRQ_SKIP_ERRNOS:
                    raise
                first = first or e
                refused[k] = v
                skipped.append(f"IRQ {k.removeprefix(MASK_PREFIX)}: {skip_text(e)}")
        if not any(not k.startswith(BAN_PREFIX) for k in done) and first is not None:
            raise first
        if skipped:
            notes.append("skipped " + "; ".join(skipped))
        eff = self.effective_note(h, [k for k in done if not k.startswith(BAN_PREFIX)])
        if eff:
            notes.append(eff)
        if not notes:
            return None
        return {"target": done, "note": "; ".join(notes), **({"skipped": refused} if refused else {})}

    def retry(self, h, skipped: dict[str, str]) -> list[dict]:
        """Write each part of ``skipped`` (part -> CPU list) once more and read
        it back. -> per part ``{"key", "irq", "cpus", "result":
        applied|skipped|failed|gone, "reason"}``."""
        out = []
        for k, cpus in skipped.items():
            n = k.removeprefix(MASK_PREFIX)
            o = {"key": k, "irq": n, "cpus": cpus, "result": "applied", "reason": ""}
            out.append(o)
            if not h.exists(self._rel(k)):
                o["result"], o["reason"] = "gone", "no such IRQ any more"
                continue
            try:
                self._write(h, k, cpus)
            except OSError as e:
                o["result"], o["reason"] = "skipped", skip_text(e)
                continue
            got = irq_cpus_text(h.read(self._rel(k)), k.startswith(MASK_PREFIX))
            if got != irq_cpus_text(cpus, False):
                o["result"], o["reason"] = "failed", f"reads {got} after writing {cpus}"
                continue
            eff = effective_cpus(h, n)
            o["reason"] = f"effective on {eff}" if eff is not None else ""
        return out

    def effective_note(self, h, keys) -> str:
        """``effective: IRQ 42 on 4, ...`` (the first :data:`EFFECTIVE_SHOWN`), or ``""``."""
        got = []
        for k in keys:
            n = k.removeprefix(MASK_PREFIX)
            e = effective_cpus(h, n)
            if e is not None:
                got.append(f"IRQ {n} on {e}")
        if not got:
            return ""
        more = len(got) - EFFECTIVE_SHOWN
        return "effective: " + ", ".join(got[:EFFECTIVE_SHOWN]) + (f" (+{more} IRQs)" if more > 0 else "")

    def restore(self, h, prior, swap):
        """Remove the ban files the job wrote, put the masks back, ask irqbalance to rescan."""
        bans = False
        for k, v in prior.items():
            if k.startswith(BAN_PREFIX) and v == BAN_ABSENT:
                _remove_ban(h, self._rel(k))
                bans = True
        for k, v in prior.items():
            if k.startswith(BAN_PREFIX) or v is None or not h.exists(self._rel(k)):
                continue
            cur = h.read(self._rel(k))
            if irq_cpus_text(cur, k.startswith(MASK_PREFIX)) != irq_cpus_text(v, False):
                self._write(h, k, v)
        if bans:
            irqbalance_rescan(h)
