"""Streaming aggregates with O(1) memory in job length. Pure.

:class:`Metric`: time-weighted mean, min, max, time above/below thresholds,
gap time and a histogram; :class:`Timeline`: at most ``max_points`` buckets,
merging neighbours; :class:`Counter`: a cumulative hardware counter (NVML
energy, mJ) across resets. ``to_dict`` / ``from_dict`` for the state file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

HIST_EDGES_PCT = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.0001)


@dataclass
class Metric:
    """One metric's running aggregate. ``add(value, dt_s)`` weights a value
    by the time it stood for (seconds); ``None`` values (N/A) count as gap
    time (``gap_s``), never as 0. ``n`` counts values, ``vsum`` their plain
    sum (the mean of a job too short to have any weighted time)."""

    thresholds: tuple[float, ...] = ()
    hist_edges: tuple[float, ...] = ()
    n: int = 0
    weight_s: float = 0.0
    wsum: float = 0.0
    min: float | None = None
    max: float | None = None
    gap_s: float = 0.0
    vsum: float = 0.0
    above_s: dict = field(default_factory=dict)   # str(threshold) -> seconds at value >= threshold
    hist_s: list = field(default_factory=list)

    def add(self, value: float | None, dt_s: float) -> None:
        if dt_s < 0 or (isinstance(dt_s, float) and math.isnan(dt_s)):
            return
        if value is None or (isinstance(value, float) and math.isnan(value)):
            self.gap_s += dt_s
            return
        v = float(value)
        self.n += 1
        self.vsum += v
        self.weight_s += dt_s
        self.wsum += v * dt_s
        self.min = v if self.min is None else min(self.min, v)
        self.max = v if self.max is None else max(self.max, v)
        for t in self.thresholds:
            if v >= t:
                self.above_s[str(t)] = self.above_s.get(str(t), 0.0) + dt_s
        if self.hist_edges:
            if not self.hist_s:
                self.hist_s = [0.0] * (len(self.hist_edges) - 1)
            for i in range(len(self.hist_edges) - 1):
                if self.hist_edges[i] <= v < self.hist_edges[i + 1]:
                    self.hist_s[i] += dt_s
                    break

    def add_gap(self, dt_s: float) -> None:
        """Time with no reading at all (sampler not running)."""
        if dt_s > 0:
            self.gap_s += dt_s

    @property
    def mean(self) -> float | None:
        """Time-weighted mean; the plain mean of the values when none carried
        time yet (a single-sample job); None when no value was ever seen."""
        if self.n == 0:
            return None
        if self.weight_s <= 0:
            return self.vsum / self.n
        return self.wsum / self.weight_s

    def frac_above(self, threshold: float) -> float | None:
        if self.weight_s <= 0:
            return None
        return self.above_s.get(str(threshold), 0.0) / self.weight_s

    def to_dict(self) -> dict:
        return dict({f.name: getattr(self, f.name) for f in fields(self)},   # not asdict: its deep copy
                    thresholds=list(self.thresholds), hist_edges=list(self.hist_edges),   # costs every flush
                    above_s=dict(self.above_s), hist_s=list(self.hist_s))

    @classmethod
    def from_dict(cls, d: dict) -> "Metric":
        m = _from_dict(cls, d)
        m.thresholds, m.hist_edges = tuple(m.thresholds), tuple(m.hist_edges)
        m.above_s, m.hist_s = dict(m.above_s), list(m.hist_s)
        return m


@dataclass
class Timeline:
    """At most ``max_points`` ``[t_s, mean, max]`` buckets; when full, neighbours
    merge (weighted by their counts), halving the resolution."""

    max_points: int = 1000
    points: list = field(default_factory=list)   # [t_start_s, mean, max, count]
    bucket_n: int = 1                             # raw points per bucket now

    def add(self, t_s: float, value: float | None) -> None:
        if value is None:
            return
        v = float(value)
        if self.points and self.points[-1][3] < self.bucket_n:
            b = self.points[-1]
            b[1] = (b[1] * b[3] + v) / (b[3] + 1)
            b[2] = max(b[2], v)
            b[3] += 1
        else:
            self.points.append([float(t_s), v, v, 1])
        if len(self.points) >= self.max_points:
            merged = []
            for i in range(0, len(self.points), 2):
                a = self.points[i]
                if i + 1 < len(self.points):
                    c = self.points[i + 1]
                    n = a[3] + c[3]
                    merged.append([a[0], (a[1] * a[3] + c[1] * c[3]) / n, max(a[2], c[2]), n])
                else:
                    merged.append(a)
            self.points = merged
            self.bucket_n *= 2

    def to_dict(self) -> dict:
        """Plain dict; values shortened by :func:`_sig` (the state file is
        rewritten every flush, so its size matters more than the 7th digit)."""
        return {"max_points": self.max_points, "bucket_n": self.bucket_n,
                "points": [[round(p[0], 1), _sig(p[1]), _sig(p[2]), p[3]] for p in self.points]}

    @classmethod
    def from_dict(cls, d: dict) -> "Timeline":
        t = _from_dict(cls, d)
        t.points = [list(p) for p in t.points]
        return t


@dataclass
class Counter:
    """A cumulative hardware counter (``nvmlDeviceGetTotalEnergyConsumption``,
    mJ) whose ``total`` sums the deltas between readings; a lower reading is a
    reset, counted from 0 (at most one interval lost); None readings skipped.
    ``t_first_s`` / ``t_last_s``: the span ``total`` covers."""

    first: float | None = None
    last: float | None = None
    total: float = 0.0
    resets: int = 0
    t_first_s: float | None = None
    t_last_s: float | None = None

    def add(self, value: float | None, t_s: float | None = None) -> None:
        if value is None:
            return
        v = float(value)
        if self.first is None:
            self.first = self.last = v
            self.t_first_s = self.t_last_s = t_s
            return
        d = v - self.last
        if d >= 0:
            self.total += d
        else:
            self.resets += 1   # counter restarted from ~0: count what it reached since
            self.total += max(v, 0.0)
        self.last = v
        self.t_last_s = t_s

    @property
    def span_s(self) -> float | None:
        """Seconds between the first and last readings (None without times)."""
        if self.t_first_s is None or self.t_last_s is None:
            return None
        return self.t_last_s - self.t_first_s

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "Counter":
        return _from_dict(cls, d)


def _from_dict(cls, d: dict):
    """``cls`` from the keys of ``d`` it has fields for (a missing key takes the default)."""
    return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _sig(x: float) -> float:
    """``x`` shortened for the state file: 2 decimals below 1e6 (percent,
    W, MHz, cores), whole units above (bytes). Cheap: it runs for every
    timeline point at every flush."""
    return round(x, 2) if -1e6 < x < 1e6 else float(round(x))
