"""Regenerate the summary fixtures in this folder (see README.md).

Run from the checkout root: ``python -P tests/data/summaries/make.py OUTDIR``.
Writes, per scenario, the files as gsrun writes them in the spool:
``sampler-<node>.json`` (the sampler's final state, as ``Sampler.flush``
writes it), ``node-<node>.json`` (the epilog's node summary, with the
``sampler_stop`` / ``request`` keys the epilog adds) and ``summary.json``
(EpilogSlurmctld's job summary), all in ``atomic_write_json``'s form
(compact, sorted keys) except sampler state (compact, insertion order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))

from gsrun.facts.nvml import NA, FakeNvml, Seq  # noqa: E402
from gsrun.report.records import JobInfo, NodeSummary  # noqa: E402
from gsrun.report.summary import job_summary, node_record  # noqa: E402
from helpers.sampler_sim import (GIB, SimClock, cpu_usage, energy_stream, h200_data,  # noqa: E402
                                  make_sampler, run_job, util_sample_stream)

H = 3600.0
T0 = 1_760_000_000.0
REQUEST = {"tune": {"governor": "performance"}, "mps": None, "mig": None, "bind": True, "exclusive": True,
           "exclusive_source": "job record OverSubscribe", "report": True}


def _node_of(state, elapsed, cpus, gpus, node, extras=True):
    env = {"node": node, "job_id": state["job_id"] if state else "4242", "cpus_on_node": cpus, "gpus": gpus,
           "prolog_time": T0}
    s = node_record(state, env, (state["start_time"] if state else T0) + elapsed).to_json()
    if extras:
        s["sampler_stop"] = "stopped"
        s["request"] = REQUEST
    return s


def _job(node_sums, elapsed, **rec):
    base = {"id": "4242", "array": None, "user": "alice", "name": "train-llm", "partition": "gpu",
            "state": "COMPLETED", "exit_code": 0, "nodes": [n["node"] for n in node_sums], "cpus_alloc": None,
            "mem_req_bytes": None, "gpus_alloc": None, "mail_user": "alice@example.org", "mail_type": "END",
            "start_time": None, "end_time": None, "elapsed_s": elapsed}
    base.update(rec)
    return job_summary(JobInfo(**base), map(NodeSummary.from_json, node_sums)).to_json()


def busy4(tmp, name, lose_gpu, gpm=True, n=721):
    fake = FakeNvml(h200_data(4))
    for i in range(4):
        fake.set(i, "util_samples", Seq(util_sample_stream(
            n, 5.0, lambda t, i=i: 2 if i == 3 else (100 if (t % (60 * (i + 1))) < 30 * (i + 1) else 10))))
        fake.set(i, "energy_mj", Seq(energy_stream(n, 5.0, lambda t, i=i: 150 + 100 * i)))
        fake.set(i, "power_mw", Seq([{"ok": int((150 + 100 * i + (k % 7) * 20) * 1000)} for k in range(n)]))
        fake.set(i, "memory", Seq([{"ok": {"total": 150754820096,
                                           "used": int(min(k, 300) / 300 * (5 + 25 * i) * GIB), "free": 0}}
                                   for k in range(n)]))
        if gpm:
            fake.set(i, "gpm", Seq([{"error": "first GPM sample", "code": None}] + [
                {"ok": {"sm_active_pct": (4.0 if i == 1 else 40.0 + 10 * i) + (k % 5), "sm_occupancy_pct": 10.0,
                        "tensor_active_pct": 20.0, "dram_bw_pct": 5.0}} for k in range(n)]))
    fake.set(0, "throttle_reasons", Seq([{"ok": 0x20 if k % 3 == 0 else 0} for k in range(n)]))
    fake.set(1, "xid_events", Seq([{"ok": [48, 999] if k == 100 else []} for k in range(n)]))
    fake.set(1, "ecc_uncorrected", Seq([{"ok": 3 if k > 200 else 1} for k in range(n)]))
    clock = SimClock()
    if lose_gpu:
        clock.at(1800, lambda: fake.data["devices"][2].__setitem__("lost", True))
    return run_job(make_sampler(tmp, fake, [0, 1, 2, 3], clock, node=name, timeline_points=40,
                                usage=cpu_usage(clock, 15.5, 40 * GIB)), n)


def simple(tmp, name, gres, util, cores_busy, mem_peak, power_w=400.0, mig=False, n=721):
    fake = FakeNvml(h200_data(len(gres)))
    for i in range(len(gres)):
        fake.set(i, "minor", gres[i])
        if mig:
            fake.set(i, "mig_mode", [1, 1])
            fake.set(i, "util_samples", NA("Not Supported", 3))
            fake.set(i, "utilization", NA("Not Supported", 3))
        else:
            fake.set(i, "util_samples", Seq(util_sample_stream(n, 5.0, lambda t: util)))
        fake.set(i, "energy_mj", Seq(energy_stream(n, 5.0, lambda t: power_w)))
        fake.set(i, "memory", {"total": 150754820096, "used": 20 * GIB, "free": 0})
    clock = SimClock()
    return run_job(make_sampler(tmp, fake, gres, clock, node=name, timeline_points=40,
                                usage=cpu_usage(clock, cores_busy, mem_peak // 2, mem_peak)), n)


def scenarios(tmp: Path) -> dict:
    """name -> (sampler states {node: state}, node summaries, job summary)."""
    out = {}
    (tmp / "a").mkdir()
    st = busy4(tmp / "a", "gpu-a01", lose_gpu=True)
    ns = [_node_of(st, H, 16, [0, 1, 2, 3], "gpu-a01")]
    out["lost-gpu"] = ({"gpu-a01": st}, ns, _job(ns, H, cpus_alloc=16, mem_req_bytes=512 * GIB, gpus_alloc=4))

    (tmp / "b").mkdir()
    sa = simple(tmp / "b", "gpu-a01", [0, 1], 50, 4.0, 10 * GIB)
    sb = simple(tmp / "b", "gpu-a02", [2, 3], 50, 2.0, 20 * GIB, power_w=40000.0)
    ns = [_node_of(sa, H, 8, [0, 1], "gpu-a01"), _node_of(sb, H, 8, [2, 3], "gpu-a02")]
    out["two-nodes"] = ({"gpu-a01": sa, "gpu-a02": sb}, ns,
                        _job(ns, H, cpus_alloc=16, mem_req_bytes=64 * GIB, gpus_alloc=4,
                             array="4240_2", nodes=["gpu-a01", "gpu-a02", "gpu-a03"]))

    (tmp / "c").mkdir()
    sm = simple(tmp / "c", "mig-01", [0], None, 7.99, GIB, mig=True)
    ns = [_node_of(sm, H, 8, [0], "mig-01")]
    out["mig"] = ({"mig-01": sm}, ns, _job(ns, 100000.0, cpus_alloc=8, mem_req_bytes=16 * GIB, gpus_alloc=1,
                                           state="TIMEOUT", exit_code=1))

    (tmp / "d").mkdir()
    data = h200_data(1)
    data["init"] = {"error": "Driver/library version mismatch", "code": 18}
    clock = SimClock()
    sn = run_job(make_sampler(tmp / "d", None, [0], clock, nvml=lambda: FakeNvml(data), timeline_points=40,
                              usage=lambda: (None, 3 * GIB, None, "psutil")), 13)
    ns = [_node_of(sn, 60, 8, [0], "n1", extras=False)]
    out["nvml-fail"] = ({"n1": sn}, ns, _job(ns, 60, cpus_alloc=8, mem_req_bytes=16 * GIB, gpus_alloc=1,
                                             name=None, mail_user=None, mail_type=None))

    ns = [_node_of(None, 30.0, 4, [0, 1], "gpu-b07")]
    out["no-sampler"] = ({}, ns, _job(ns, 30.0, cpus_alloc=4, gpus_alloc=2, state="FAILED", exit_code=2))

    out["cancelled"] = ({}, [], _job([], 0.0, nodes=[], state="CANCELLED", exit_code=None))
    return out


def dump(obj, sort=True) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=sort) + "\n"


def main(outdir: str) -> None:
    import tempfile

    out = Path(outdir)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (states, nodes, job) in scenarios(Path(tmp)).items():
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            for node, st in states.items():
                (d / f"sampler-{node}.json").write_text(dump(st, sort=False))
            for n in nodes:
                (d / f"node-{n['node']}.json").write_text(dump(n))
            (d / "summary.json").write_text(dump(job))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent))
