"""The knobs of every area in application order, the facts they read, and
the decision (pure): what a job's request does to each setting.

    read facts (:func:`read_facts`) -> plan (:func:`plan_tuning`)

Restore runs the journal's entries in the reverse of :data:`KNOBS`' order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gsrun.node.tuning.cstate import CstateKnob
from gsrun.node.tuning.governor import GovernorKnob
from gsrun.node.tuning.hugepages import HugepagesKnob
from gsrun.node.tuning.irq import IrqKnob
from gsrun.node.tuning.knob import _CPU, VM, FileKnob, Knob, _is_scoped, _plain
from gsrun.node.tuning.thp import ThpKnob
from gsrun.node.tuning.vm import SWAP_FALLBACK_SWAPPINESS, DirtyKnob, SwapKnob, read_meminfo_kb
from gsrun.request.tune import TUNE_KEYS, check_tune_value, parse_tune_request
import re


# application order; restore is the reverse of what the journal holds
KNOBS: dict[str, Knob] = {k.key: k for k in (
    GovernorKnob(),
    FileKnob("swappiness", f"{VM}/swappiness", "vm.swappiness"),
    DirtyKnob("dirty_ratio"),
    DirtyKnob("dirty_background_ratio"),
    ThpKnob("thp", "enabled"),
    ThpKnob("thp_defrag", "defrag"),
    FileKnob("zone_reclaim_mode", f"{VM}/zone_reclaim_mode", "vm.zone_reclaim_mode"),
    SwapKnob(),
    CstateKnob(),
    IrqKnob(),
    HugepagesKnob(),
)}
assert set(KNOBS) == set(TUNE_KEYS)


@dataclass(frozen=True, slots=True)
class Facts:
    """What :func:`plan_tuning` needs from the node (JSON-able): ``current``
    (None = unsupported), ``choices`` the kernel offers, ``/proc/meminfo``
    figures, baseline ``entries``, ``live_jobs``, and ``skipped`` parts whose
    value cannot be read (never written).
    """
    # targets: job-scoped knobs: key -> value -> [verdict, target, note] (ScopedKnob.resolve)
    current: dict
    choices: dict
    swap_used_kb: int = 0
    mem_available_kb: int = 0
    entries: list = field(default_factory=list)
    live_jobs: list = field(default_factory=list)
    targets: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Policy:
    """From :class:`gsrun.request.config.Config` (``tuning.*``, per partition):
    ``enabled``, ``exclusive_only`` (bool), ``defaults`` (key -> value),
    ``allowed_keys`` (tuple of keys), ``partition`` (str or None)."""

    enabled: bool = True
    exclusive_only: bool = True
    defaults: dict = field(default_factory=dict)
    allowed_keys: tuple = TUNE_KEYS
    partition: str | None = None

    @classmethod
    def from_config(cls, cfg, partition: str | None) -> "Policy":
        """Raises ConfigError/InputError if ``tuning.defaults`` does not parse."""
        if cfg is None:
            return cls(partition=partition)
        return cls(enabled=bool(cfg.get("tuning.enabled", partition)),
                   exclusive_only=bool(cfg.get("tuning.exclusive_only", partition)),
                   defaults=parse_tune_request(cfg.get("tuning.defaults", partition) or ""),
                   allowed_keys=tuple(cfg.get("tuning.allowed_keys", partition)),
                   partition=partition)


@dataclass(slots=True, eq=True)
class PlanItem:
    """One decision (mutable: the run updates it). action: ``apply``,
    ``unchanged`` (journaled so later jobs see who holds it), ``reuse``,
    ``refused``, ``unsupported``; after the run ``applied``, ``failed``,
    ``rolled_back``, ``skipped``. ``source``: ``request`` | ``default`` |
    ``fallback``; ``holder``: the job that set the value; ``target``: a
    job-scoped knob's files and values."""

    key: str
    action: str
    value: str | None = None
    source: str = ""
    reason: str = ""
    prior: Any = None
    holder: str | None = None
    target: Any = None

    def to_dict(self) -> dict:
        """The fields as a dict (``prior``/``target`` copied), in field order."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def plan_tuning(job_id: str, request: dict[str, str], request_error: str | None, policy: Policy,
                exclusive: bool, facts: Facts) -> list[PlanItem]:
    """Decide what to do for each key, in :data:`KNOBS` order. Pure. The
    request first, then the site default (a refused request falls back to it).
    """
    items: list[PlanItem] = []
    if request_error:
        items.append(PlanItem("request", "refused", None, "request", request_error))
    if not policy.enabled:
        for k, v in list(request.items()) + list(policy.defaults.items()):
            items.append(PlanItem(k, "refused", v, "request" if k in request else "default",
                                  "tuning disabled (tuning.enabled = false)"))
        return items
    wanted: dict[str, list[tuple[str, str]]] = {}
    for k, v in request.items():
        wanted.setdefault(k, []).append((v, "request"))
    for k, v in policy.defaults.items():
        wanted.setdefault(k, []).append((v, "default"))
    # swap=off unsafe -> swappiness fallback (decided before swappiness is planned)
    swap_ok, swap_why = True, ""
    if any(v == "off" for v, _ in wanted.get("swap", [])) and facts.swap_used_kb > facts.mem_available_kb:
        swap_ok = False
        swap_why = (f"swapped pages ({facts.swap_used_kb} kB) exceed MemAvailable "
                    f"({facts.mem_available_kb} kB); swap stays on, swappiness only")
        if "swappiness" not in wanted:
            wanted["swappiness"] = [(SWAP_FALLBACK_SWAPPINESS, "fallback")]
    live = set(facts.live_jobs) - {job_id}
    by_key = {e["key"]: e for e in facts.entries}
    for key in KNOBS:
        knob = KNOBS[key]
        for value, source in wanted.get(key, []):
            item = _decide(job_id, key, knob, value, source, policy, exclusive, facts, by_key.get(key),
                           live, swap_ok, swap_why)
            items.append(item)
            if item.action != "refused":
                break
    return items


def _decide(job_id, key, knob, value, source, policy, exclusive, facts, entry, live, swap_ok, swap_why):
    def refuse(why, holder=None):
        return PlanItem(key, "refused", value, source, why, holder=holder)

    if source == "request" and key not in policy.allowed_keys:
        where = f" for partition {policy.partition}" if policy.partition else ""
        return refuse(f"key not allowed by tuning.allowed_keys{where}")
    if policy.exclusive_only and not exclusive:
        return refuse("node-wide setting needs a job with the node exclusively (tuning.exclusive_only)")
    problem = check_tune_value(key, value)
    if problem:
        return refuse(problem)
    held_by = [j for j in (entry or {}).get("holders", []) if j in live]
    if entry and held_by:
        if entry["value"] != value:
            return refuse(f"conflicts with {key}={entry['value']} set by running job {held_by[0]} "
                          f"(first job wins)", holder=held_by[0])
        return PlanItem(key, "reuse", value, source, f"already set by running job {held_by[0]}",
                        prior=entry["prior"], holder=held_by[0])
    current = facts.current.get(key)
    if key == "swap" and not swap_ok:
        return refuse(swap_why)
    if _is_scoped(knob):
        verdict, target, note = facts.targets.get(key, {}).get(value) or ("unsupported", None, knob.unsupported_reason)
        if verdict == "refused":
            return refuse(note)
        if verdict != "ok":
            return PlanItem(key, "unsupported", value, source, note)
        prior = entry["prior"] if entry else knob.prior_of(current, target)
        if knob.matches(current, target):
            return PlanItem(key, "unchanged", value, source, note or "already the value", prior=prior, target=target)
        return PlanItem(key, "apply", value, source, note, prior=prior, target=target)
    if not knob.supported(current) and not entry:
        return PlanItem(key, "unsupported", value, source, knob.unsupported_reason)
    choices = facts.choices.get(key)
    if choices is not None and value not in choices:
        return refuse(f"{value!r} not offered by this kernel (allowed: {' '.join(choices) or 'none'})")
    prior = entry["prior"] if entry else current
    skipped = facts.skipped.get(key)
    note = (f"skipped {' '.join(skipped)}: value unreadable (prior unknown, never written)"
            if skipped else "")
    if knob.matches(current, value):
        return PlanItem(key, "unchanged", value, source, "; ".join(x for x in ("already the value", note) if x),
                        prior=prior)
    return PlanItem(key, "apply", value, source, note, prior=prior)


def format_plan(plan) -> str:
    """Text table for ``gsrun-node prolog --dry-run``; ``plan`` is a report
    from :func:`prolog_tune` or a list of :class:`PlanItem`/dicts."""
    items = plan.get("items", []) if isinstance(plan, dict) else plan
    rows = [i.to_dict() if isinstance(i, PlanItem) else dict(i) for i in items]
    if not rows:
        return "tuning: nothing to do\n"
    out = [f"{'setting':<24} {'action':<12} {'value':<14} {'from':<9} {'now':<22} reason"]
    for r in rows:
        out.append(f"{r['key']:<24} {r['action']:<12} {str(r.get('value') or '-'):<14} "
                   f"{r.get('source') or '-':<9} {_short(r.get('prior')):<22} {r.get('reason') or ''}".rstrip())
    return "\n".join(out) + "\n"


def _short(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict) and "form" in v:
        return f"{v['value']} ({v['form']})"
    if isinstance(v, dict) and v and not all(re.match(_CPU, str(k)) for k in v):   # job-scoped: file -> value
        shown = [f"{k}={x}" for k, x in list(v.items())[:3]]
        return " ".join(shown) + (f" (+{len(v) - 3})" if len(v) > 3 else "")
    if isinstance(v, dict):
        vals = sorted(set(v.values()))
        return ",".join(vals) + f" ({len(v)} cpus)"
    if isinstance(v, list):
        return ",".join(d["name"] for d in v) or "none"
    return str(v)


def read_facts(hostfs, keys, entries=(), live_jobs=(), wanted=None, scope=None) -> Facts:
    """Read current values and choices for ``keys`` (plus meminfo), resolving
    the job-scoped knobs' ``wanted`` values against ``scope``."""
    current, choices, targets, skipped = {}, {}, {}, {}
    for k in keys:
        knob = KNOBS[k]
        current[k] = knob.read(hostfs)
        choices[k] = knob.choices(hostfs)
        if _is_scoped(knob):
            targets[k] = {}
            for v in (wanted or {}).get(k, []):
                if check_tune_value(k, v) is None:
                    targets[k][v] = list(knob.resolve(hostfs, v, scope))
        if isinstance(knob, GovernorKnob) and knob.unreadable(hostfs):
            skipped[k] = knob.unreadable(hostfs)
    mem = read_meminfo_kb(hostfs)
    return Facts(current, choices, max(0, mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)),
                 mem.get("MemAvailable", 0), list(entries), list(live_jobs), targets=targets, skipped=skipped)
