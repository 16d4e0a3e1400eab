"""The efficiency report users read: text (``gseff``, the mail's text part)
and a per-GPU timeline picture (PNG, ``gseff --plot`` and the mail)."""

from __future__ import annotations

import io


def _b(n) -> str:
    if n is None:
        return "N/A"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _p(x) -> str:
    return "N/A" if x is None else f"{x:.1f}%"


def _dur(s) -> str:
    if s is None:
        return "N/A"
    s = int(round(s))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def render_text(summary: dict, color: bool = False) -> str:
    """The report as plain text (ANSI colour when ``color``)."""
    def c(code, s):
        return f"\033[{code}m{s}\033[0m" if color else s

    job, cpu, mem, gpu = summary["job"], summary["cpu"], summary["memory"], summary["gpu"]
    jid = job.get("array") or job["id"]
    lines = [
        c("1", f"gsrun efficiency report: job {jid}") + (f" ({job['name']})" if job.get("name") else ""),
        f"  User: {job.get('user') or 'N/A'}   Partition: {job.get('partition') or 'N/A'}   "
        f"State: {job.get('state') or 'N/A'}   Exit code: {job.get('exit_code') if job.get('exit_code') is not None else 'N/A'}",
        f"  Nodes: {len(job.get('nodes') or [])} ({', '.join(job.get('nodes') or []) or 'N/A'})",
        f"  Elapsed: {_dur(job.get('elapsed_s'))}   CPUs: {job.get('cpus_alloc') or 'N/A'}   "
        f"GPUs: {job.get('gpus_alloc') or gpu['count']}",
        "",
        c("1", "CPU and memory"),
        f"  CPU time: {_dur(cpu['time_s'])}   CPU efficiency: {_p(cpu['efficiency_pct'])}"
        + (f"   [{cpu['source']}]" if cpu.get("source") else ""),
        f"  Memory high water: {_b(mem['peak_bytes'])}"
        + (f" of {_b(mem['req_bytes'])} requested ({_p(mem['efficiency_pct'])})" if mem.get("req_bytes") else ""),
        "",
        c("1", "GPUs"),
    ]
    if not gpu["available"]:
        lines.append(f"  GPU figures unavailable: {gpu.get('reason') or 'unknown reason'}")
    if gpu["devices"]:
        lines.append(f"  {'node':<10} {'gpu':>3} {'util':>7} {'SM act':>7} {'tensor':>7} {'mem peak':>20} "
                     f"{'energy':>10} {'power':>8}  name")
        for g in gpu["devices"]:
            memtxt = _b(g["mem_peak_bytes"]) + ("/" + _b(g["mem_total_bytes"]) if g["mem_total_bytes"] else "")
            util = "N/A" if g["util_mean_pct"] is None else f"{g['util_mean_pct']:.1f}%"
            lines.append(
                f"  {g['node']:<10} {g['index']:>3} {util:>7} {_p(g['sm_active_mean_pct']):>7} "
                f"{_p(g['tensor_active_mean_pct']):>7} {memtxt:>20} "
                f"{'N/A' if g['energy_j'] is None else format(g['energy_j'], '.0f') + ' J':>10} "
                f"{'N/A' if g['power_mean_w'] is None else format(g['power_mean_w'], '.0f') + ' W':>8}  "
                f"{g.get('name') or ('emulated' if g['emulated'] else '')}"
                + (f"  LOST at {g['lost_at_s']:.0f} s" if g.get("lost_at_s") is not None else ""))
        if gpu.get("gpu_hours_alloc") is not None:
            lines.append(f"  GPU-hours: {gpu['gpu_hours_used'] if gpu['gpu_hours_used'] is not None else 'N/A'} used"
                         f" of {gpu['gpu_hours_alloc']} allocated"
                         + (f"   Energy: {gpu['energy_kwh']:.4f} kWh" if gpu.get("energy_kwh") is not None else ""))
    if summary.get("findings"):
        lines += ["", c("1", "Findings")]
        for f in summary["findings"]:
            mark = {"alert": c("31", "!!"), "warn": c("33", "! "), "info": "- "}.get(f["severity"], "- ")
            lines.append(f"  {mark} {f['text']}")
    return "\n".join(lines) + "\n"


def render_png(summary: dict) -> bytes | None:
    """Per-GPU timeline of utilization, SM activity, memory and power as PNG
    bytes; None when matplotlib is missing or there is nothing to draw."""
    devices = [g for g in summary["gpu"]["devices"] if any(g.get("timeline", {}).get(k) for k in g.get("timeline", {}))]
    if not devices:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    for g in devices:
        label = f"{g['node']}:{g['index']}"
        tl = g["timeline"]
        for ax, key, scale in ((axes[0], "util_pct", 1), (axes[0], "sm_active_pct", 1),
                               (axes[1], "mem_used_bytes", 1 / 2**30), (axes[2], "power_w", 1)):
            pts = tl.get(key) or []
            if pts:
                style = "--" if key == "sm_active_pct" else "-"
                ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], style,
                        label=f"{label} {'SM act' if key == 'sm_active_pct' else ''}".strip())
    axes[0].set_ylabel("util / SM act (%)")
    axes[0].set_ylim(0, 105)
    axes[1].set_ylabel("memory (GiB)")
    axes[2].set_ylabel("power (W)")
    axes[2].set_xlabel("seconds since job start")
    axes[0].legend(fontsize=7, ncol=4)
    fig.suptitle(f"job {summary['job']['id']}: GPU timeline")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
