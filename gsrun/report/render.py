"""The report users read, from a :class:`~gsrun.report.records.JobSummary`: text
(``gseff``, the mail) and a GPU timeline PNG; missing figures print as ``N/A``, never 0.
"""

from __future__ import annotations

import datetime
import io
import re
import textwrap

from gsrun.base.record import ABSENT, known
from gsrun.facts.sampler_state import WasteAction
from gsrun.facts.slurm import compress_hostlist
from gsrun.report.findings import fmt_run_time, gpus_asked, headline, plural, run_time_s, shown_findings, verdicts
from gsrun.report.records import GpuSummary, JobSummary, NodeSetting, is_mig
from gsrun.report.units import (NA, fmt_bytes, fmt_bytes_of, fmt_duration_s, fmt_energy_j, fmt_hours_h, fmt_pct,
                                fmt_power_w, fmt_share_pct, fmt_time)

WRAP_COLS = 76      # every line of the text report (and the mail's text part) fits this width
VERDICT_COLS = (15, 4, 17)      # label, value, judgement; the detail fills the rest
TABLE_FROM_GPUS = 5             # this many GPUs or more: one table row per GPU instead of a block each
LIST_UP_TO_GPUS = 32            # more GPUs: the distribution and the lowest/highest few, unless all_gpus
LIST_UP_TO_NODES = 32           # more nodes: the job's first few and its last, unless all_gpus
FINDING_UP_TO_NODES = 4         # a finding about GPUs on more nodes names the first few, unless all_gpus
_LABEL_ITEM = re.compile(r"GPUs? [0-9][0-9, -]*? on [^\s,:]+")   # one node of gsrun.report.findings.gpus_label
LIST_ENDS = 5                   # lowest and highest GPUs (by busy) listed when summarising
LEVEL_COLOR = {"good": "32", "better": "33", "wasteful": "31"}
SETTINGS_GROUPS_SHOWN = 4       # node-settings lines in the report; the other groups are counted
_SETTING_WHY = ("refused", "unsupported", "failed", "rolled_back", "skipped")


#: What each figure means (``gseff --explain``; docs/USER.md holds the same text: test_figure_definitions.py).
FIGURES = (
    ("GPU busy", "mean over the job's GPUs of the share of time a kernel ran on each (NVML "
     "utilization.gpu, sampled; a GPU with no reading is left out). jobstats' and reportseff's "
     "'GPU utilization' is the same figure."),
    ("GPU SM active", "mean share of each GPU's streaming multiprocessors that had work (NVML GPM "
     "SM_ACTIVITY; H100/H200 and newer). A GPU can be 100% busy with 10% of its SMs in use."),
    ("GPU memory", "the fullest GPU's memory high water as a share of its total (the highest "
     "nvmlDeviceGetMemoryInfo used, less what was in use before the job, over the job's GPUs): can "
     "any GPU's memory hold a larger batch? jobstats and reportseff show the MEAN over the GPUs of "
     "each GPU's peak over its total instead, so the same job reads 82% here and 45% there when one "
     "GPU is full and the others half."),
    ("CPU efficiency", "CPU time of the job (cgroup cpu.stat usage_usec, or sacct TotalCPU) over "
     "the allocated cores x the elapsed time, as seff computes it."),
    ("Host memory", "the job's host memory high water (cgroup memory.peak, or sacct MaxRSS) over "
     "the memory it asked for (--mem, or Slurm's default for the partition), as seff computes it."),
    ("Time limit", "elapsed time over the time limit (Slurm Elapsed and TimeLimit)."),
    ("Elapsed", "Slurm's elapsed time of the job: from its start to its end as slurmctld records them "
     "(StartTime to EndTime, less any time it was suspended; to now while it runs), the figure of sacct "
     "Elapsed, squeue TimeUsed and scontrol RunTime, and of seff, reportseff and jobstats. gseff, the mail "
     "and gsrun --wait show the same number, as [D-]HH:MM:SS. Where gsrun has no job record from Slurm "
     "(EpilogSlurmctld did not run or could not read it; a running job's report so far) it shows the span "
     "its samplers covered instead, marked '(sampled)'; a node's elapsed_s in gseff --json is that node's "
     "sampled span."),
    ("Energy", "the GPUs' energy counters over the job (nvmlDeviceGetTotalEnergyConsumption), in Wh; "
     "'(estimated)' where a GPU has no counter and its power readings were integrated."),
)


def explain_text() -> str:
    """:data:`FIGURES` as plain text."""
    lines = ["What the figures of a gsrun report mean", ""]
    for label, text in FIGURES:
        lines += _wrap(f"{label}: {text}", "", "  ")
    return "\n".join(lines) + "\n"


def _util(g: GpuSummary) -> str:
    return fmt_share_pct(g.util_mean_pct, na="N/A (MIG)" if is_mig(g) else NA)


def _mem_power_energy(g: GpuSummary) -> tuple[str, str, str]:
    """A GPU's memory peak of its total, mean power (W) and energy (Wh), formatted."""
    return (fmt_bytes_of(g.mem_peak_bytes, g.mem_total_bytes), fmt_power_w(g.power_mean_w),
            fmt_energy_j(g.energy_j, "wh"))


def _throttle(g: GpuSummary) -> str:
    ts = {k: v for k, v in (g.throttle_s or {}).items() if v and k != "sync_boost"}
    cov = g.covered_s
    if not ts or not cov:
        return ""
    cause, s = max(ts.items(), key=lambda kv: kv[1])
    return f"slowed by {cause.replace('hw_slowdown', 'hardware').replace('_', ' ')} {fmt_share_pct(100 * s / cov)}"


def _wrap(text: str, first: str = "  ", rest: str = "    ") -> list[str]:
    return textwrap.wrap(text, width=WRAP_COLS, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=True) or [first.rstrip()]


def doc_link(cfg, code) -> str:
    """``<report.doc_url>#<code>``, or ""."""
    try:
        base = cfg["report.doc_url"] if cfg is not None else ""
    except KeyError:
        base = ""
    return f"{base}#{code}" if base else ""


def _gpu_notes(g: GpuSummary, c) -> list[str]:
    notes = []
    if known(g.lost_at_s):
        notes.append(c("31", f"lost {fmt_duration_s(g.lost_at_s, 'clock')} into the job"))
    elif g.emulated:
        notes.append("no NVIDIA device")
    if g.xid:
        notes.append("Xid " + ", ".join(str(x) for x in dict.fromkeys(g.xid)))
    if _throttle(g):
        notes.append(_throttle(g))
    if g.util_gap_s and g.covered_s and g.util_gap_s > 0.05 * g.covered_s:
        notes.append(f"no utilization reading for {fmt_duration_s(g.util_gap_s, 'clock')} (left out of the mean)")
    if g.energy_estimated:
        why = (g.unsupported or {}).get("energy_mj") or "no usable reading"
        notes.append(f"energy estimated from power samples (energy counter: {why})")
    if known(g.mem_procs_peak_bytes):
        base = (f", v1 minus {fmt_bytes(g.mem_baseline_bytes)} in use before the job"
                if known(g.mem_baseline_bytes) else "")
        notes.append(f"the job's processes held at most {fmt_bytes(g.mem_procs_peak_bytes)} "
                     f"(device high water {fmt_bytes(g.mem_peak_bytes)}{base})")
    return notes


def fmt_setting(st: NodeSetting) -> str:
    """A node setting as ``governor=performance applied``, ``irq=local refused (...)``."""
    key, value, state, why = st.key, st.value, st.state, st.reason or ""
    if key == "cpu_dma_latency":
        return f"cpu_dma_latency={value}us held by the node monitor"
    if key == "malloc" and why.startswith(("LD_PRELOAD=", "not found")) or key == "malloc" and state == "unsupported":
        return f"{key}={value} ({why})"       # what the task got (gsrun-bind's notes)
    if state == "requested":
        return f"{key}={value} (preloaded by gsrun-bind)"
    if key == "memlock":
        return f"memlock warning ({why})"
    text = f"{key}={value} {str(state).replace('_', ' ')}" if value is not None else f"{key} {state}"
    why = re.sub(r"^not supported here \((.*?)\)(;|$)", r"\1\2", why)    # "unsupported" says it already
    if why and (state in _SETTING_WHY or key in ("cstate", "irq", "hugepages")) and why != "already the value":
        text += f" ({why})"
    return text


def settings_lines(summary: JobSummary) -> list[str]:
    """"Node settings during the job" lines (unwrapped): one per group (the first
    :data:`SETTINGS_GROUPS_SHOWN`), then the unknown nodes; ``[]`` when nothing was changed or asked."""
    groups = summary.settings or ()
    if not any(g.settings for g in groups):
        return []
    seen = {n for g in groups for n in g.nodes}
    unknown = [n for n in summary.job.nodes or () if n not in seen]
    lines = []
    for g in groups[:SETTINGS_GROUPS_SHOWN]:
        names = g.nodes
        what = "; ".join(fmt_setting(x) for x in g.settings) or "none changed"
        where = "" if len(groups) == 1 and not unknown else \
            f" on {compress_hostlist(names)}" + (f" ({len(names)} nodes)" if len(names) > 1 else "")
        lines.append(f"Node settings during the job{where}: {what}")
    rest = groups[SETTINGS_GROUPS_SHOWN:]
    if rest:
        n = sum(len(g.nodes) for g in rest)
        lines.append(f"Node settings differ on {plural(n, 'more node')} in {len(rest)} groups "
                     "(gseff --json: settings)")
    if unknown:
        lines.append(f"Node settings unknown on {compress_hostlist(unknown)} (no prolog record)")
    return lines


def _short_label(text: str, keep: int) -> str:
    """A finding's leading GPU list (:func:`~gsrun.report.findings.gpus_label`) cut to ``keep`` nodes."""
    items, i = [], 0
    while True:
        m = _LABEL_ITEM.match(text, i)
        if not m:
            break
        items.append(m.group(0))
        i = m.end()
        if not (text.startswith(", ", i) and _LABEL_ITEM.match(text, i + 2)):
            break
        i += 2
    if len(items) <= keep:
        return text
    return f"{', '.join(items[:keep])} and GPUs on {len(items) - keep} more nodes (gseff --all lists them)" + text[i:]


MAX_ACTIONS_SHOWN = 10
ACTION_WORDS = {"alert_mailed": "alert mailed", "cancel_warned": "idle-cancel warning",
                "cancel_requested": "idle cancel requested", "cancel_done": "cancelled by gsrun",
                "cancel_failed": "idle cancel failed", "cancel_report": "would cancel (idle.cancel = report)"}


def action_text(a: WasteAction) -> str:
    """``2025-10-09 10:02 on n1: alert mailed (idle): GPU 4 on n1 idle since ...``."""
    what = ACTION_WORDS.get(a.action, str(a.action).replace("_", " "))
    if a.kind:
        what += f" ({str(a.kind).replace('_', ' ')})"
    return f"{fmt_time(a.time)} on {a.node or 'N/A'}: {what}" + (f": {a.detail}" if a.detail else "")


def render_text(summary: JobSummary, color: bool = False, cfg=None, all_gpus: bool = False) -> str:
    """The text report, lines at most :data:`WRAP_COLS` wide (ANSI colour not counted). ``all_gpus``
    lifts every list's limit; ``cfg``: targets and doc URL (None: defaults)."""
    def c(code, s):
        return f"\033[{code}m{s}\033[0m" if color else s

    job, cpu, mem, gpu = summary.job, summary.cpu, summary.memory, summary.gpu
    nodes = list(job.nodes or ())
    rows = verdicts(summary, cfg, job.partition)
    head = headline(summary, rows)
    title = f"gsrun report: job {job.array or job.id}" + (f" ({job.name})" if job.name else "") \
        + f" {job.state or 'N/A'}"
    if run_time_s(job):
        title += f" after {fmt_run_time(job)}"
    if nodes:
        title += f" on {nodes[0]}" + (f" and {len(nodes) - 1} more" if len(nodes) > 1 else "")
    lines = [c("1", ln) for ln in _wrap(title, "", "  ")]
    if head["alert"]:
        lines += [c("31", ln) for ln in _wrap(head["alert"], "!! ", "   ")]
    if head["next"]:
        lines += _wrap(head["next"], "Next time: ", "  ")
    lw, vw, ww = VERDICT_COLS
    for r in rows:
        word = c(LEVEL_COLOR[r["level"]], f"{r['word']:<{ww}}") if r["level"] and color else f"{r['word']:<{ww}}"
        first = f"{r['label']:<{lw}}{fmt_share_pct(r['pct']):>{vw}}  "
        pad = " " * (lw + vw + 2 + ww)
        wrapped = textwrap.wrap(r["detail"], width=WRAP_COLS - len(pad)) or [""]
        lines.append((first + word + wrapped[0]).rstrip())
        lines += [pad + w for w in wrapped[1:]]

    shown_f = shown_findings(summary)
    if shown_f:
        lines += ["", c("1", "Findings")]
        for f in shown_f:
            mark = {"alert": "!!", "warn": "! ", "info": "- "}.get(f.severity, "- ")
            text = f.text if all_gpus else _short_label(f.text, FINDING_UP_TO_NODES)
            wrapped = _wrap(text, f"  {mark} ", "     ")
            col = {"alert": "31", "warn": "33"}.get(f.severity)
            lines += [c(col, w) if col else w for w in wrapped]
            link = doc_link(cfg, f.code)
            if link and f.severity != "info" or link and f.action:
                lines.append(f"     More: {link}")

    acts = summary.actions or ()
    if acts:
        lines += ["", c("1", "Actions while the job ran")]
        shown_a = acts if all_gpus else acts[:MAX_ACTIONS_SHOWN]
        for a in shown_a:
            lines += _wrap(action_text(a), "  - ", "    ")
        if len(shown_a) < len(acts):
            lines.append(f"  ... {len(acts) - len(shown_a)} more (gseff --all lists them)")

    lines += ["", c("1", "Job")]
    lines += _wrap(f"User {job.user or 'N/A'}, partition {job.partition or 'N/A'}, exit code "
                   + (str(job.exit_code) if known(job.exit_code) else "N/A"))
    start, end, submit = job.start_time, job.end_time, job.submit_time
    if submit and start and start >= submit:
        lines += _wrap(f"Submitted {fmt_time(submit)}, waited {fmt_duration_s(start - submit, 'clock')} "
                       "in the queue")
    if start:
        same_day = end and fmt_time(start)[:10] == fmt_time(end)[:10]
        ran = f"Ran {fmt_time(start)} to {fmt_time(end, with_date=not same_day) if end else 'N/A'}"
        if job.time_limit_s:
            ran += f", time limit {fmt_duration_s(job.time_limit_s, 'clock')}"
        elif job.time_limit_s is not ABSENT:
            ran += ", no time limit"
        lines += _wrap(ran)
    gpus_text = plural(gpus_asked(job, gpu), "GPU")
    if not nodes and not start:     # not started: what it asked for, no figures
        if submit:
            lines += _wrap(f"Submitted {fmt_time(submit)}"
                           + (f", time limit {fmt_duration_s(job.time_limit_s, 'clock')}" if job.time_limit_s else ""))
        lines += _wrap(f"Asked for {job.cpus_alloc or 'N/A'} CPUs, {gpus_text}")
    else:
        named = nodes if all_gpus or len(nodes) <= LIST_UP_TO_NODES else \
            nodes[:FINDING_UP_TO_NODES] + [f"... {nodes[-1]}; gseff --all lists them"]
        lines += _wrap(f"{plural(len(nodes), 'node')} ({', '.join(named) or 'N/A'}), "
                       f"{job.cpus_alloc or 'N/A'} CPUs, {gpus_text}, "
                       f"{fmt_bytes(mem.req_bytes) if mem.req_bytes else 'no'} memory requested")
        if known(cpu.time_s):
            cpu_line = f"CPU time {fmt_duration_s(cpu.time_s, 'clock')}"
            if job.cpus_alloc and run_time_s(job):
                cpu_line += f" of {job.cpus_alloc} cores x {fmt_run_time(job)}"
            cpu_line += f"; host memory peak {fmt_bytes(mem.peak_bytes)}"
            if cpu.anomaly:
                cpu_line += " [accounting anomaly]"
            lines += _wrap(cpu_line)
        elif not rows:
            lines += _wrap(f"CPU efficiency {fmt_share_pct(cpu.efficiency_pct)}, host memory peak "
                           f"{fmt_bytes(mem.peak_bytes)}")
    for ln in settings_lines(summary):
        lines += _wrap(ln)

    lines += ["", c("1", "GPUs")]
    shown = [g for g in gpu.devices if g.status != "unavailable"]
    if not gpus_asked(job, gpu) and not shown:
        lines.append("  none: the job asked for no GPUs")
    elif not gpu.available:
        lines += _wrap(f"unavailable ({gpu.reason or 'unknown reason'})")
    elif not shown and not nodes:
        lines.append(f"  {plural(gpus_asked(job, gpu), 'GPU')} asked for; figures once the job runs")
    elif not shown:
        lines.append("  none")
    has_sm = any(known(g.sm_active_mean_pct) for g in shown)
    if shown and len(shown) < TABLE_FROM_GPUS:
        for g in shown:
            lines += _wrap(f"{g.node} GPU {g.index}" + (f", {g.name}" if g.name else ""))
            busy = [f"busy {_util(g)}"]
            if has_sm:
                busy += [f"SM active {fmt_share_pct(g.sm_active_mean_pct)}",
                         f"tensor active {fmt_share_pct(g.tensor_active_mean_pct)}"]
            lines += _wrap(", ".join(busy), "    ", "      ")
            lines += _wrap("memory peak {}, power {}, energy {}".format(*_mem_power_energy(g)), "    ", "      ")
            notes = _gpu_notes(g, c)
            if notes:
                lines += _wrap("; ".join(notes), "    ", "      ")
    elif shown:
        if len(shown) > LIST_UP_TO_GPUS and not all_gpus:
            lines += _distribution(shown)
            ranked = sorted(shown, key=lambda g: (not known(g.util_mean_pct), g.util_mean_pct or 0.0, str(g.node),
                                                  g.index))
            shown = ranked[:LIST_ENDS] + ranked[-LIST_ENDS:]
        multi = len({g.node for g in shown}) > 1
        nw = max(len(str(g.node)) for g in shown) if multi else 0
        hdr = (f"{'node':<{nw}} " if multi else "") + f"{'GPU':>3} {'busy':>5}" + (f" {'SM':>4}" if has_sm else "") \
            + f"  {'memory peak':<19} {'power':>5} {'energy':>8}"
        if not multi:
            lines.append(f"  on {shown[0].node}" + (f", {shown[0].name}" if shown[0].name else ""))
        lines.append("  " + hdr)
        for g in shown:
            row = (f"{g.node:<{nw}} " if multi else "") + f"{g.index:>3} {_util(g):>5}" \
                + (f" {fmt_share_pct(g.sm_active_mean_pct):>4}" if has_sm else "") \
                + "  {:<19} {:>5} {:>8}".format(*_mem_power_energy(g))
            lines.append("  " + row.rstrip())
        for g in shown:
            notes = _gpu_notes(g, c)
            if notes:
                lines += _wrap(f"GPU {g.index}" + (f" on {g.node}" if multi else "") + ": " + "; ".join(notes))
    if shown and gpu.available:
        tot = []
        if known(gpu.gpu_hours_alloc):
            tot.append(f"GPU-hours busy {fmt_hours_h(gpu.gpu_hours_used)} of "
                       f"{fmt_hours_h(gpu.gpu_hours_alloc)} allocated")
        if known(gpu.energy_j):
            tot.append(f"energy {fmt_energy_j(gpu.energy_j, 'wh')}" + (" (estimated)" if gpu.energy_estimated else ""))
        if tot:
            t = "; ".join(tot)
            lines += _wrap(t[0].upper() + t[1:])
        lines += _wrap("busy = share of time a kernel ran" + ("; SM active = share of the GPU's compute units in "
                       "use (GPM)" if has_sm else "") + "; N/A = not reported.")
    return "\n".join(lines) + "\n"


def _distribution(gpus: list[GpuSummary]) -> list[str]:
    """Many GPUs: the spread of busy, then what the table lists."""
    vals = sorted(g.util_mean_pct for g in gpus if known(g.util_mean_pct))
    out = []
    if vals:
        def q(f: float) -> float:
            return vals[min(len(vals) - 1, int(f * (len(vals) - 1) + 0.5))]
        out += _wrap(f"{len(gpus)} GPUs; busy over {len(vals)} with a figure: min {fmt_pct(vals[0], 0)}, "
                     f"10th percentile {fmt_pct(q(0.1), 0)}, median {fmt_pct(q(0.5), 0)}, 90th percentile "
                     f"{fmt_pct(q(0.9), 0)}, max {fmt_pct(vals[-1], 0)}")
    else:
        out += _wrap(f"{len(gpus)} GPUs; none with a busy figure")
    out += _wrap(f"the {LIST_ENDS} least and {LIST_ENDS} most busy (gseff --all lists every GPU):")
    return out


def _time_axis(max_t: float) -> tuple[float, str]:
    if max_t >= 3 * 86400:
        return 86400.0, "days"
    if max_t >= 3 * 3600:
        return 3600.0, "hours"
    if max_t >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _segments(pts: list, scale: float, tdiv: float):
    """x/y lists with NaN breaks where the sampling stopped a while."""
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


PNG_WIDTH_IN, PNG_DPI = 7.2, 200      # 1440 px wide, shown at 720 CSS px (2x for high-DPI screens)
MANY_GPUS = 5                          # from this many GPUs: mean with a min-max band, worst GPUs named


def render_png(summary: JobSummary) -> bytes | None:
    """The GPU timeline PNG (busy %, SM active %, memory GiB, power W), one line per GPU below
    :data:`MANY_GPUS`, else mean and band. None without matplotlib or anything to draw."""
    alldev = summary.gpu.devices
    devices = [g for g in alldev if any((g.timeline or {}).values())]
    # a many-GPU job's pooled gpu.timeline: [t_s, mean, max, n, lowest GPU mean]
    pooled = {k: v for k, v in (summary.gpu.timeline or {}).items() if v} if not devices else {}
    if not devices and not pooled:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.dates as mdates
    except ImportError:
        return None
    max_t = max([p[0] for g in devices for pts in g.timeline.values() for p in pts]
                + [p[0] for pts in pooled.values() for p in pts], default=0.0)
    start = summary.job.start_time
    clock = bool(start) and max_t > 3600
    tdiv, tunit = _time_axis(max_t)
    panels = [(k, t, sc) for k, t, sc in (("util_pct", "busy (%)", 1.0), ("sm_active_pct", "SM active (%)", 1.0),
                                          ("mem_used_bytes", "memory (GiB)", 1 / 2**30), ("power_w", "power (W)", 1.0))
              if any(g.timeline.get(k) for g in devices) or pooled.get(k)]
    many = bool(pooled) or len(devices) >= MANY_GPUS
    plt.rcParams.update({"font.size": 11})
    fig, axes = plt.subplots(len(panels), 1, figsize=(PNG_WIDTH_IN, 1.55 * len(panels) + 0.7), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    shown = devices or alldev
    multi_node = len({d.node for d in shown}) > 1

    def xs_of(ts):
        if clock:
            return [datetime.datetime.fromtimestamp(start + t) if t == t else float("nan") for t in ts]
        return [t / tdiv if t == t else float("nan") for t in ts]

    for ax, (key, title, scale) in zip(axes, panels):
        series = [(g, g.timeline.get(key) or []) for g in devices]
        series = [(g, pts) for g, pts in series if pts]
        allv = [p[1] * scale for _g, pts in series for p in pts if p[1] is not None]
        if pooled:
            pts = [p for p in pooled.get(key) or [] if p[1] is not None]
            allv = [p[1] * scale for p in pts]
            x = xs_of([p[0] for p in pts])
            ax.fill_between(x, [(p[4] if len(p) > 4 and p[4] is not None else p[1]) * scale for p in pts],
                            [(p[2] if p[2] is not None else p[1]) * scale for p in pts], color=colors[0], alpha=0.2,
                            lw=0, label="lowest GPU mean to highest sample")
            ax.plot(x, allv, color=colors[0], lw=1.6, label="mean of GPUs")
        elif many:
            grid: dict = {}
            for _g, pts in series:
                for p in pts:
                    if p[1] is not None:
                        grid.setdefault(round(p[0]), []).append(p[1] * scale)
            ts = sorted(grid)
            x = xs_of(ts)
            ax.fill_between(x, [min(grid[t]) for t in ts], [max(grid[t]) for t in ts], color=colors[0], alpha=0.2,
                            lw=0, label="min-max of GPUs")
            ax.plot(x, [sum(grid[t]) / len(grid[t]) for t in ts], color=colors[0], lw=1.6, label="mean of GPUs")
        else:
            for i, (g, pts) in enumerate(series):
                xs, ys = _segments(pts, scale, 1.0)
                ax.plot(xs_of(xs), ys, "-", color=colors[i % len(colors)], lw=1.4,
                        label=f"GPU {g.index}" + (f" ({g.node})" if multi_node else ""))
        if allv:
            mean = sum(allv) / len(allv)
            ax.axhline(mean, color="#444444", ls="--", lw=1)
            unit = "%" if key.endswith("_pct") else (" GiB" if key == "mem_used_bytes" else " W")
            ax.annotate(f"mean {mean:.0f}{unit}", (1.0, mean), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=11, color="#444444", xytext=(-4, 2), textcoords="offset points")
        ax.set_ylabel(title, fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=11)
        if key.endswith("_pct"):
            ax.set_ylim(0, 105)
        elif key == "mem_used_bytes":
            peak = max(allv, default=0.0)
            ax.set_ylim(0, max(peak * 1.15, 0.5))
            totals = {g.mem_total_bytes for g in shown if g.mem_total_bytes}
            if totals:
                ax.annotate(f"of {max(totals) * scale:.0f} GiB per GPU", (0.0, 1.0), xycoords="axes fraction",
                            ha="left", va="top", fontsize=11, color="#666666", xytext=(4, -3),
                            textcoords="offset points")
        else:
            lim = max((g.power_limit_w or 0 for g in shown), default=0)
            top = max(max(allv, default=1.0), lim)
            if lim:
                ax.axhline(lim, color="#c62828", lw=1)
                ax.annotate(f"power limit {lim:.0f} W", (0.0, lim), xycoords=("axes fraction", "data"),
                            fontsize=11, color="#c62828", xytext=(4, -13), textcoords="offset points")
            ax.set_ylim(0, top * 1.15)
        for g in shown:
            if known(g.lost_at_s):
                lx = xs_of([g.lost_at_s])[0]
                ax.axvline(lx, color="#c62828", ls=":", lw=1.5)
                if ax is axes[0]:
                    ax.annotate(f"GPU {g.index} lost", (lx, 1.0), xycoords=("data", "axes fraction"),
                                fontsize=11, color="#c62828", xytext=(3, -14), textcoords="offset points")
    # idle stretches: every GPU's busy share under 5 % at a point
    util = {}
    for g in devices:
        for p in g.timeline.get("util_pct") or []:
            if p[1] is not None:
                util.setdefault(round(p[0]), []).append(p[1])
    for p in pooled.get("util_pct") or []:      # the highest sample of any GPU is under 5 %
        if p[2] is not None:
            util.setdefault(round(p[0]), []).append(p[2])
    ts = sorted(util)
    for a, b in zip(ts, ts[1:]):
        if max(util[a]) < 5 and max(util[b]) < 5:
            for ax in axes:
                ax.axvspan(*xs_of([a, b]), color="#999999", alpha=0.15, lw=0)
    if clock:
        axes[-1].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        axes[-1].set_xlabel("clock time", fontsize=11)
    else:
        axes[-1].set_xlabel(f"{tunit} since job start", fontsize=11)
        axes[-1].set_xlim(left=0)
    job = summary.job
    title = f"job {job.array or job.id}" + (f" ({job.name})" if job.name else "")
    if many:
        ranked = sorted((g for g in shown if known(g.util_mean_pct)), key=lambda g: g.util_mean_pct)
        worst = ", ".join(f"GPU {g.index}" + (f" on {g.node}" if multi_node else "") + f" {g.util_mean_pct:.0f}%"
                          for g in ranked[:2])
        title += f": {len(shown)} GPUs" + (f", lowest busy: {worst}" if worst else "")
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    if len(devices) > 1 and not many or many:
        h, lab = axes[0].get_legend_handles_labels()
        if h:
            axes[0].legend(h, lab, loc="lower left", fontsize=11, ncol=min(len(h), 4), frameon=True, framealpha=0.8)
    fig.tight_layout(pad=0.4)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI, facecolor="white")
    plt.close(fig)
    return buf.getvalue()
