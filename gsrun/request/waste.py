"""Waste detection while a job runs: idle GPUs, stuck collectives, GPUs held
but never used, and the (opt-in) idle-cancel decision. Pure: no I/O, no NVML.

The sampler keeps one :class:`GpuWatch` per GPU and feeds it each poll's
``values`` (:func:`gsrun.node.sampler.update_gpu`; missing or None = unknown):
``util_pct``, ``sm_active_pct`` / ``tensor_active_pct`` (GPM, Hopper+; None on
older GPUs, VMs, MIG), ``power_w``, ``mem_used_bytes`` (``nvmlDeviceGetMemoryInfo``),
``job_gpu_pids`` (``nvmlDeviceGetComputeRunningProcesses`` x the job's cgroup;
under MPS the server, so an empty list alone never makes a busy GPU idle),
``pcie_*_bytes_s`` (GPM's PCIe metrics, else ``nvmlDeviceGetPcieThroughput``; KB/s x 1024) and
``nvlink_*_bytes_s`` (field-value counters per second between polls).

A poll is ``idle``, ``stuck`` (high utilization at near-idle power doing no
work: with GPM, SM/tensor activity low; without, power <= ``stuck_power_max_pct``
of the enforced limit and link traffic <= ``stuck_link_max_kbs``), ``busy`` or
``unknown`` (a gap, carried over up to ``max_gap_s``). An idle stretch of
``warn_after_min`` is ``gpu_idle`` (``gpu_never_used`` when nothing of the job
ran on the GPU since the first poll), a stuck one of ``stuck_after_min`` is
``gpu_stuck_collective``; each reported once per stretch. The idle power level
is the lowest power read during the job (real H200: 83 W bare, 120-128 W with
a context, ``tests/data/hosts/h200-real/results/real_node-final.json``; the
default 60 W margin covers it). Times are seconds in the caller's frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gsrun.base.errors import ConfigError
from gsrun.base.ids import PARTITION_RE, USER_NAME_RE

IDLE = "gpu_idle"
STUCK = "gpu_stuck_collective"
NEVER_USED = "gpu_never_used"
CANCEL_MODES = ("off", "report", "on")
#: finding code -> the alert condition it belongs to (one alert per condition and job, re-armed when it clears)
CONDITIONS = {IDLE: "idle", STUCK: "stuck", NEVER_USED: "never_used"}
WATCH_VERSION = 1
DEFAULT_MAX_GAP_S = 60.0
GAP_FACTOR = 2.0                 # a poll later than this x the interval: the excess is a pause (gap time)
_NAME_RE = PARTITION_RE          # Slurm partition, QOS and account names: same allowed characters


@dataclass(frozen=True)
class IdleConfig:
    """The ``[idle]`` table of the site config (meanings: docs/CONFIG.md);
    ``cancel_after_min`` None = never cancel (the config's 0)."""

    warn_after_min: float = 60.0
    cancel_after_min: float | None = None
    cancel: str = "off"
    stuck_after_min: float = 15.0
    util_idle_pct: float = 1.0
    sm_idle_pct: float = 1.0
    power_idle_margin_w: float = 60.0
    util_stuck_pct: float = 90.0
    stuck_power_max_pct: float = 35.0
    stuck_link_max_kbs: float = 8192.0
    exempt_partitions: tuple[str, ...] = ()
    exempt_qos: tuple[str, ...] = ()
    exempt_users: tuple[str, ...] = ()
    exempt_accounts: tuple[str, ...] = ()
    interactive_grace_min: float = 60.0
    cancel_grace_min: float = 15.0
    alert_mail: bool = True
    mail_per_user_per_hour: int = 3
    touch_comment: bool = False

    @classmethod
    def from_table(cls, table: dict | None) -> "IdleConfig":
        """From the ``[idle]`` table or a full config's effective dict
        (``idle.``-prefixed keys); a missing key takes its default.

        Raises:
            ConfigError: an unknown key, wrong type or out-of-range value (a typo in gsrun.toml).
        """
        table = dict(table or {})
        if any(k.startswith("idle.") for k in table):
            table = {k[5:]: v for k, v in table.items() if k.startswith("idle.")}
        known = {f.name: f for f in fields(cls)}
        out = {}
        for k, v in table.items():
            if k not in known:
                raise ConfigError("config", "unknown key", f"idle.{k}", hint=f"keys of [idle]: {', '.join(known)}")
            problem = check_idle_value(k, v)
            if problem:
                raise ConfigError("config", f"bad value for idle.{k}", f"{v!r}: {problem}")
            if k.startswith("exempt_"):
                v = tuple(v)
            elif k == "cancel_after_min":
                v = None if v in (None, 0) else float(v)
            elif isinstance(v, int) and not isinstance(v, bool) and k.endswith(("_min", "_pct", "_w")):
                v = float(v)
            out[k] = v
        return cls(**out)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_idle_value(key: str, v) -> str | None:
    """The problem with ``idle.<key> = v``, or None."""
    if key in ("warn_after_min", "stuck_after_min"):
        return None if _num(v) and 0.05 <= v <= 100000 \
            else "must be a number of minutes between 0.05 (3 s, test sites) and 100000"
    if key in ("cancel_after_min", "interactive_grace_min", "cancel_grace_min"):
        if key == "cancel_after_min" and v is None:
            return None
        return None if _num(v) and 0 <= v <= 100000 else "must be a number of minutes between 0 and 100000"
    if key in ("util_idle_pct", "sm_idle_pct", "util_stuck_pct", "stuck_power_max_pct"):
        return None if _num(v) and 0 <= v <= 100 else "must be a percentage between 0 and 100"
    if key == "stuck_link_max_kbs":
        return None if _num(v) and 0 <= v <= 1e9 else "must be KB/s between 0 and 1000000000"
    if key == "power_idle_margin_w":
        return None if _num(v) and 0 <= v <= 2000 else "must be watts between 0 and 2000"
    if key == "cancel":
        return None if v in CANCEL_MODES else "must be off, report or on"
    if key in ("alert_mail", "touch_comment"):
        return None if isinstance(v, bool) else "must be true or false"
    if key == "mail_per_user_per_hour":
        return None if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1000 \
            else "must be an integer between 0 and 1000"
    if key.startswith("exempt_"):
        rx = USER_NAME_RE if key == "exempt_users" else _NAME_RE
        if not isinstance(v, (list, tuple)):
            return "must be a list of names"
        bad = [x for x in v if not isinstance(x, str) or not rx.fullmatch(x)]
        return f"not valid names: {bad!r}" if bad else None
    return "unknown key"


# ----------------------------------------------------------------------------- one poll

def _f(v) -> float | None:
    return float(v) if _num(v) else None


LINKS = ("pcie", "nvlink")      # the links whose traffic the stuck test without GPM reads


def links_kbs(reading: dict) -> dict[str, float]:
    """``{"pcie": KB/s, "nvlink": KB/s}`` of one poll, tx + rx; a link with
    neither direction read is left out."""
    out = {}
    for link in LINKS:
        tx, rx = _f(reading.get(f"{link}_tx_bytes_s")), _f(reading.get(f"{link}_rx_bytes_s"))
        if tx is not None or rx is not None:
            out[link] = ((tx or 0.0) + (rx or 0.0)) / 1024.0
    return out


def link_kbs(reading: dict) -> tuple[float | None, list[str]]:
    """(total KB/s of the links read, their names); (None, []) when none."""
    per = links_kbs(reading)
    return (sum(per.values()) if per else None), list(per)


def classify(reading: dict, idle_power_w: float | None, cfg: IdleConfig, power_limit_w: float | None = None) -> str:
    """One poll of one GPU -> ``"idle"``, ``"stuck"``, ``"busy"`` or
    ``"unknown"`` (module doc); ``power_limit_w`` None: no stuck without GPM."""
    return _classify(_f(reading.get("util_pct")), _f(reading.get("sm_active_pct")),
                     _f(reading.get("tensor_active_pct")), _f(reading.get("power_w")), reading.get("job_gpu_pids"),
                     idle_power_w, cfg, power_limit_w, link_kbs(reading)[0])


def _stuck_without_gpm(util, power, power_limit_w, link, cfg: IdleConfig) -> bool:
    return (util >= cfg.util_stuck_pct and power is not None and power_limit_w is not None and power_limit_w > 0
            and power <= power_limit_w * cfg.stuck_power_max_pct / 100.0
            and link is not None and link <= cfg.stuck_link_max_kbs)


def _classify(util, sm, tensor, power, pids, idle_power_w, cfg: IdleConfig, power_limit_w=None, link=None) -> str:
    near_idle = None if power is None or idle_power_w is None else power <= idle_power_w + cfg.power_idle_margin_w
    sm_low = sm is None or sm <= cfg.sm_idle_pct
    if util is not None:
        if util <= cfg.util_idle_pct and sm_low and near_idle is not False:
            return "idle"
        if util >= cfg.util_stuck_pct and sm is not None and sm_low \
                and (tensor is None or tensor <= cfg.sm_idle_pct) and near_idle is True:
            return "stuck"
        if sm is None and _stuck_without_gpm(util, power, power_limit_w, link, cfg):
            return "stuck"
    elif sm is not None:
        if sm_low and (tensor is None or tensor <= cfg.sm_idle_pct) and near_idle is not False:
            return "idle"
        return "busy"
    if isinstance(pids, (list, tuple)) and not pids and (util is None or util <= cfg.util_idle_pct) and sm_low:
        return "idle"
    if util is None and sm is None:
        return "unknown"
    return "busy"


# ----------------------------------------------------------------------------- the watch

@dataclass(slots=True)
class _Stretch:
    """A run of polls of one kind: start, last poll (s into the job), figures over it."""

    kind: str
    since_s: float
    last_s: float
    n: int = 0
    util_max: float | None = None
    util_sum: float = 0.0
    util_n: int = 0
    sm_max: float | None = None
    tensor_max: float | None = None
    power_sum: float = 0.0
    power_n: int = 0
    power_max: float | None = None
    reported: bool = False
    link_max_kbs: float | None = None
    links: list[str] = field(default_factory=list)
    mem_used_bytes: int | None = None
    link_max_kbs_by: dict[str, float] = field(default_factory=dict)   # link -> highest KB/s over the stretch

    def add(self, t_s: float, r: dict) -> None:
        self.last_s = t_s
        self.n += 1
        u, s, te, p = (_f(r.get(k)) for k in ("util_pct", "sm_active_pct", "tensor_active_pct", "power_w"))
        if u is not None:
            self.util_max = u if self.util_max is None else max(self.util_max, u)
            self.util_sum += u
            self.util_n += 1
        if s is not None:
            self.sm_max = s if self.sm_max is None else max(self.sm_max, s)
        if te is not None:
            self.tensor_max = te if self.tensor_max is None else max(self.tensor_max, te)
        if p is not None:
            self.power_max = p if self.power_max is None else max(self.power_max, p)
            self.power_sum += p
            self.power_n += 1
        m = _f(r.get("mem_used_bytes"))
        if m is not None:
            self.mem_used_bytes = int(m)
        per = links_kbs(r)
        if per:
            lk = sum(per.values())
            self.link_max_kbs = lk if self.link_max_kbs is None else max(self.link_max_kbs, lk)
            self.links = sorted(set(self.links) | set(per))
            by = dict(self.link_max_kbs_by or {})
            for link, v in per.items():
                by[link] = max(by.get(link, v), v)
            self.link_max_kbs_by = by

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> "_Stretch":
        since = float(d["since_s"])
        return cls(**{"last_s": since, **{f.name: d[f.name] for f in fields(cls) if f.name in d},
                      "kind": str(d["kind"]), "since_s": since})


def _r1(v):
    return None if v is None else round(float(v), 1)


def fmt_rate_bytes_s(bytes_s: float | None) -> str:
    """A link throughput in decimal units, as NVML and nvidia-smi give them:
    ``0 B/s``, ``950 B/s``, ``3.9 MB/s``, ``1.2 GB/s``; ``n/a`` for None."""
    if bytes_s is None:
        return "n/a"
    v = float(bytes_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(v) < 1000 or unit == "GB/s":
            return f"{v:.0f} {unit}" if unit == "B/s" else f"{v:.1f} {unit}"
        v /= 1000
    raise AssertionError("unreachable")


def stuck_text(ev: dict, span_s: float) -> str:
    """The signals of a stuck detection without GPM, in one line: ``util 99 %,
    power 127 W of 700 W limit, NVLink max 0 B/s, PCIe max 3.9 MB/s over
    300 s; no GPM`` (means over the stretch for utilization and power, the
    highest poll for the links; a link not read says so: ``NVLink not read``)."""
    parts = [f"util {ev['util_mean_pct']:.0f} %" if ev.get("util_mean_pct") is not None else "util n/a"]
    if ev.get("power_mean_w") is not None and ev.get("power_limit_w"):
        parts.append(f"power {ev['power_mean_w']:.0f} W of {ev['power_limit_w']:.0f} W limit")
    for link, label in (("nvlink", "NVLink"), ("pcie", "PCIe")):
        kbs = ev.get(f"{link}_max_kbs")
        parts.append(f"{label} not read" if kbs is None else f"{label} max {fmt_rate_bytes_s(kbs * 1024.0)}")
    return ", ".join(parts) + f" over {max(0.0, span_s):.0f} s; no GPM"


class GpuWatch:
    """The waste detector of one GPU of the job (module doc). ``gpu``: its
    name in findings; ``idle_power_w`` None: learned; ``max_gap_s``: the
    longest pause a stretch carries over; ``power_limit_w``:
    ``nvmlDeviceGetEnforcedPowerLimit``, W."""

    def __init__(self, gpu: str, cfg: IdleConfig, idle_power_w: float | None = None,
                 max_gap_s: float = DEFAULT_MAX_GAP_S, power_limit_w: float | None = None):
        self.gpu = str(gpu)
        self.cfg = cfg
        self.idle_power_w = _f(idle_power_w)
        self.idle_power_source = "given" if self.idle_power_w is not None else None
        self.max_gap_s = float(max_gap_s)
        self.window_s: float | None = None      # the span one reading without GPM covers (the poll interval)
        self.power_limit_w = _f(power_limit_w)
        self.first_s: float | None = None
        self.last_s: float | None = None         # last poll
        self.last_known_s: float | None = None   # last poll that was not unknown
        self.kind: str | None = None              # classification of the last known poll
        self.stretch: _Stretch | None = None      # the current idle or stuck stretch
        self._ever_used = False
        self.polls = 0
        self.gpm_seen = False                     # any SM activity figure read
        self.detections: list[dict] = []          # the detections of the current stretch (0 or 1)

    @property
    def idle_since_s(self) -> float | None:
        """Start of the current idle stretch (s), None when not idle now."""
        st = self.stretch
        return st.since_s if st is not None and st.kind == "idle" else None

    @property
    def ever_used(self) -> bool:
        """A process of the job, or activity, was seen on the GPU at some poll."""
        return self._ever_used

    @property
    def active(self) -> list[dict]:
        """The current stretch's detections, each with ``until_s`` = its last poll."""
        st = self.stretch
        if st is None or not st.reported:
            return []
        return [dict(d, until_s=st.last_s) for d in self.detections]

    @property
    def limits(self) -> list[str]:
        """What this GPU's figures cannot tell (plain language; empty: none)."""
        out = []
        if self.polls >= 3 and not self.gpm_seen:
            out.append("SM activity unknown (no GPM on this GPU): idle is judged on utilization, power and "
                       "the job's processes; a stuck collective on utilization, power against the limit and "
                       "link traffic, which cannot tell it from a loop of tiny kernels")
            if self.power_limit_w is None:
                out.append("power limit unknown: no stuck-collective detection without GPM")
        if self.idle_power_w is None and self.polls >= 1:
            out.append("power unknown: idle is judged without it; no stuck-collective detection")
        return out

    def update(self, t_s: float, reading: dict) -> list[dict]:
        """Fold one poll in (``{}``: no figures, e.g. a lost GPU); returns the
        new detections (``code``, ``gpu``, ``since_s``, ``detected_s``, ``evidence``)."""
        cfg = self.cfg
        t_s = float(t_s)
        reading = reading or {}
        util = _f(reading.get("util_pct"))
        sm = _f(reading.get("sm_active_pct"))
        power = _f(reading.get("power_w"))
        pids = reading.get("job_gpu_pids")
        if power is not None and (self.idle_power_w is None or power < self.idle_power_w):
            self.idle_power_w = power
            self.idle_power_source = "min_seen"
        if sm is not None:
            self.gpm_seen = True
        if self.first_s is None:
            self.first_s = t_s
        prev_s = self.last_s
        self.last_s = t_s
        self.polls += 1
        if not self._ever_used and (bool(pids) or (util is not None and util > cfg.util_idle_pct)
                                    or (sm is not None and sm > cfg.sm_idle_pct)):
            self._ever_used = True
        kind = _classify(util, sm, _f(reading.get("tensor_active_pct")), power, pids, self.idle_power_w, cfg,
                         self.power_limit_w, link_kbs(reading)[0])
        st = self.stretch
        if kind == "unknown":
            if st is not None and t_s - st.last_s > self.max_gap_s:
                self._end()
            return []
        self.last_known_s = t_s
        self.kind = kind
        if st is not None and (st.kind != kind or t_s - st.last_s > self.max_gap_s):
            self._end()
            st = None
        if kind == "busy":
            return []
        if st is None:
            # a stretch starts at the window of its first reading: the previous poll (GPM's means cover a
            # pause; utilization samples and instant power at most one interval of a pause: window_s)
            since = prev_s if prev_s is not None and t_s - prev_s <= self.max_gap_s else t_s
            if sm is None and self.window_s is not None and t_s - since > GAP_FACTOR * self.window_s:
                since = t_s - self.window_s
            st = self.stretch = _Stretch(kind, since, since)
        st.add(t_s, reading)
        if st.reported:
            return []
        after_min = cfg.warn_after_min if kind == "idle" else cfg.stuck_after_min
        if t_s - st.since_s + 1e-9 < 60.0 * after_min:
            return []
        code = STUCK if kind == "stuck" else (
            NEVER_USED if not self._ever_used and st.since_s == self.first_s else IDLE)
        det = {"code": code, "gpu": self.gpu, "since_s": round(st.since_s, 3), "detected_s": round(t_s, 3),
               "evidence": self._evidence(st, reading)}
        st.reported = True
        self.detections = [det]
        return [dict(det)]

    def _end(self) -> None:
        self.stretch = None
        self.detections = []

    def _evidence(self, st: _Stretch, reading: dict) -> dict:
        pids = reading.get("job_gpu_pids")
        basis = []
        if st.util_n:
            basis.append("utilization")
        if st.sm_max is not None:
            basis.append("sm_activity")
        if st.power_n and self.idle_power_w is not None:
            basis.append("power")
        if isinstance(pids, (list, tuple)):
            basis.append("processes")
        if st.kind == "stuck" and st.sm_max is None:
            basis += ["power_vs_limit"] + [f"{x}_traffic" for x in st.links]
        ev = {"minutes": round((st.last_s - st.since_s) / 60.0, 1),
              "polls": st.n,
              "util_max_pct": _r1(st.util_max),
              "util_mean_pct": _r1(st.util_sum / st.util_n) if st.util_n else None,
              "sm_active_max_pct": _r1(st.sm_max),
              "tensor_active_max_pct": _r1(st.tensor_max),
              "power_mean_w": _r1(st.power_sum / st.power_n) if st.power_n else None,
              "power_max_w": _r1(st.power_max),
              "power_idle_w": _r1(self.idle_power_w),
              "power_idle_source": self.idle_power_source,
              "job_processes": len(pids) if isinstance(pids, (list, tuple)) else None,
              "mem_used_bytes": st.mem_used_bytes,
              "ever_used": self._ever_used,
              "basis": basis}
        if st.kind == "stuck" and st.sm_max is None:
            ev["signals"] = "nvml_counters"     # no GPM: utilization, power vs limit, link throughput
            ev["power_limit_w"] = _r1(self.power_limit_w)
            ev["link_max_kbs"] = _r1(st.link_max_kbs)
            by = st.link_max_kbs_by or {}
            ev["pcie_max_kbs"] = _r1(by.get("pcie"))
            ev["nvlink_max_kbs"] = _r1(by.get("nvlink"))
            ev["text"] = stuck_text(ev, st.last_s - st.since_s)
        elif st.kind == "stuck":
            ev["signals"] = "gpm"
        if self.limits:
            ev["limits"] = self.limits
        return ev

    def to_json(self) -> dict:
        """The watch as plain JSON (the sampler's state file, key ``watch``)."""
        return {"v": WATCH_VERSION, "gpu": self.gpu, "idle_power_w": self.idle_power_w,
                "idle_power_source": self.idle_power_source, "max_gap_s": self.max_gap_s,
                "first_s": self.first_s, "last_s": self.last_s, "last_known_s": self.last_known_s,
                "kind": self.kind, "ever_used": self._ever_used, "polls": self.polls, "gpm_seen": self.gpm_seen,
                "stretch": None if self.stretch is None else self.stretch.to_json(),
                "detections": [dict(d) for d in self.detections]}

    @classmethod
    def from_json(cls, d: dict, cfg: IdleConfig) -> "GpuWatch":
        """Inverse of :meth:`to_json` with the site's current ``cfg``; the
        caller sets ``power_limit_w``. Unknown keys are ignored.

        Raises:
            ValueError: not a watch object or a newer version.
        """
        if not isinstance(d, dict) or "gpu" not in d:
            raise ValueError("GPU watch state: expected an object with 'gpu'")
        if isinstance(d.get("v"), int) and d["v"] > WATCH_VERSION:
            raise ValueError(f"GPU watch state version {d['v']} is newer than {WATCH_VERSION}")
        w = cls(d["gpu"], cfg, d.get("idle_power_w"), d.get("max_gap_s", DEFAULT_MAX_GAP_S))
        w.idle_power_source = d.get("idle_power_source")
        for k in ("first_s", "last_s", "last_known_s", "kind", "polls", "gpm_seen"):
            if k in d:
                setattr(w, k, d[k])
        w._ever_used = bool(d.get("ever_used", False))
        w.stretch = _Stretch.from_json(d["stretch"]) if isinstance(d.get("stretch"), dict) else None
        w.detections = [dict(x) for x in d.get("detections") or [] if isinstance(x, dict)]
        return w


def all_idle_since(watches) -> float | None:
    """The latest ``idle_since_s`` of ``watches``; None when any (or none) is not idle."""
    since = [w.idle_since_s for w in watches]
    if not since or any(s is None for s in since):
        return None
    return max(since)


# ----------------------------------------------------------------------------- alerts

def alert_plan(fired: dict, active: set) -> tuple[list[str], list[str]]:
    """``(raise_, rearm)``, sorted: the conditions of ``active`` (those holding
    on this node now) not ``fired`` (condition -> alert raised and not cleared
    since), and the fired ones no longer active."""
    raise_ = sorted(c for c in active if c in CONDITIONS.values() and not fired.get(c))
    rearm = sorted(c for c, f in fired.items() if f and c not in active)
    return raise_, rearm


# ----------------------------------------------------------------------------- cancel

def cancel_decision(cfg: IdleConfig, job: dict, all_idle_since_s: float | None, now_s: float) -> tuple[str, str]:
    """``(action, reason)`` for a job whose GPUs are all idle since
    ``all_idle_since_s`` (s, None: not all idle): ``"none"``, ``"report"`` or
    ``"cancel"``. ``job``: ``partition``, ``qos``, ``user``, ``account``,
    ``interactive`` (adds ``interactive_grace_min`` to the limit)."""
    if cfg.cancel == "off" or cfg.cancel_after_min is None:
        return "none", "idle cancel is off (idle.cancel = \"off\" or idle.cancel_after_min unset)"
    if all_idle_since_s is None:
        return "none", "not all of the job's GPUs are idle"
    job = job or {}
    for key, names, what in (("partition", cfg.exempt_partitions, "partition"), ("qos", cfg.exempt_qos, "QOS"),
                             ("user", cfg.exempt_users, "user"), ("account", cfg.exempt_accounts, "account")):
        v = job.get(key)
        if v is not None and v in names:
            return "none", f"{what} {v} is exempt from idle cancel (idle.exempt_{'qos' if key == 'qos' else key + 's'})"
    interactive = bool(job.get("interactive"))
    limit_min = cfg.cancel_after_min + (cfg.interactive_grace_min if interactive else 0.0)
    idle_min = max(0.0, (now_s - all_idle_since_s) / 60.0)
    limit_text = f"{_fmt_min(limit_min)} min" + (
        f" ({_fmt_min(cfg.cancel_after_min)} + {_fmt_min(cfg.interactive_grace_min)} min grace for an interactive "
        "job)" if interactive else "")
    if idle_min < limit_min:
        return "none", f"all GPUs idle for {_fmt_min(idle_min)} min, below the limit of {limit_text}"
    reason = (f"all allocated GPUs idle since {all_idle_since_s:.0f} s into the job, for {_fmt_min(idle_min)} min "
              f"(limit {limit_text}, idle.cancel_after_min)")
    return ("cancel" if cfg.cancel == "on" else "report"), reason


def cancel_step(action: str, warned_s: float | None, now_s: float, grace_min: float) -> str:
    """The idle cancel's next step for :func:`cancel_decision`'s ``action``
    and the warning time ``warned_s`` (None: not warned): ``"none"``,
    ``"report"``, ``"warn"``, ``"wait"`` (within ``grace_min``) or ``"cancel"``."""
    if action != "cancel":
        return action if action in ("none", "report") else "none"
    if warned_s is None:
        return "warn"
    return "cancel" if now_s - warned_s + 1e-9 >= 60.0 * grace_min else "wait"


def _fmt_min(m: float) -> str:
    return f"{m:.0f}" if abs(m - round(m)) < 0.05 else f"{m:.1f}"


__all__ = ["IdleConfig", "GpuWatch", "classify", "all_idle_since", "alert_plan", "cancel_decision", "cancel_step",
           "check_idle_value", "CONDITIONS", "IDLE", "STUCK", "NEVER_USED", "CANCEL_MODES"]
