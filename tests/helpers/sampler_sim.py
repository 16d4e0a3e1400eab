"""Helpers (no tests here): synthetic NVML sample streams driven through the
real :class:`gsrun.node.sampler.Sampler` with :class:`gsrun.facts.nvml.FakeNvml` and a
simulated clock, so a job of any length runs in seconds with known answers.

Every device starts as the real H200 recording
(``tests/data/hosts/h200-vm/nvml.json``); streams are given per poll with
``FakeNvml.set(i, key, Seq([...]))`` (one item per poll, in poll order).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import FakeNvml, Seq
from gsrun.node.sampler import Sampler, state_to_json
from gsrun.report.records import JobInfo, JobSummary, NodeSummary
from gsrun.report.summary import job_summary, node_record

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "data" / "hosts" / "h200-vm" / "nvml.json"
SAMPLES = REPO / "tests" / "data" / "samples"
T0 = 1_760_000_000.0        # simulated epoch of the job start
GIB = 1 << 30


def h200_data(n_gpus: int = 1) -> dict:
    """The H200 recording with ``n_gpus`` copies of its device (minor numbers
    0..n-1, distinct UUIDs and bus ids)."""
    base = json.loads(H200.read_text())
    dev0 = base["devices"][0]
    devs = []
    for i in range(n_gpus):
        d = copy.deepcopy(dev0)
        d["index"] = i
        d["minor"] = {"ok": i}
        d["uuid"] = {"ok": f"GPU-00000000-1111-2222-3333-44444444444{i}"}
        d["pci"] = {"ok": dict(dev0["pci"]["ok"], busId=f"00000000:{0x10 + i:02x}:00.0")}
        d.pop("gpu_instance_profiles", None)
        devs.append(d)
    base["devices"] = devs
    base["count"] = {"ok": n_gpus}
    return base


class SimClock:
    """A clock that only moves when the sampler sleeps. ``hooks`` run when
    the time passes a mark (e.g. a GPU falls off the bus at t = 1800 s)."""

    def __init__(self, t0: float = T0):
        self.t = t0
        self.t0 = t0
        self.hooks: list[tuple[float, object]] = []
        self.slept = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.slept += s
        while self.hooks and self.t - self.t0 >= self.hooks[0][0] - 1e-9:
            _, fn = self.hooks.pop(0)
            fn()

    def at(self, t_rel_s: float, fn) -> None:
        self.hooks.append((t_rel_s, fn))
        self.hooks.sort(key=lambda h: h[0])


def poll_times(n_polls: int, interval_s: float) -> list[float]:
    return [k * interval_s for k in range(n_polls)]


def util_sample_stream(n_polls: int, interval_s: float, busy, period_s: float = 0.5,
                       overlap: int = 0) -> list:
    """``nvmlDeviceGetSamples`` answers, one per poll: the driver's samples
    (every ``period_s``) in (t_prev, t_k], each ``[ts_us, busy(t) %]``, plus
    ``overlap`` samples from the previous window (a driver repeating the
    boundary: the sampler must deduplicate by timestamp)."""
    out = []
    prev = -interval_s
    for k in range(n_polls):
        t = k * interval_s
        start = prev - overlap * period_s
        first = int(round(start / period_s)) + 1
        last = int(round(t / period_s))
        items = [[int((T0 + j * period_s) * 1e6), busy(j * period_s)] for j in range(first, last + 1)]
        out.append({"ok": items})
        prev = t
    return out


def energy_stream(n_polls: int, interval_s: float, power_w, start_mj: float = 2858029.0) -> list:
    """Energy counter readings (mJ) per poll for a power profile ``power_w(t)``
    (constant across each interval)."""
    e = start_mj
    out = []
    for k in range(n_polls):
        if k:
            e += power_w((k - 1) * interval_s) * interval_s * 1000.0
        out.append({"ok": int(round(e))})
    return out


def make_sampler(tmp_path, fake, gres, clock, interval_s=5.0, flush_s=1e9, node="n1", job_id="4242",
                 usage=None, timeline_points=1000, nvml=None):
    """A real Sampler on ``fake`` with the simulated clock (no sleeping)."""
    if usage is None:
        usage = lambda: (None, None, None, "test")  # noqa: E731
    root = tmp_path / f"root-{node}"
    root.mkdir(exist_ok=True)
    return Sampler(HostFS(str(root)), job_id, 1000, node, gres, str(tmp_path / f"sampler-{node}.json"),
                   interval_s, flush_s, timeline_points, clock=clock,
                   nvml=nvml if nvml is not None else fake, usage=usage)


def run_job(sampler, n_polls: int) -> dict:
    """``n_polls`` polls at ``start + n * interval_s`` (t = 0 .. (n-1) x interval, waiting with the
    simulated clock, else in real time), then its final sample and flush -> the state (JSON form), as the epilog reads it."""
    next_t = sampler.clock()
    for n in range(n_polls):
        if n:
            next_t += sampler.interval_s
            if sampler.clock() < next_t:
                getattr(sampler.clock, "sleep", time.sleep)(next_t - sampler.clock())     # a SimClock, or real time
        sampler.poll()
    sampler.finish()
    return state_to_json(sampler.state)


def node_of(state: dict, elapsed_s: float, cpus: int | None = 8, gpus=None, node: str = "n1") -> dict:
    """The node summary's JSON form (``node-<node>.json``)."""
    env = {"node": node, "job_id": state["job_id"], "cpus_on_node": cpus, "gpus": gpus or []}
    return node_record(state, env, state["start_time"] + elapsed_s).to_json()


def job_of(node_summaries: list[dict | NodeSummary], elapsed_s: float, **job) -> JobSummary:
    """Job summary of ``node_summaries`` (JSON forms, as :func:`node_of` gives, or records); ``job``
    overrides record fields."""
    nodes = [n if isinstance(n, NodeSummary) else NodeSummary.from_json(n) for n in node_summaries]
    rec = {"id": "4242", "state": "COMPLETED", "elapsed_s": elapsed_s, "nodes": [n.node for n in nodes]}
    rec.update(job)
    return job_summary(JobInfo(**rec), nodes)


def cpu_usage(clock, cores_busy: float, mem_bytes: int | None = None, peak: int | None = None):
    """A job usage reader: ``cores_busy`` CPU-seconds per second since t0."""
    def f():
        return (cores_busy * (clock.t - clock.t0), mem_bytes, peak, "cgroup2:/test")
    return f
