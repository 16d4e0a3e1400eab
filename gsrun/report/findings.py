"""Plain-language findings with the number behind each, and the verdict rows. Pure.

Thresholds: the site's ``findings.*`` (per partition). Hardware events
(lost GPU, Xid, ECC) come first whatever the job length; advice only for
jobs of at least ``findings.short_job_s``. A GPU without a utilization
figure (MIG, field case 12) is never called idle. Codes:
:class:`gsrun.report.records.FindingCode`.
"""

from __future__ import annotations

from typing import Iterable

from gsrun.base.record import ABSENT, known, or_none
from gsrun.facts.slurm import pending_for_good, pending_hint
from gsrun.report.records import Finding, FindingCode, GpuFigures, GpuSummary, JobInfo, JobSummary, WasteDetection
from gsrun.report.units import as_number, fmt_bytes_of, fmt_duration_s, fmt_share_pct, fmt_time
from gsrun.request.config import Config, SETTINGS

_DEFAULTS = {s.key: s.default for s in SETTINGS}
THROTTLE_FRAC = 0.10        # throttled more than this share of the GPU's time -> finding
CPU_IDLE_PCT = 10.0         # CPU efficiency below this -> fewer CPUs
CPU_BOUND_GPU_PCT = 50.0    # GPUs below this mean while CPUs saturated -> CPU-bound pipeline
TIME_SLACK_S = 1800.0       # a time limit this close to the elapsed time is never called too long
SEVERITY_RANK = {"alert": 0, "warn": 1, "info": 2}
XID_MEANING = {79: "GPU has fallen off the bus", 48: "double-bit ECC error", 63: "ECC page retirement",
               64: "ECC page retirement failure", 74: "NVLink error", 94: "contained ECC error",
               95: "uncontained ECC error", 119: "GSP timeout", 13: "graphics engine exception",
               31: "GPU memory page fault", 43: "GPU stopped processing"}


def run_time_s(job: JobInfo) -> float | None:
    """Seconds the figures cover: ``job.elapsed_s`` (Slurm's), else ``job.sampled_s``; None if neither."""
    return next((v for v in map(as_number, (job.elapsed_s, job.sampled_s)) if v is not None), None)


def fmt_run_time(job: JobInfo) -> str:
    """:func:`run_time_s` as ``[D-]HH:MM:SS``, marked `` (sampled)`` for the samplers' span."""
    text = fmt_duration_s(run_time_s(job), "clock")
    return text + " (sampled)" if as_number(job.elapsed_s) is None and text != "N/A" else text


def _t(cfg: Config | None, key: str, partition: str | None):
    return cfg.get(key, partition) if cfg is not None else _DEFAULTS[key]


def _gpu(g: GpuSummary) -> str:
    return f"GPU {g.index} on {g.node}"


def real_gpus(devices: Iterable[GpuSummary] | None) -> list[GpuSummary]:
    """The devices that are or were real GPUs: status ``ok`` or ``lost`` (no status: not ``emulated``)."""
    return [g for g in devices or ()
            if (("emulated" if g.emulated else "ok") if g.status is ABSENT else g.status) in ("ok", "lost")]


def gpus_asked(job: JobInfo, gpu: GpuFigures | None) -> int:
    """GPUs the job had: Slurm's ``gpus_alloc``, else the GPUs with a summary; 0 for a CPU-only job."""
    return int(as_number(job.gpus_alloc) or as_number(gpu.count if gpu else None) or 0)


def plural(k: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{k} {word}" + ("" if k == 1 else "s")


WASTE_TEXT = {
    FindingCode.GPU_NEVER_USED: ("held but never used", "no process of the job ran on {it} since the job started",
                                 "release GPUs the job does not use (ask for fewer with --gpus)"),
    FindingCode.GPU_IDLE: ("idle while the job ran", "utilization and SM activity stayed at ~0 near idle power",
                           "end the job (or its GPU work) when the GPU work is done; do not hold GPUs while idle"),
    FindingCode.GPU_STUCK_COLLECTIVE: ("stuck", "utilization stayed high while SM and tensor activity were ~0 at "
                                       "near-idle power: a collective (NCCL) waiting for a rank that hangs, or "
                                       "kernels too small to use the GPU",
                                       "check for a hung rank (NCCL_DEBUG=INFO, py-spy dump) and set a timeout "
                                       "on collectives"),
}
# a stuck detection without GPM says what it was decided on instead
STUCK_WHY_NO_GPM = ("utilization stayed high at low power with no link traffic ({text}): a collective (NCCL) "
                    "waiting for a rank that hangs, or kernels too small to use the GPU")


def _lasted_min(w: WasteDetection) -> float:
    """Minutes a detection held: to ``until_s``, else to its detection."""
    end = w.until_s if isinstance(w.until_s, (int, float)) else w.detected_s
    try:
        return max(0.0, (float(end) - float(w.since_s)) / 60.0)
    except (TypeError, ValueError):
        return float((w.evidence or {}).get("minutes") or 0.0)


def _waste(waste: Iterable[WasteDetection]) -> list[Finding]:
    """One finding per kind of waste detected, GPUs grouped; value: the longest stretch, minutes."""
    out = []
    for code, (what, why, action) in WASTE_TEXT.items():
        hits = [w for w in waste if w.code == code.value]
        if not hits:
            continue
        devs = [GpuSummary(node=w.node, index=int(w.gpu) if str(w.gpu).isdigit() else w.gpu) for w in hits]
        devs = list({(d.node, d.index): d for d in devs}.values())
        longest = max(_lasted_min(w) for w in hits)
        first = min(w.since_s or 0.0 for w in hits)
        it = "it" if len(devs) == 1 else "them"
        if code is FindingCode.GPU_STUCK_COLLECTIVE:
            texts = [(w.evidence or {}).get("text") for w in hits]
            if all(isinstance(t, str) and t for t in texts):    # every GPU decided without GPM
                text = max(hits, key=_lasted_min).evidence["text"][:300]
                why = STUCK_WHY_NO_GPM.replace("{text}", text.replace("{", "{{").replace("}", "}}"))
        out.append(Finding(code=code, severity="warn", value=round(float(longest), 1), action=action,
                           text=f"{gpus_label(devs)} {_were(devs)} {what} (detected while the job ran, from "
                                f"{fmt_duration_s(first, 'clock')} into the job, for at least {longest:.0f} min): "
                                f"{why.format(it=it)}. Next time: {action}."))
    return out


def _hardware(gpu: GpuFigures) -> list[Finding]:
    out = []
    for g in gpu.devices or ():
        if known(g.lost_at_s):
            xid = " (Xid 79: fallen off the bus)" if 79 in (g.xid or ()) else ""
            out.append(Finding(code=FindingCode.GPU_LOST, severity="alert", value=g.lost_at_s,
                               text=f"Hardware event: {_gpu(g)} was lost {fmt_duration_s(g.lost_at_s, 'clock')} "
                                    f"into the job{xid} and the node was flagged for the admins. Its figures cover "
                                    "only the time before; if the job failed then, resubmit it."))
        xids = [x for x in (g.xid or ()) if not (x == 79 and known(g.lost_at_s))]
        if xids:
            named = ", ".join(f"{x} ({XID_MEANING[x]})" if x in XID_MEANING else str(x)
                              for x in dict.fromkeys(xids))
            out.append(Finding(code=FindingCode.XID, severity="alert", value=xids,
                               text=f"Hardware event: {_gpu(g)} reported Xid error(s) {named}."))
        if g.ecc_uncorrected:
            out.append(Finding(code=FindingCode.ECC, severity="alert", value=g.ecc_uncorrected,
                               text=f"Hardware event: {_gpu(g)} had {g.ecc_uncorrected} uncorrected ECC "
                                    "error(s) during the job."))
    return out


def finding_records(summary: JobSummary, cfg: Config | None = None, partition: str | None = None) -> list[Finding]:
    """The findings of a job summary, most important first."""
    out: list[Finding] = []
    job, gpu, cpu, mem = summary.job, summary.gpu, summary.cpu, summary.memory
    elapsed = run_time_s(job) or 0.0
    state = (job.state or "").upper()
    if state.startswith("CANCELLED") and elapsed <= 0:
        return [Finding(code=FindingCode.NEVER_STARTED, severity="info", value=0,
                        text="The job was cancelled before it started: nothing to report.")]
    if state in ("PENDING", "REQUEUED"):
        return [_deferred(job, state)]
    out += _hardware(gpu)
    out += _waste(summary.waste or ())
    if not gpu.available and gpu.reason and gpus_asked(job, gpu):
        out.append(Finding(code=FindingCode.GPU_UNAVAILABLE, severity="info", value=None,
                           text="No GPU figures: the node could not read this job's GPUs (the cause is under GPUs "
                                "below and in the node's log, for the admin). This is not a problem of the job."))
    if summary.nodes_missing:
        out.append(Finding(code=FindingCode.NODES_MISSING, severity="warn", value=list(summary.nodes_missing),
                           text=f"No summary from node(s) {', '.join(summary.nodes_missing)}: figures are partial."))
    short_s = _t(cfg, "findings.short_job_s", partition)
    if elapsed < short_s:
        ran = "ran" if as_number(job.elapsed_s) is not None else "was sampled for"
        out.append(Finding(code=FindingCode.SHORT_JOB, severity="info", value=round(elapsed, 1),
                           text=f"The job {ran} {elapsed:.0f} s (less than {short_s:.0f} s): too short for the "
                                "figures below to be meaningful, so there is no advice."))
        return out
    real = real_gpus(gpu.devices)
    if gpu.available:
        out += _gpu_advice(real, cfg, partition)
    cpu_sat = _t(cfg, "findings.cpu_saturated_pct", partition)
    busy = [g.util_mean_pct for g in real if known(g.util_mean_pct)]
    gmean = sum(busy) / len(busy) if busy else None
    eff = or_none(cpu.efficiency_pct)
    if gpu.available and eff is not None and eff >= cpu_sat and busy and gmean < CPU_BOUND_GPU_PCT:
        out.append(Finding(code=FindingCode.CPU_BOUND, severity="warn", value=eff,
                           text=f"The allocated CPUs were {eff:.0f}% busy while the GPUs were "
                                f"busy only {gmean:.0f}% of the time: the input pipeline is likely CPU-bound. "
                                "Use more DataLoader workers (num_workers), pin_memory=True, and ask for more "
                                "CPUs per GPU if the node has them.",
                           action="more DataLoader workers (num_workers) and more CPUs per GPU"))
    if cpu.anomaly:
        out.append(Finding(code=FindingCode.CPU_ANOMALY, severity="info", value=cpu.efficiency_pct,
                           text="The CPU time exceeds the allocated cores x elapsed time (accounting anomaly): "
                                "CPU efficiency is shown as 100%."))
    if known(mem.efficiency_pct) and mem.efficiency_pct < _t(cfg, "findings.mem_overrequest_pct", partition):
        out.append(Finding(code=FindingCode.MEM_OVERREQUEST, severity="info", value=mem.efficiency_pct,
                           action=_mem_action(summary),
                           text=f"The job used at most {mem.efficiency_pct:.0f}% of the host memory it requested: "
                                f"{_mem_action(summary)}, so other jobs can run."))
    if eff is not None and eff < CPU_IDLE_PCT and _cpus_can_shrink(job, gpu):
        out.append(Finding(code=FindingCode.CPU_IDLE, severity="info", value=eff, action="fewer CPUs per task",
                           text=f"CPU efficiency was {eff:.0f}% of {job.cpus_alloc or None} "
                                "allocated cores: fewer CPUs per task would do."))
    out += _time_limit(job, cfg, partition)
    return sorted(out, key=lambda f: SEVERITY_RANK.get(f.severity, 3))


def _deferred(job: JobInfo, state: str) -> Finding:
    """The one finding of a job not run yet: why it waits, when it may start, when a report exists."""
    reason = job.pending_reason or ""
    why = f" ({reason})" if reason else ""
    stuck = pending_for_good(reason)
    text = f"The job is {state.lower()}{why}"
    if stuck:
        text += f", and will not start as it is: {stuck}."
    else:
        start = job.expected_start
        text += (f"; Slurm expects it to start at {fmt_time(start)}." if isinstance(start, (int, float))
                 else ".")
        text += f" A report exists once it starts (gseff {job.id or 'JOBID'} shows it as it runs) and " \
                "the full one when it ends."
    return Finding(code=FindingCode.DEFERRED, severity="warn" if stuck else "info", value=None, text=text,
                   action=pending_hint(str(job.id or "JOBID")) if stuck else ABSENT)


def _cpus_can_shrink(job: JobInfo, gpu: GpuFigures) -> bool:
    """More than one CPU per GPU (or per job without GPUs); True when unknown."""
    cpus = job.cpus_alloc
    if not isinstance(cpus, (int, float)):
        return True
    return cpus > max(1, gpus_asked(job, gpu))


IDLE_CODES = frozenset({FindingCode.IDLE_GPU, FindingCode.LOW_GPU_UTIL})


def shown_findings(summary: JobSummary) -> list[Finding]:
    """The stored findings to show: without :data:`IDLE_CODES` when no GPU has a utilization figure
    (MIG, field case 12)."""
    any_util = any(as_number(d.util_mean_pct) is not None for d in (summary.gpu.devices if summary.gpu else ()) or ())
    return [f for f in summary.findings or () if any_util or f.code not in IDLE_CODES]


def _mem_action(summary: JobSummary) -> str:
    """``ask for less memory (--mem 40G)``: the largest node high water x 1.25 in whole GiB (per node)."""
    peaks = [n.mem_peak_bytes for n in summary.nodes_detail or () if n.mem_peak_bytes]
    if not peaks:
        return "ask for less memory"
    gib = -(-int(1.25 * max(peaks)) // 2**30)
    return f"ask for less memory (--mem {gib}G)"


def _ranges(idx: list) -> str:
    """[0, 1, 2, 3, 6, 7] -> ``0-3, 6, 7`` (non-integer indices as they are)."""
    runs: list[list[int]] = []
    for i in sorted(i for i in idx if isinstance(i, int)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    out = [x for r in runs for x in ([f"{r[0]}-{r[-1]}"] if len(r) > 2 else map(str, r))]
    return ", ".join(out + [str(i) for i in idx if not isinstance(i, int)])


def gpus_label(devs: Iterable[GpuSummary]) -> str:
    """``GPU 3 on n1``, ``GPUs 4-7 on node01, GPU 1 on b`` (nodes in order of first appearance); ``devs``:
    anything with ``.node`` and ``.index``."""
    by_node: dict = {}
    for g in devs:
        by_node.setdefault(g.node, []).append(g.index)
    return ", ".join(f"{'GPU' if len(ix) == 1 else 'GPUs'} {_ranges(ix)} on {node}" for node, ix in by_node.items())


def _span(vals: list[float]) -> str:
    """``98%`` or ``33-100%``."""
    lo, hi = fmt_share_pct(min(vals)), fmt_share_pct(max(vals))
    return lo if lo == hi else f"{lo[:-1]}-{hi}"


def _were(devs: list) -> str:
    return "was" if len(devs) == 1 else "were"


def _gpu_advice(real: list[GpuSummary], cfg, partition) -> list[Finding]:
    """GPU advice: one finding per kind of problem, its GPUs grouped."""
    out = []
    idle_thr = _t(cfg, "findings.idle_util_pct", partition)
    low_sm = _t(cfg, "findings.low_sm_activity_pct", partition)
    note = _t(cfg, "findings.low_util_note_pct", partition)
    warn = _t(cfg, "findings.low_util_warn_pct", partition)
    with_util = [g for g in real if known(g.util_mean_pct)]
    idle = [g for g in with_util if g.util_mean_pct < idle_thr]
    keep = len(real) - len(idle)
    if idle:
        pcts = [100.0 * g.util_idle_frac if known(g.util_idle_frac) else 100.0 - g.util_mean_pct for g in idle]
        if keep > 0:
            action = f"ask for {plural(keep, 'GPU')} (--gpus {keep})"
        else:
            action = "check that the code runs on the GPU at all (model and data moved to 'cuda')"
        out.append(Finding(code=FindingCode.IDLE_GPU, severity="warn", value=round(max(pcts), 1), action=action,
                           text=f"{gpus_label(idle)} {_were(idle)} idle {_span(pcts)} of the time (mean "
                                f"utilization {_span([g.util_mean_pct for g in idle])}): {action}."))
    low = [g for g in with_util if idle_thr <= g.util_mean_pct < note]
    for sev, group in (("warn", [g for g in low if g.util_mean_pct < warn]),
                       ("info", [g for g in low if g.util_mean_pct >= warn])):
        if not group:
            continue
        action = "feed the GPU faster (DataLoader num_workers, pin_memory, larger batches)"
        out.append(Finding(code=FindingCode.LOW_GPU_UTIL, severity=sev, action=action,
                           value=round(min(g.util_mean_pct for g in group), 1),
                           text=f"{gpus_label(group)} {_were(group)} busy only "
                                f"{_span([g.util_mean_pct for g in group])} of the time (target {note:.0f}%): "
                                "the GPU mostly waited for input or for the CPU. Use more DataLoader workers "
                                "(num_workers), pin_memory=True and larger batches, and avoid .item() / .cpu() "
                                "in the training loop; torch.profiler shows where the time goes."))
    small = [g for g in with_util if known(g.sm_active_mean_pct) and g.util_mean_pct >= idle_thr
             and g.sm_active_mean_pct < low_sm and g.sm_active_mean_pct < 0.5 * g.util_mean_pct]
    if small:
        out.append(Finding(code=FindingCode.LOW_SM_ACTIVITY, severity="warn",
                           value=round(min(g.sm_active_mean_pct for g in small), 1),
                           action="use larger batches, CUDA graphs or torch.compile",
                           text=f"{gpus_label(small)}: SM activity {_span([g.sm_active_mean_pct for g in small])}"
                                f" is far below the utilization {_span([g.util_mean_pct for g in small])}: "
                                "kernels ran most of the time but kept few of the GPU's compute units (SMs) busy "
                                "(tiny kernels or small batches). Try a larger batch, CUDA graphs or "
                                "torch.compile."))
    by_why: dict = {}
    for g in real:
        if not known(g.util_mean_pct) and g.status != "lost":
            by_why.setdefault("MIG" if g.mig or g.util_na_reason == "MIG"
                              else (g.util_na_reason or "not reported"), []).append(g)
    for why, group in by_why.items():
        peaks = [g.mem_peak_pct for g in group if known(g.mem_peak_pct)]
        out.append(Finding(code=FindingCode.UTIL_NA, severity="info", value=None,
                           text=f"{gpus_label(group)}: utilization N/A ({why}): NVML gives no utilization figure "
                                "here, which does not mean the GPU was unused."
                                + (f" Memory high water: {_span(peaks)} of the slice." if peaks else "")))
    hints = {"thermal": "report it to the admins (cooling)",
             "power": "the GPU hit its power limit; normal for heavy loads, report it if frequent",
             "hw_slowdown": "report it to the admins"}
    for cause in ("thermal", "power", "hw_slowdown"):
        hit = [(g, (g.throttle_s or {}).get(cause) or 0.0) for g in real]
        hit = [(g, s) for g, s in hit if (g.covered_s or 0.0) > 0 and s > THROTTLE_FRAC * g.covered_s]
        if hit:
            out.append(Finding(code=FindingCode(f"throttle_{cause}"), severity="warn",
                               value=round(max(s for _g, s in hit), 1),
                               text=f"{gpus_label([g for g, _s in hit])} {_were(hit)} slowed down by "
                                    f"{cause.replace('_', ' ')} "
                                    f"{_span([100 * s / g.covered_s for g, s in hit])} of the time: {hints[cause]}."))
    roomy = [g for g in with_util if g.mem_peak_bytes and g.mem_total_bytes
             and g.mem_peak_bytes < 0.1 * g.mem_total_bytes and g.util_mean_pct >= idle_thr]
    if roomy:
        pcts = [100 * g.mem_peak_bytes / g.mem_total_bytes for g in roomy]
        out.append(Finding(code=FindingCode.GPU_MEM_LOW, severity="info", value=round(max(pcts), 1),
                           action="a larger batch, or a MIG slice / MPS share (--mps)",
                           text=f"{gpus_label(roomy)} used at most {_span(pcts)} of "
                                f"{'its' if len(roomy) == 1 else 'their'} memory: a larger batch would fit, or a "
                                "MIG slice / MPS share (--mps) would do."))
    return out


def _suggest_time_s(elapsed_s: float) -> float:
    """1.5 x the elapsed time, at least 30 min more, rounded up to 15 min."""
    want = max(1.5 * elapsed_s, elapsed_s + 1800.0)
    return float(-(-int(want) // 900) * 900)


def _time_limit(job: JobInfo, cfg, partition) -> list[Finding]:
    limit, elapsed = job.time_limit_s, as_number(job.elapsed_s)   # Slurm's, as the limit is
    if not limit or not elapsed or limit <= 0:
        return []
    pct = 100.0 * elapsed / limit
    if pct >= _t(cfg, "findings.time_limit_used_pct", partition) or limit - elapsed < TIME_SLACK_S:
        return []
    new = fmt_duration_s(_suggest_time_s(elapsed), "clock")
    action = f"ask for less time (--time {new})"
    return [Finding(code=FindingCode.TIME_LIMIT_HIGH, severity="info", value=round(pct, 1), action=action,
                    text=f"The job ran {fmt_duration_s(elapsed, 'clock')} of its {fmt_duration_s(limit, 'clock')} "
                         f"time limit ({pct:.0f}%): {action}. A shorter limit lets Slurm start the job sooner "
                         "(backfill).")]


LEVEL_WORDS = {"good": "good", "better": "could be better", "wasteful": "wasteful", None: ""}
GPU_MEM_LOW_PCT = 10.0      # GPU memory high water below this share of the total: could be better
CPU_WASTE_PCT = CPU_IDLE_PCT


def _level(v: float | None, good: float, better: float) -> str | None:
    if v is None:
        return None
    return "good" if v >= good else ("better" if v >= better else "wasteful")


def verdicts(summary: JobSummary, cfg: Config | None = None, partition: str | None = None) -> list[dict]:
    """One row per resource, most important first; empty for a job that did not run.

    Row: ``{"key", "label", "pct" (or None), "level" (good | better |
    wasteful | None: not judged), "word", "detail", "bar_pct" (0..100)}``.
    Keys and targets (good / better): ``gpu_busy`` (low_util_note_pct /
    low_util_warn_pct), ``gpu_sm`` (low_sm_activity_pct / half), ``gpu_mem``
    (fullest GPU, 10 %), ``cpu`` (cpu_good_pct / 10 %), ``host_mem``
    (mem_good_pct / mem_overrequest_pct), ``time`` (2 x
    time_limit_used_pct, never wasteful)."""
    job, gpu, cpu, mem = summary.job, summary.gpu, summary.cpu, summary.memory
    ran = run_time_s(job)
    if not ran or any(f.code in (FindingCode.NEVER_STARTED, FindingCode.DEFERRED) for f in summary.findings or ()):
        return []
    rows = []
    # too short to judge (the SHORT_JOB finding says so): the figures stand, without a level
    judge = ran >= _t(cfg, "findings.short_job_s", partition)
    real = real_gpus(gpu.devices)
    util = [g for g in real if known(g.util_mean_pct)]
    if gpu.available and util:
        mean = sum(g.util_mean_pct for g in util) / len(util)
        low = min(util, key=lambda g: g.util_mean_pct)
        detail = "share of time a kernel ran" if len(util) == 1 else \
            f"mean of {len(util)} GPUs; lowest {_short_label(low, real)}: {fmt_share_pct(low.util_mean_pct)}"
        rows.append({"key": "gpu_busy", "label": "GPU busy", "pct": mean, "detail": detail,
                     "level": _level(mean, _t(cfg, "findings.low_util_note_pct", partition),
                                     _t(cfg, "findings.low_util_warn_pct", partition))})
        sm = [g.sm_active_mean_pct for g in util if known(g.sm_active_mean_pct)]
        if sm:
            low_sm = _t(cfg, "findings.low_sm_activity_pct", partition)
            rows.append({"key": "gpu_sm", "label": "GPU SM active", "pct": sum(sm) / len(sm),
                         "detail": "share of the SMs in use",
                         "level": _level(sum(sm) / len(sm), low_sm, low_sm / 2)})
    elif real and gpu.available:
        rows.append({"key": "gpu_busy", "label": "GPU busy", "pct": None, "level": None,
                     "detail": "not reported (MIG or driver): does not mean unused"})
    withmem = [g for g in real if known(g.mem_peak_bytes) and g.mem_total_bytes]
    if withmem:
        top = max(withmem, key=lambda g: g.mem_peak_bytes / g.mem_total_bytes)
        pct = 100.0 * top.mem_peak_bytes / top.mem_total_bytes
        rows.append({"key": "gpu_mem", "label": "GPU memory", "pct": pct,
                     "detail": "peak " + fmt_bytes_of(top.mem_peak_bytes, top.mem_total_bytes)
                     + (f" ({_short_label(top, real)})" if len(withmem) > 1 else ""),
                     "level": "good" if pct >= GPU_MEM_LOW_PCT else "better"})
    if known(cpu.efficiency_pct):
        shrink = _cpus_can_shrink(job, gpu)
        rows.append({"key": "cpu", "label": "CPU efficiency", "pct": cpu.efficiency_pct,
                     "detail": f"of {job.cpus_alloc or 'N/A'} cores"
                               + ("" if shrink else " (one per task: the fewest there are)"),
                     "level": _level(cpu.efficiency_pct, _t(cfg, "findings.cpu_good_pct", partition),
                                     CPU_WASTE_PCT) if shrink else None})
    if known(mem.efficiency_pct):
        rows.append({"key": "host_mem", "label": "Host memory", "pct": mem.efficiency_pct,
                     "detail": "peak " + fmt_bytes_of(mem.peak_bytes, mem.req_bytes) + " requested",
                     "level": _level(mem.efficiency_pct, _t(cfg, "findings.mem_good_pct", partition),
                                     _t(cfg, "findings.mem_overrequest_pct", partition))})
    limit = job.time_limit_s
    if limit and as_number(job.elapsed_s):     # Slurm's elapsed time only, as Slurm counts the limit
        pct = 100.0 * job.elapsed_s / limit
        good = 2 * _t(cfg, "findings.time_limit_used_pct", partition)
        rows.append({"key": "time", "label": "Time limit", "pct": pct,
                     "detail": f"{fmt_duration_s(job.elapsed_s, 'clock')} of "
                               f"{fmt_duration_s(limit, 'clock')}",
                     "level": "good" if pct >= good else "better"})
    for r in rows:
        if not judge:
            r["level"] = None
        r["word"] = LEVEL_WORDS[r["level"]]
        r["bar_pct"] = None if r["pct"] is None else max(0.0, min(100.0, r["pct"]))
    return rows


def _short_label(g: GpuSummary, devs: list[GpuSummary]) -> str:
    """``GPU 7`` (one node) or ``GPU 7 on node02``."""
    return f"GPU {g.index}" if len({d.node for d in devs}) == 1 else gpus_label([g])


def headline(summary: JobSummary, rows: list[dict]) -> dict:
    """``{"alert": the first hardware event or "", "next": the most important finding's action, else
    what the verdict says could be better}``, both in lower case (after ``Next time: ``)."""
    fs = shown_findings(summary)
    alert = next((f.text.removeprefix("Hardware event: ") for f in fs if f.severity == "alert"), "")
    act = next((f for f in fs if f.action and f.severity in ("warn", "alert")), None) \
        or next((f for f in fs if f.action), None)
    weak = [r["label"] for r in rows if r["level"] in ("better", "wasteful")]
    gpu_weak = [r for r in rows if r["key"].startswith("gpu") and r["level"] in ("better", "wasteful")]
    named = " and ".join(" ".join(w if w.isupper() else w.lower() for w in lab.split()) for lab in weak)
    if act is not None:
        nxt = act.action + "."
    elif not rows or all(r["level"] is None for r in rows):
        nxt = ""        # nothing judged (a job too short to judge, no figures): nothing to advise
    elif not weak:
        nxt = "nothing to change: the job used what it asked for."
    elif not gpu_weak and any(r["key"].startswith("gpu") for r in rows):
        nxt = f"nothing to change on the GPUs; {named} could be better (below)."     # "CPU" stays upper case
    else:
        nxt = f"{named} could be better (the figures below say by how much)."
    return {"alert": alert, "next": nxt}
