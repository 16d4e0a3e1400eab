"""CPU idle states (exit latency): ``cstate``.

The idle states the kernel may enter (``cpuN/cpuidle/stateK/disable``) and
the latency the job's sampler holds on ``/dev/cpu_dma_latency``
(:func:`cstate_hold_us`).
"""

from __future__ import annotations

from gsrun.node.tuning.knob import _CPU, CPU, ScopedKnob, _dict_value_ok
import re
from gsrun.request.tune import CSTATE_SHALLOW_US


DMA_LATENCY = "dev/cpu_dma_latency"
_STATE = re.compile(r"^state[0-9]+$")


def _cpu_dirs(h) -> list[str]:
    return sorted((c for c in h.listdir(CPU) if re.match(_CPU, c)), key=lambda c: int(c[3:]))


def idle_states(h) -> dict[str, list[tuple[str, int | None, str]]]:
    """``{"cpu0": [("state0", exit latency us or None, "POLL"), ...]}`` for every CPU
    with switchable idle states (``cpuN/cpuidle/stateK/disable`` present; ``latency``
    and ``name`` beside it). Empty with the cpuidle driver ``none`` (most VMs)."""
    out = {}
    for c in _cpu_dirs(h):
        names = sorted((s for s in h.listdir(f"{CPU}/{c}/cpuidle") if re.match(_STATE, s)), key=lambda s: int(s[5:]))
        rows = []
        for s in names:
            if h.exists(f"{CPU}/{c}/cpuidle/{s}/disable"):
                rows.append((s, h.read_int(f"{CPU}/{c}/cpuidle/{s}/latency"),
                             (h.read(f"{CPU}/{c}/cpuidle/{s}/name") or "").strip()))
        if rows:
            out[c] = rows
    return out


class CstateKnob(ScopedKnob):
    """Idle states per CPU: value ``{"cpu0/state2": "0"|"1", ...}`` from
    ``cpuN/cpuidle/stateK/disable`` (1 = the kernel will not enter it).

    ``off``: every state with exit latency > 0 us is disabled (POLL stays);
    ``c1``: only POLL and the first state above it stay; ``shallow``: states
    with ``latency`` (exit latency, us) <= ``CSTATE_SHALLOW_US`` stay. States
    already disabled stay disabled (the other half: :func:`cstate_hold_us`).
    """

    key = "cstate"
    what = "cstate"
    unsupported_reason = "not supported here (no cpuN/cpuidle/stateK/disable: cpuidle driver none, e.g. a VM)"

    def _rel(self, k):
        cpu, state = k.split("/")
        return f"{CPU}/{cpu}/cpuidle/{state}/disable"

    def _states(self, h) -> dict[str, list[tuple[str, int | None, str]]]:
        return idle_states(h)

    def read(self, h):
        st = self._states(h)
        if not st:
            return None
        return {f"{c}/{s}": (h.read(f"{CPU}/{c}/cpuidle/{s}/disable") or "").strip()
                for c, rows in st.items() for s, _, _ in rows}

    def resolve(self, h, value, scope):
        st = self._states(h)
        hold = h.exists(DMA_LATENCY)
        if not st:
            why = self.unsupported_reason
            if hold:
                why += f"; /dev/cpu_dma_latency held at {cstate_hold_us(value)} us by the job's sampler instead"
            return "unsupported", None, why
        target = {}
        for c, rows in st.items():
            first_real = next((i for i, (_, lat, name) in enumerate(rows) if name != "POLL" and lat != 0), None)
            for i, (s, lat, name) in enumerate(rows):
                deep = lat is None or lat > 0
                if value == "c1":
                    deep = name != "POLL" and lat != 0 and (first_real is None or i > first_real)
                elif value == "shallow":
                    deep = lat is None or lat > CSTATE_SHALLOW_US
                if deep:
                    target[f"{c}/{s}"] = "1"
        if not target:
            return "ok", {}, "no idle state deeper than asked"
        note = f"{len(target)} idle states disabled on {len(st)} cpus"
        if hold:
            note += f"; /dev/cpu_dma_latency held at {cstate_hold_us(value)} us by the sampler"
        return "ok", target, note

    def matches(self, current, target):
        return isinstance(target, dict) and all(_dict_value_ok(current, k, v, self.what) for k, v in target.items())


def cstate_hold_us(value: str) -> int:
    """Latency (us) the monitor holds on ``/dev/cpu_dma_latency`` for
    ``cstate=value``: ``off`` 0, ``c1`` 1, ``shallow`` ``CSTATE_SHALLOW_US``."""
    return {"off": 0, "c1": 1}.get(value, CSTATE_SHALLOW_US)
