"""The efficiency report users read: text (``gseff``, the mail's text part)
and a per-GPU timeline picture (PNG, ``gseff --plot`` and the mail).

Both take a job summary (:func:`gsrun.report.summary.job_summary`). Missing
figures print as ``N/A`` (``N/A (MIG)`` for a MIG device's utilization),
never as 0. Every number goes through :mod:`gsrun.report.units` (the report's
styles: percent with 1 decimal, durations as ``[D-]HH:MM:SS``, energy in
J / Wh / kWh).
"""

from __future__ import annotations

import io
import textwrap

from gsrun.report.units import NA, fmt_bytes, fmt_duration_s, fmt_energy_j, fmt_energy_kwh, fmt_hours_h, \
    fmt_pct, fmt_power_w, fmt_seconds

WRAP_COLS = 100     # findings are wrapped to this width (the GPU table is wider)


def _util(g) -> str:
    mig = g.get("mig") or g.get("util_na_reason") == "MIG"
    return fmt_pct(g["util_mean_pct"], 1, na="N/A (MIG)" if mig else NA)


def _throttle(g) -> str:
    ts = {k: v for k, v in (g.get("throttle_s") or {}).items() if v and k != "sync_boost"}
    cov = g.get("covered_s")
    if not ts or not cov:
        return "-"
    cause, s = max(ts.items(), key=lambda kv: kv[1])
    return f"{cause.replace('hw_slowdown', 'hw')} {fmt_pct(100 * s / cov, 0)}"


def render_text(summary: dict, color: bool = False) -> str:
    """The report as plain text (ANSI colour when ``color``)."""
    def c(code, s):
        return f"\033[{code}m{s}\033[0m" if color else s

    job, cpu, mem, gpu = summary["job"], summary["cpu"], summary["memory"], summary["gpu"]
    jid = job.get("array") or job["id"]
    nodes = job.get("nodes") or []
    lines = [
        c("1", f"gsrun efficiency report: job {jid}") + (f" ({job['name']})" if job.get("name") else ""),
        f"  User: {job.get('user') or 'N/A'}   Partition: {job.get('partition') or 'N/A'}   "
        f"State: {job.get('state') or 'N/A'}   Exit code: {job.get('exit_code') if job.get('exit_code') is not None else 'N/A'}",
        f"  Nodes: {len(nodes)} ({', '.join(nodes) or 'N/A'})",
        f"  Elapsed: {fmt_duration_s(job.get('elapsed_s'), 'clock')}   CPUs: {job.get('cpus_alloc') or 'N/A'}   "
        f"GPUs: {job.get('gpus_alloc') or gpu['count'] or 0}",
        "",
        c("1", "CPU and memory"),
        f"  CPU efficiency: {fmt_pct(cpu['efficiency_pct'], 1)}"
        + (f" ({fmt_duration_s(cpu['time_s'], 'clock')} CPU time of {job.get('cpus_alloc')} cores"
           f" x {fmt_duration_s(job.get('elapsed_s'), 'clock')})"
           if cpu.get("time_s") is not None and job.get("cpus_alloc") else
           (f" (CPU time {fmt_duration_s(cpu['time_s'], 'clock')})" if cpu.get("time_s") is not None else ""))
        + ("  [accounting anomaly]" if cpu.get("anomaly") else ""),
        f"  Memory high water: {fmt_bytes(mem['peak_bytes'])}"
        + (f" of {fmt_bytes(mem['req_bytes'])} requested ({fmt_pct(mem['efficiency_pct'], 1)})"
           if mem.get("req_bytes") else ""),
    ]
    csrc, msrc = cpu.get("source"), mem.get("source")
    if csrc and msrc and (csrc == msrc or msrc.startswith(csrc + " (")):
        lines.append(f"  (from {msrc})")
    elif csrc or msrc:
        lines.append("  (" + "; ".join(x for x in (csrc and f"CPU time from {csrc}", msrc and f"memory from {msrc}")
                                       if x) + ")")
    lines += ["", c("1", "GPUs")]
    shown = [g for g in gpu["devices"] if g.get("status", "ok") != "unavailable"]
    if not gpu["available"]:
        lines.append(f"  unavailable ({gpu.get('reason') or 'unknown reason'})")
    elif not shown:
        lines.append("  none")
    if shown:
        lines.append(f"  {'node':<12} {'gpu':>3} {'util':>9} {'SM act':>7} {'tensor':>7} {'memory high water':>24} "
                     f"{'energy':>9} {'power':>6} {'throttled':>10}  name")
        for g in shown:
            memtxt = fmt_bytes(g["mem_peak_bytes"])
            if g["mem_total_bytes"]:
                memtxt += f" / {fmt_bytes(g['mem_total_bytes'])}"
            power = fmt_power_w(g["power_mean_w"])
            extra = ""
            if g.get("lost_at_s") is not None:
                extra = c("31", f"  LOST at {fmt_seconds(g['lost_at_s'])}")
            elif g.get("emulated"):
                extra = "  (no NVIDIA device)"
            lines.append(
                f"  {g['node']:<12} {g['index']:>3} {_util(g):>9} {fmt_pct(g.get('sm_active_mean_pct'), 1):>7} "
                f"{fmt_pct(g.get('tensor_active_mean_pct'), 1):>7} {memtxt:>24} "
                f"{fmt_energy_j(g['energy_j'], 'auto'):>9} "
                f"{power:>6} {_throttle(g):>10}  {g.get('name') or ''}{extra}")
        lines.append("  util = share of time a kernel ran; SM act = share of the SMs kept busy (GPM);"
                     " N/A = not reported")
        gaps = [g for g in shown if g.get("util_gap_s") and g.get("covered_s")
                and g["util_gap_s"] > 0.05 * g["covered_s"]]
        for g in gaps:
            lines.append(f"  GPU {g['index']} on {g['node']}: no utilization reading for "
                         f"{fmt_seconds(g['util_gap_s'])} (left out of the mean, not counted as 0)")
        for g in shown:
            if g.get("energy_estimated"):
                why = (g.get("unsupported") or {}).get("energy_mj") or "no usable reading"
                lines.append(f"  GPU {g['index']} on {g['node']}: energy estimated from power samples "
                             f"(energy counter: {why})")
            if g.get("mem_procs_peak_bytes") is not None:
                base = (f", v1 minus {fmt_bytes(g['mem_baseline_bytes'])} in use before the job"
                        if g.get("mem_baseline_bytes") is not None else "")
                lines.append(f"  GPU {g['index']} on {g['node']}: the job's processes held at most "
                             f"{fmt_bytes(g['mem_procs_peak_bytes'])} (device high water "
                             f"{fmt_bytes(g['mem_peak_bytes'])}{base})")
    if gpu.get("gpu_hours_alloc") is not None and (shown or job.get("gpus_alloc")):
        used = gpu.get("gpu_hours_used")
        line = f"  GPU-hours: {fmt_hours_h(used)} busy of {fmt_hours_h(gpu['gpu_hours_alloc'])} allocated"
        if used is not None and gpu["gpu_hours_alloc"]:
            line += f" ({fmt_pct(100 * used / gpu['gpu_hours_alloc'], 0)})"
        if gpu.get("energy_j") is not None:
            line += f"   Energy: {fmt_energy_kwh(gpu['energy_kwh'])}"
            if gpu.get("energy_estimated"):
                line += " (estimated)"
        lines.append(line)
    if summary.get("findings"):
        lines += ["", c("1", "Findings")]
        for f in summary["findings"]:
            mark = {"alert": c("31", "!!"), "warn": c("33", "! "), "info": "- "}.get(f["severity"], "- ")
            wrapped = textwrap.wrap(f["text"], width=WRAP_COLS - 5) or [""]
            lines.append(f"  {mark} {wrapped[0]}")
            lines += [f"     {w}" for w in wrapped[1:]]
    return "\n".join(lines) + "\n"


def _time_axis(max_t: float) -> tuple[float, str]:
    if max_t >= 3 * 86400:
        return 86400.0, "days"
    if max_t >= 3 * 3600:
        return 3600.0, "hours"
    if max_t >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _segments(pts: list, scale: float, tdiv: float):
    """x/y lists with NaN breaks where the sampling stopped for a while (a
    gap or a lost GPU), so the plot does not draw across missing data."""
    if not pts:
        return [], []
    steps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]) if b[0] > a[0])
    typical = steps[len(steps) // 2] if steps else 0
    xs, ys = [], []
    for i, p in enumerate(pts):
        if i and typical and p[0] - pts[i - 1][0] > 3 * typical:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(p[0] / tdiv)
        ys.append(p[1] * scale)
    return xs, ys


def render_png(summary: dict) -> bytes | None:
    """Per-GPU timeline as PNG bytes: four panels (utilization, SM activity,
    GPU memory in GiB with each GPU's total dashed, power in W), one line
    per GPU, a marker where a GPU was lost. None when matplotlib is missing
    or there is nothing to draw (no GPU figures)."""
    devices = [g for g in summary["gpu"]["devices"]
               if any(g.get("timeline", {}).get(k) for k in g.get("timeline", {}))]
    if not devices:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    max_t = max((p[0] for g in devices for pts in g["timeline"].values() for p in pts), default=0.0)
    tdiv, tunit = _time_axis(max_t)
    panels = (("util_pct", "utilization (%)", 1.0), ("sm_active_pct", "SM activity (%)", 1.0),
              ("mem_used_bytes", "GPU memory (GiB)", 1 / 2**30), ("power_w", "power (W)", 1.0))
    fig, axes = plt.subplots(4, 1, figsize=(9, 8.5), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    multi_node = len({d["node"] for d in devices}) > 1
    totals_drawn: set = set()
    for i, g in enumerate(devices):
        col = colors[i % len(colors)]
        label = f"GPU {g['index']}" + (f" ({g['node']})" if multi_node else "")
        if g.get("util_mean_pct") is not None:
            label += f": {g['util_mean_pct']:.0f}% util"
        elif g.get("mig"):
            label += ": util N/A (MIG)"
        for ax, (key, _title, scale) in zip(axes, panels):
            pts = g["timeline"].get(key) or []
            if pts:
                xs, ys = _segments(pts, scale, tdiv)
                ax.plot(xs, ys, "-", color=col, lw=1.2, label=label)
            if key == "mem_used_bytes" and g.get("mem_total_bytes"):
                total = g["mem_total_bytes"] * scale
                ax.axhline(total, color="grey" if total in totals_drawn else col, ls="--", lw=0.8)
                if total not in totals_drawn:
                    ax.annotate(f"total {total:.0f} GiB", (0, total), xycoords=("axes fraction", "data"),
                                xytext=(4, -10), textcoords="offset points", fontsize=7, color="grey")
                    totals_drawn.add(total)
            if g.get("lost_at_s") is not None:
                ax.axvline(g["lost_at_s"] / tdiv, color=col, ls=":", lw=1.5)
        if g.get("lost_at_s") is not None:
            axes[0].annotate(f"GPU {g['index']} lost", (g["lost_at_s"] / tdiv, 1.0), xycoords=("data", "axes fraction"),
                             color=col, fontsize=8, xytext=(3, 3), textcoords="offset points",
                             bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": col, "lw": 0.8})
    for ax, (key, title, _s) in zip(axes, panels):
        ax.set_ylabel(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
        if key.endswith("_pct"):
            ax.set_ylim(-2, 105)
        else:
            ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
        if not any(g["timeline"].get(key) for g in devices):
            ax.text(0.5, 0.5, "not available on these GPUs", transform=ax.transAxes, ha="center",
                    va="center", color="grey", fontsize=9)
    axes[-1].set_xlabel(f"{tunit} since job start", fontsize=9)
    axes[-1].set_xlim(left=0)
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:
        for ax in axes[1:]:
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                break
    ncol = min(len(handles), 4) or 1
    rows = -(-len(handles) // ncol) if handles else 0
    top = 0.965 - 0.022 * rows
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.06, 0.965), fontsize=8, ncol=ncol,
                   frameon=False, columnspacing=1.5, handlelength=1.5)
    job = summary["job"]
    title = f"job {job.get('array') or job['id']}" + (f" ({job['name']})" if job.get("name") else "")
    fig.suptitle(f"{title}: GPU timeline", x=0.02, y=0.995, ha="left", va="top", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, top))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
