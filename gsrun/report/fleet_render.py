"""The cluster report's tables as fixed-width text, CSV and JSON, and a
user's digest as text (pure); numbers through :mod:`gsrun.report.units`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass

from gsrun.report.fleet import Table, UserDigest
from gsrun.report.units import NA, as_number, fmt_duration_s, fmt_hours_h, fmt_share_pct, fmt_time

_KIND = {
    "GPU-h at 0%": "h", "GPU-h": "h", "CPU-h": "h", "GPU-h over": "h", "GPU-h unused": "h",
    "share": "pct", "util": "pct", "SM active": "pct", "host mem used": "pct", "limit used": "pct",
    "queued": "dur", "mean run": "dur", "mean limit": "dur", "kWh": "kwh",
    "max cores/GPU": "num", "max mem/GPU GiB": "num", "Wh per GPU-h": "int",
}


@dataclass(frozen=True)
class Scope:
    """What a report covers (epoch s; empty name tuples: all)."""

    start_s: float
    end_s: float
    clusters: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()

    def line(self, seen_clusters=()) -> str:
        cl = ",".join(self.clusters) or ",".join(sorted(c for c in seen_clusters if c)) or "this cluster"
        out = (f"window {fmt_time(self.start_s)} .. {fmt_time(self.end_s)}   cluster {cl}   "
               f"partitions {','.join(self.partitions) or 'all'}")
        return out + (f"   accounts {','.join(self.accounts)}" if self.accounts else "")


def cell(column: str, v) -> str:
    """One value as the table prints it (None: N/A)."""
    kind = _KIND.get(column)
    if v is None:
        return NA
    if kind in _FMT:
        return _FMT[kind](v)
    if kind in _DIGITS:
        f = as_number(v)
        return NA if f is None else f"{f:.{_DIGITS[kind]}f}"
    return str(v)


_FMT = {"h": fmt_hours_h, "pct": fmt_share_pct, "dur": lambda v: fmt_duration_s(v, "clock")}
_DIGITS = {"kwh": 3, "num": 1, "int": 0}


def _thresholds(t: Table) -> str:
    return "   ".join(f"{k}={v}" for k, v in t.thresholds.items()) or "none"


def table_text(t: Table, scope: Scope, seen_clusters=()) -> str:
    """One table: title, scope, thresholds, counts, then the rows (text left, numbers right)."""
    lines = [f"== {t.title} ==", scope.line(seen_clusters),
             f"thresholds: {_thresholds(t)}   jobs: {t.jobs}   without figures: {t.no_figures}"]
    lines += [f"note: {n}" for n in t.notes]
    if not t.rows:
        lines.append("(nothing to report)")
        return "\n".join(lines) + "\n"
    cells = [[cell(c, v) for c, v in zip(t.columns, r)] for r in t.rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(t.columns)]
    numeric = [all(as_number(r[i]) is not None or r[i] is None for r in t.rows) and i > 0
               for i in range(len(t.columns))]

    def fmt(row):
        return "  ".join(s.rjust(w) if num else s.ljust(w) for s, w, num in zip(row, widths, numeric)).rstrip()

    lines.append(fmt(t.columns))
    lines.append(fmt(["-" * w for w in widths]))
    lines += [fmt(r) for r in cells]
    return "\n".join(lines) + "\n"


def report_text(tables: list[Table], scope: Scope, seen_clusters=(), head: str = "") -> str:
    """Every table, separated by blank lines."""
    return head + "\n".join(table_text(t, scope, seen_clusters) for t in tables)


def report_csv(tables: list[Table], scope: Scope) -> str:
    """One CSV: a ``table,<columns...>`` header per table, raw numbers (N/A empty)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for t in tables:
        w.writerow(["table", *t.columns])
        for r in t.rows:
            w.writerow([t.key, *("" if v is None else v for v in r)])
    return buf.getvalue()


def report_json(tables: list[Table], scope: Scope, extra: dict) -> str:
    """``{"scope": ..., "tables": [...], **extra}`` (raw numbers)."""
    return json.dumps({"scope": asdict(scope), **extra, "tables": [asdict(t) for t in tables]},
                      indent=1, sort_keys=True, default=str) + "\n"


#: The digest's sections: (UserDigest list, title, column heads, one row's text).
_DIGEST_SECTIONS = (
    ("zero", "GPUs left idle (0 % utilization): cancel jobs whose GPUs stopped working, or ask for fewer GPUs",
     f"{'job':<16} {'GPU-h at 0%':>11}", lambda r: f"{r[0]:<16} {fmt_hours_h(r[1]):>11}"),
    ("low", "Low GPU utilization: profile the job (larger batches, more data-loader workers)",
     f"{'job':<16} {'util':>5} {'SM':>5} {'GPU-h':>7}",
     lambda r: f"{r[0]:<16} {fmt_share_pct(r[1]):>5} {fmt_share_pct(r[2]):>5} {fmt_hours_h(r[3]):>7}"),
    ("over", "More CPU cores or memory per GPU than the node's share: others' GPUs on the node go unused",
     f"{'job':<16} {'cores/GPU':>9} {'share':>6} {'GiB/GPU':>8} {'share':>6}",
     lambda r: f"{r[0]:<16} {r[1]:>9.1f} {r[2]:>6.1f} {r[3]:>8.1f} {r[4]:>6.1f}"),
    ("mig", "A MIG slice would have served these jobs: ask for it (gsrun --mig) and wait less",
     f"{'job':<16} {'profile':<10} {'GPU mem GiB':>11} {'compute':>7}",
     lambda r: f"{r[0]:<16} {r[1]:<10} {r[2]:>11.1f} {fmt_share_pct(r[3]):>7}"),
    ("time_limit", "Time limits far beyond the run time: a shorter limit starts sooner (backfill)",
     f"{'job':<16} {'ran':>10} {'limit':>10}",
     lambda r: f"{r[0]:<16} {fmt_duration_s(r[1], 'clock'):>10} {fmt_duration_s(r[2], 'clock'):>10}"),
)


def digest_text(d: UserDigest, scope: Scope, doc_url: str = "") -> str:
    """One user's digest of their GPU jobs since their last one."""
    out = [f"gsrun: your GPU jobs {fmt_time(scope.start_s)} .. {fmt_time(scope.end_s)}",
           f"{d.jobs} GPU jobs, {fmt_hours_h(d.gpu_h)} GPU-hours, GPU energy {d.energy_kwh:.3f} kWh", ""]
    for name, title, head, fmt in _DIGEST_SECTIONS:
        rows, more = getattr(d, name), getattr(d, name + "_more")
        if rows:
            out += [title, "  " + head, *("  " + fmt(r) for r in rows)]
            out += [f"  ... and {more} more", ""] if more else [""]
    out.append("Each job's own report: gseff JOBID")
    if doc_url:
        out.append(f"Help: {doc_url}")
    return "\n".join(out) + "\n"
