"""CPU frequency governor: ``governor``.

``/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor`` for each CPU that
has it, allowed = ``scaling_available_governors`` (all CPUs). A CPU whose
governor cannot be read (EINVAL on some intel_pstate boxes) has an unknown
prior: it is never written, it is skipped and reported, and the other CPUs
proceed.
"""

from __future__ import annotations

from gsrun.base.ids import is_digits
from gsrun.node.tuning.knob import CPU, Knob, kernel_write


def governor_cpus(hostfs) -> list[str]:
    """CPU dir names (``cpu0`` ...) that have ``cpufreq/scaling_governor``, numeric order."""
    cpus = [c for c in hostfs.listdir(CPU) if c.startswith("cpu") and is_digits(c[3:], None)
            and hostfs.exists(f"{CPU}/{c}/cpufreq/scaling_governor")]
    return sorted(cpus, key=lambda c: int(c[3:]))


class GovernorKnob(Knob):
    """Value: ``{"cpu0": "powersave", ...}`` for CPUs with cpufreq; target a name."""

    key = "governor"
    unsupported_reason = "not supported here (no cpufreq/scaling_governor, e.g. a VM)"

    def read(self, h):
        """``{cpu: governor}`` of the CPUs whose governor reads back (others are
        never written); None when none does."""
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
        return [g for g in sets[0] if all(g in s for s in sets[1:])]

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
