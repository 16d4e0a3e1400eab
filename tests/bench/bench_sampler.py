"""Benchmark (not a test): the per-job sampler's CPU cost per GPU per sample and
its resident memory after a simulated 7-day job, against a bare NVML polling
loop, in the same run.

    /opt/gsrun/venv/bin/python tests/bench/bench_sampler.py [--gpus 8] [--days 7] [--interval 5]
    /opt/gsrun/venv/bin/python tests/bench/bench_sampler.py --real [--samples 20000]   # on a GPU node

The job's clock is simulated (no sleeping): a 7-day job at 5 s is 120960
polls, run back to back; state is flushed (atomic JSON rewrite) every
``--flush`` simulated seconds, as the real sampler does.

- Fake mode (default): :class:`gsrun.facts.nvml.FakeNvml` from the real H200
  recording, ``--gpus`` copies, whose utilization buffer and energy counter
  follow the simulated clock. The bare loop makes the *same* FakeNvml calls
  as the sampler (:func:`gsrun.node.sampler.read_gpu`) without aggregating, so the
  ratio is the cost of gsrun's aggregation + state over the calls themselves.
- ``--real``: pynvml on this host's GPUs (all of them, or ``--gpus N``). The
  bare loop is ``nvmlDeviceGetUtilizationRates`` / ``MemoryInfo`` /
  ``PowerUsage`` / ``TotalEnergyConsumption`` per GPU (what a minimal
  exporter polls); the sampler makes its full set of calls (sample buffer,
  clocks, throttle reasons, PCIe, ECC, Xid events, GPM where supported).

``--waste`` runs only the waste detector's section: the sampler's
polls with and without its per-GPU detector (:class:`gsrun.request.waste.GpuWatch`,
fed every poll), alternating A/B rounds of ``--waste-samples`` polls in one run,
and prints the per-poll CPU of both (best round and mean) and their ratio (aim:
at most 1.10).

Then the same run compares today's sampler with the sampler writing the
Prometheus textfile at each flush (``[metrics] textfile_dir``,
:mod:`gsrun.node.metrics_textfile`): per-poll CPU amortized over polls and
flushes, best of ``--rounds`` interleaved rounds, and the ratio to today's.

Prints CPU microseconds per GPU per sample (process time) for: the bare
4-call loop, the bare same-calls loop, the sampler's polls (without flushes)
and the sampler including its flushes; the ratios to the bare loops; the
resident-set growth (psutil RSS) over each run; the state file size and the
timeline points per metric at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import psutil  # noqa: E402

from gsrun.facts.hostfs import HostFS  # noqa: E402
from gsrun.facts.nvml import FakeNvml, RealNvml, is_na  # noqa: E402
from gsrun.node.sampler import Sampler, read_gpu, resolve_gpus  # noqa: E402

T0 = 1_760_000_000.0
H200 = REPO / "tests" / "data" / "hosts" / "h200-vm" / "nvml.json"
BARE4 = ("utilization", "memory", "power_mw", "energy_mj")


class Clock:
    def __init__(self):
        self.t = T0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


class ClockedFake(FakeNvml):
    """The H200 recording x N GPUs; utilization buffer (1 sample/s, busy 3 s
    of 10) and energy counter (300 W) follow the simulated clock."""

    def __init__(self, n: int, clock: Clock):
        base = json.loads(H200.read_text())
        dev = base["devices"][0]
        dev.pop("gpu_instance_profiles", None)
        devs = []
        for i in range(n):
            d = copy.deepcopy(dev)
            d["index"], d["minor"] = i, {"ok": i}
            devs.append(d)
        base["devices"] = devs
        super().__init__(base)
        self.clock = clock

    def get(self, index, key, **kw):
        if key == "util_samples":
            t = self.clock() - T0
            since = kw.get("since_us", 0) / 1e6 - T0
            lo = max(int(since) + 1, int(t) - 20)
            return [[int((T0 + s) * 1e6), 100 if s % 10 < 3 else 0] for s in range(lo, int(t) + 1)]
        if key == "energy_mj":
            return int(1e6 + 300_000 * (self.clock() - T0))
        devs = self.data["devices"]
        if not 0 <= index < len(devs):
            return super().get(index, key, **kw)
        return super().get(index, key, **kw)


class _Quiet(list):
    def append(self, _x):
        pass


def rss() -> int:
    return psutil.Process().memory_info().rss


def job_usage_reader():
    """A cheap, real job-usage reading (this process's CPU time and RSS), so
    the sampler's CPU/memory side costs what a file read costs."""
    me = psutil.Process()

    def f():
        ct = me.cpu_times()
        return ct.user + ct.system, me.memory_info().rss, None, "bench"
    return f


def bare_loop(nv, refs, n: int, keys) -> float:
    """Seconds of CPU for ``n`` polls of ``keys`` on every GPU, no aggregation."""
    c0 = time.process_time()
    for _ in range(n):
        for r in refs:
            for k in keys:
                nv.get(r.nvml_index, k)
    return time.process_time() - c0


def bare_same(nv, refs, n: int, clock: Clock, interval: float) -> float:
    last = {r.gres_index: 0 for r in refs}
    c0 = time.process_time()
    for _ in range(n):
        for r in refs:
            x = read_gpu(nv, r, last[r.gres_index])
            s = x.get("util_samples")
            if isinstance(s, list) and s:
                last[r.gres_index] = s[-1][0]
        clock.t += interval
    return time.process_time() - c0


def run_variant(nv, refs, a, clock: Clock, tmp: Path, name: str, export: bool,
                detect: bool = True) -> tuple[float, float, int, float]:
    """``--compare-samples`` polls of a fresh sampler with flushes every
    ``--flush`` simulated s; with ``export``, the Prometheus textfile written
    at each flush as the real sampler does (``[metrics] textfile_dir``);
    without ``detect``, the waste detector is not fed (the sampler before
    ``Sampler._watch`` replaced by a no-op).
    -> (CPU s of the polls, CPU s of flushes incl. export, flushes, CPU s
    inside the export calls alone, CPU s inside the detector calls alone)."""
    from gsrun.node.metrics_textfile import TextfileExporter

    clock.t = T0
    d = tmp / name
    d.mkdir(exist_ok=True)
    s = Sampler(HostFS(str(tmp / "root")), "4242", os.getuid(), "bench", [r.gres_index for r in refs],
                str(d / "sampler.json"), a.interval, a.flush, 1000, clock=clock,
                nvml=nv, usage=job_usage_reader())
    spent = [0.0, 0.0]         # CPU s inside the export calls, inside the detector calls
    if not detect:
        s._watch = lambda *_a: None
    else:
        watch = s._watch

        def timed_watch(*args):
            c = time.process_time()
            watch(*args)
            spent[1] += time.process_time() - c
        s._watch = timed_watch
    if export:
        exporter = TextfileExporter(str(d), "4242", "bench")

        def timed_export(state):
            c = time.process_time()
            exporter(state)
            spent[0] += time.process_time() - c
        s.export = timed_export
    poll = flush = 0.0
    n_flush = 0
    last = None
    for _ in range(a.compare_samples):
        c0 = time.process_time()
        s.sample_once()
        c1 = time.process_time()
        poll += c1 - c0
        if last is None or clock.t - last >= a.flush:
            s.flush()
            flush += time.process_time() - c1
            n_flush += 1
            last = clock.t
        clock.t += a.interval
    if export and not (d / "gsrun_job_4242.prom").exists():
        raise SystemExit("bench: the exporter wrote no file")
    return poll, flush, n_flush, spent[0], spent[1]


def compare_export(nv, refs, a, clock: Clock, tmp: Path) -> None:
    """Per-poll CPU (amortized: polls + flushes + what runs at the flush, over
    the polls) of today's sampler (no waste detection) against the sampler
    with the detector, and with the detector and the Prometheus textfile
    export, same run, interleaved rounds, best of ``--rounds``.
    The export runs at the flush only (every ``--flush`` s), so its cost per
    poll is its cost per flush x interval / flush."""
    from gsrun.node.metrics_textfile import render

    render([])    # prometheus_client imported once, as the sampler does at its first export

    ng = len(refs)
    variants = (("today (no detection)", False, False), ("detection", False, True),
                ("detection + export", True, True))
    best: dict[str, tuple] = {}
    for _ in range(a.rounds):
        for i, (name, export, detect) in enumerate(variants):
            r = run_variant(nv, refs, a, clock, tmp, f"variant{i}", export, detect)
            if name not in best or sum(r[:2]) < sum(best[name][:2]):
                best[name] = r
    base = sum(best["today (no detection)"][:2]) / (a.compare_samples * ng)
    print(f"per-poll CPU, amortized over {a.compare_samples} polls (flush every {a.flush:g} s at {a.interval:g} s; "
          f"best of {a.rounds} interleaved rounds)")
    print(f"{'variant':<30} {'us/GPU/poll':>12} {'polls us':>10} {'flush ms':>9} {'x today':>8}")
    for name, _e, _d in variants:
        poll, flush, n = best[name][:3]
        per = (poll + flush) / (a.compare_samples * ng)
        print(f"{name:<30} {1e6 * per:12.2f} {1e6 * poll / (a.compare_samples * ng):10.2f} "
              f"{1e3 * flush / max(n, 1):9.3f} {per / base:8.3f}")
    poll, flush, n, inside, detect_s = best["detection + export"]
    per_flush = inside / max(n, 1)
    amort = inside / (a.compare_samples * ng)
    det = detect_s / (a.compare_samples * ng)
    print("timed around their calls (less noisy than the differences above):")
    print(f"  detection: {1e6 * det:.2f} us per GPU per poll = {100 * det / base:.1f} % of today's per-poll CPU")
    print(f"  export: {1e3 * per_flush:.3f} ms CPU per flush for {ng} GPUs = {1e6 * amort:.2f} us per GPU per poll "
          f"amortized = {100 * amort / base:.1f} % of today's per-poll CPU")
    print(f"  detection + export: {100 * (det + amort) / base:.1f} % of today's per-poll CPU (target: within 10 %)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", action="store_true", help="use pynvml on this host's GPUs")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs (fake: default 8; real: default all)")
    ap.add_argument("--days", type=float, default=7.0, help="simulated job length (default 7)")
    ap.add_argument("--interval", type=float, default=5.0, help="sampler interval in s (default 5)")
    ap.add_argument("--flush", type=float, default=30.0, help="state flush period in simulated s (default 30)")
    ap.add_argument("--samples", type=int, default=None,
                    help="polls for the sampler run (default: days x 86400 / interval)")
    ap.add_argument("--bare-samples", type=int, default=20000, help="polls for each bare loop (default 20000)")
    ap.add_argument("--waste", action="store_true",
                    help="only the waste detector's section: polls with / without it, and the ratio")
    ap.add_argument("--waste-samples", type=int, default=5000, help="polls per A/B round (default 5000)")
    ap.add_argument("--waste-rounds", type=int, default=4, help="A/B rounds (default 4)")
    ap.add_argument("--compare-samples", type=int, default=None,
                    help="polls per variant and round in the detection/export comparison "
                         "(default 20000; --real: 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the comparison (default 3)")
    a = ap.parse_args(argv)

    samples = a.samples or int(a.days * 86400 / a.interval)
    if a.compare_samples is None:
        a.compare_samples = 2000 if a.real else 20000
    clock = Clock()
    if a.real:
        nv = RealNvml()
        n = nv.count() if a.gpus is None else min(a.gpus, nv.count())
        mode = f"real NVML, driver {nv.driver_version()}, {n} GPU(s)"
    else:
        n = a.gpus or 8
        nv = ClockedFake(n, clock)
        nv.calls = _Quiet()
        mode = f"FakeNvml (H200 recording) x {n} GPU(s)"
    refs, notes = resolve_gpus(nv, list(range(n)))
    refs = [r for r in refs if r.nvml_index is not None]
    if not refs:
        print("no GPUs: " + "; ".join(notes))
        return 1
    name = nv.get(refs[0].nvml_index, "name")
    print(f"mode: {mode} ({'N/A' if is_na(name) else name}); GPM: {[r.gpm for r in refs]}")
    print(f"sampler run: {samples} polls = {samples * a.interval / 86400:.2f} simulated days at {a.interval:g} s, "
          f"flush every {a.flush:g} s; bare loops: {a.bare_samples} polls")

    ng = len(refs)
    if a.waste:
        return waste_section(nv, refs, clock, a)
    r0 = rss()
    bare4_s = bare_loop(nv, refs, a.bare_samples, BARE4)
    bare_same_s = bare_same(nv, refs, a.bare_samples, clock, a.interval)
    bare_rss = rss() - r0
    bare4_us = 1e6 * bare4_s / (a.bare_samples * ng)
    same_us = 1e6 * bare_same_s / (a.bare_samples * ng)

    tmp = tempfile.mkdtemp(prefix="bench-sampler-")
    clock.t = T0
    root = Path(tmp) / "root"
    root.mkdir()
    r1 = rss()
    s = Sampler(HostFS(str(root)), "4242", os.getuid(), "bench", [r.gres_index for r in refs],
                str(Path(tmp) / "sampler.json"), a.interval, a.flush, 1000, clock=clock,
                nvml=nv, usage=job_usage_reader())
    poll_cpu = flush_cpu = 0.0
    flushes = 0
    last_flush = None
    t_wall = time.perf_counter()
    for _ in range(samples):
        c0 = time.process_time()
        s.sample_once()
        c1 = time.process_time()
        poll_cpu += c1 - c0
        if last_flush is None or clock.t - last_flush >= a.flush:
            s.flush()
            flush_cpu += time.process_time() - c1
            flushes += 1
            last_flush = clock.t
        clock.t += a.interval
    s.flush(done=True)
    wall = time.perf_counter() - t_wall
    sampler_rss = rss() - r1
    state_bytes = os.path.getsize(Path(tmp) / "sampler.json")
    st = json.loads((Path(tmp) / "sampler.json").read_text())
    points = {k: len(v["points"]) for k, v in st["gpus"][0]["timeline"].items()}
    poll_us = 1e6 * poll_cpu / (samples * ng)
    total_us = 1e6 * (poll_cpu + flush_cpu) / (samples * ng)
    sim_days = samples * a.interval / 86400

    print()
    print(f"{'CPU per GPU per sample':<44} {'us':>9}  {'x bare-4':>8}  {'x same-calls':>12}")
    print(f"{'bare loop, 4 NVML calls (util/mem/power/energy)':<44} {bare4_us:9.1f}  {1.0:8.2f}  {bare4_us / same_us:12.2f}")
    print(f"{'bare loop, the same NVML calls as the sampler':<44} {same_us:9.1f}  {same_us / bare4_us:8.2f}  {1.0:12.2f}")
    print(f"{'sampler polls (calls + aggregation)':<44} {poll_us:9.1f}  {poll_us / bare4_us:8.2f}  {poll_us / same_us:12.2f}")
    print(f"{'sampler incl. state flushes':<44} {total_us:9.1f}  {total_us / bare4_us:8.2f}  {total_us / same_us:12.2f}")
    print()
    print(f"flushes: {flushes}, {1e3 * flush_cpu / max(flushes, 1):.2f} ms CPU each; state file {state_bytes / 1024:.0f} KiB "
          f"({state_bytes / 1024 / ng:.0f} KiB per GPU)")
    print(f"timeline points per metric (GPU 0): {points}")
    print(f"RSS growth: bare loops {bare_rss / 2**20:+.1f} MiB; sampler after {sim_days:.2f} simulated days "
          f"{sampler_rss / 2**20:+.1f} MiB; process RSS now {rss() / 2**20:.0f} MiB")
    busy_cpu_per_day = (poll_cpu + flush_cpu) / sim_days
    print(f"sampler CPU per real job-day at this interval: {busy_cpu_per_day:.1f} s "
          f"({100 * busy_cpu_per_day / 86400:.4f}% of one core); wall for the run {wall:.1f} s")
    print()
    compare_export(nv, refs, a, clock, Path(tmp))
    nv.close()
    for p in Path(tmp).rglob("*"):
        if p.is_file():
            p.unlink()
    return 0


def waste_section(nv, refs, clock: Clock, a) -> int:
    """Per-poll CPU of the sampler with and without the waste detector, in
    alternating rounds (same process, same fake or real GPUs); prints the ratio."""
    from gsrun.request.waste import IdleConfig

    ng = len(refs)
    cfg = IdleConfig(warn_after_min=1, stuck_after_min=1)   # short: stretches, detections and evidence happen
    tmp = tempfile.mkdtemp(prefix="bench-waste-")
    root = Path(tmp) / "root"
    root.mkdir()
    rounds = {"without": [], "with": []}      # CPU s per round
    found = 0
    for rnd in range(a.waste_rounds):
        for which in (("without", "with") if rnd % 2 == 0 else ("with", "without")):
            clock.t = T0
            state = Path(tmp) / f"sampler-{which}.json"
            state.unlink(missing_ok=True)
            s = Sampler(HostFS(str(root)), "4242", os.getuid(), "bench", [r.gres_index for r in refs], str(state),
                        a.interval, 1e12, 1000, clock=clock, nvml=nv, usage=job_usage_reader(),
                        idle=cfg)
            if which == "without":
                s._watch = lambda *_a: None          # the sampler as before the detector
            c0 = time.process_time()
            for _ in range(a.waste_samples):
                s.sample_once()
                clock.t += a.interval
            rounds[which].append(time.process_time() - c0)
            if which == "with":
                found = len(s.state["waste_findings"])
    # the least disturbed round of each (a shared machine adds noise, never takes it away)
    us = {k: 1e6 * min(v) / (a.waste_samples * ng) for k, v in rounds.items()}
    mean = {k: 1e6 * sum(v) / (len(v) * a.waste_samples * ng) for k, v in rounds.items()}
    print()
    print(f"waste detector: {a.waste_rounds} alternating rounds of {a.waste_samples} polls x {ng} GPU(s) each; "
          f"detections in the last round: {found}")
    print(f"{'CPU per GPU per poll (best round / mean)':<44} {'us':>9} {'mean us':>9}")
    print(f"{'sampler polls without the detector':<44} {us['without']:9.1f} {mean['without']:9.1f}")
    print(f"{'sampler polls with the detector':<44} {us['with']:9.1f} {mean['with']:9.1f}")
    print(f"ratio with / without: {us['with'] / us['without']:.3f} best rounds, "
          f"{mean['with'] / mean['without']:.3f} means (aim <= 1.10)")
    for p in Path(tmp).rglob("*"):
        if p.is_file():
            p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
