"""Make the job summaries the report, gseff and mail goldens render from.

Run once (``python tests/data/golden/summaries/make.py`` with the installed
gsrun); the golden tests read the stored JSON, so a later change of the
sampler or the summary merge does not move the rendered goldens. Each job is
a real :class:`gsrun.node.sampler.Sampler` run on the H200 recording through
``tests/helpers/sampler_sim.py`` (simulated clock, fixed streams):

- ``job-1gpu.json``: 1 x H200, 1 h, busy 80 % of the time, CPU 3 of 8 cores;
- ``job-8gpu.json``: 8 x H200 on one node, 2 h, utilization 95 % down to 5 %
  by GPU, GPU 7 idle, GPU 1 power-capped a quarter of the
  time, Xid 79 on GPU 3 at 40 min and GPU 5 lost after 1 h;
- ``job-failed.json``: the 1-GPU job FAILED (exit 1) after 10 min, mail FAIL;
- ``job-cancelled.json``: CANCELLED before start (no node summary at all);
- ``job-tuned.json`` (``make.py --tuned``, from ``job-1gpu.json``): the same job
  with the node settings a prolog record of an exclusive tuned job gives
  (:data:`TUNED_PROLOG` through ``node_settings`` and ``settings_groups``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))          # tests/ -> helpers

from gsrun import SUMMARY_SCHEMA  # noqa: E402
from gsrun.facts.nvml import FakeNvml, Seq  # noqa: E402
from gsrun.report.records import JobInfo, JobSummary, NodeSummary  # noqa: E402
from gsrun.report.summary import job_summary  # noqa: E402
from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data, job_of,  # noqa: E402
                                 make_sampler, node_of, run_job, util_sample_stream)

INTERVAL_S = 10.0
TIMELINE_POINTS = 24        # small stored files; the text and mail do not print the timeline
MAIL = {"mail_user": "alice@example.org", "mail_type": "END"}


def _node(tmp: Path, n_gpus: int, elapsed_s: float, util, power, mem_gib, cores_busy: float, cpus: int,
          node: str, hooks=(), streams=None):
    n = int(elapsed_s / INTERVAL_S) + 1
    fake = FakeNvml(h200_data(n_gpus))
    for i in range(n_gpus):
        fake.set(i, "util_samples", Seq(util_sample_stream(n, INTERVAL_S, lambda t, i=i: util(i, t))))
        fake.set(i, "energy_mj", Seq(energy_stream(n, INTERVAL_S, lambda t, i=i: power(i, t))))
        fake.set(i, "power_mw", Seq([{"ok": int(power(i, k * INTERVAL_S) * 1000)} for k in range(n)]))
        fake.set(i, "memory", Seq([{"ok": {"total": 150754820096,
                                           "used": int(min(k, 30) / 30 * mem_gib(i) * GIB), "free": 0}}
                                   for k in range(n)]))
        fake.set(i, "gpm", Seq([{"error": "first GPM sample", "code": None}] + [
            {"ok": {"sm_active_pct": util(i, k * INTERVAL_S) * 0.6, "sm_occupancy_pct": 20.0,
                    "tensor_active_pct": util(i, k * INTERVAL_S) * 0.3, "dram_bw_pct": 12.0}}
            for k in range(n)]))
    for (i, key), seq in (streams or {}).items():
        fake.set(i, key, Seq(seq(n)))
    clock = SimClock()
    for t, fn in hooks:
        clock.at(t, lambda fn=fn: fn(fake))
    st = run_job(make_sampler(tmp, fake, list(range(n_gpus)), clock, interval_s=INTERVAL_S, node=node,
                              job_id="4242", usage=cpu_usage(clock, cores_busy, 30 * GIB),
                              timeline_points=TIMELINE_POINTS), n)
    return node_of(st, elapsed_s, cpus=cpus, gpus=list(range(n_gpus)), node=node)


def job_1gpu(tmp: Path, **over) -> JobSummary:
    elapsed = over.pop("elapsed_s", 3600.0)
    node = _node(tmp, 1, elapsed, util=lambda i, t: 100 if (t % 50) < 40 else 0, power=lambda i, t: 480.0,
                 mem_gib=lambda i: 61.0, cores_busy=3.0, cpus=8, node="gpu-a01")
    job = dict(id="4242", name="train-1gpu", user="alice", partition="gpu", cpus_alloc=8,
               mem_req_bytes=64 * GIB, gpus_alloc=1, exit_code=0, **MAIL)
    job.update(over)
    return job_of([node], elapsed, **job)


def job_8gpu(tmp: Path) -> JobSummary:
    levels = [95, 90, 80, 70, 50, 30, 5, 0]

    def lose(fake):
        fake.data["devices"][5]["lost"] = True

    node = _node(tmp, 8, 7200.0, util=lambda i, t: levels[i] if (t % 60) < 50 else levels[i] // 2,
                 power=lambda i, t: 120.0 + 5.5 * levels[i], mem_gib=lambda i: 10.0 + 15 * i,
                 cores_busy=40.0, cpus=96, node="gpu-b07", hooks=[(3600.0, lose)],
                 streams={(3, "xid_events"): lambda n: [{"ok": [79] if k == 240 else []} for k in range(n)],
                          (1, "throttle_reasons"): lambda n: [{"ok": 0x4 if k % 4 == 0 else 0} for k in range(n)]})
    return job_of([node], 7200.0, id="5151", name="pretrain-8x", user="bob", partition="h200",
                  cpus_alloc=96, mem_req_bytes=512 * GIB, gpus_alloc=8, exit_code=0,
                  mail_user="bob@example.org", mail_type="END,FAIL")


def job_cancelled() -> JobSummary:
    return job_summary(JobInfo(**{"id": "6262", "name": "queued-8x", "user": "carol", "partition": "h200",
                        "state": "CANCELLED by 1001", "exit_code": 0, "nodes": ["gpu-b08"], "elapsed_s": 0.0,
                        "cpus_alloc": 96, "gpus_alloc": 8, "mem_req_bytes": 512 * GIB,
                        "mail_user": "carol@example.org", "mail_type": "ALL"}), [])


TIMES = {"job-1gpu": {"submit_time": 1760000000.0 - 900, "time_limit_s": 8 * 3600.0},
         "job-8gpu": {"submit_time": 1760000000.0 - 5400, "time_limit_s": 4 * 3600.0}}


def refresh_findings() -> None:
    """``make.py --findings``: keep the stored figures, add the job record's
    SubmitTime / TimeLimit (:data:`TIMES`) and recompute the
    findings with today's rules (what EpilogSlurmctld would store now)."""
    from gsrun.report.findings import finding_records
    for p in sorted(HERE.glob("job-*.json")):
        d = json.loads(p.read_text())
        d["job"].update(TIMES.get(p.stem, {}))
        s = JobSummary.from_json(d)
        s = dataclasses.replace(s, findings=tuple(finding_records(s)))
        p.write_text(json.dumps(s.to_json(), indent=1, sort_keys=True) + "\n")
        print(f"refreshed {p.name}: {len(s.findings)} finding(s)")


# the prolog record's tuning report (gsrun.node.tuning.prolog_tune) of a job run with
# gsrun --tune governor=performance,swap=off,thp=never,cstate=c1,irq=local,hugepages=2M:512
# --malloc jemalloc on a node where irqbalance runs without gsrun's policy script
TUNED_PROLOG = {
    "request": {"tune": "governor=performance,swap=off,thp=never,cstate=c1,irq=local,hugepages=2M:512",
                "malloc": "jemalloc"},
    "steps": {"tuning": {"items": [
        {"key": "governor", "action": "applied", "value": "performance", "source": "request", "reason": ""},
        {"key": "swappiness", "action": "unchanged", "value": "10", "source": "default",
         "reason": "already the value"},
        {"key": "thp", "action": "applied", "value": "never", "source": "request", "reason": ""},
        {"key": "swap", "action": "unsupported", "value": "off", "source": "request",
         "reason": "not supported here (no active swap in /proc/swaps)"},
        {"key": "cstate", "action": "unsupported", "value": "c1", "source": "request",
         "reason": "not supported here (no cpuN/cpuidle/stateK/disable: cpuidle driver none, e.g. a VM); "
                   "/dev/cpu_dma_latency held at 1 us by the job's sampler instead"},
        {"key": "irq", "action": "refused", "value": "local", "source": "request",
         "reason": "irqbalance runs without gsrun's policy script and would move the IRQs back within 10 s"},
        {"key": "hugepages", "action": "applied", "value": "2M:512", "source": "request",
         "reason": "512 x 2048 kB on NUMA node 0"}],
        "holds": {"cpu_dma_latency_us": 1}}}}


def tuned() -> None:
    """``make.py --tuned``: ``job-tuned.json`` from the stored ``job-1gpu.json``."""
    from gsrun.report.node_end import node_settings
    from gsrun.report.summary import settings_groups
    s = json.loads((HERE / "job-1gpu.json").read_text())
    s["job"]["id"] = "4350"
    node = NodeSummary(schema=SUMMARY_SCHEMA, kind="node", job_id="4350", node=s["job"]["nodes"][0],
                       settings=tuple(node_settings(TUNED_PROLOG)))
    s["settings"] = [g.to_json() for g in settings_groups([node])]
    (HERE / "job-tuned.json").write_text(json.dumps(s, indent=1, sort_keys=True) + "\n")
    print(f"wrote job-tuned.json ({len(s['settings'][0]['settings'])} settings)")


def main() -> None:
    if sys.argv[1:] == ["--findings"]:
        refresh_findings()
        return
    if sys.argv[1:] == ["--tuned"]:
        tuned()
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for sub in "abc":
            (tmp / sub).mkdir()
        jobs = {"job-1gpu": job_1gpu(tmp / "a"),
                "job-8gpu": job_8gpu(tmp / "b"),
                "job-failed": job_1gpu(tmp / "c", elapsed_s=600.0, id="4343", state="FAILED", exit_code=1,
                                       name="train-crash", mail_type="FAIL"),
                "job-cancelled": job_cancelled()}
    for name, summary in jobs.items():
        s = summary.to_json()
        s["job"].update(TIMES.get(name, {}))
        (HERE / f"{name}.json").write_text(json.dumps(s, indent=1, sort_keys=True) + "\n")
        print(f"wrote {name}.json ({s['job']['state']}, {len(s['gpu']['devices'])} GPU(s))")


if __name__ == "__main__":
    main()
